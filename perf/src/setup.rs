//! The host handshake, done blocking before the measurement starts: admin queue (ICReq,
//! Connect with cntlid 0xFFFF, CC.EN = 1 until CSTS.RDY, Identify, Set Features Number of
//! Queues) through the project's client, then one TCP connection per I/O queue (ICReq and
//! I/O Connect) handed to the non-blocking I/O loop.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use nvme::spec::{cns, fid, reg};
use nvme::wire::fabrics::{ConnectCommand, ConnectData};
use nvme::wire::identify::{IdentifyController, IdentifyNamespace};
use nvme::wire::{DecodeError, SglDescriptor, Status};
use transport::client::{Client, ClientError, ClientOptions, HostStream, TlsParams};
use transport::tcp::pdu::{
    encode_pdu, CommonHeader, Digests, IcReq, IcResp, PduError, PduHeader, RecvLimits, Role,
    COMMON_HEADER_LEN, IC_PDU_LEN, MIN_MAXH2CDATA,
};
use transport::tcp::recv::{Discard, Event, Receiver};

use crate::socket::Socket;

/// Admin queue entries asked for (Linux uses 32, NVME_AQ_DEPTH).
const ADMIN_QUEUE_ENTRIES: u16 = 32;
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

/// One controller: the admin queue stays open (and is kept alive) for the whole run.
pub struct Controller {
    pub admin: Client,
    pub info: ControllerInfo,
}

impl Controller {
    /// Admin-queue bring-up, asking for `want_queues` I/O queues.
    pub fn connect(host: &HostParams, want_queues: u16) -> Result<Self, SetupError> {
        let opts = ClientOptions {
            header_digest: host.digests.header,
            data_digest: host.digests.data,
            hpda: 0,
            timeout: host.timeout,
        };
        let mut admin = match &host.tls {
            None => Client::connect(host.addr, opts),
            Some(tls) => Client::connect_tls(host.addr, opts, tls),
        }
        .map_err(client_err("admin ICReq"))?;
        let cntlid = admin
            .fabrics_connect(
                0,
                ADMIN_QUEUE_ENTRIES - 1,
                nvme::spec::CNTLID_DYNAMIC,
                &host.subnqn,
                &host.hostnqn,
                host.hostid,
                host.kato_ms,
            )
            .map_err(client_err("admin Connect"))?;
        let cap = admin
            .property_get(reg::CAP, true)
            .map_err(client_err("Property Get CAP"))?;
        admin
            .enable_controller(host.timeout)
            .map_err(client_err("CC.EN=1 / CSTS.RDY"))?;
        let id = admin
            .identify(cns::CONTROLLER, 0)
            .map_err(client_err("Identify Controller"))?;
        let id = IdentifyController::decode(&id).map_err(|source| SetupError::Decode {
            step: "Identify Controller",
            source,
        })?;
        // NVMe Base 2.0 §5.27.1.7: both counts are 0's based; the controller may grant fewer.
        let n = want_queues.max(1) as u32 - 1;
        let cqe = admin
            .set_features(fid::NUMBER_OF_QUEUES, n | n << 16)
            .map_err(client_err("Set Features Number of Queues"))?;
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
        let raw = self
            .admin
            .identify(cns::NAMESPACE, nsid)
            .map_err(client_err("Identify Namespace"))?;
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
        self.admin.keep_alive().map_err(client_err("Keep Alive"))
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
    let mut sqe = ConnectCommand {
        recfmt: 0,
        qid,
        // SQSIZE is 0's based (NVMe-oF 1.1 §3.3.1); Linux uses queue_size − 1 the same way.
        sqsize: (entries - 1) as u16,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(0);
    let data = ConnectData {
        hostid: host.hostid,
        cntlid: ctrl.cntlid,
        subnqn: host.subnqn.clone(),
        hostnqn: host.hostnqn.clone(),
    }
    .encode();
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

/// Controllers and their I/O queues for `queues` connections: as many controllers as needed
/// when one grants fewer queues than asked (the target's max_io_queues).
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
    let mut controllers: Vec<Controller> = Vec::new();
    let mut conns = Vec::with_capacity(queues as usize);
    let mut namespace = None;
    let mut first_info = None;
    while (conns.len() as u32) < queues {
        let want = (queues - conns.len() as u32).min(u16::MAX as u32) as u16;
        let mut ctrl = Controller::connect(host, want)?;
        let info = ctrl.info;
        if namespace.is_none() {
            namespace = Some(ctrl.namespace(nsid)?);
            if queue_entries(qd) > info.max_queue_entries {
                return Err(SetupError::QueueTooDeep {
                    qd,
                    max: info.max_queue_entries,
                });
            }
            if let Some(mdts) = info.max_transfer {
                if bs as u64 > mdts {
                    return Err(SetupError::TooLarge { bs, mdts });
                }
            }
            first_info = Some(info);
        }
        if info.io_queues == 0 {
            return Err(SetupError::NoQueues);
        }
        for qid in 1..=info.io_queues {
            if conns.len() as u32 == queues {
                break;
            }
            conns.push(open_io_queue(
                host,
                &info,
                qid,
                queue_entries(qd),
                bs.max(MIN_MAXH2CDATA),
            )?);
        }
        controllers.push(ctrl);
    }
    Ok(Fabric {
        controllers,
        queues: conns,
        namespace: namespace.ok_or(SetupError::NoQueues)?,
        info: first_info.ok_or(SetupError::NoQueues)?,
    })
}
