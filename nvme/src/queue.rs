//! Per-queue command dispatch: the dispatch contract of ARCHITECTURE.md. A transport owns one
//! `Queue` per NVMe-oF queue (connection / QP) and drives it through `prepare` → `execute` →
//! (`finish`), plus `poll` for asynchronous completions and teardown.
//!
//! `Queue` keeps its state private and only routes, in one place (`route`): by queue role
//! (unconnected, admin of an I/O or a discovery controller, I/O) and by opcode to the entry of
//! a command table — `fabrics::COMMANDS`, `admin::COMMANDS`, `discovery::COMMANDS`,
//! `nvm::COMMANDS` — whose direction and data limit `prepare` checks and whose handler
//! `execute` runs. Handlers are free functions with a narrow context; they return what changed
//! (`fabrics::Accepted`, a Disconnect, an aborted AER); `Queue` applies it.

use std::sync::Arc;
use std::time::Instant;

use crate::admin::{self, AdminCommand, AdminContext, HeldAers};
use crate::auth::{self, QueueAuth};
use crate::command::{Completion, DataLimit, Exec};
pub use crate::command::{Direction, Outcome, PollResult, Response, TerminateReason};
use crate::controller::Controller;
use crate::discovery;
use crate::fabrics::{
    self, Accepted, Association, ConnectContext, FabricsCommand, FabricsRun, TlsIdentity,
};
use crate::fabrics_auth::{self, AuthContext};
use crate::limits::Limits;
use crate::metrics::{Class, QueueMetrics, Transport};
use crate::nvm::{self, NvmCommand};
pub use crate::peer::{PeerInfo, TransportKind};
use crate::reservation;
use crate::spec::{admin_opcode, fctype, nvm_opcode, FABRICS_OPCODE, SQHD_FLOW_CONTROL_DISABLED};
use crate::target::Target;
use crate::wire::fabrics::ConnectCommand;
use crate::wire::log::ErrorLogEntry;
use crate::wire::{Cqe, Sqe, Status};
use storage::{IoSubmit, Lent};

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
    /// The TLS PSK identity the connection was secured with: its Connect must name the
    /// same host and subsystem (the PSK is what authenticated the host).
    tls_identity: Option<TlsIdentity>,
    /// Command counters, when the target counts (`Target::metrics`).
    metrics: Option<QueueMetrics>,
    /// The transport can send a read from the backend's memory (`lend_reads`), and the bytes
    /// of the read `execute` just completed that way (`take_lent`).
    lend_reads: bool,
    lent: Option<Lent>,
    /// Admin commands running on the reservation persistence thread, by CID.
    admin_changes: Vec<(u16, reservation::PendingChange)>,
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
            assoc: None,
            connect_qid: 0,
            sqhd: 0,
            sq_entries: 0,
            flow_control_disabled: false,
            held_aers: HeldAers::default(),
            deferred: Vec::new(),
            disconnect_requested: false,
            auth: None,
            tls_identity: None,
            metrics,
            lend_reads: false,
            lent: None,
            admin_changes: Vec::new(),
        }
    }

    /// The transport can send read data from a backend's memory (`Backend::lend`): reads of
    /// RAM and null namespaces then complete without filling the data buffer, and the
    /// transport takes their bytes with [`Queue::take_lent`] right after `execute`.
    pub fn lend_reads(&mut self, on: bool) {
        self.lend_reads = on;
    }

    /// The bytes of the Read the last `execute` completed from the backend's memory: the
    /// `data_len` bytes of its `Response` are these, not the data buffer's.
    pub fn take_lent(&mut self) -> Option<Lent> {
        self.lent.take()
    }

    /// Whether the transport is to time this queue's commands for the metrics
    /// ([`Queue::observe_latency`], [`Queue::observe_backend`]): the target counts commands.
    /// Otherwise it need not read a clock for them.
    #[inline]
    pub fn timing(&self) -> bool {
        self.metrics.is_some()
    }

    /// The latency of a command (`opcode`, `nsid`) whose response the transport handed to its
    /// socket or queue pair, from the arrival of its capsule, in nanoseconds. Held
    /// Asynchronous Event Requests are not timed (they wait for an event).
    #[inline]
    pub fn observe_latency(&mut self, opcode: u8, nsid: u32, latency_ns: u64) {
        let admin = !matches!(self.assoc, Some(Association::Io(_)));
        if admin && opcode == admin_opcode::ASYNC_EVENT_REQUEST {
            return;
        }
        if let Some(m) = &mut self.metrics {
            m.observe_latency(classify(opcode, admin), nsid, latency_ns);
        }
    }

    /// How long the block operation of a command (`opcode`, `nsid`) took from its submission
    /// (`Outcome::Submitted`) to its completion (before `finish`), in nanoseconds.
    #[inline]
    pub fn observe_backend(&mut self, opcode: u8, nsid: u32, latency_ns: u64) {
        let admin = !matches!(self.assoc, Some(Association::Io(_)));
        if let Some(m) = &mut self.metrics {
            m.observe_backend(classify(opcode, admin), nsid, latency_ns);
        }
    }

    /// A command of this queue waits for a data buffer of a pool the transport shares with
    /// other queues (RDMA device pools): counted for the metrics.
    pub fn note_pool_wait(&mut self) {
        if let Some(m) = &mut self.metrics {
            m.pool_wait();
        }
    }

    /// The queue of a connection secured by TLS with the PSK identity of `hostnqn` and
    /// `subnqn` (NVMe/TCP 1.1 §3.6.1.3: the identity names the host and the subsystem).
    pub fn with_tls_identity(mut self, hostnqn: String, subnqn: String) -> Queue {
        self.tls_identity = Some(TlsIdentity { hostnqn, subnqn });
        self
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
        // exist on I/O queues only (NVMe Base 2.0 §3.4.2: Compare and Write); `nvm` pairs them.
        let io_queue = matches!(self.assoc, Some(Association::Io(_))) && !sqe.is_fabrics();
        if sqe.psdt() != 1 || (sqe.fuse() != 0 && !io_queue) {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        // MDTS bounds every transfer (NVMe Base 2.0 §5.17.2.1).
        if data_len > self.limits.max_data_transfer {
            return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
        }
        match &mut self.assoc {
            Some(a) if !sqe.is_fabrics() => {
                auth::gate(self.auth.as_ref())?;
                // NVMe Base 2.0 §3.5: admin commands need CSTS.RDY (only Fabrics commands are
                // allowed before the controller is enabled).
                if let Association::Admin { ctrl, .. } = a {
                    if !ctrl.is_ready() {
                        return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                    }
                }
            }
            _ => {}
        }
        let handler = route(self.assoc.as_ref(), sqe)?;
        if let (Handler::Nvm(cmd), Some(Association::Io(q))) = (handler, &mut self.assoc) {
            let r = nvm::admission(&mut q.context(), cmd, sqe, data_len);
            self.take_fused_completions();
            r?;
        }
        // Command-specific maximum (0 for commands without data).
        let (dir, limit) = handler.data();
        if data_len > limit.of(sqe) {
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
        let unconnected = self.assoc.is_none();
        let again = match &mut self.metrics {
            Some(m) if m.any_again() => m.admit_again(sqe.cid),
            Some(m) => {
                m.admit();
                false
            }
            None => false,
        };
        // The handler `prepare` found; a command that did not pass it fails as it did there.
        let exec = match route(self.assoc.as_ref(), sqe) {
            Ok(Handler::Nvm(cmd)) => self.execute_nvm(cmd, sqe, data, tag, io),
            Ok(Handler::Admin(cmd)) => self.execute_admin(cmd, sqe, data, tag, io),
            Ok(Handler::Fabrics(cmd)) => self.execute_fabrics(cmd, sqe, data, tag, io),
            Err(status) => Completion::err(status).into(),
        };
        if unconnected {
            self.note_connected();
        }
        match exec {
            Exec::Done(c) => {
                // A command executed again had its data counted the first time.
                let sent = if again {
                    0
                } else {
                    self.host_sent(sqe, data.len())
                };
                Outcome::Complete(self.respond_at(sqe, c, sent))
            }
            Exec::Submitted => {
                if self.metrics.is_some() {
                    self.count_parked(sqe, data.len(), again, false);
                }
                Outcome::Submitted
            }
            Exec::Held => Outcome::Held,
            Exec::Blocked => {
                self.note_blocked(sqe);
                if self.metrics.is_some() {
                    self.count_parked(sqe, data.len(), again, true);
                }
                Outcome::Blocked
            }
        }
    }

    /// An NVM command (`route` finds these on I/O queues only).
    #[inline(always)]
    fn execute_nvm(
        &mut self,
        cmd: &NvmCommand,
        sqe: &Sqe,
        data: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Exec {
        let Some(Association::Io(q)) = &mut self.assoc else {
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR).into();
        };
        let mut cx = q.context();
        if self.lend_reads {
            self.lent = None;
            cx.lend = Some(&mut self.lent);
        }
        let exec = nvm::execute(&mut cx, cmd, sqe, data, tag, io);
        // `take_fused_completions` with `q` already in hand: calling it matches `assoc` again,
        // +6 instructions per 4K read at QD32 (callgrind).
        if !q.state.fusing.completed.is_empty() {
            self.defer_fused_completions();
        }
        exec
    }

    /// A Fabrics command (`cmd`, which `route` allowed on this queue).
    #[inline(never)]
    fn execute_fabrics(
        &mut self,
        cmd: &FabricsCommand,
        sqe: &Sqe,
        data: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Exec {
        match (cmd.run, &self.assoc) {
            (FabricsRun::Connect, None) => {
                self.connect_qid = ConnectCommand::from_sqe(sqe).qid;
                let cx = ConnectContext {
                    target: &self.target,
                    peer: &self.peer,
                    limits: &self.limits,
                    tls_identity: self.tls_identity.as_ref(),
                };
                let (c, accepted) = fabrics::connect(&cx, sqe, data);
                if let Some(a) = accepted {
                    self.accept(a);
                }
                c.into()
            }
            (FabricsRun::Authentication, Some(a)) => {
                let done = io.external().map(|done| (done, tag));
                let mut cx = auth_context(&self.target, &self.peer, a, &mut self.auth, done);
                fabrics_auth::execute(&mut cx, sqe, data)
            }
            (FabricsRun::Property(property), Some(a)) => property(a.controller(), sqe).into(),
            (FabricsRun::Disconnect, Some(_)) => {
                // The queue (and for the admin queue, the controller) is deleted once this
                // completes; `poll` then tells the transport to close.
                self.disconnect_requested = true;
                Completion::ok().into()
            }
            _ => Completion::fail(Status::COMMAND_SEQUENCE_ERROR).into(),
        }
    }

    /// A command blocked by something other than its QoS limits (a fused pair's write lock)
    /// may have passed the QoS gate: its next run must not be charged again.
    #[cold]
    #[inline(never)]
    fn note_blocked(&mut self, sqe: &Sqe) {
        if let Some(Association::Io(q)) = &mut self.assoc {
            if let Some(qos) = &mut q.state.qos {
                if sqe.fuse() == 0 && !qos.is_waiting(sqe.cid) {
                    qos.passed_but_blocked(sqe.cid);
                }
            }
        }
    }

    /// Metrics of a command that completes later: from `finish` (submitted) or from a later
    /// `execute` (blocked, executed again). The data the host sent is counted now, once.
    #[cold]
    #[inline(never)]
    fn count_parked(&mut self, sqe: &Sqe, data_len: usize, again: bool, blocked: bool) {
        let sent = if again {
            0
        } else {
            self.host_sent(sqe, data_len)
        };
        let admin = !matches!(self.assoc, Some(Association::Io(_)));
        if let Some(m) = &mut self.metrics {
            m.host_bytes(classify(sqe.opcode, admin), sqe.nsid, sent);
            if blocked {
                m.run_again(sqe.cid);
            }
        }
    }

    /// An admin (or discovery) queue's command; out of line so that the I/O path of
    /// `execute` keeps its registers.
    #[inline(never)]
    fn execute_admin(
        &mut self,
        cmd: &AdminCommand,
        sqe: &Sqe,
        data: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Exec {
        let Some(Association::Admin { ctrl, subsys }) = &self.assoc else {
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR).into();
        };
        let mut cx = AdminContext {
            target: &self.target,
            subsys,
            peer: &self.peer,
            limits: &self.limits,
            aers: &mut self.held_aers,
            aborted_aer: None,
            offload: io.external().map(|done| (done, tag)),
            changes: &mut self.admin_changes,
        };
        let exec = (cmd.execute)(&mut cx, ctrl, sqe, data);
        if let Some(cid) = cx.aborted_aer {
            let aborted = self.respond_aborted_aer(cid);
            self.deferred.push(aborted);
        }
        exec
    }

    /// Completion of the `BlockOp` submitted for `sqe`. `None`: the command is not done — the
    /// transport runs it again like an `Outcome::Blocked` one (the Write of a fused Compare and
    /// Write whose Compare read just matched).
    pub fn finish(&mut self, sqe: &Sqe, result: i32) -> Option<Response> {
        // The handler `prepare` found: only those that submit work complete here.
        let c = match (route(self.assoc.as_ref(), sqe), &mut self.assoc) {
            (Ok(Handler::Fabrics(f)), Some(a))
                if matches!(f.run, FabricsRun::Authentication)
                    && fabrics_auth::is_computing(&self.auth, sqe.cid) =>
            {
                let mut cx = auth_context(&self.target, &self.peer, a, &mut self.auth, None);
                fabrics_auth::finish(&mut cx)
            }
            (Ok(Handler::Nvm(cmd)), Some(Association::Io(q))) => {
                let mut cx = q.context();
                let c = nvm::finish(&mut cx, cmd, sqe, result);
                self.take_fused_completions();
                match c {
                    Some(c) => c,
                    None => {
                        // Executed again by the transport: still the same admission.
                        if let Some(m) = &mut self.metrics {
                            m.run_again(sqe.cid);
                        }
                        return None;
                    }
                }
            }
            (Ok(Handler::Admin(_)), Some(Association::Admin { subsys, .. })) => {
                match self
                    .admin_changes
                    .iter()
                    .position(|(cid, _)| *cid == sqe.cid)
                {
                    Some(i) => {
                        let (_, pending) = self.admin_changes.swap_remove(i);
                        let (c, notices) = pending.take().unwrap_or_else(|| {
                            (Completion::fail(Status::INTERNAL_ERROR), Vec::new())
                        });
                        subsys.notify_reservation(sqe.nsid, &notices);
                        c
                    }
                    None => Completion::fail(Status::COMMAND_SEQUENCE_ERROR),
                }
            }
            _ => Completion::fail(Status::COMMAND_SEQUENCE_ERROR),
        };
        Some(self.respond_at(sqe, c, 0))
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
        let (Some(a), Some(m)) = (&self.assoc, &mut self.metrics) else {
            return;
        };
        let ctrl = a.controller();
        m.connected(&a.subsystem().nqn, ctrl.cntlid, &ctrl.hostnqn, a.is_admin());
    }

    /// Completes a command the transport refused (SGL errors) with `status`.
    pub fn reject(&mut self, sqe: &Sqe, status: Status) -> Response {
        if let Some(ctrl) = self.controller() {
            ctrl.note_activity();
        }
        if let Some(m) = &mut self.metrics {
            m.admit();
        }
        self.respond_at(sqe, Completion::err(status), 0)
    }

    /// Held AER completions, keep-alive and teardown (see ARCHITECTURE.md).
    pub fn poll(&mut self, now: Instant) -> PollResult {
        let deferred = self.deferred.len();
        let result = self.poll_inner(now);
        if let Some(m) = &mut self.metrics {
            if result.terminate == Some(TerminateReason::KeepAliveTimeout)
                && self.assoc.as_ref().is_some_and(Association::is_admin)
            {
                m.keep_alive_expired();
            }
            for _ in deferred..result.completions.len() {
                // Held AERs completed now (the deferred ones were counted by `respond`).
                m.complete(Class::Admin, 0, 0);
            }
            m.maybe_publish(now);
        }
        result
    }

    fn poll_inner(&mut self, now: Instant) -> PollResult {
        let mut completions = std::mem::take(&mut self.deferred);
        let Some(assoc) = &self.assoc else {
            return PollResult {
                completions,
                terminate: None,
            };
        };
        let ctrl = Arc::clone(assoc.controller());
        let admin = assoc.is_admin();
        if self.auth.is_some() {
            let mut cx = auth_context(&self.target, &self.peer, assoc, &mut self.auth, None);
            fabrics_auth::tick(&mut cx, now);
        }
        let mut terminate = ctrl.check_keep_alive(now);
        if let Association::Io(q) = assoc {
            if terminate.is_none() && q.epoch != ctrl.enable_epoch() {
                terminate = Some(TerminateReason::ControllerReset);
            }
        }
        if self.disconnect_requested && terminate.is_none() {
            terminate = Some(TerminateReason::HostDisconnect);
        }
        if admin {
            // Aborts of I/O commands whose queue answered (NVMe Base 2.0 §5.1, Dword 0 bit 0:
            // 0 = aborted).
            for (cid, aborted) in ctrl.aborts.take_answers() {
                completions.push(self.respond_cid(cid, Completion::value(u32::from(!aborted))));
            }
        }
        if let Some(Association::Io(q)) = &mut self.assoc {
            nvm::refresh_idle(&mut q.context());
        }
        if terminate.is_none() && admin {
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
    #[inline]
    fn take_fused_completions(&mut self) {
        let Some(Association::Io(q)) = &mut self.assoc else {
            return;
        };
        if !q.state.fusing.completed.is_empty() {
            self.defer_fused_completions();
        }
    }

    #[cold]
    fn defer_fused_completions(&mut self) {
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
        if let Association::Io(q) = &a.association {
            q.ctrl.aborts.open_queue(q.qid);
        }
        self.assoc = Some(a.association);
    }

    /// Commands of this I/O queue that Aborts on the admin queue ask for (NVMe Base 2.0 §5.1),
    /// each once. The transport answers each with [`Queue::answer_abort`]: at once if it
    /// completed the command with [`Queue::abort_waiting`] or cannot abort it, or when the
    /// backend op it cancelled completes.
    pub fn take_abort_requests(&mut self) -> Vec<u16> {
        match &self.assoc {
            Some(Association::Io(q)) => q.ctrl.aborts.take_requests(q.qid),
            _ => Vec::new(),
        }
    }

    /// The transport's answer to an Abort of command `cid` of this queue.
    pub fn answer_abort(&mut self, cid: u16, aborted: bool) {
        if let Some(Association::Io(q)) = &self.assoc {
            q.ctrl.aborts.answer(q.qid, cid, aborted);
        }
    }

    /// Whether running the blocked command `sqe` again at `now` can change anything:
    /// `false` while it waits for a QoS limit whose time has not come (transports skip it
    /// then instead of running every waiting command on every poll). Always `true` for
    /// commands blocked for other reasons.
    #[inline]
    pub fn may_run(&self, sqe: &Sqe, now: Instant) -> bool {
        match &self.assoc {
            Some(Association::Io(q)) => q
                .state
                .qos
                .as_ref()
                .is_none_or(|qos| qos.may_run(sqe.cid, now)),
            _ => true,
        }
    }

    /// When the first command waiting for a QoS limit may start: the transport asks its
    /// submitter for a wake-up then (`IoSubmit::wake_at`) after running its blocked commands,
    /// since those it skipped (`may_run`) asked for none this time.
    #[inline]
    pub fn next_wake(&self) -> Option<Instant> {
        match &self.assoc {
            Some(Association::Io(q)) => q.state.qos.as_ref().and_then(|qos| qos.earliest()),
            _ => None,
        }
    }

    /// Aborts a command that has not started: admitted and waiting for its data or a buffer,
    /// parked by back-pressure before admission, or blocked behind a fused pair's range lock.
    /// Completes it with Abort Requested and drops what it held (its place in the write lock's
    /// queue). `None`: it cannot be aborted alone — a fused half, whose pair is bookkept across
    /// both commands — and runs on.
    pub fn abort_waiting(&mut self, sqe: &Sqe) -> Option<Response> {
        if sqe.fuse() != 0 {
            return None;
        }
        if let Some(Association::Io(q)) = &mut self.assoc {
            if q.state.jobs.iter().any(|j| j.cid == sqe.cid) {
                // A Copy or Verify between two steps: the next one starts at once.
                return None;
            }
            // Dropping the hold leaves the namespace's write-lock queue (and wakes those behind).
            q.state
                .fusing
                .waiting_writes
                .retain(|(cid, _)| *cid != sqe.cid);
            // A durable Write Zeroes between its zeroing and its Flush.
            q.state.durable_zeroes.retain(|(cid, _)| *cid != sqe.cid);
            // A command held by a QoS limit leaves its queue's FIFO.
            if let Some(qos) = &mut q.state.qos {
                qos.forget(sqe.cid, Instant::now());
            }
        }
        // A command blocked behind a fused pair was admitted when it first ran.
        if self.metrics.as_mut().is_some_and(|m| m.take_again(sqe.cid)) {
            return Some(self.respond_at(sqe, Completion::err(Status::ABORT_REQUESTED), 0));
        }
        Some(self.reject(sqe, Status::ABORT_REQUESTED))
    }

    /// Builds the CQE: cid, sqid, SQ head (NVMe-oF 1.1 §3.3.2.1: 0xFFFF when the host disabled
    /// SQ flow control), and records failures in the controller's error log.
    fn respond(&mut self, sqe: &Sqe, c: Completion) -> Response {
        self.respond_at(sqe, c, 0)
    }

    /// [`Queue::respond`] with the metrics' completion hook: `sent` is the data bytes the host
    /// sent with the command (counted with its completion).
    fn respond_at(&mut self, sqe: &Sqe, c: Completion, sent: u32) -> Response {
        if let Some(m) = &mut self.metrics {
            let class = classify(sqe.opcode, !matches!(self.assoc, Some(Association::Io(_))));
            if c.status.is_success() {
                m.complete(class, sqe.nsid, c.data_len + sent);
            } else {
                let connect =
                    self.assoc.is_none() && sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT;
                m.complete_failed(class, sqe.nsid, c.status, connect, sent, c.backend_failed);
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

/// The class of each opcode on an I/O queue (Fabrics commands count as admin): a table, since
/// the completion hook runs once per command.
const IO_CLASS: [Class; 256] = {
    let mut t = [Class::Other; 256];
    t[nvm_opcode::READ as usize] = Class::Read;
    t[nvm_opcode::WRITE as usize] = Class::Write;
    t[nvm_opcode::FLUSH as usize] = Class::Flush;
    t[FABRICS_OPCODE as usize] = Class::Admin;
    t
};

/// The class of a command (`opcode`) on an admin (`admin`) or I/O queue.
#[inline]
fn classify(opcode: u8, admin: bool) -> Class {
    if admin {
        return Class::Admin;
    }
    IO_CLASS[opcode as usize]
}

/// The handler of a command: the entry of its queue's command table that its opcode (FCTYPE
/// for Fabrics commands) names. `prepare` admits a command by it; `execute` and `finish` run
/// what it names (as nvmet's parse step sets `req->execute`).
#[derive(Debug, Clone, Copy)]
enum Handler {
    Fabrics(&'static FabricsCommand),
    /// Of an NVM or a discovery controller's admin queue (`admin::COMMANDS`,
    /// `discovery::COMMANDS`).
    Admin(&'static AdminCommand),
    Nvm(&'static NvmCommand),
}

impl Handler {
    /// The command's data direction and data length limit.
    #[inline(always)]
    fn data(self) -> (Direction, DataLimit) {
        match self {
            Handler::Fabrics(c) => (c.dir, c.limit),
            Handler::Admin(c) => (c.dir, c.limit),
            Handler::Nvm(c) => (c.dir, c.limit),
        }
    }
}

/// Where every command is routed, by the role of its queue (`assoc`: unconnected, admin queue
/// of an NVM or a discovery controller, I/O queue) and its opcode: the one place that decodes
/// them. `Err`: the status that refuses the command (Invalid Command Opcode; Command Sequence
/// Error before Connect, or for a second Connect).
#[inline(always)]
fn route(assoc: Option<&Association>, sqe: &Sqe) -> Result<Handler, Status> {
    if sqe.is_fabrics() {
        return fabrics::command(sqe.fctype(), assoc.map(Association::is_admin))
            .map(Handler::Fabrics);
    }
    let invalid = Status::INVALID_OPCODE.with_dnr();
    match assoc {
        Some(Association::Io(_)) => nvm::command(sqe.opcode).map(Handler::Nvm).ok_or(invalid),
        Some(Association::Admin { ctrl, .. }) => {
            let table = if ctrl.is_discovery() {
                &discovery::COMMANDS[..]
            } else {
                &admin::COMMANDS[..]
            };
            admin::command(table, sqe.opcode)
                .map(Handler::Admin)
                .ok_or(invalid)
        }
        None => Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
    }
}

fn transport_of(t: TransportKind) -> Transport {
    match t {
        TransportKind::Tcp => Transport::Tcp,
        TransportKind::Rdma => Transport::Rdma,
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
            if let Association::Io(q) = &a {
                q.ctrl.aborts.close_queue(q.qid);
            }
            a.release();
        }
    }
}

/// What Authentication Send/Receive, their completion and the queue's tick need of a connected
/// queue (`assoc`) with authentication state `auth`.
fn auth_context<'a>(
    target: &'a Target,
    peer: &'a PeerInfo,
    assoc: &'a Association,
    auth: &'a mut Option<QueueAuth>,
    done: Option<(&'a Arc<storage::ExternalCompletions>, u64)>,
) -> AuthContext<'a> {
    AuthContext {
        target,
        peer,
        ctrl: assoc.controller(),
        subsys: assoc.subsystem(),
        qid: assoc.qid(),
        auth,
        done,
    }
}
