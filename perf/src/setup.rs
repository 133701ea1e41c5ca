//! The host handshake, done blocking before the measurement starts: admin queue (Connect with
//! cntlid 0xFFFF, CC.EN = 1 until CSTS.RDY, Identify, Set Features Number of Queues) over any
//! transport's [`AdminQueue`] (NVMe/TCP: the project's client after ICReq; NVMe/RDMA:
//! `rdma`), then for NVMe/TCP one connection per I/O queue (ICReq and I/O Connect) handed to
//! the non-blocking I/O loop.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nvme::spec::{cc, cns, csts, fid, reg};
use nvme::wire::fabrics::{ConnectCommand, ConnectData};
use nvme::wire::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_DATA_SIZE};
use nvme::wire::{Cqe, DecodeError, SglDescriptor, Sqe, Status};
use transport::client::{Client, ClientError, ClientOptions, DataOut, HostStream, TlsParams};
use transport::tcp::pdu::{
    encode_pdu, CommonHeader, Digests, IcReq, IcResp, PduError, PduHeader, RecvLimits, Role,
    COMMON_HEADER_LEN, IC_PDU_LEN, MIN_MAXH2CDATA,
};
use transport::tcp::recv::{Discard, Event, Receiver};

use crate::rdma_proto::QueueError;
use crate::socket::Socket;

/// Admin queue entries asked for (Linux uses 32, NVME_AQ_DEPTH).
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// The memory page size the I/O command sizes are expressed in (CAP.MPSMIN = 0: 4 KiB).
const MIN_PAGE: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{step}: {source}")]
    Client {
        step: &'static str,
        #[source]
        source: ClientError,
    },
    #[error("{step}: {source}")]
    Io {
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{step}: malformed PDU: {source}")]
    Pdu {
        step: &'static str,
        #[source]
        source: PduError,
    },
    #[error("{step}: {source}")]
    Decode {
        step: &'static str,
        #[source]
        source: DecodeError,
    },
    #[error("{step}: {source}")]
    Admin {
        step: &'static str,
        #[source]
        source: AdminError,
    },
    #[error("{step} failed with {status}")]
    CommandFailed { step: &'static str, status: Status },
    #[error("the controller reported a fatal status (CSTS.CFS) while being enabled")]
    ControllerFatal,
    #[error("CSTS.RDY not set {0:?} after CC.EN")]
    ReadyTimeout(Duration),
    #[error("I/O queue {qid} Connect failed with {status}")]
    ConnectFailed { qid: u16, status: Status },
    #[error("ICResp refused: {0}")]
    BadIcResp(&'static str),
    #[error("namespace {nsid}: {why}")]
    Namespace { nsid: u32, why: String },
    #[error("queue depth {qd} exceeds the controller's maximum queue size {max} (CAP.MQES + 1)")]
    QueueTooDeep { qd: u32, max: u32 },
    #[error("I/O size {bs} exceeds the controller's maximum data transfer size {mdts}")]
    TooLarge { bs: u32, mdts: u64 },
    #[error("controller granted no I/O queue")]
    NoQueues,
}

fn client_err(step: &'static str) -> impl FnOnce(ClientError) -> SetupError {
    move |source| SetupError::Client { step, source }
}

fn io_err(step: &'static str) -> impl FnOnce(io::Error) -> SetupError {
    move |source| SetupError::Io { step, source }
}

/// Who we are and whom we talk to.
#[derive(Debug, Clone)]
pub struct HostParams {
    pub addr: SocketAddr,
    pub subnqn: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub digests: Digests,
    pub kato_ms: u32,
    pub timeout: Duration,
    /// TLS 1.3 with this PSK identity on every queue (`--tls-key`).
    pub tls: Option<TlsParams>,
}

/// What the controller told us that the I/O loop needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerInfo {
    pub cntlid: u16,
    /// Largest in-capsule write on an I/O queue: IOCCSZ × 16 − 64 (NVMe-oF 1.1 §4.1).
    pub in_capsule_limit: u32,
    /// MDTS in bytes, None = no limit.
    pub max_transfer: Option<u64>,
    /// CAP.MQES + 1.
    pub max_queue_entries: u32,
    /// I/O queues granted by Set Features Number of Queues.
    pub io_queues: u16,
}

/// The namespace under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
}

/// Data an admin command moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminData<'a> {
    None,
    /// Host to controller.
    Write(&'a [u8]),
    /// Controller to host, this many bytes.
    Read(u32),
}

/// A finished admin command: its CQE, whatever the status, and the data it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminReply {
    pub cqe: Cqe,
    pub data: Vec<u8>,
}

/// Why an admin command got no completion.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Tcp(#[from] ClientError),
    #[error("{0}")]
    Rdma(#[from] QueueError),
}

/// An admin queue of either transport: one command at a time, waited for.
pub trait AdminQueue {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>) -> Result<AdminReply, AdminError>;
}

impl AdminQueue for Client {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>) -> Result<AdminReply, AdminError> {
        let data = match data {
            AdminData::None => DataOut::None,
            AdminData::Write(bytes) => DataOut::Write(bytes.to_vec()),
            AdminData::Read(n) => DataOut::Read(n),
        };
        let c = Client::execute(self, sqe, data)?;
        Ok(AdminReply {
            cqe: c.cqe,
            data: c.data,
        })
    }
}

/// Runs one admin command; a completion with an error status is a setup error too.
fn command<A: AdminQueue>(
    admin: &mut A,
    step: &'static str,
    sqe: Sqe,
    data: AdminData<'_>,
) -> Result<AdminReply, SetupError> {
    let r = admin
        .execute(sqe, data)
        .map_err(|source| SetupError::Admin { step, source })?;
    if !r.cqe.status.is_success() {
        return Err(SetupError::CommandFailed {
            step,
            status: r.cqe.status,
        });
    }
    Ok(r)
}

/// The Fabrics Connect of queue `qid` (NVMe-oF 1.1 §3.3.1) with its 1024 bytes of data.
/// SQSIZE is 0's based; the admin queue asks for a dynamic controller and sets the KATO.
pub fn connect_command(
    host: &HostParams,
    qid: u16,
    entries: u32,
    cntlid: u16,
) -> (Sqe, [u8; ConnectData::SIZE]) {
    let sqe = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize: (entries - 1) as u16,
        cattr: 0,
        kato: if qid == 0 { host.kato_ms } else { 0 },
    }
    .to_sqe(0);
    let data = ConnectData {
        hostid: host.hostid,
        cntlid,
        subnqn: host.subnqn.clone(),
        hostnqn: host.hostnqn.clone(),
    }
    .encode();
    (sqe, data)
}

/// Fabrics Connect of I/O queue `qid` on an established queue of either transport.
pub fn connect_io_queue<A: AdminQueue>(
    queue: &mut A,
    host: &HostParams,
    ctrl: &ControllerInfo,
    qid: u16,
    entries: u32,
) -> Result<(), SetupError> {
    let (sqe, data) = connect_command(host, qid, entries, ctrl.cntlid);
    match command(queue, "I/O Connect", sqe, AdminData::Write(&data)) {
        Err(SetupError::CommandFailed { status, .. }) => {
            Err(SetupError::ConnectFailed { qid, status })
        }
        other => other.map(|_| ()),
    }
}

/// One controller: the admin queue stays open (and is kept alive) for the whole run.
pub struct Controller<A = Client> {
    pub admin: A,
    pub info: ControllerInfo,
}

impl Controller<Client> {
    /// NVMe/TCP admin-queue bring-up, asking for `want_queues` I/O queues.
    pub fn connect(host: &HostParams, want_queues: u16) -> Result<Self, SetupError> {
        let opts = ClientOptions {
            header_digest: host.digests.header,
            data_digest: host.digests.data,
            hpda: 0,
            timeout: host.timeout,
        };
        let admin = match &host.tls {
            None => Client::connect(host.addr, opts),
            Some(tls) => Client::connect_tls(host.addr, opts, tls),
        }
        .map_err(client_err("admin ICReq"))?;
        Self::bring_up(admin, host, want_queues)
    }
}

impl<A: AdminQueue> Controller<A> {
    /// Connect, CAP, CC.EN, Identify Controller and Number of Queues on a fresh admin queue.
    pub fn bring_up(mut admin: A, host: &HostParams, want_queues: u16) -> Result<Self, SetupError> {
        let (sqe, data) = connect_command(
            host,
            0,
            ADMIN_QUEUE_ENTRIES.into(),
            nvme::spec::CNTLID_DYNAMIC,
        );
        let cntlid = command(&mut admin, "admin Connect", sqe, AdminData::Write(&data))?
            .cqe
            .dw0 as u16;
        let cap = Client::property_value(
            &command(
                &mut admin,
                "Property Get CAP",
                Client::property_get_sqe(reg::CAP, true),
                AdminData::None,
            )?
            .cqe,
        );
        enable(&mut admin, host.timeout)?;
        let id = command(
            &mut admin,
            "Identify Controller",
            Client::identify_sqe(cns::CONTROLLER, 0),
            AdminData::Read(IDENTIFY_DATA_SIZE as u32),
        )?
        .data;
        let id = IdentifyController::decode(&id).map_err(|source| SetupError::Decode {
            step: "Identify Controller",
            source,
        })?;
        // NVMe Base 2.0 §5.27.1.7: both counts are 0's based; the controller may grant fewer.
        let n = want_queues.max(1) as u32 - 1;
        let cqe = command(
            &mut admin,
            "Set Features Number of Queues",
            Client::set_features_sqe(fid::NUMBER_OF_QUEUES, n | n << 16),
            AdminData::None,
        )?
        .cqe;
        let granted = (cqe.dw0 & 0xffff).min(cqe.dw0 >> 16) + 1;
        Ok(Self {
            admin,
            info: ControllerInfo {
                cntlid,
                in_capsule_limit: (id.ioccsz * 16).saturating_sub(64),
                max_transfer: (id.mdts != 0).then(|| MIN_PAGE << id.mdts.min(40)),
                max_queue_entries: (cap & 0xffff) as u32 + 1,
                io_queues: granted.min(want_queues.max(1) as u32) as u16,
            },
        })
    }

    /// Identify Namespace: size and block size (NVM Command Set 1.0 Figure 97).
    pub fn namespace(&mut self, nsid: u32) -> Result<NamespaceInfo, SetupError> {
        let raw = command(
            &mut self.admin,
            "Identify Namespace",
            Client::identify_sqe(cns::NAMESPACE, nsid),
            AdminData::Read(IDENTIFY_DATA_SIZE as u32),
        )?
        .data;
        let ns = IdentifyNamespace::decode(&raw).map_err(|source| SetupError::Decode {
            step: "Identify Namespace",
            source,
        })?;
        // FLBAS bits 3:0 select the format; LBAF n is at byte 128 + 4n, LBADS in bits 23:16.
        let fmt = (ns.flbas & 0xf) as usize;
        let lbads = raw.get(128 + 4 * fmt + 2).copied().unwrap_or(0);
        if ns.nsze == 0 {
            return Err(SetupError::Namespace {
                nsid,
                why: "not active (NSZE 0)".into(),
            });
        }
        if !(9..=16).contains(&lbads) {
            return Err(SetupError::Namespace {
                nsid,
                why: format!("unsupported LBA data size 2^{lbads}"),
            });
        }
        Ok(NamespaceInfo {
            nsid,
            block_size: 1 << lbads,
            blocks: ns.nsze,
        })
    }

    pub fn keep_alive(&mut self) -> Result<(), SetupError> {
        command(
            &mut self.admin,
            "Keep Alive",
            Client::keep_alive_sqe(),
            AdminData::None,
        )
        .map(|_| ())
    }
}

/// Sets CC.EN and waits for CSTS.RDY (NVMe Base 2.0 §3.5.1).
fn enable<A: AdminQueue>(admin: &mut A, timeout: Duration) -> Result<(), SetupError> {
    command(
        admin,
        "Property Set CC",
        Client::property_set_sqe(reg::CC, u64::from(cc::ENABLE), false),
        AdminData::None,
    )?;
    let deadline = Instant::now() + timeout;
    loop {
        let csts = Client::property_value(
            &command(
                admin,
                "Property Get CSTS",
                Client::property_get_sqe(reg::CSTS, false),
                AdminData::None,
            )?
            .cqe,
        );
        if csts & u64::from(csts::CFS) != 0 {
            return Err(SetupError::ControllerFatal);
        }
        if csts & u64::from(csts::RDY) != 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SetupError::ReadyTimeout(timeout));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An I/O queue's connection after ICReq and Connect, ready for the I/O loop.
#[derive(Debug)]
pub struct IoQueueConn {
    pub stream: Socket,
    /// Receive state machine, established with the negotiated digests.
    pub rx: Receiver,
    pub digests: Digests,
    /// Controller PDU data alignment in bytes.
    pub cpda: usize,
    pub maxh2cdata: u32,
    pub qid: u16,
}

/// ICReq/ICResp on a fresh connection (NVMe/TCP 1.0 §3.3; inside TLS when `tls`), blocking.
pub fn initialize_connection(
    addr: SocketAddr,
    digests: Digests,
    timeout: Duration,
    tls: Option<&TlsParams>,
    max_c2h_data: u32,
) -> Result<(HostStream, Receiver, usize, u32), SetupError> {
    let mut stream =
        HostStream::connect(addr, timeout, tls).map_err(client_err("connect (TCP, TLS)"))?;
    let req = IcReq {
        pfv: 0,
        hpda: 0,
        dgst: digests.to_dgst(),
        maxr2t: 0,
    };
    stream
        .write_all(&req.encode())
        .map_err(io_err("send ICReq"))?;
    let mut pdu = [0u8; IC_PDU_LEN];
    stream
        .read_exact(&mut pdu)
        .map_err(io_err("receive ICResp"))?;
    let pdu_err = |source| SetupError::Pdu {
        step: "ICResp",
        source,
    };
    let limits = RecvLimits {
        max_capsule_data: 0,
        max_data_pdu: max_c2h_data,
    };
    CommonHeader::decode(&pdu[..COMMON_HEADER_LEN])
        .map_err(|e| pdu_err(e.into()))?
        .validate(Role::Host, Digests::default(), 4, limits)
        .map_err(pdu_err)?;
    let resp = IcResp::decode(&pdu).map_err(|e| pdu_err(e.into()))?;
    // §3.6.2.3: PFV 0; MAXH2CDATA ≥ 4096 and dword-aligned; CPDA ≤ 31; the digests are
    // those we asked for (Linux refuses any difference too).
    if resp.pfv != 0 {
        return Err(SetupError::BadIcResp("PFV is not 0"));
    }
    if resp.maxh2cdata < MIN_MAXH2CDATA || resp.maxh2cdata % 4 != 0 {
        return Err(SetupError::BadIcResp("MAXH2CDATA below 4096 or unaligned"));
    }
    if resp.cpda > 31 {
        return Err(SetupError::BadIcResp("CPDA out of range"));
    }
    if Digests::from_dgst(resp.dgst) != digests {
        return Err(SetupError::BadIcResp(
            "digests differ from the ones asked for",
        ));
    }
    let mut rx = Receiver::new(Role::Host, limits);
    rx.establish(digests, 4);
    Ok((stream, rx, (resp.cpda as usize + 1) * 4, resp.maxh2cdata))
}

/// Opens I/O queue `qid` of `ctrl` with `entries` entries.
pub fn open_io_queue(
    host: &HostParams,
    ctrl: &ControllerInfo,
    qid: u16,
    entries: u32,
    max_c2h_data: u32,
) -> Result<IoQueueConn, SetupError> {
    let (mut stream, mut rx, cpda, maxh2cdata) = initialize_connection(
        host.addr,
        host.digests,
        host.timeout,
        host.tls.as_ref(),
        max_c2h_data,
    )?;
    let (mut sqe, data) = connect_command(host, qid, entries, ctrl.cntlid);
    // The 1024 bytes of Connect data always go in-capsule (NVMe/TCP 1.0 §2.2: the I/O queue
    // Connect is sized to carry them regardless of IOCCSZ).
    sqe.dptr = SglDescriptor::in_capsule(0, data.len() as u32);
    let pdu = encode_pdu(&PduHeader::CapsuleCmd(sqe), &data, host.digests, cpda);
    stream.write_all(&pdu).map_err(io_err("send I/O Connect"))?;
    let cqe = loop {
        match read_event(&mut stream, &mut rx)? {
            Event::Pdu {
                header: PduHeader::CapsuleResp(cqe),
                ..
            } => break cqe,
            Event::Pdu {
                header: PduHeader::C2HTermReq(t),
                ..
            } => {
                return Err(SetupError::Client {
                    step: "I/O Connect",
                    source: ClientError::Terminated {
                        fes: t.fes,
                        fei: t.fei,
                    },
                })
            }
            Event::Pdu { header, .. } => {
                return Err(SetupError::Client {
                    step: "I/O Connect",
                    source: ClientError::UnexpectedPdu(header.pdu_type()),
                })
            }
            Event::DataComplete { .. } => {}
        }
    };
    if !cqe.status.is_success() {
        return Err(SetupError::ConnectFailed {
            qid,
            status: cqe.status,
        });
    }
    let stream = Socket::new(stream).map_err(io_err("non-blocking socket"))?;
    Ok(IoQueueConn {
        stream,
        rx,
        digests: host.digests,
        cpda,
        maxh2cdata,
        qid,
    })
}

/// Reads byte by byte until the receiver reports an event: only used for the one response
/// of the Connect, so nothing of the I/O phase is ever read ahead here.
fn read_event(stream: &mut HostStream, rx: &mut Receiver) -> Result<Event, SetupError> {
    let mut byte = [0u8; 1];
    loop {
        let n = stream
            .read(&mut byte)
            .map_err(io_err("receive I/O Connect response"))?;
        if n == 0 {
            return Err(SetupError::Client {
                step: "I/O Connect",
                source: ClientError::Closed,
            });
        }
        let (_, ev) = rx
            .feed(&byte, &mut Discard)
            .map_err(|source| SetupError::Pdu {
                step: "I/O Connect response",
                source,
            })?;
        if let Some(ev) = ev {
            return Ok(ev);
        }
    }
}

/// Entries of an I/O queue for `qd` outstanding commands: at least two, the smallest queue
/// Connect allows (NVMe-oF 1.1 §3.3.1).
pub fn queue_entries(qd: u32) -> u32 {
    qd.max(2)
}

/// Controllers for `queues` I/O queues: as many as needed when one grants fewer queues than
/// asked (the target's max_io_queues), each queue named by its controller and QID.
pub struct Plan<A> {
    pub controllers: Vec<Controller<A>>,
    pub queues: Vec<(ControllerInfo, u16)>,
    pub namespace: NamespaceInfo,
    /// In-capsule write limit and MDTS of the (identical) controllers.
    pub info: ControllerInfo,
}

/// Brings up controllers with `connect` (asked for the queues still missing) until `queues`
/// I/O queues are granted; checks the namespace, queue depth and I/O size on the first.
pub fn plan_controllers<A: AdminQueue, E: From<SetupError>>(
    nsid: u32,
    queues: u32,
    qd: u32,
    bs: u32,
    connect: &mut dyn FnMut(u16) -> Result<Controller<A>, E>,
) -> Result<Plan<A>, E> {
    let mut controllers: Vec<Controller<A>> = Vec::new();
    let mut planned = Vec::with_capacity(queues as usize);
    let mut first: Option<(NamespaceInfo, ControllerInfo)> = None;
    while (planned.len() as u32) < queues {
        let want = (queues - planned.len() as u32).min(u16::MAX as u32) as u16;
        let mut ctrl = connect(want)?;
        let info = ctrl.info;
        if first.is_none() {
            let namespace = ctrl.namespace(nsid)?;
            if queue_entries(qd) > info.max_queue_entries {
                return Err(SetupError::QueueTooDeep {
                    qd,
                    max: info.max_queue_entries,
                }
                .into());
            }
            if let Some(mdts) = info.max_transfer {
                if bs as u64 > mdts {
                    return Err(SetupError::TooLarge { bs, mdts }.into());
                }
            }
            first = Some((namespace, info));
        }
        if info.io_queues == 0 {
            return Err(SetupError::NoQueues.into());
        }
        let take = (queues - planned.len() as u32).min(info.io_queues.into()) as u16;
        planned.extend((1..=take).map(|qid| (info, qid)));
        controllers.push(ctrl);
    }
    let (namespace, info) = first.ok_or(SetupError::NoQueues)?;
    Ok(Plan {
        controllers,
        queues: planned,
        namespace,
        info,
    })
}

/// NVMe/TCP controllers with their I/O queue connections open.
pub struct Fabric {
    pub controllers: Vec<Controller>,
    pub queues: Vec<IoQueueConn>,
    pub namespace: NamespaceInfo,
    /// In-capsule write limit and MDTS of the (identical) controllers.
    pub info: ControllerInfo,
}

pub fn connect_fabric(
    host: &HostParams,
    nsid: u32,
    queues: u32,
    qd: u32,
    bs: u32,
) -> Result<Fabric, SetupError> {
    let plan = plan_controllers(nsid, queues, qd, bs, &mut |want| {
        Controller::connect(host, want)
    })?;
    let conns = plan
        .queues
        .iter()
        .map(|(info, qid)| {
            open_io_queue(host, info, *qid, queue_entries(qd), bs.max(MIN_MAXH2CDATA))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Fabric {
        controllers: plan.controllers,
        queues: conns,
        namespace: plan.namespace,
        info: plan.info,
    })
}
