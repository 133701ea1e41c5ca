//! Per-queue command dispatch: the dispatch contract of ARCHITECTURE.md. A transport owns one
//! `Queue` per NVMe-oF queue (connection / QP) and drives it through `prepare` → `execute` →
//! (`finish`), plus `poll` for asynchronous completions and teardown.
//!
//! `Queue` keeps its state private and only routes: by queue role (unconnected, admin of an
//! I/O or a discovery controller, I/O) and by opcode to the handlers, which are free functions
//! with a narrow context — `fabrics::connect` / `fabrics::execute`, `admin::execute`,
//! `discovery::execute`, `io::execute` / `io::finish`. Handlers return what changed
//! (`fabrics::Accepted`, a Disconnect flag, an aborted AER); `Queue` applies it.

use std::sync::Arc;
use std::time::Instant;

use crate::admin::{self, AdminContext, HeldAers};
use crate::auth::{self, QueueAuth};
use crate::backend::IoSubmit;
use crate::command::{Completion, Exec};
pub use crate::command::{Direction, Outcome, PollResult, Response, TerminateReason};
use crate::controller::Controller;
use crate::discovery;
use crate::fabrics::{self, Accepted, Association, ConnectContext};
use crate::fabrics_auth::{self, AuthContext};
use crate::io;
use crate::limits::Limits;
pub use crate::peer::{PeerInfo, TransportKind};
use crate::spec::{admin_opcode, fctype, SQHD_FLOW_CONTROL_DISABLED};
use crate::target::Target;
use crate::wire::fabrics::{ConnectCommand, ConnectData};
use crate::wire::log::ErrorLogEntry;
use crate::wire::{Cqe, Sqe, Status};

/// One NVMe-oF queue (admin or I/O) of one connection.
#[derive(Debug)]
pub struct Queue {
    target: Arc<Target>,
    peer: PeerInfo,
    limits: Limits,
    /// What Connect made of this queue; `None` until then.
    assoc: Option<Association>,
    /// Qid from the Connect being processed (for the CQE of a failed Connect).
    connect_qid: u16,
    sqhd: u16,
    sq_entries: u16,
    flow_control_disabled: bool,
    /// Outstanding Asynchronous Event Requests (admin queue only).
    held_aers: HeldAers,
    /// Completions produced outside `execute` (e.g. an AER completed by Abort).
    deferred: Vec<Response>,
    disconnect_requested: bool,
    /// In-band authentication of this queue, when its host has a key (`fabrics_auth`).
    auth: Option<QueueAuth>,
}

impl Queue {
    pub fn new(target: Arc<Target>, peer: PeerInfo) -> Queue {
        let limits = *target.limits();
        Queue {
            target,
            peer,
            limits,
            assoc: None,
            connect_qid: 0,
            sqhd: 0,
            sq_entries: 0,
            flow_control_disabled: false,
            held_aers: HeldAers::default(),
            deferred: Vec::new(),
            disconnect_requested: false,
            auth: None,
        }
    }

    pub fn qid(&self) -> Option<u16> {
        self.assoc.as_ref().map(Association::qid)
    }

    pub fn sq_entries(&self) -> u16 {
        self.sq_entries
    }

    pub fn flow_control_disabled(&self) -> bool {
        self.flow_control_disabled
    }

    /// The controller this queue belongs to, once connected.
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.assoc.as_ref().map(Association::controller)
    }

    /// Phase 1 (see ARCHITECTURE.md): admission and data direction.
    pub fn prepare(&mut self, sqe: &Sqe, data_len: u32) -> Result<Direction, Status> {
        // PSDT must say "SGL, metadata in one contiguous buffer" (01b). Fused operations
        // exist on I/O queues only (NVMe Base 2.0 §3.4.2: Compare and Write); `io` pairs them.
        let io_queue = matches!(self.assoc, Some(Association::Io(_))) && !sqe.is_fabrics();
        if sqe.psdt() != 1 || (sqe.fuse() != 0 && !io_queue) {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        // MDTS bounds every transfer (NVMe Base 2.0 §5.17.2.1).
        if data_len > self.limits.max_data_transfer {
            return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
        }
        let (dir, max_len) = match &mut self.assoc {
            None => {
                if !(sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT) {
                    return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                }
                (Direction::HostToController, ConnectData::SIZE as u32)
            }
            Some(a) if sqe.is_fabrics() => fabrics::admission(sqe, a.is_admin())?,
            Some(Association::Admin { ctrl, .. }) => {
                auth::gate(self.auth.as_ref())?;
                // NVMe Base 2.0 §3.5: admin commands need CSTS.RDY (only Fabrics commands are
                // allowed before the controller is enabled).
                if !ctrl.is_ready() {
                    return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                }
                admin::admission(sqe.opcode, ctrl.is_discovery())
                    .ok_or(Status::INVALID_OPCODE.with_dnr())?
            }
            Some(Association::Io(q)) => {
                auth::gate(self.auth.as_ref())?;
                let mut cx = q.context();
                let r = io::admission(&mut cx, sqe, data_len);
                self.take_fused_completions();
                r?
            }
        };
        // Command-specific maximum (0 for commands without data).
        if data_len > max_len {
            return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
        }
        Ok(dir)
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
        let exec = match &mut self.assoc {
            None => {
                if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                    self.connect_qid = ConnectCommand::from_sqe(sqe).qid;
                    let cx = ConnectContext {
                        target: &self.target,
                        peer: &self.peer,
                        limits: &self.limits,
                    };
                    let (c, accepted) = fabrics::connect(&cx, sqe, data);
                    if let Some(a) = accepted {
                        self.accept(a);
                    }
                    c.into()
                } else {
                    Completion::fail(Status::COMMAND_SEQUENCE_ERROR).into()
                }
            }
            Some(a)
                if sqe.is_fabrics()
                    && matches!(
                        sqe.fctype(),
                        fctype::AUTHENTICATION_SEND | fctype::AUTHENTICATION_RECEIVE
                    ) =>
            {
                let mut cx = AuthContext {
                    target: &self.target,
                    peer: &self.peer,
                    ctrl: a.controller(),
                    subsys: a.subsystem(),
                    qid: a.qid(),
                    auth: &mut self.auth,
                };
                fabrics_auth::execute(&mut cx, sqe, data).into()
            }
            Some(a) if sqe.is_fabrics() => {
                let (c, disconnect) = fabrics::execute(a.controller(), sqe, a.is_admin());
                // NVMe-oF 1.1 §3.3.4: the queue (and for the admin queue, the controller) is
                // deleted once this completes; `poll` then tells the transport to close.
                self.disconnect_requested |= disconnect;
                c.into()
            }
            Some(Association::Admin { ctrl, subsys }) => {
                let mut cx = AdminContext {
                    target: &self.target,
                    subsys,
                    peer: &self.peer,
                    limits: &self.limits,
                    aers: &mut self.held_aers,
                    aborted_aer: None,
                };
                let exec = if ctrl.is_discovery() {
                    discovery::execute(&mut cx, ctrl, sqe, data)
                } else {
                    admin::execute(&mut cx, ctrl, sqe, data)
                };
                if let Some(cid) = cx.aborted_aer {
                    let aborted = self.respond_aborted_aer(cid);
                    self.deferred.push(aborted);
                }
                exec
            }
            Some(Association::Io(q)) => {
                let mut cx = q.context();
                let exec = io::execute(&mut cx, sqe, data, tag, io);
                self.take_fused_completions();
                exec
            }
        };
        match exec {
            Exec::Done(c) => Outcome::Complete(self.respond(sqe, c)),
            Exec::Submitted => Outcome::Submitted,
            Exec::Held => Outcome::Held,
            Exec::Blocked => Outcome::Blocked,
        }
    }

    /// Completion of the `BlockOp` submitted for `sqe`. `None`: the command is not done — the
    /// transport runs it again like an `Outcome::Blocked` one (the Write of a fused Compare and
    /// Write whose Compare read just matched).
    pub fn finish(&mut self, sqe: &Sqe, result: i32) -> Option<Response> {
        let c = match &mut self.assoc {
            Some(Association::Io(q)) => {
                let mut cx = q.context();
                let c = io::finish(&mut cx, sqe, result);
                self.take_fused_completions();
                c?
            }
            _ => Completion::fail(Status::COMMAND_SEQUENCE_ERROR),
        };
        Some(self.respond(sqe, c))
    }

    /// Completes a command the transport refused (SGL errors) with `status`.
    pub fn reject(&mut self, sqe: &Sqe, status: Status) -> Response {
        if let Some(ctrl) = self.controller() {
            ctrl.note_activity();
        }
        self.respond(sqe, Completion::err(status))
    }

    /// Held AER completions, keep-alive and teardown (see ARCHITECTURE.md).
    pub fn poll(&mut self, now: Instant) -> PollResult {
        let mut completions = std::mem::take(&mut self.deferred);
        let Some(assoc) = &self.assoc else {
            return PollResult {
                completions,
                terminate: None,
            };
        };
        let ctrl = Arc::clone(assoc.controller());
        let mut terminate = ctrl.check_keep_alive(now);
        if let Association::Io(q) = assoc {
            if terminate.is_none() && q.epoch != ctrl.enable_epoch() {
                terminate = Some(TerminateReason::ControllerReset);
            }
        }
        if self.disconnect_requested && terminate.is_none() {
            terminate = Some(TerminateReason::HostDisconnect);
        }
        if terminate.is_none() && assoc.is_admin() {
            while !self.held_aers.is_empty() {
                let Some(event) = ctrl.take_event() else {
                    break;
                };
                let cid = self.held_aers.pop_oldest().unwrap_or_default();
                completions.push(self.respond_cid(cid, Completion::value(event.dw0())));
            }
        }
        PollResult {
            completions,
            terminate,
        }
    }

    /// First halves of fused pairs completed while handling another command (their pair ran
    /// or broke): sent from the next `poll`.
    fn take_fused_completions(&mut self) {
        let Some(Association::Io(q)) = &mut self.assoc else {
            return;
        };
        let done = std::mem::take(&mut q.state.fusing.completed);
        for (sqe, c) in done {
            let r = self.respond(&sqe, c);
            self.deferred.push(r);
        }
    }

    /// A successful Connect: the queue now belongs to a controller.
    fn accept(&mut self, a: Accepted) {
        self.sq_entries = a.sq_entries;
        self.flow_control_disabled = a.flow_control_disabled;
        self.auth = a.auth;
        self.assoc = Some(a.association);
    }

    /// Builds the CQE: cid, sqid, SQ head (NVMe-oF 1.1 §3.3.2.1: 0xFFFF when the host disabled
    /// SQ flow control), and records failures in the controller's error log.
    fn respond(&mut self, sqe: &Sqe, c: Completion) -> Response {
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
                    trtype: self.peer.transport.trtype(),
                    command_specific: 0,
                });
            }
        }
        self.respond_cid(sqe.cid, c)
    }

    /// The completion of an AER that Abort removed (NVMe Base 2.0 §5.1: Abort Requested).
    fn respond_aborted_aer(&mut self, cid: u16) -> Response {
        let sqe = Sqe {
            cid,
            opcode: admin_opcode::ASYNC_EVENT_REQUEST,
            ..Sqe::default()
        };
        self.respond(&sqe, Completion::err(Status::ABORT_REQUESTED))
    }

    fn respond_cid(&mut self, cid: u16, c: Completion) -> Response {
        // nvmet's rule: the head advances by one per completion (each completed command has
        // been consumed from the SQ).
        if self.sq_entries > 0 {
            self.sqhd = (self.sqhd + 1) % self.sq_entries;
        }
        let sqhd = if self.flow_control_disabled {
            SQHD_FLOW_CONTROL_DISABLED
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
}

// Reactors hand accepted connections (and their queues) between threads.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Queue>();
};

impl Drop for Queue {
    fn drop(&mut self) {
        // The connection of this queue is gone.
        if let Some(a) = self.assoc.take() {
            a.release();
        }
    }
}
