//! Per-queue command dispatch: Contract 1 of ARCHITECTURE.md. A transport owns one `Queue` per
//! NVMe-oF queue (connection / QP) and drives it through `prepare` → `execute` → (`finish`),
//! plus `poll` for asynchronous completions and teardown.
//!
//! The handlers live beside their concern: `fabrics.rs` (Connect, Property Get/Set,
//! Disconnect), `admin.rs`, `discovery.rs`, `io.rs`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::IoSubmit;
pub use crate::controller::TerminateReason;
use crate::controller::{Controller, IoCounters, MAX_AERS};
use crate::metrics::{Class, QueueMetrics, Transport};
use crate::namespace::NamespaceTable;
use crate::target::{Limits, Target};
use crate::wire::fabrics::{fctype, ConnectCommand, ConnectData};
use crate::wire::log::ErrorLogEntry;
use crate::wire::{Cqe, Sqe, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Tcp,
    Rdma,
}

/// Who is on the other end of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub transport: TransportKind,
    pub port_id: u16,
    /// Our address of this connection (what the host connected to).
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// Which way a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    None,
    HostToController,
    ControllerToHost,
}

/// A completion for the transport: send `data_len` bytes of the command's data buffer to the
/// host (controller-to-host commands), then the CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub cqe: Cqe,
    pub data_len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done now.
    Complete(Response),
    /// One `BlockOp` went to `IoSubmit`; `finish` completes the command.
    Submitted,
    /// Held (Asynchronous Event Request); completed later by `poll`.
    Held,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct PollResult {
    pub completions: Vec<Response>,
    /// Set when the queue must be closed (keep-alive expiry, controller deleted or reset).
    pub terminate: Option<TerminateReason>,
}

/// What a handler decided; `Queue::respond` turns it into a CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
    /// Bytes of data to return (controller-to-host), only on success.
    pub data_len: u32,
    /// Error log: parameter error location (byte offset in the SQE) and LBA.
    pub pel: u16,
    pub lba: u64,
}

impl Completion {
    pub fn ok() -> Self {
        Self {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            data_len: 0,
            pel: 0xffff,
            lba: 0,
        }
    }
    pub fn data(len: usize) -> Self {
        Self {
            data_len: len as u32,
            ..Self::ok()
        }
    }
    pub fn value(dw0: u32) -> Self {
        Self { dw0, ..Self::ok() }
    }
    pub fn err(status: Status) -> Self {
        Self {
            status,
            ..Self::ok()
        }
    }
    /// Status with Do Not Retry: the command will fail the same way again.
    pub fn fail(status: Status) -> Self {
        Self::err(status.with_dnr())
    }
    pub fn at(self, pel: u16) -> Self {
        Self { pel, ..self }
    }
    pub fn with_lba(self, lba: u64) -> Self {
        Self { lba, ..self }
    }
    pub fn with_dw0(self, dw0: u32) -> Self {
        Self { dw0, ..self }
    }
}

impl From<Status> for Completion {
    fn from(s: Status) -> Self {
        Self::err(s)
    }
}

pub(crate) enum Exec {
    Done(Completion),
    Submitted,
    Held,
}

impl From<Completion> for Exec {
    fn from(c: Completion) -> Self {
        Exec::Done(c)
    }
}

/// What Connect made of this queue.
#[derive(Debug)]
pub(crate) enum Role {
    Unconnected,
    Admin(Arc<Controller>),
    Io {
        ctrl: Arc<Controller>,
        qid: u16,
        /// `Controller::enable_epoch` at Connect; a reset since then deletes this queue.
        epoch: u32,
    },
}

/// I/O queue state kept off the shared controller so the hot path takes no lock.
#[derive(Debug)]
pub(crate) struct IoState {
    pub table: Arc<NamespaceTable>,
    /// ANA group states on this queue's port, from the table published with `table`.
    pub ana: crate::ana::PortAnaView,
    pub generation: u64,
    pub counters: Arc<IoCounters>,
    /// Compare reads the stored data here (allocated on first Compare, MDTS-sized).
    pub scratch: Option<crate::io::AlignedBuf>,
}

/// Opcodes (NVMe Base 2.0 Figure 139, NVM Command Set 1.0 Figure 18).
pub(crate) mod opcode {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;

    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// One NVMe-oF queue (admin or I/O) of one connection.
#[derive(Debug)]
pub struct Queue {
    pub(crate) target: Arc<Target>,
    pub(crate) peer: PeerInfo,
    pub(crate) limits: Limits,
    pub(crate) role: Role,
    /// Qid from the Connect being processed (for the CQE of a failed Connect).
    connect_qid: u16,
    sqhd: u16,
    pub(crate) sq_entries: u16,
    pub(crate) flow_control_disabled: bool,
    /// CIDs of outstanding Asynchronous Event Requests, oldest first.
    pub(crate) held_aers: VecDeque<u16>,
    /// Completions produced outside `execute` (e.g. an AER completed by Abort).
    pub(crate) deferred: Vec<Response>,
    pub(crate) disconnect_requested: bool,
    pub(crate) io: Option<IoState>,
    /// Command counters, when the target counts (`Target::metrics`).
    metrics: Option<QueueMetrics>,
}

impl Queue {
    pub fn new(target: Arc<Target>, peer: PeerInfo) -> Queue {
        let limits = *target.limits();
        let metrics = target
            .metrics()
            .map(|r| QueueMetrics::new(r, peer.port_id, transport_of(peer.transport)));
        Queue {
            target,
            peer,
            limits,
            role: Role::Unconnected,
            connect_qid: 0,
            sqhd: 0,
            sq_entries: 0,
            flow_control_disabled: false,
            held_aers: VecDeque::new(),
            deferred: Vec::new(),
            disconnect_requested: false,
            io: None,
            metrics,
        }
    }

    pub fn qid(&self) -> Option<u16> {
        match &self.role {
            Role::Unconnected => None,
            Role::Admin(_) => Some(0),
            Role::Io { qid, .. } => Some(*qid),
        }
    }

    pub fn sq_entries(&self) -> u16 {
        self.sq_entries
    }

    pub fn flow_control_disabled(&self) -> bool {
        self.flow_control_disabled
    }

    /// The controller this queue belongs to, once connected.
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        match &self.role {
            Role::Unconnected => None,
            Role::Admin(c) | Role::Io { ctrl: c, .. } => Some(c),
        }
    }

    /// Phase 1 (see ARCHITECTURE.md): admission and data direction.
    pub fn prepare(&mut self, sqe: &Sqe, data_len: u32) -> Result<Direction, Status> {
        // NVMe-oF 1.1 §2.2: fused operations are not supported; PSDT must say "SGL, metadata
        // in one contiguous buffer" (01b).
        if sqe.fuse() != 0 || sqe.psdt() != 1 {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        // MDTS bounds every transfer (NVMe Base 2.0 §5.17.2.1).
        if data_len > self.limits.max_data_transfer {
            return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
        }
        let (dir, max_len) = match &self.role {
            Role::Unconnected => {
                if !(sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT) {
                    return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                }
                (Direction::HostToController, ConnectData::SIZE as u32)
            }
            Role::Admin(ctrl) => {
                if sqe.is_fabrics() {
                    self.fabrics_admission(sqe, true)?
                } else {
                    // NVMe Base 2.0 §3.5: admin commands need CSTS.RDY (only Fabrics
                    // commands are allowed before the controller is enabled).
                    if !ctrl.is_ready() {
                        return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                    }
                    admin_direction(sqe.opcode, ctrl.is_discovery())
                        .ok_or(Status::INVALID_OPCODE.with_dnr())?
                }
            }
            Role::Io { .. } => {
                if sqe.is_fabrics() {
                    self.fabrics_admission(sqe, false)?
                } else {
                    self.io_admission(sqe, data_len)?
                }
            }
        };
        // Command-specific maximum (0 for commands without data).
        if data_len > max_len {
            return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
        }
        Ok(dir)
    }

    /// Fabrics commands on a connected queue: Property Get/Set on the admin queue only,
    /// Disconnect on any; a second Connect is a sequence error.
    fn fabrics_admission(&self, sqe: &Sqe, admin: bool) -> Result<(Direction, u32), Status> {
        match sqe.fctype() {
            fctype::CONNECT => Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
            fctype::PROPERTY_GET | fctype::PROPERTY_SET if admin => Ok((Direction::None, 0)),
            fctype::DISCONNECT => Ok((Direction::None, 0)),
            _ => Err(Status::INVALID_OPCODE.with_dnr()),
        }
    }

    /// Phase 2 (see ARCHITECTURE.md).
    pub fn execute(
        &mut self,
        sqe: &Sqe,
        data: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Outcome {
        if let Some(ctrl) = self.controller() {
            ctrl.note_activity();
        }
        let unconnected = matches!(self.role, Role::Unconnected);
        let t0 = self.metrics.as_mut().and_then(QueueMetrics::admit);
        let exec = match &self.role {
            Role::Unconnected => {
                if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                    self.connect_qid = ConnectCommand::from_sqe(sqe).qid;
                    self.connect(sqe, data).into()
                } else {
                    Completion::fail(Status::COMMAND_SEQUENCE_ERROR).into()
                }
            }
            Role::Admin(_) if sqe.is_fabrics() => self.fabrics(sqe, true).into(),
            Role::Io { .. } if sqe.is_fabrics() => self.fabrics(sqe, false).into(),
            Role::Admin(ctrl) => {
                let ctrl = Arc::clone(ctrl);
                if ctrl.is_discovery() {
                    self.discovery_admin(&ctrl, sqe, data)
                } else {
                    self.admin(&ctrl, sqe, data)
                }
            }
            Role::Io { .. } => self.io_execute(sqe, data, tag, io),
        };
        if unconnected {
            self.note_connected();
        }
        match exec {
            Exec::Done(c) => {
                let sent = self.host_sent(sqe, data.len());
                Outcome::Complete(self.respond_at(sqe, c, t0, sent))
            }
            Exec::Submitted => {
                let sent = self.host_sent(sqe, data.len());
                let admin = !matches!(self.role, Role::Io { .. });
                if let Some(m) = &mut self.metrics {
                    // Counted now: the completion comes from `finish`, without the data.
                    m.host_bytes(classify(sqe, admin), sqe.nsid, sent);
                    if let Some(t0) = t0 {
                        m.park(sqe.cid, t0);
                    }
                }
                Outcome::Submitted
            }
            Exec::Held => Outcome::Held,
        }
    }

    /// Completion of the `BlockOp` submitted for `sqe`.
    pub fn finish(&mut self, sqe: &Sqe, result: i32) -> Response {
        let t0 = self
            .metrics
            .as_mut()
            .and_then(|m| m.unpark(sqe.cid, result));
        let c = self.io_finish(sqe, result);
        self.respond_at(sqe, c, t0, 0)
    }

    /// Bytes of data the host sent with `sqe` (`data_len` when it carries data to the
    /// controller), for the metrics.
    #[inline]
    fn host_sent(&self, sqe: &Sqe, data_len: usize) -> u32 {
        if self.metrics.is_some() && host_to_controller(sqe) {
            data_len as u32
        } else {
            0
        }
    }

    /// Labels this queue's counters with its controller once Connect succeeded.
    fn note_connected(&mut self) {
        let (ctrl, admin) = match &self.role {
            Role::Unconnected => return,
            Role::Admin(c) => (c, true),
            Role::Io { ctrl, .. } => (ctrl, false),
        };
        if let Some(m) = &mut self.metrics {
            m.connected(&ctrl.subsys.nqn, ctrl.cntlid, &ctrl.hostnqn, admin);
        }
    }

    /// Completes a command the transport refused (SGL errors) with `status`.
    pub fn reject(&mut self, sqe: &Sqe, status: Status) -> Response {
        if let Some(ctrl) = self.controller() {
            ctrl.note_activity();
        }
        let t0 = self.metrics.as_mut().and_then(QueueMetrics::admit);
        self.respond_at(sqe, Completion::err(status), t0, 0)
    }

    /// Held AER completions, keep-alive and teardown (see ARCHITECTURE.md).
    pub fn poll(&mut self, now: Instant) -> PollResult {
        let deferred = self.deferred.len();
        let result = self.poll_inner(now);
        if let Some(m) = &mut self.metrics {
            if result.terminate == Some(TerminateReason::KeepAliveTimeout)
                && matches!(self.role, Role::Admin(_))
            {
                m.keep_alive_expired();
            }
            for _ in deferred..result.completions.len() {
                // Held AERs completed now (the deferred ones were counted by `respond`).
                m.complete(Class::Admin, 0, 0, None);
            }
            m.maybe_publish(now);
        }
        result
    }

    fn poll_inner(&mut self, now: Instant) -> PollResult {
        let mut completions = std::mem::take(&mut self.deferred);
        let ctrl = match &self.role {
            Role::Unconnected => {
                return PollResult {
                    completions,
                    terminate: None,
                }
            }
            Role::Admin(c) | Role::Io { ctrl: c, .. } => Arc::clone(c),
        };
        let mut terminate = ctrl.check_keep_alive(now);
        if let Role::Io { epoch, .. } = &self.role {
            if terminate.is_none() && *epoch != ctrl.enable_epoch() {
                terminate = Some(TerminateReason::ControllerReset);
            }
        }
        if self.disconnect_requested && terminate.is_none() {
            terminate = Some(TerminateReason::HostDisconnect);
        }
        if terminate.is_none() && matches!(self.role, Role::Admin(_)) {
            while !self.held_aers.is_empty() {
                let Some(event) = ctrl.take_event() else {
                    break;
                };
                let cid = self.held_aers.pop_front().unwrap_or_default();
                completions.push(self.respond_cid(cid, Completion::value(event.dw0())));
            }
        }
        PollResult {
            completions,
            terminate,
        }
    }

    /// Builds the CQE: cid, sqid, SQ head (NVMe-oF 1.1 §3.3.2.1: 0xFFFF when the host disabled
    /// SQ flow control), and records failures in the controller's error log.
    pub(crate) fn respond(&mut self, sqe: &Sqe, c: Completion) -> Response {
        self.respond_at(sqe, c, None, 0)
    }

    /// [`Queue::respond`] for a command admitted at `t0` when timed (the metrics' completion
    /// hook).
    /// `sent`: data bytes the host sent with the command (counted with its completion).
    fn respond_at(&mut self, sqe: &Sqe, c: Completion, t0: Option<Instant>, sent: u32) -> Response {
        if let Some(m) = &mut self.metrics {
            let class = classify(sqe, !matches!(self.role, Role::Io { .. }));
            if c.status.is_success() {
                m.complete(class, sqe.nsid, c.data_len + sent, t0);
            } else {
                let connect = matches!(self.role, Role::Unconnected)
                    && sqe.is_fabrics()
                    && sqe.fctype() == fctype::CONNECT;
                m.complete_failed(class, sqe.nsid, c.status, t0, connect, sent);
            }
        }
        if !c.status.is_success() {
            if let Some(ctrl) = self.controller() {
                ctrl.record_error(ErrorLogEntry {
                    error_count: 0,
                    sqid: self.qid().unwrap_or(0),
                    cid: sqe.cid,
                    status: c.status,
                    param_error_location: c.pel,
                    lba: c.lba,
                    nsid: if sqe.is_fabrics() { 0 } else { sqe.nsid },
                    trtype: match self.peer.transport {
                        TransportKind::Tcp => crate::wire::log::disc::TRTYPE_TCP,
                        TransportKind::Rdma => crate::wire::log::disc::TRTYPE_RDMA,
                    },
                    command_specific: 0,
                });
            }
        }
        self.respond_cid(sqe.cid, c)
    }

    fn respond_cid(&mut self, cid: u16, c: Completion) -> Response {
        // nvmet's rule: the head advances by one per completion (each completed command has
        // been consumed from the SQ).
        if self.sq_entries > 0 {
            self.sqhd = (self.sqhd + 1) % self.sq_entries;
        }
        let sqhd = if self.flow_control_disabled {
            crate::wire::cqe::SQHD_FLOW_CONTROL_DISABLED
        } else {
            self.sqhd
        };
        Response {
            cqe: Cqe {
                dw0: c.dw0,
                dw1: c.dw1,
                sqhd,
                sqid: self.qid().unwrap_or(self.connect_qid),
                cid,
                status: c.status,
            },
            data_len: if c.status.is_success() { c.data_len } else { 0 },
        }
    }

    /// The connection of this queue is gone.
    fn release(&mut self) {
        match std::mem::replace(&mut self.role, Role::Unconnected) {
            Role::Unconnected => {}
            Role::Admin(ctrl) => {
                // NVMe-oF 1.1 §3.4: the controller's association ends with its admin queue.
                ctrl.terminate(TerminateReason::AdminQueueGone);
                ctrl.subsys.remove_controller(ctrl.cntlid);
            }
            Role::Io { ctrl, qid, .. } => ctrl.unregister_io_queue(qid),
        }
    }

    /// Number of AERs the host may have outstanding (Identify AERL + 1).
    pub(crate) fn aer_limit_reached(&self) -> bool {
        self.held_aers.len() >= MAX_AERS
    }
}

// Reactors hand accepted connections (and their queues) between threads.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Queue>();
};

impl Drop for Queue {
    fn drop(&mut self) {
        self.release();
    }
}

/// Admin opcodes this controller accepts and their data direction (opcode bits 1:0,
/// NVMe Base 2.0 Figure 139). Discovery controllers accept the subset of NVMe Base 2.0
/// Figure 284 (no Abort).
fn admin_direction(op: u8, discovery: bool) -> Option<(Direction, u32)> {
    const PAGE: u32 = crate::wire::identify::IDENTIFY_DATA_SIZE as u32;
    Some(match op {
        opcode::GET_LOG_PAGE => (Direction::ControllerToHost, u32::MAX),
        opcode::IDENTIFY => (Direction::ControllerToHost, PAGE),
        opcode::ABORT if !discovery => (Direction::None, 0),
        opcode::SET_FEATURES => (Direction::HostToController, PAGE),
        opcode::GET_FEATURES => (Direction::ControllerToHost, PAGE),
        opcode::ASYNC_EVENT_REQUEST | opcode::KEEP_ALIVE => (Direction::None, 0),
        _ => return None,
    })
}

/// Whether `sqe` carries data from the host (opcode / FCTYPE bits 1:0 = 01b, NVMe Base 2.0
/// Figure 139, NVMe-oF 1.1 Figure 18).
#[inline]
fn host_to_controller(sqe: &Sqe) -> bool {
    // The Fabrics opcode (7Fh) has bits 1:0 = 11b: only then is FCTYPE looked at.
    match sqe.opcode & 3 {
        1 => true,
        3 if sqe.is_fabrics() => sqe.fctype() & 3 == 1,
        _ => false,
    }
}

/// The class of `sqe` on an admin (`admin`) or I/O queue.
#[inline]
fn classify(sqe: &Sqe, admin: bool) -> Class {
    if admin || sqe.is_fabrics() {
        return Class::Admin;
    }
    match sqe.opcode {
        opcode::READ => Class::Read,
        opcode::WRITE => Class::Write,
        opcode::FLUSH => Class::Flush,
        _ => Class::Other,
    }
}

fn transport_of(t: TransportKind) -> Transport {
    match t {
        TransportKind::Tcp => Transport::Tcp,
        TransportKind::Rdma => Transport::Rdma,
    }
}
