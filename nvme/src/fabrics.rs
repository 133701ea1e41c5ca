//! Fabrics commands (NVMe-oF 1.1 §3.3): Connect, Property Get / Property Set, Disconnect;
//! Authentication Send / Receive are in `fabrics_auth`.

use std::sync::Arc;

use crate::auth::QueueAuth;
use crate::command::{Completion, DataLimit, Direction, TerminateReason};
use crate::controller::{Controller, ControllerParams, IoQueueRefusal, ADMIN_QUEUE_ENTRIES};
use crate::fabrics_auth;
use crate::limits::Limits;
use crate::nvm::{IoQueue, IoState};
use crate::peer::PeerInfo;
use crate::spec::{fctype, reg, CNTLID_DYNAMIC, NVME_VERSION};
use crate::subsystem::{AllocError, Subsystem};
use crate::target::Target;
use crate::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use crate::wire::{DecodeError, Sqe, Status};

/// IPO/IATTR for a Connect "Invalid Parameters" response (NVMe-oF 1.1 Figure 21): IATTR bit 0
/// (DW0 bit 16) says whether the offset is into the Connect data (1) or the SQE (0).
fn invalid_in_data(offset: u16) -> Completion {
    Completion::fail(Status::CONNECT_INVALID_PARAMETERS).with_dw0(1 << 16 | offset as u32)
}
fn invalid_in_sqe(offset: u16) -> Completion {
    Completion::fail(Status::CONNECT_INVALID_PARAMETERS)
        .with_dw0(offset as u32)
        .at(offset)
}

/// What a successful Connect made of a queue.
// The I/O variant is what every command touches: kept inline rather than boxed (a pointer
// chase per command), however small the admin variant is.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Association {
    Admin {
        ctrl: Arc<Controller>,
        subsys: Arc<Subsystem>,
    },
    Io(IoQueue),
}

impl Association {
    pub fn controller(&self) -> &Arc<Controller> {
        match self {
            Association::Admin { ctrl, .. } | Association::Io(IoQueue { ctrl, .. }) => ctrl,
        }
    }

    pub fn subsystem(&self) -> &Arc<Subsystem> {
        match self {
            Association::Admin { subsys, .. } | Association::Io(IoQueue { subsys, .. }) => subsys,
        }
    }

    pub fn qid(&self) -> u16 {
        match self {
            Association::Admin { .. } => 0,
            Association::Io(q) => q.qid,
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Association::Admin { .. })
    }

    /// The connection of the queue is gone.
    pub fn release(self) {
        match self {
            Association::Admin { ctrl, subsys } => {
                // NVMe-oF 1.1 §3.4: the controller's association ends with its admin queue.
                ctrl.terminate(TerminateReason::AdminQueueGone);
                subsys.remove_controller(ctrl.cntlid);
            }
            Association::Io(q) => q.ctrl.unregister_io_queue(q.qid),
        }
    }
}

/// A successful Connect: the association and the queue parameters the host asked for.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub association: Association,
    /// SQSIZE + 1.
    pub sq_entries: u16,
    /// CATTR bit 2 (NVMe-oF 1.1 §3.3.1).
    pub flow_control_disabled: bool,
    /// The queue's in-band authentication, when its host has a key (`fabrics_auth`).
    pub auth: Option<QueueAuth>,
}

impl Accepted {
    fn new(association: Association, cmd: &ConnectCommand, auth: Option<QueueAuth>) -> Self {
        Self {
            association,
            sq_entries: cmd.sqsize + 1,
            flow_control_disabled: cmd.flow_control_disabled(),
            auth,
        }
    }
}

/// The TLS PSK identity a connection was secured with (NVMe/TCP 1.1 §3.6.1.3: the identity
/// names the host and the subsystem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsIdentity {
    pub hostnqn: String,
    pub subnqn: String,
}

/// What Connect needs to know about the queue it arrives on.
pub(crate) struct ConnectContext<'a> {
    pub target: &'a Target,
    pub peer: &'a PeerInfo,
    pub limits: &'a Limits,
    /// Set on a TLS connection: its Connect must name the same host and subsystem (the PSK
    /// is what authenticated the host).
    pub tls_identity: Option<&'a TlsIdentity>,
}

/// One entry of the Fabrics command table (`COMMANDS`): what the FCTYPE decides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FabricsCommand {
    pub fctype: u8,
    pub dir: Direction,
    pub limit: DataLimit,
    /// The queues it is allowed on.
    on: Allowed,
    pub run: FabricsRun,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    /// A queue that no Connect has made anything of yet.
    Unconnected,
    /// A connected admin queue.
    AdminQueue,
    /// Any connected queue.
    Connected,
}

/// The handler of a Fabrics command; each needs a different part of its queue, which the
/// queue hands over (`Queue::execute`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum FabricsRun {
    /// [`connect`]: makes the queue what `Accepted` says.
    Connect,
    /// Authentication Send / Receive (`fabrics_auth`).
    Authentication,
    /// Property Get / Set on the queue's controller.
    Property(fn(&Controller, &Sqe) -> Completion),
    /// NVMe-oF 1.1 §3.3.4: the queue (and for the admin queue, the controller) is deleted
    /// once this completes.
    Disconnect,
}

/// The Fabrics commands (NVMe-oF 1.1 §3.3 and §6), by FCTYPE.
static COMMANDS: [FabricsCommand; 6] = [
    FabricsCommand {
        fctype: fctype::CONNECT,
        dir: Direction::HostToController,
        limit: DataLimit::Bytes(ConnectData::SIZE as u32),
        on: Allowed::Unconnected,
        run: FabricsRun::Connect,
    },
    FabricsCommand {
        fctype: fctype::PROPERTY_GET,
        dir: Direction::None,
        limit: DataLimit::Bytes(0),
        on: Allowed::AdminQueue,
        run: FabricsRun::Property(property_get),
    },
    FabricsCommand {
        fctype: fctype::PROPERTY_SET,
        dir: Direction::None,
        limit: DataLimit::Bytes(0),
        on: Allowed::AdminQueue,
        run: FabricsRun::Property(property_set),
    },
    FabricsCommand {
        fctype: fctype::DISCONNECT,
        dir: Direction::None,
        limit: DataLimit::Bytes(0),
        on: Allowed::Connected,
        run: FabricsRun::Disconnect,
    },
    FabricsCommand {
        fctype: fctype::AUTHENTICATION_SEND,
        dir: Direction::HostToController,
        limit: DataLimit::Bytes(nvmfd_auth::controller::MAX_SEND_LEN),
        on: Allowed::Connected,
        run: FabricsRun::Authentication,
    },
    FabricsCommand {
        fctype: fctype::AUTHENTICATION_RECEIVE,
        dir: Direction::ControllerToHost,
        // AL bounds nothing we allocate; MDTS bounds the buffer.
        limit: DataLimit::Bytes(u32::MAX),
        on: Allowed::Connected,
        run: FabricsRun::Authentication,
    },
];

/// The Fabrics command `fctype` on a queue connected as an admin (`Some(true)`) or an I/O
/// queue (`Some(false)`), or not connected (`None`: Connect only). A Connect on a connected
/// queue, or anything else before Connect, is a sequence error; Property Get/Set on an I/O
/// queue and unknown types are invalid opcodes.
pub(crate) fn command(fctype: u8, admin: Option<bool>) -> Result<&'static FabricsCommand, Status> {
    let Some(c) = COMMANDS.iter().find(|c| c.fctype == fctype) else {
        let status = match admin {
            None => Status::COMMAND_SEQUENCE_ERROR,
            Some(_) => Status::INVALID_OPCODE,
        };
        return Err(status.with_dnr());
    };
    let status = match (c.on, admin) {
        (Allowed::Unconnected, None)
        | (Allowed::Connected, Some(_))
        | (Allowed::AdminQueue, Some(true)) => return Ok(c),
        (_, None) | (Allowed::Unconnected, Some(_)) => Status::COMMAND_SEQUENCE_ERROR,
        (Allowed::AdminQueue, Some(false)) => Status::INVALID_OPCODE,
    };
    Err(status.with_dnr())
}

/// Connect (NVMe-oF 1.1 §3.3.1): creates a controller (admin queue, dynamic cntlid) or
/// attaches an I/O queue to an existing one. The queue becomes what `Accepted` says.
pub(crate) fn connect(
    cx: &ConnectContext,
    sqe: &Sqe,
    data: &[u8],
) -> (Completion, Option<Accepted>) {
    let cmd = ConnectCommand::from_sqe(sqe);
    let remote = cx.peer.remote;
    if cmd.recfmt != 0 {
        tracing::warn!(%remote, recfmt = cmd.recfmt, "Connect rejected: unsupported record format");
        return (
            Completion::fail(Status::CONNECT_INCOMPATIBLE_FORMAT)
                .with_dw0(ConnectCommand::OFFSET_RECFMT as u32),
            None,
        );
    }
    let d = match ConnectData::decode(data) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(%remote, error = %e, "Connect rejected: malformed Connect data");
            let offset = match e {
                DecodeError::InvalidValue {
                    field: "subnqn", ..
                } => ConnectData::OFFSET_SUBNQN,
                DecodeError::InvalidValue {
                    field: "hostnqn", ..
                } => ConnectData::OFFSET_HOSTNQN,
                _ => return (Completion::fail(Status::DATA_SGL_LENGTH_INVALID), None),
            };
            return (invalid_in_data(offset), None);
        }
    };
    let reject = |why: &str| {
        tracing::warn!(
            %remote,
            port = cx.peer.port_id,
            hostnqn = %d.hostnqn,
            subnqn = %d.subnqn,
            qid = cmd.qid,
            "Connect rejected: {why}"
        );
    };
    let Some(subsys) = cx.target.subsystem(&d.subnqn) else {
        reject("unknown subsystem");
        return (invalid_in_data(ConnectData::OFFSET_SUBNQN), None);
    };
    if subsys.is_removed() || !subsys.is_discovery() && !subsys.exported_on(cx.peer.port_id) {
        reject("subsystem not exported on this port");
        return (invalid_in_data(ConnectData::OFFSET_SUBNQN), None);
    }
    if let Some(id) = cx.tls_identity {
        if id.hostnqn != d.hostnqn {
            reject("host NQN differs from the TLS PSK identity's");
            return (
                Completion::fail(Status::CONNECT_INVALID_HOST)
                    .with_dw0(1 << 16 | ConnectData::OFFSET_HOSTNQN as u32),
                None,
            );
        }
        if id.subnqn != d.subnqn {
            reject("subsystem NQN differs from the TLS PSK identity's");
            return (invalid_in_data(ConnectData::OFFSET_SUBNQN), None);
        }
    }
    if !subsys.host_allowed(&d.hostnqn) {
        reject("host not allowed");
        return (
            Completion::fail(Status::CONNECT_INVALID_HOST)
                .with_dw0(1 << 16 | ConnectData::OFFSET_HOSTNQN as u32),
            None,
        );
    }
    // SQSIZE is 0's based and a queue needs at least two entries (NVMe-oF 1.1 §3.3.1).
    let entries = cmd.sqsize as u32 + 1;
    if cmd.qid == 0 {
        if cmd.sqsize == 0 || entries > ADMIN_QUEUE_ENTRIES as u32 {
            reject("admin queue size out of range");
            return (invalid_in_sqe(ConnectCommand::OFFSET_SQSIZE), None);
        }
        if d.cntlid != CNTLID_DYNAMIC {
            reject("admin Connect must ask for a dynamic controller (cntlid 0xffff)");
            return (invalid_in_data(ConnectData::OFFSET_CNTLID), None);
        }
        // Discovery controllers with KATO 0 still time out eventually (stale sessions).
        let kato_ms = if cmd.kato == 0 && subsys.is_discovery() {
            cx.limits.kato_default_ms
        } else {
            cmd.kato
        };
        let params = ControllerParams {
            subnqn: subsys.nqn.clone(),
            discovery: subsys.is_discovery(),
            hostnqn: d.hostnqn.clone(),
            hostid: d.hostid,
            peer: *cx.peer,
            limits: *cx.limits,
            kato_ms,
            volatile_cache: subsys
                .namespaces()
                .iter()
                .any(|ns| ns.backend.capabilities().volatile_cache),
        };
        let ctrl = match subsys.add_controller(|id| Controller::new(id, params)) {
            Ok(c) => c,
            Err(AllocError::Exhausted) => {
                reject("no controller ID left");
                return (Completion::fail(Status::CONNECT_CONTROLLER_BUSY), None);
            }
            Err(AllocError::Removed) => {
                reject("subsystem is being removed");
                return (invalid_in_data(ConnectData::OFFSET_SUBNQN), None);
            }
        };
        tracing::info!(
            %remote,
            port = cx.peer.port_id,
            hostnqn = %d.hostnqn,
            subnqn = %d.subnqn,
            cntlid = ctrl.cntlid,
            kato_ms,
            "controller created"
        );
        let cntlid = ctrl.cntlid;
        let (auth, authreq) = fabrics_auth::attach(&subsys, &d.hostnqn);
        let accepted = Accepted::new(Association::Admin { ctrl, subsys }, &cmd, auth);
        return (Completion::value(cntlid as u32 | authreq), Some(accepted));
    }
    if subsys.is_discovery() {
        reject("discovery controllers have no I/O queues");
        return (invalid_in_sqe(ConnectCommand::OFFSET_QID), None);
    }
    let ctrl = match subsys.controller(d.cntlid) {
        Some(c) if c.hostnqn == d.hostnqn && c.terminated().is_none() => c,
        _ => {
            reject("no such live controller for this host");
            return (invalid_in_data(ConnectData::OFFSET_CNTLID), None);
        }
    };
    if !ctrl.is_ready() {
        reject("controller not enabled");
        return (Completion::fail(Status::COMMAND_SEQUENCE_ERROR), None);
    }
    if cmd.sqsize == 0 || entries > cx.limits.max_queue_size as u32 {
        reject("I/O queue size out of range");
        return (invalid_in_sqe(ConnectCommand::OFFSET_SQSIZE), None);
    }
    match ctrl.register_io_queue(cmd.qid, cx.peer.reactor) {
        Ok(()) => {}
        Err(IoQueueRefusal::QidOutOfRange { granted }) => {
            reject(&format!("qid beyond the {granted} granted I/O queues"));
            return (invalid_in_sqe(ConnectCommand::OFFSET_QID), None);
        }
        Err(IoQueueRefusal::AlreadyConnected) => {
            reject("qid already connected");
            return (
                Completion::fail(Status::COMMAND_SEQUENCE_ERROR).at(ConnectCommand::OFFSET_QID),
                None,
            );
        }
    }
    let counters = cx.target.health().subsystem(&subsys.nqn);
    let (table, ana, generation) = subsys.published_for(&ctrl.hostnqn);
    let state = IoState {
        table,
        ana: ana.port_view(ctrl.peer.port_id),
        generation,
        counters,
        fusing: Default::default(),
        compares: Vec::new(),
        jobs: Default::default(),
        reservation_changes: Vec::new(),
        fresh_reports: Vec::new(),
        durable_zeroes: Vec::new(),
        preempt_drains: Vec::new(),
        // Read after the generation, as `nvm::refresh` does.
        qos: crate::nvm::qos_state(subsys.qos_for(&ctrl.hostnqn)),
    };
    let cntlid = ctrl.cntlid;
    let (auth, authreq) = fabrics_auth::attach(&subsys, &d.hostnqn);
    tracing::debug!(%remote, cntlid, qid = cmd.qid, entries, "I/O queue connected");
    let association = Association::Io(IoQueue {
        epoch: ctrl.enable_epoch(),
        ctrl,
        subsys,
        qid: cmd.qid,
        state,
    });
    (
        Completion::value(cntlid as u32 | authreq),
        Some(Accepted::new(association, &cmd, auth)),
    )
}

/// Property Get (NVMe-oF 1.1 §3.3.2): CAP (8 bytes, or 4-byte halves), VS, CC, CSTS.
fn property_get(ctrl: &Controller, sqe: &Sqe) -> Completion {
    let Ok(p) = PropertyCommand::from_sqe(sqe) else {
        return Completion::fail(Status::INVALID_FIELD).at(40);
    };
    let value: u64 = match (p.offset, p.size) {
        (reg::CAP, PropertySize::Eight) => ctrl.cap(),
        (reg::CAP, PropertySize::Four) => ctrl.cap() & 0xffff_ffff,
        // Hosts that only do 4-byte accesses read CAP as two halves.
        (reg::CAP_HIGH, PropertySize::Four) => ctrl.cap() >> 32,
        (reg::VS, PropertySize::Four) => NVME_VERSION as u64,
        (reg::CC, PropertySize::Four) => ctrl.lock().cc as u64,
        (reg::CSTS, PropertySize::Four) => ctrl.csts() as u64,
        _ => return Completion::fail(Status::INVALID_FIELD).at(44),
    };
    Completion {
        dw1: (value >> 32) as u32,
        ..Completion::value(value as u32)
    }
}

/// Property Set: only CC is writable; CAP, VS and CSTS are read-only, NSSR (subsystem
/// reset) is not supported.
fn property_set(ctrl: &Controller, sqe: &Sqe) -> Completion {
    let Ok(p) = PropertyCommand::from_sqe(sqe) else {
        return Completion::fail(Status::INVALID_FIELD).at(40);
    };
    match (p.offset, p.size) {
        (reg::CC, PropertySize::Four) => {
            ctrl.write_cc(p.value as u32);
            Completion::ok()
        }
        _ => Completion::fail(Status::INVALID_FIELD).at(44),
    }
}
