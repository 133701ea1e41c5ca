//! NVM command set I/O commands (NVM Command Set 1.0 §3): Read, Write, Flush, Write Zeroes,
//! Dataset Management, Compare. Range and length checks happen in `prepare` (before any data
//! moves) and again in `execute` against the namespace table current at that moment.

use crate::ana::PortAnaView;
use crate::command::{Completion, DataLimit, Direction, Exec};
use crate::controller::Controller;
use crate::copy::{self, Job, Jobs, StepError};
use crate::fused::{First, Fusing};
use crate::health::IoCounters;
use crate::namespace::Namespace;
use crate::namespace::NamespaceTable;
use crate::qos::{Cost, Gate, QueueQos};
use crate::reservation;
use crate::spec::nvm_bits::{COPY_SOURCE_RANGE_SIZE, DEAC, DSM_AD, DSM_RANGE_SIZE, FUA};
use crate::spec::{nvm_opcode, sqe_flags};
use crate::subsystem::Subsystem;
use crate::wire::dsm::DsmRange;
use crate::wire::{Sqe, Status};
use crate::write_lock::{Begun, Hold, Range};
mod compare;
mod reservations;

pub(crate) use compare::PendingCompare;
use compare::{compare, compare_finish, fused_compare_finish, fused_write};
use reservations::{
    offload_reservation, preempt_abort_drained, preempt_abort_wait, preempts_with_abort,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use storage::{BackendRequest, BlockError, IoSubmit, Lent, Started, Zeroing};

/// I/O queue state kept off the shared controller so the hot path takes no lock.
#[derive(Debug)]
pub(crate) struct IoState {
    pub table: Arc<NamespaceTable>,
    /// ANA group states on this queue's port, from the table published with `table`.
    pub ana: PortAnaView,
    pub generation: u64,
    pub counters: Arc<IoCounters>,
    /// Fused Compare and Write pairs of this queue (boxed: rarely used, kept off the
    /// queue's hot state).
    pub fusing: Box<Fusing>,
    /// Compares whose read is in flight (matched by CID on completion).
    pub compares: Vec<PendingCompare>,
    /// Copy and Verify commands between their steps (`copy`), by CID (boxed like `fusing`:
    /// rarely used, kept off the queue's hot state).
    pub jobs: Box<Jobs>,
    /// Reservation commands running on the persistence thread (`reservation::offload`), by
    /// CID: their outcome is taken in [`finish`].
    pub reservation_changes: Vec<(u16, reservation::PendingChange)>,
    /// Reservation Reports whose namespace state was read again from a gateway group's
    /// store, by CID: their next run answers from it.
    pub fresh_reports: Vec<u16>,
    /// Write Zeroes that must be durable when they complete (FUA, or no volatile write cache
    /// for this controller's host) on a namespace whose backend has a cache, by CID, and
    /// whether their zeroing is done: a Flush follows it before the command completes.
    pub durable_zeroes: Vec<(u16, bool)>,
    /// Preempt and Abort commands whose reservation change is made, by CID: the namespace's
    /// write lock held over every LBA until the writes in flight before it have drained, and
    /// the completion to send then ([`preempt_abort_drained`]).
    pub preempt_drains: Vec<(u16, Hold, Completion)>,
    /// QoS limits that apply to this queue and the commands they hold (`qos`); `None` while
    /// no limit applies, so an unlimited queue pays one test per command.
    pub qos: Option<Box<QueueQos>>,
}

/// The QoS state of a queue to which `applied` applies (`None`: nothing limits it).
pub(crate) fn qos_state(applied: crate::qos::Applied) -> Option<Box<QueueQos>> {
    (!applied.is_empty()).then(|| Box::new(QueueQos::new(applied)))
}

/// What an NVM command does once admitted and found valid: the handler its table entry names
/// (`COMMANDS`), run by [`execute`] and [`finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    Flush,
    WriteZeroes,
    DatasetManagement,
    Reservation,
    Compare,
    Verify,
    Copy,
}

/// How a command's data and the LBAs it addresses are checked against the namespace
/// (`check_ns`).
#[derive(Debug, Clone, Copy)]
enum Lbas {
    /// None addressed (Flush, reservations).
    None,
    /// SLBA/NLB, and the SGL describes exactly NLB blocks (NVMe Base 2.0 §4.3.2).
    WithData,
    /// SLBA/NLB, no data.
    Only,
    /// Dataset Management: NR + 1 ranges in the data.
    DsmRanges,
    /// Copy: NR + 1 source ranges in the data; the destination is checked by its plan.
    CopyRanges,
}

/// What a command costs the QoS limits (`qos`).
#[derive(Debug, Clone, Copy)]
enum Charge {
    /// Not limited (Flush, Dataset Management, reservations).
    Free,
    /// Its extent's bytes read.
    Read,
    /// Its extent's bytes written.
    Write,
    /// A command without bytes of its own counted (IOPS limits only).
    Command,
}

/// One entry of the NVM command table: everything the command's opcode decides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvmCommand {
    pub dir: Direction,
    pub limit: DataLimit,
    pub op: Op,
    /// The opcode whose row of NVMe Base 2.0 Figure 333 (reservation conflicts) applies:
    /// Copy is a write (of its destination) and Verify a read (NVM Command Set 1.0 §3.3.1,
    /// §3.3.5).
    access: u8,
    /// It changes the media: refused on a write-protected namespace.
    pub writes: bool,
    lbas: Lbas,
    charge: Charge,
}

/// The NVM command set (NVM Command Set 1.0 §3, reservations of NVMe Base 2.0 §7), by
/// opcode: the one place an opcode is decoded. `prepare` picks the entry; `execute` and
/// `finish` run its `Op`.
static COMMANDS: [Option<NvmCommand>; 256] = {
    use nvm_opcode as o;
    use Direction::{ControllerToHost as ToHost, HostToController as FromHost, None as NoData};
    use Lbas::{CopyRanges, DsmRanges, Only, WithData};
    const ANY: u32 = u32::MAX;
    // NR is 8 bits: up to 256 ranges (DSM) or source ranges (Copy; beyond MSRC is Command
    // Size Limit Exceeded) arrive.
    const DSM: u32 = (256 * DSM_RANGE_SIZE) as u32;
    const COPY: u32 = (256 * COPY_SOURCE_RANGE_SIZE) as u32;
    const fn row(
        dir: Direction,
        limit: u32,
        op: Op,
        access: u8,
        writes: bool,
        lbas: Lbas,
        charge: Charge,
    ) -> NvmCommand {
        NvmCommand {
            dir,
            limit: DataLimit::Bytes(limit),
            op,
            access,
            writes,
            lbas,
            charge,
        }
    }
    // Their limits come from their fields (`reservation::data_limit`), their checks from
    // `reservation` (`check_ns` stops at `Op::Reservation`).
    const fn reservation(dir: Direction) -> NvmCommand {
        NvmCommand {
            limit: DataLimit::Fields(reservation::data_limit),
            ..row(dir, 0, Op::Reservation, 0, false, Lbas::None, Charge::Free)
        }
    }
    #[rustfmt::skip]
    let rows = [
        // opcode                   direction  limit  handler                access                 writes  LBAs        QoS charge
        (o::READ,               row(ToHost,    ANY,   Op::Read,              o::READ,               false,  WithData,   Charge::Read)),
        (o::WRITE,              row(FromHost,  ANY,   Op::Write,             o::WRITE,              true,   WithData,   Charge::Write)),
        (o::COMPARE,            row(FromHost,  ANY,   Op::Compare,           o::COMPARE,            false,  WithData,   Charge::Read)),
        (o::FLUSH,              row(NoData,    0,     Op::Flush,             o::FLUSH,              false,  Lbas::None, Charge::Free)),
        (o::WRITE_ZEROES,       row(NoData,    0,     Op::WriteZeroes,       o::WRITE_ZEROES,       true,   Only,       Charge::Command)),
        (o::VERIFY,             row(NoData,    0,     Op::Verify,            o::READ,               false,  Only,       Charge::Command)),
        (o::DATASET_MANAGEMENT, row(FromHost,  DSM,   Op::DatasetManagement, o::DATASET_MANAGEMENT, true,   DsmRanges,  Charge::Free)),
        (o::COPY,               row(FromHost,  COPY,  Op::Copy,              o::WRITE,              true,   CopyRanges, Charge::Command)),
        (o::RESERVATION_REGISTER, reservation(FromHost)),
        (o::RESERVATION_ACQUIRE,  reservation(FromHost)),
        (o::RESERVATION_RELEASE,  reservation(FromHost)),
        (o::RESERVATION_REPORT,   reservation(ToHost)),
    ];
    let mut t = [None; 256];
    let mut i = 0;
    while i < rows.len() {
        t[rows[i].0 as usize] = Some(rows[i].1);
        i += 1;
    }
    t
};

/// The NVM command `opcode`; `None`: not one this target implements (Invalid Command Opcode).
#[inline(always)]
pub(crate) fn command(opcode: u8) -> Option<&'static NvmCommand> {
    COMMANDS[opcode as usize].as_ref()
}

/// Every NVM command this target implements, with its opcode (the Commands Supported and
/// Effects log lists them).
pub(crate) fn commands() -> impl Iterator<Item = (u8, &'static NvmCommand)> {
    (0..=u8::MAX).filter_map(|op| Some((op, command(op)?)))
}

/// What `cmd` costs the QoS limits; `None`: not limited (a durable Write Zeroes' Flush is
/// not: its zeroing was counted).
#[inline(always)]
fn qos_cost(cmd: &NvmCommand, ext: Option<Extent>, flush_phase: bool) -> Option<Cost> {
    match (cmd.charge, ext) {
        (Charge::Read, Some(e)) => Some(Cost {
            read: e.bytes,
            write: 0,
        }),
        (Charge::Write, Some(e)) => Some(Cost {
            read: 0,
            write: e.bytes,
        }),
        (Charge::Command, _) if !flush_phase => Some(Cost::default()),
        _ => None,
    }
}

/// Registers an ordinary write in flight on `ns`'s write lock; `None`: it waits behind a
/// fused pair (keeps its place in `waiting` for the retry).
#[inline]
fn begin_write(
    waiting: &mut Vec<(u16, Hold)>,
    ns: &Namespace,
    cid: u16,
    ext: Extent,
    io: &mut dyn IoSubmit,
) -> Option<Begun> {
    // Nothing of this queue parked and no fused pair registered on the namespace.
    if waiting.is_empty() && ns.writes.try_count() {
        return Some(Begun::Counted);
    }
    begin_write_fused(waiting, ns, cid, ext, io)
}

#[cold]
fn begin_write_fused(
    waiting: &mut Vec<(u16, Hold)>,
    ns: &Namespace,
    cid: u16,
    ext: Extent,
    io: &mut dyn IoSubmit,
) -> Option<Begun> {
    let i = waiting.iter().position(|(c, _)| *c == cid);
    let mut token = i.map(|i| waiting[i].1.token());
    // The reactor's waker is cloned only if the write has to wait.
    let begun = ns
        .writes
        .try_begin_write(&mut token, range(ext), io.external());
    match (begun, i, token) {
        (Some(_), Some(i), _) => drop(waiting.swap_remove(i)),
        (None, None, Some(t)) => waiting.push((cid, Hold::new(&ns.writes, t))),
        _ => {}
    }
    begun
}

/// After the backend took a write that holds the write lock as `begun`: released now if it
/// is done, else on completion (`Fusing::writes`, see [`finish`]).
#[inline(always)]
fn write_started(
    writes: &mut Vec<(u16, Begun, u64)>,
    ns: &Namespace,
    cid: u16,
    r: &Started,
    ext: Extent,
    begun: Begun,
) {
    match r {
        Started::Done(_) => ns.writes.end_write(range(ext), begun),
        Started::Submitted => writes.push((cid, begun, ns.writes.id())),
    }
}

/// Whether a write (Write, Write Zeroes) must be durable when it completes: FUA (CDW12 bit
/// 30, NVM Command Set 1.0 §3.2.6, §3.2.8), or no volatile write cache for this controller's
/// host — none reported (a namespace with a cache added by a reload since) or Feature 06h WCE
/// off (`Controller::vwc_present`).
#[inline(always)]
fn durable(ctrl: &Controller, sqe: &Sqe) -> bool {
    sqe.cdw12 & FUA != 0 || !ctrl.volatile_write_cache()
}

/// Submits the data of a Write (or of the Write of a fused pair) covering `ext` of `ns`, with
/// FUA when it must be durable ([`durable`]).
#[inline(always)]
fn start_write(
    ctrl: &Controller,
    ns: &Namespace,
    sqe: &Sqe,
    data: &mut [u8],
    ext: Extent,
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Started {
    ns.stats.write_started();
    let request = BackendRequest::Write {
        offset: ext.offset,
        fua: durable(ctrl, sqe),
    };
    ns.backend
        .start(request, &mut data[..ext.bytes as usize], tag, io)
}

/// A validated LBA range of one namespace.
#[derive(Debug, Clone, Copy)]
struct Extent {
    slba: u64,
    offset: u64,
    bytes: u64,
}

/// The controller status the I/O path needs, read from atomics only.
fn controller_gate(ctrl: &Controller) -> Result<(), Status> {
    // The controller is gone (keep-alive expiry, admin queue closed, subsystem removed); the
    // queue is being torn down.
    if ctrl.terminated().is_some() {
        return Err(Status::ABORTED_SQ_DELETION);
    }
    if !ctrl.is_ready() {
        // NVMe Base 2.0 §3.5: no I/O while the controller is not enabled (or reset).
        return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    Ok(())
}

/// Starting LBA and number of blocks → checked byte extent (no overflow, inside capacity).
fn extent(ns: &Namespace, slba: u64, nlb: u64) -> Result<Extent, Completion> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks && nlb > 0 => Ok(Extent {
            slba,
            offset: slba << ns.lba_shift,
            bytes: nlb << ns.lba_shift,
        }),
        _ => Err(Completion::fail(Status::LBA_OUT_OF_RANGE)
            .at(40)
            .with_lba(slba)),
    }
}

/// SLBA (CDW10/11).
fn slba(sqe: &Sqe) -> u64 {
    sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32
}

/// NLB (CDW12 15:0) is 0's based.
fn nlb(sqe: &Sqe) -> u64 {
    (sqe.cdw12 & 0xffff) as u64 + 1
}

/// Backend error → NVMe status (NVMe Base 2.0 Figures 94 and 96). EIO is a media error.
fn backend_status(op: u8, error: BlockError) -> Status {
    match error {
        BlockError::Media => {
            if op == nvm_opcode::READ || op == nvm_opcode::COMPARE {
                Status::UNRECOVERED_READ_ERROR
            } else {
                Status::WRITE_FAULT
            }
        }
        BlockError::NoSpace => Status::CAPACITY_EXCEEDED.with_dnr(),
        // The backend's medium turned read-only (a file system remounted read-only).
        BlockError::ReadOnly => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
        // The op was cancelled for an Abort (IoSubmit::cancel, NVMe Base 2.0 §5.1).
        BlockError::Canceled => Status::ABORT_REQUESTED,
        // The backend has no way to do this (a device that can neither discard nor
        // write-zeroes on a kernel without the discard command): not worth retrying.
        BlockError::Unsupported => Status::INVALID_FIELD.with_dnr(),
        // Ceph refused this process's RADOS client (EBLOCKLISTED is ESHUTDOWN): another
        // gateway of its gateway group fenced it and owns the namespace's ANA group now. The
        // namespace is inaccessible through this controller (§8.1.3.3); a path status makes
        // the host retry on another path instead of failing the I/O.
        BlockError::Fenced => Status::ANA_INACCESSIBLE,
        BlockError::Invalid | BlockError::Other(_) => Status::INTERNAL_ERROR,
    }
}

/// Picks up a namespace table published since the last command: one atomic load per
/// command, the lock only after a change. The table is the host's view (`visibility`), so a
/// namespace hidden from it is simply absent: no per-command check.
#[inline]
fn refresh(ctrl: &Controller, subsys: &Subsystem, state: &mut IoState) {
    if subsys.ns_generation() != state.generation {
        pick_up_view(ctrl, subsys, state);
    }
}

/// [`refresh`] from the queue's periodic poll: an idle queue lets go of namespaces removed
/// since its last command (their backends close, their files leave the rings) within a tick
/// rather than at its next command. Ops still in flight on a removed namespace keep what they
/// need: the kernel holds its own reference to an op's file, as when a command's refresh
/// drops the table.
pub(crate) fn refresh_idle(cx: &mut IoContext<'_>) {
    refresh(cx.ctrl, cx.subsys, cx.state);
}

/// Out of line and cold: runs once per published change, and building the host's view must not
/// weigh on the per-command path `refresh` is inlined into.
#[cold]
#[inline(never)]
fn pick_up_view(ctrl: &Controller, subsys: &Subsystem, state: &mut IoState) {
    let (table, ana, generation) = subsys.published_for(&ctrl.hostnqn);
    state.ana = ana.port_view(ctrl.peer.port_id);
    (state.table, state.generation) = (table, generation);
    // Read after the generation: a change published in between is picked up next time.
    let applied = subsys.qos_for(&ctrl.hostnqn);
    match &mut state.qos {
        Some(q) => {
            q.update(applied);
            if q.is_idle() {
                state.qos = None;
            }
        }
        None => state.qos = qos_state(applied),
    }
}

/// The active namespace `nsid`, borrowed from the queue's cached table (no reference count
/// traffic on the shared namespace per command).
fn lookup(table: &NamespaceTable, nsid: u32) -> Result<&Namespace, Completion> {
    let invalid = || Completion::fail(Status::INVALID_NAMESPACE).at(4);
    if nsid == 0 || nsid == u32::MAX {
        return Err(invalid());
    }
    table.get(nsid).map(|ns| &**ns).ok_or_else(invalid)
}

/// Everything that can be checked before data moves. Returns the extent for commands that
/// address LBAs.
#[inline(always)]
fn check(
    ctrl: &Controller,
    subsys: &Subsystem,
    state: &mut IoState,
    cmd: &NvmCommand,
    sqe: &Sqe,
    data_len: u32,
) -> Result<Option<Extent>, Completion> {
    controller_gate(ctrl).map_err(Completion::err)?;
    refresh(ctrl, subsys, state);
    check_ns(ctrl, subsys, &state.table, &state.ana, cmd, sqe, data_len).map(|(_, ext)| ext)
}

/// [`check`] after the gate and the refresh, with the namespace found (inlined into both
/// callers: as a call it costs a quarter of itself in register saves and the result's copy).
#[inline(always)]
fn check_ns<'t>(
    ctrl: &Controller,
    subsys: &Subsystem,
    table: &'t NamespaceTable,
    ana: &PortAnaView,
    cmd: &NvmCommand,
    sqe: &Sqe,
    data_len: u32,
) -> Result<(&'t Namespace, Option<Extent>), Completion> {
    let ns = lookup(table, sqe.nsid)?;
    // ANA (NVMe Base 2.0 §8.1.3): a group that is not accessible through this port refuses
    // every I/O command with a path status (no DNR), so the host retries on another path.
    if let Some(status) = ana.io_status(ns.anagrpid) {
        return Err(Completion::err(status));
    }
    if cmd.op == Op::Reservation {
        // Not served where another gateway could hold a different registration.
        if !subsys.reservations_supported() {
            return Err(Completion::fail(Status::INVALID_OPCODE));
        }
        return Ok((ns, None));
    }
    // NVMe Base 2.0 Figure 333: Reservation Conflict for the command groups a reservation
    // held by another host excludes.
    ns.reservations
        .check_io(&ctrl.hostid, cmd.access)
        .map_err(Completion::err)?;
    if cmd.writes && ns.read_only {
        return Err(Completion::fail(Status::NAMESPACE_WRITE_PROTECTED));
    }
    match cmd.lbas {
        Lbas::WithData => {
            let ext = extent(ns, slba(sqe), nlb(sqe))?;
            // The SGL must describe exactly NLB blocks (NVMe Base 2.0 §4.3.2).
            if ext.bytes != data_len as u64 {
                return Err(Completion::fail(Status::DATA_SGL_LENGTH_INVALID).with_lba(ext.slba));
            }
            Ok((ns, Some(ext)))
        }
        Lbas::Only => Ok((ns, Some(extent(ns, slba(sqe), nlb(sqe))?))),
        Lbas::DsmRanges => {
            let ranges = (sqe.cdw10 & 0xff) as usize + 1;
            if (data_len as usize) < ranges * DSM_RANGE_SIZE {
                return Err(Completion::fail(Status::DATA_SGL_LENGTH_INVALID));
            }
            Ok((ns, None))
        }
        Lbas::None => Ok((ns, None)),
        Lbas::CopyRanges => {
            if (data_len as usize) < copy::data_len(sqe) {
                return Err(Completion::fail(Status::DATA_SGL_LENGTH_INVALID));
            }
            Ok((ns, None))
        }
    }
}

/// `ns` is `None` when a reload removed the namespace while its op was in flight.
fn account(ns: Option<&Namespace>, op: u8, bytes: u64) {
    match (op, ns) {
        (nvm_opcode::READ, Some(ns)) => ns.stats.read_done(bytes),
        (nvm_opcode::WRITE, Some(ns)) => ns.stats.write_done(bytes),
        _ => {}
    }
}

#[cold]
fn io_error(counters: &IoCounters, sqe: &Sqe, error: BlockError, lba: u64) -> Completion {
    let status = backend_status(sqe.opcode, error);
    if status == Status::UNRECOVERED_READ_ERROR || status == Status::WRITE_FAULT {
        IoCounters::add(&counters.media_errors, 1);
    }
    if error == BlockError::ReadOnly {
        // SMART Critical Warning bit 3 (read-only medium), NVMe Base 2.0 Figure 207.
        counters.read_only.store(true, Ordering::Relaxed);
    }
    tracing::debug!(
        nsid = sqe.nsid,
        opcode = sqe.opcode,
        %error,
        lba,
        "backend I/O failed"
    );
    Completion {
        // A cancelled op is an Abort that came in time, not a failure of the storage.
        backend_failed: error != BlockError::Canceled,
        ..Completion::err(status).with_lba(lba)
    }
}

/// Accounts a completed data command and maps its result.
#[inline(always)]
fn sync_result(
    counters: &IoCounters,
    ns: &Namespace,
    sqe: &Sqe,
    r: std::io::Result<()>,
    ext: Extent,
) -> Completion {
    match r {
        Ok(()) => {
            account(Some(ns), sqe.opcode, ext.bytes);
            if sqe.opcode == nvm_opcode::READ {
                Completion::data(ext.bytes as usize)
            } else {
                Completion::ok()
            }
        }
        Err(e) => io_error(counters, sqe, BlockError::from_io(&e), ext.slba),
    }
}

#[inline(always)]
fn started(counters: &IoCounters, ns: &Namespace, sqe: &Sqe, r: Started, ext: Extent) -> Exec {
    match r {
        Started::Submitted => Exec::Submitted,
        Started::Done(r) => sync_result(counters, ns, sqe, r, ext).into(),
    }
}

/// What Connect made of an I/O queue: its controller and subsystem (shared) and its own state.
#[derive(Debug)]
pub(crate) struct IoQueue {
    pub ctrl: Arc<Controller>,
    pub subsys: Arc<Subsystem>,
    pub qid: u16,
    /// `Controller::enable_epoch` at Connect; a reset since then deletes this queue.
    pub epoch: u32,
    /// Kept on the queue, off the shared controller, so the I/O path takes no lock.
    pub state: IoState,
}

impl IoQueue {
    pub fn context(&mut self) -> IoContext<'_> {
        IoContext {
            ctrl: &self.ctrl,
            subsys: &self.subsys,
            state: &mut self.state,
            lend: None,
        }
    }
}

/// What an I/O command may use of its queue: the controller and its subsystem (shared) and
/// the queue's own I/O state.
pub(crate) struct IoContext<'a> {
    pub ctrl: &'a Controller,
    pub subsys: &'a Subsystem,
    pub state: &'a mut IoState,
    /// The transport sends reads from the backend's memory where it can (`Backend::lend`):
    /// a Read completed that way leaves its bytes here instead of in the data buffer.
    pub lend: Option<&'a mut Option<Lent>>,
}

/// `prepare` for I/O queues, once the table gave `cmd` (its direction and data limit): the
/// pairing of fused commands and the checks of `check`.
pub(crate) fn admission(
    cx: &mut IoContext,
    cmd: &NvmCommand,
    sqe: &Sqe,
    data_len: u32,
) -> Result<(), Status> {
    let IoContext {
        ctrl,
        subsys,
        state,
        ..
    } = cx;
    let plan = state.fusing.plan(sqe)?;
    let r = check(ctrl, subsys, state, cmd, sqe, data_len).map_err(|c| c.status);
    state.fusing.admitted(plan, sqe, r.is_ok());
    r.map(|_| ())
}

/// The byte range a Write / Write Zeroes holds in the namespace's write lock.
fn range(ext: Extent) -> Range {
    Range {
        start: ext.offset,
        end: ext.offset + ext.bytes,
    }
}

/// Runs the NVM command `sqe` whose table entry `prepare` picked (`cmd`): the checks again
/// against the namespace table of now, the QoS gate, then its `Op`.
pub(crate) fn execute(
    cx: &mut IoContext,
    cmd: &NvmCommand,
    sqe: &Sqe,
    data: &mut [u8],
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Exec {
    match sqe.fuse() {
        sqe_flags::FUSE_FIRST => {
            return match cx.state.fusing.first(sqe, data) {
                First::Fail(status) => Completion::err(status).into(),
                First::Hold => Exec::Held,
            }
        }
        sqe_flags::FUSE_SECOND => return fused_write(cx, cmd, sqe, data, tag, io),
        _ => {}
    }
    let IoContext {
        ctrl,
        subsys,
        state,
        lend,
    } = cx;
    if let Some(i) = state.jobs.iter().position(|j| j.cid == sqe.cid) {
        // A host reusing the CID of a Copy or Verify whose step is in flight (NVMe Base 2.0
        // §4.2: CIDs are unique among outstanding commands) is refused: the job's buffer is
        // the kernel's until that step completes.
        if state.jobs[i].in_flight || !matches!(cmd.op, Op::Copy | Op::Verify) {
            return Completion::fail(Status::CID_CONFLICT).into();
        }
        // The next step of a Copy or Verify whose previous step completed.
        let job = state.jobs.swap_remove(i);
        return run_job(ctrl, state, sqe, job, tag, io);
    }
    // The second run of a durable Write Zeroes whose zeroing completed: its Flush. Taken
    // before any check, so that a failing check cannot leave the mark for a later command
    // with this CID.
    let flush_phase = !state.durable_zeroes.is_empty() && take_zeroed(state, sqe);
    // Likewise the second run of a Reservation Report whose state was read from a gateway
    // group's store: it answers from what was read.
    let fresh_report = !state.fresh_reports.is_empty() && take_fresh_report(state, sqe);
    if let Err(s) = controller_gate(ctrl) {
        return Completion::err(s).into();
    }
    refresh(ctrl, subsys, state);
    let IoState {
        table,
        ana,
        counters,
        fusing,
        compares,
        preempt_drains,
        qos,
        ..
    } = state;
    let (ns, ext) = match check_ns(ctrl, subsys, table, ana, cmd, sqe, data.len() as u32) {
        Ok(found) => found,
        Err(c) => {
            // A Preempt and Abort waiting for writes to drain whose namespace went: it ends
            // here, and so does its hold on the write lock.
            if !preempt_drains.is_empty() {
                preempt_drains.retain(|d| d.0 != sqe.cid);
            }
            // A command held by a QoS limit whose namespace went (or that fails a check now).
            if let Some(q) = qos.as_mut().filter(|q| q.holds()) {
                q.forget(sqe.cid, Instant::now());
            }
            return c.into();
        }
    };
    // QoS (`qos`): held commands wait in the queue's FIFO; the reactor ticks the connection
    // when the first of them may go, and the transport runs them again.
    if let Some(q) = qos {
        if let Some(cost) = qos_cost(cmd, ext, flush_phase) {
            if let Gate::Hold(at) = q.gate(sqe.cid, sqe.nsid, cost, Instant::now()) {
                io.wake_at(at);
                return Exec::Blocked;
            }
        }
    }
    let Fusing {
        waiting_writes,
        writes,
        ..
    } = &mut **fusing;
    match (cmd.op, ext) {
        (Op::Read, Some(ext)) => {
            ns.stats.read_started();
            if let Some(out) = lend {
                if let Some(bytes) = ns.backend.lend(ext.offset, ext.bytes as usize) {
                    **out = Some(bytes);
                    return started(counters, ns, sqe, Started::Done(Ok(())), ext);
                }
            }
            let request = BackendRequest::Read { offset: ext.offset };
            let r = ns
                .backend
                .start(request, &mut data[..ext.bytes as usize], tag, io);
            started(counters, ns, sqe, r, ext)
        }
        (Op::Write, Some(ext)) => {
            // A fused Compare and Write holds (or waits for) these LBAs: park until it is done.
            let Some(begun) = begin_write(waiting_writes, ns, sqe.cid, ext, io) else {
                return Exec::Blocked;
            };
            let r = start_write(ctrl, ns, sqe, data, ext, tag, io);
            write_started(writes, ns, sqe.cid, &r, ext, begun);
            started(counters, ns, sqe, r, ext)
        }
        (Op::Flush, _) => {
            let r = ns.backend.start(BackendRequest::Flush, &mut [], tag, io);
            let whole = Extent {
                slba: 0,
                offset: 0,
                bytes: 0,
            };
            started(counters, ns, sqe, r, whole)
        }
        (Op::WriteZeroes, Some(ext)) if flush_phase => {
            let r = ns.backend.start(BackendRequest::Flush, &mut [], tag, io);
            zeroes_started(counters, sqe, r, ext.slba)
        }
        (Op::WriteZeroes, Some(ext)) => {
            let Some(begun) = begin_write(waiting_writes, ns, sqe.cid, ext, io) else {
                return Exec::Blocked;
            };
            let ranges = [(ext.offset, ext.bytes)];
            let what = Zeroing::WriteZeroes {
                deallocate: sqe.cdw12 & DEAC != 0,
            };
            let r = ns.backend.start_zeroes(&ranges, what, tag, io);
            write_started(writes, ns, sqe.cid, &r, ext, begun);
            // The zeroes must be durable when the command completes, as a Write's data would
            // be; zeroing through a cache (fallocate, discard, zero writes) is not, so a Flush
            // follows it.
            if durable(ctrl, sqe) && ns.backend.capabilities().volatile_cache {
                match r {
                    Started::Submitted => state.durable_zeroes.push((sqe.cid, false)),
                    Started::Done(Ok(())) => {
                        let r = ns.backend.start(BackendRequest::Flush, &mut [], tag, io);
                        return zeroes_started(counters, sqe, r, ext.slba);
                    }
                    Started::Done(Err(_)) => {}
                }
            }
            zeroes_started(counters, sqe, r, ext.slba)
        }
        (Op::DatasetManagement, _) => dataset_management(ns, counters, sqe, data, tag, io),
        (Op::Reservation, _) => {
            let op = sqe.opcode;
            // A Preempt and Abort whose reservation change is made, waiting for writes to
            // drain (a host reusing its CID meanwhile breaks NVMe Base 2.0 §4.2: refused).
            if let Some(i) = preempt_drains.iter().position(|d| d.0 == sqe.cid) {
                if op != nvm_opcode::RESERVATION_ACQUIRE {
                    return Completion::fail(Status::CID_CONFLICT).into();
                }
                return preempt_abort_drained(preempt_drains, i, io);
            }
            // A change may write the store. A report through a gateway group's store first
            // reads the stored state (another gateway may have changed it), off the reactor;
            // its next run answers from what was read.
            let offload = if op == nvm_opcode::RESERVATION_REPORT {
                !fresh_report && ns.reservations.shared()
            } else {
                ns.reservations.saves()
            };
            if offload {
                if let (Some(done), Some(ns)) = (io.external(), table.get(sqe.nsid)) {
                    let ns = Arc::clone(ns);
                    return offload_reservation(
                        &mut state.reservation_changes,
                        done,
                        ns,
                        ctrl.hostid,
                        sqe,
                        data,
                        tag,
                    );
                }
            }
            let (done, notices) = reservation::execute(&ns.reservations, ctrl.hostid, sqe, data);
            subsys.notify_reservation(sqe.nsid, &notices);
            if preempts_with_abort(sqe, &done) {
                preempt_abort_wait(preempt_drains, ns, sqe.cid, done);
                return preempt_abort_drained(preempt_drains, preempt_drains.len() - 1, io);
            }
            done.into()
        }
        (Op::Compare, Some(ext)) => compare(ns, counters, compares, sqe, data, ext, tag, io),
        (Op::Verify, Some(ext)) => {
            let job = Job::verify(ns, sqe, ext.slba, nlb(sqe), copy::MAX_COPY_BYTES);
            run_job(ctrl, state, sqe, job, tag, io)
        }
        (Op::Copy, _) => {
            let (reads, dest, total) = match copy::plan_copy(ns, sqe, data) {
                Ok(p) => p,
                Err(c) => return c.into(),
            };
            let ext = Extent {
                slba: slba(sqe),
                offset: dest,
                bytes: total,
            };
            // The destination is written like a Write: it waits behind a fused pair.
            let Some(begun) = begin_write(waiting_writes, ns, sqe.cid, ext, io) else {
                return Exec::Blocked;
            };
            let job = Job::copy(ns, sqe, reads, dest, total, begun);
            run_job(ctrl, state, sqe, job, tag, io)
        }
        _ => Completion::fail(Status::INVALID_OPCODE).into(),
    }
}

/// Completion of a submitted op: `result` is bytes transferred or -errno. A short transfer
/// cannot be resumed here, so it is an error too.
pub(crate) fn finish(
    cx: &mut IoContext,
    cmd: &NvmCommand,
    sqe: &Sqe,
    result: i32,
) -> Option<Completion> {
    let IoContext {
        ctrl,
        subsys,
        state,
        ..
    } = cx;
    if cmd.op == Op::Reservation && !state.reservation_changes.is_empty() {
        if let Some(i) = state
            .reservation_changes
            .iter()
            .position(|(cid, _)| *cid == sqe.cid)
        {
            let (_, pending) = state.reservation_changes.swap_remove(i);
            let (done, notices) = pending
                .take()
                .unwrap_or_else(|| (Completion::fail(Status::INTERNAL_ERROR), Vec::new()));
            subsys.notify_reservation(sqe.nsid, &notices);
            if sqe.opcode == nvm_opcode::RESERVATION_REPORT && done.status.is_success() {
                // Read again: the next run reports (it has the host's buffer).
                state.fresh_reports.push(sqe.cid);
                return None;
            }
            if preempts_with_abort(sqe, &done) {
                // The drain starts from the command's next run, which has the submitter
                // (the waker); `None` blocks it until then.
                refresh(ctrl, subsys, state);
                if let Ok(ns) = lookup(&state.table, sqe.nsid) {
                    preempt_abort_wait(&mut state.preempt_drains, ns, sqe.cid, done);
                    return None;
                }
            }
            return Some(done);
        }
    }
    match cmd.op {
        Op::Copy | Op::Verify => return job_step_done(state, sqe, result),
        Op::Compare => return Some(compare_finish(state, sqe, sqe, result)),
        // The Write of a fused pair (the only fused second half, `fused`).
        Op::Write if sqe.fuse() == sqe_flags::FUSE_SECOND => {
            if let Some(i) = state.fusing.comparing.iter().position(|f| f.0 == sqe.cid) {
                return fused_compare_finish(state, i, sqe, result);
            }
            // The pair's Write is done: its LBAs are free for other writes again.
            state.fusing.running.retain(|(cid, _)| *cid != sqe.cid);
        }
        Op::Write | Op::WriteZeroes => end_write(ctrl, subsys, state, sqe),
        _ => {}
    }
    if cmd.op == Op::WriteZeroes && !state.durable_zeroes.is_empty() {
        if let Some(i) = state
            .durable_zeroes
            .iter()
            .position(|&(cid, zeroed)| cid == sqe.cid && !zeroed)
        {
            if result >= 0 {
                // Zeroed: the transport runs the command again, which starts its Flush.
                state.durable_zeroes[i].1 = true;
                return None;
            }
            state.durable_zeroes.swap_remove(i);
        }
    }
    let counters = &state.counters;
    if result < 0 {
        return Some(io_error(
            counters,
            sqe,
            BlockError::from_errno(-result),
            slba(sqe),
        ));
    }
    let bytes = result as u64;
    if matches!(cmd.op, Op::Read | Op::Write) {
        refresh(ctrl, subsys, state);
        // If a reload removed the namespace meanwhile, its size is unknown: the
        // backend completed the op it was given, so only the length check is skipped.
        let ns = lookup(&state.table, sqe.nsid).ok();
        if let Some(ns) = ns {
            let expected = nlb(sqe) << ns.lba_shift;
            if bytes != expected {
                tracing::warn!(nsid = sqe.nsid, result, expected, "short backend transfer");
                return Some(io_error(&state.counters, sqe, BlockError::Media, slba(sqe)));
            }
        }
        account(ns, sqe.opcode, bytes);
    }
    Some(if cmd.op == Op::Read {
        Completion::data(bytes as usize)
    } else {
        Completion::ok()
    })
}

/// A Write or Write Zeroes completed: the namespace's write lock no longer counts it
/// (`write_started`).
#[inline]
fn end_write(ctrl: &Controller, subsys: &Subsystem, state: &mut IoState, sqe: &Sqe) {
    let Some(i) = state.fusing.writes.iter().position(|w| w.0 == sqe.cid) else {
        return;
    };
    let (_, begun, lock) = state.fusing.writes.swap_remove(i);
    refresh(ctrl, subsys, state);
    // A namespace replaced meanwhile has a lock of its own: this write never held it.
    match lookup(&state.table, sqe.nsid) {
        Ok(ns) if ns.writes.id() == lock => {
            let ext = Extent {
                slba: slba(sqe),
                offset: slba(sqe) << ns.lba_shift,
                bytes: nlb(sqe) << ns.lba_shift,
            };
            ns.writes.end_write(range(ext), begun);
        }
        _ => {}
    }
}

/// Starts the next step of `job` (a Copy or Verify, `copy`): kept in the queue's state while a
/// step is in flight; done (success or the failed step's status) otherwise.
fn run_job(
    ctrl: &Controller,
    state: &mut IoState,
    sqe: &Sqe,
    mut job: Job,
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Exec {
    let Some(ns) = state.table.get(sqe.nsid).cloned() else {
        // A reload removed the namespace between two steps.
        return Completion::fail(Status::INVALID_NAMESPACE).into();
    };
    match job.advance(&ns, tag, io, !ctrl.volatile_write_cache()) {
        Ok(true) => {
            state.jobs.push(job);
            Exec::Submitted
        }
        Ok(false) => Completion::ok().into(),
        Err(e) => step_error(&state.counters, sqe, e).into(),
    }
}

/// A step of a Copy or Verify completed: `None` (not done, the transport runs the command
/// again for the next step) or its completion.
fn job_step_done(state: &mut IoState, sqe: &Sqe, result: i32) -> Option<Completion> {
    let Some(i) = state
        .jobs
        .iter()
        .position(|j| j.cid == sqe.cid && j.in_flight)
    else {
        tracing::error!(
            cid = sqe.cid,
            "completion for a Copy/Verify that is not running"
        );
        return Some(Completion::fail(Status::INTERNAL_ERROR));
    };
    match state.jobs[i].completed(result) {
        Ok(true) => None,
        Ok(false) => {
            state.jobs.swap_remove(i);
            Some(Completion::ok())
        }
        Err(e) => {
            state.jobs.swap_remove(i);
            Some(step_error(&state.counters, sqe, e))
        }
    }
}

/// A failed Copy/Verify step, reported like the Read or Write it was (media errors counted).
fn step_error(counters: &IoCounters, sqe: &Sqe, e: StepError) -> Completion {
    let op = if e.reading {
        nvm_opcode::READ
    } else {
        nvm_opcode::WRITE
    };
    let as_step = Sqe { opcode: op, ..*sqe };
    io_error(counters, &as_step, e.error, e.slba)
}

/// Dataset Management (NVM Command Set 1.0 §3.3.3): with the Deallocate attribute every range
/// is deallocated (reads zero afterwards); without it the ranges are hints and ignored.
fn dataset_management(
    ns: &Namespace,
    counters: &IoCounters,
    sqe: &Sqe,
    data: &[u8],
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Exec {
    if sqe.cdw11 & DSM_AD == 0 {
        return Completion::ok().into();
    }
    let ranges = (sqe.cdw10 & 0xff) as usize + 1;
    let Some(list) = data.get(..ranges * DSM_RANGE_SIZE) else {
        return Completion::fail(Status::DATA_SGL_LENGTH_INVALID).into();
    };
    // Validate every range before deallocating any. At most 256 ranges (NR is 8 bits).
    let mut extents = [Extent {
        slba: 0,
        offset: 0,
        bytes: 0,
    }; 256];
    let mut n = 0;
    for r in list.as_chunks::<{ DsmRange::SIZE }>().0 {
        let r = DsmRange::decode(r);
        if r.blocks == 0 {
            continue;
        }
        match extent(ns, r.slba, r.blocks as u64) {
            Ok(e) => {
                extents[n] = e;
                n += 1;
            }
            Err(c) => return c.into(),
        }
    }
    // Every range as one backend operation with one completion.
    let mut ranges = [(0u64, 0u64); 256];
    for (r, e) in ranges.iter_mut().zip(&extents[..n]) {
        *r = (e.offset, e.bytes);
    }
    let lba = extents[..n].first().map_or(0, |e| e.slba);
    let r = ns
        .backend
        .start_zeroes(&ranges[..n], Zeroing::Deallocate, tag, io);
    zeroes_started(counters, sqe, r, lba)
}

/// An asynchronous Write Zeroes / Deallocate: completes through `Queue::finish` with result 0
/// (no bytes move), or failed before anything was submitted.
fn zeroes_started(counters: &IoCounters, sqe: &Sqe, r: Started, lba: u64) -> Exec {
    match r {
        Started::Submitted => Exec::Submitted,
        Started::Done(Ok(())) => Completion::ok().into(),
        Started::Done(Err(e)) => io_error(counters, sqe, BlockError::from_io(&e), lba).into(),
    }
}

/// Takes the mark [`finish`] left for a Reservation Report whose store was read.
#[cold]
fn take_fresh_report(state: &mut IoState, sqe: &Sqe) -> bool {
    let Some(i) = state.fresh_reports.iter().position(|&cid| cid == sqe.cid) else {
        return false;
    };
    state.fresh_reports.swap_remove(i);
    sqe.opcode == nvm_opcode::RESERVATION_REPORT
}

/// Takes the mark of a durable Write Zeroes whose zeroing completed (`IoState::durable_zeroes`):
/// `true` when `sqe` is that command run again for its Flush.
#[cold]
fn take_zeroed(state: &mut IoState, sqe: &Sqe) -> bool {
    let Some(i) = state
        .durable_zeroes
        .iter()
        .position(|&(cid, zeroed)| cid == sqe.cid && zeroed)
    else {
        return false;
    };
    state.durable_zeroes.swap_remove(i);
    sqe.opcode == nvm_opcode::WRITE_ZEROES
}
