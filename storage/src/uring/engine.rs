//! The engine: the ring, its slots, and the submission and completion loop.

mod complete;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, IoUring};

use super::resources::{Buffers, Files, Span};
use super::sqe::{build_sqe, AlignedZeroes, InFlight, Timer, ZERO_CHUNK};
use super::table::Table;
use super::{check_opcodes, classify_setup_error, RingOptions, UringError, FIXED_BUFFER_SLOTS};
use crate::fixedbuf::BufferUnit;
use crate::{BlockOp, BlockOpKind, Deferred, ExternalCompletions, IoSubmit, ZeroMethod};

/// How often an op that the kernel bounced with `-EAGAIN`/`-EINTR` is retried before that error
/// is reported to the host. io_uring normally retries internally (io-wq punt), so this only
/// bounds a pathological loop.
const MAX_TRANSIENT_RETRIES: u8 = 8;

/// How long dropping the engine waits for ops a backend library (librbd) still holds. Those
/// may hang on an unreachable cluster; past this the process is exiting anyway.
const EXTERNAL_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// `user_data` bit of an `IORING_OP_ASYNC_CANCEL` SQE; op SQEs carry their slot index, which
/// never reaches it.
const CANCEL_USER_DATA: u64 = 1 << 63;

/// Several ops reported as one completion.
#[derive(Debug)]
struct Group {
    tag: u64,
    remaining: usize,
    /// 0, or the first error a member reported.
    result: i32,
}

/// The per-reactor io_uring. `Send` (it may be created on the main thread, so that an
/// unavailable io_uring is reported before any reactor starts, and then moved into its reactor)
/// but not `Sync`: one thread submits and reaps.
pub struct UringEngine {
    pub(super) ring: IoUring,
    eventfd: OwnedFd,
    /// Ops by slot index; the SQE `user_data` is the slot index, not the caller's tag, so that a
    /// resubmitted remainder can never be confused with anything else.
    pub(super) slots: Vec<Option<InFlight>>,
    free_slots: Vec<u32>,
    /// Slots waiting for SQ space or for completion-queue budget (the overflow queue).
    overflow: VecDeque<u32>,
    /// SQEs pushed (submitted or not) whose CQE has not been reaped yet.
    in_kernel: usize,
    /// Cap on `in_kernel`: the CQ size, so completions never overflow the CQ even on kernels
    /// without `IORING_FEAT_NODROP`.
    max_in_kernel: usize,
    /// Ops failed without reaching the kernel (invalid op); delivered by the next `reap`.
    failed_early: VecDeque<(u64, i32)>,
    /// Scratch for draining the CQ without allocating per reap.
    cqe_scratch: Vec<(u64, i32)>,
    /// Completions of backends with their own I/O threads (librbd); they signal the same
    /// eventfd as the ring, so the reactor needs nothing beyond `fd` and `reap`.
    external: Arc<ExternalCompletions>,
    groups: Vec<Option<Group>>,
    free_groups: Vec<u32>,
    /// 4096-aligned zeroes for `ZeroMethod::WriteZeroes` (allocated on first use, never
    /// written after; the kernel only reads it).
    zero_buf: Option<Vec<u8>>,
    /// A kernel thread consumes the SQ (`RingOptions::sqpoll_idle_ms`).
    sqpoll: bool,
    pub(super) files: Table<Files>,
    pub(super) buffers: Table<Buffers>,
    /// The earliest wake-up a command held by a QoS limit asked for (`IoSubmit::wake_at`);
    /// the reactor takes it ([`UringEngine::take_wake_at`]) to time its next tick.
    wake_at: Option<std::time::Instant>,
}

// SAFETY: the only non-Send parts are the raw buffer pointers inside queued `BlockOp`s. The
// engine never dereferences them (only the kernel does, via the SQEs), so moving the engine to
// another thread moves plain addresses; the transport's buffer-lifetime rule (backend contract) is
// what keeps them valid, independent of which thread owns the engine.
unsafe impl Send for UringEngine {}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("ring_fd", &self.ring.as_raw_fd())
            .field("eventfd", &self.eventfd.as_raw_fd())
            .field("in_kernel", &self.in_kernel)
            .field("overflow", &self.overflow.len())
            .finish_non_exhaustive()
    }
}

impl UringEngine {
    /// Creates a ring with `entries` submission entries (rounded up to a power of two by the
    /// kernel) and registers a non-blocking eventfd for completion readiness.
    pub fn new(entries: u32) -> Result<Self, UringError> {
        Self::with_options(entries, RingOptions::default())
    }

    /// [`UringEngine::new`] with `options`. A kernel that refuses SQPOLL to this process
    /// (before Linux 5.11 it needs CAP_SYS_NICE; seccomp or LSM policies) gets a ring without
    /// it, and one log line saying so.
    pub fn with_options(entries: u32, options: RingOptions) -> Result<Self, UringError> {
        let entries = entries.max(1);
        let plain = || {
            IoUring::builder()
                .setup_clamp()
                .build(entries)
                .map_err(|source| classify_setup_error(entries, source))
        };
        let ring = match options.sqpoll_idle_ms {
            None => plain()?,
            Some(idle_ms) => match IoUring::builder()
                .setup_clamp()
                .setup_sqpoll(idle_ms)
                .build(entries)
            {
                Ok(ring) => ring,
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring SQPOLL refused; this reactor submits with io_uring_enter");
                    plain()?
                }
            },
        };
        let sqpoll = ring.params().is_setup_sqpoll();
        check_opcodes(&ring)?;
        let files = Table::new(&ring.submitter(), options.registered_files, u64::MAX);
        let buffers = Table::new(
            &ring.submitter(),
            FIXED_BUFFER_SLOTS,
            options.fixed_buffer_bytes,
        );
        // SAFETY: eventfd(2) has no memory-safety preconditions; the result is checked below
        // before it is wrapped.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(UringError::Eventfd(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        ring.submitter()
            .register_eventfd(eventfd.as_raw_fd())
            .map_err(UringError::RegisterEventfd)?;
        // A second descriptor for the same eventfd object, owned by the shared completion
        // channel (which may outlive the engine inside a backend library's callbacks).
        let notify = eventfd.try_clone().map_err(UringError::Eventfd)?;
        let max_in_kernel = ring.params().cq_entries() as usize;
        Ok(UringEngine {
            ring,
            eventfd,
            slots: Vec::new(),
            free_slots: Vec::new(),
            overflow: VecDeque::new(),
            in_kernel: 0,
            max_in_kernel,
            failed_early: VecDeque::new(),
            cqe_scratch: Vec::new(),
            external: Arc::new(ExternalCompletions::new(notify)),
            groups: Vec::new(),
            free_groups: Vec::new(),
            zero_buf: None,
            sqpoll,
            files,
            buffers,
            wake_at: None,
        })
    }

    /// The earliest wake-up asked for since the last call (`IoSubmit::wake_at`): the reactor
    /// ticks its connections then.
    pub fn take_wake_at(&mut self) -> Option<std::time::Instant> {
        self.wake_at.take()
    }

    /// [`UringEngine::take_wake_at`] without taking it.
    pub fn wake_at(&self) -> Option<std::time::Instant> {
        self.wake_at
    }

    /// Transport buffers registered with this ring now, and the bytes they pin.
    pub fn registered_buffers(&self) -> (usize, u64) {
        self.buffers.registered()
    }

    /// Whether a kernel thread polls this ring's submission queue.
    pub fn sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// The eventfd that becomes readable when completions are waiting: register it with the
    /// reactor's epoll (level-triggered or edge-triggered both work: `reap` drains it).
    pub fn fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// Ops submitted and not yet reaped (the reactor keeps a closed connection until its ops are
    /// gone; the daemon drains this to zero before exiting).
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len() + self.failed_early.len() + self.external.pending()
    }

    /// Hands the SQEs queued since the last call to the kernel (one `io_uring_enter` per batch),
    /// refilling the SQ from the overflow queue as the kernel consumes entries. Returns only
    /// when the SQ is empty or the kernel refuses more for now: the reactor may sleep in
    /// epoll_wait right after this, and an SQE left behind would wait for an unrelated wake-up.
    ///
    /// With SQPOLL the kernel thread takes the SQ by itself (`submit` enters the kernel only to
    /// wake it when it went idle), so SQEs in the SQ are never left behind; ops still in the
    /// overflow queue because the SQ was full wait for room (`IORING_ENTER_SQ_WAIT`).
    pub fn flush(&mut self) {
        // Once per reactor turn: empty the slots of files whose backends are gone, and the
        // registrations of transport buffers whose owners are.
        self.files.sweep(&self.ring);
        self.buffers.sweep(&self.ring);
        loop {
            self.push_overflow();
            if self.ring.submission().is_empty() {
                return;
            }
            match self.ring.submit() {
                // Nothing taken (should not happen with entries queued): try next time rather
                // than spin.
                Ok(0) => return,
                Ok(_) if self.sqpoll => {
                    // Overflow held back by the CQ budget moves on when completions are
                    // reaped (the eventfd wakes the reactor); only a full SQ is waited for.
                    if self.overflow.is_empty() || self.in_kernel >= self.max_in_kernel {
                        return;
                    }
                    if let Err(e) = self.ring.submitter().squeue_wait() {
                        if e.raw_os_error() != Some(libc::EINTR) {
                            tracing::warn!(error = %e, "io_uring SQ wait failed; retrying on next flush");
                            return;
                        }
                    }
                }
                // Possibly fewer than queued: without IORING_SETUP_SUBMIT_ALL the kernel stops
                // at an SQE that fails during submission (it still posts that SQE's CQE), so
                // go round again for the rest.
                Ok(_) => {}
                // EINTR: retry at once. EAGAIN/EBUSY: the kernel is short of resources or wants
                // its CQ drained first; the SQEs stay queued and the next flush (after a reap)
                // tries again.
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) {
                        tracing::warn!(error = %e, "io_uring_enter failed; retrying on next flush");
                    }
                    return;
                }
            }
        }
    }

    /// Delivers every available completion as `f(tag, res)`, where `res` is the total number of
    /// bytes transferred (reads and writes, always the full length on success), 0 for a flush,
    /// or `-errno`. Short transfers are resubmitted for the remainder and reported once, when
    /// complete; call [`flush`](Self::flush) afterwards to send those remainders.
    pub fn reap(&mut self, mut f: impl FnMut(u64, i32)) {
        self.drain_eventfd();
        while let Some((tag, res)) = self.failed_early.pop_front() {
            f(tag, res);
        }
        self.external.drain(&mut f);
        let mut cqes = std::mem::take(&mut self.cqe_scratch);
        loop {
            cqes.clear();
            cqes.extend(
                self.ring
                    .completion()
                    .map(|cqe| (cqe.user_data(), cqe.result())),
            );
            if cqes.is_empty() {
                break;
            }
            for &(user_data, res) in &cqes {
                self.in_kernel = self.in_kernel.saturating_sub(1);
                if let Some((tag, res)) = self.complete_one(user_data, res) {
                    f(tag, res);
                }
            }
        }
        self.cqe_scratch = cqes;
        self.push_overflow();
    }

    /// Blocks until at least one completion is available (or `in_flight` is 0). For shutdown
    /// and tests; the reactor uses the eventfd instead.
    pub fn wait(&mut self) -> io::Result<()> {
        if !self.failed_early.is_empty() || self.external.ready() {
            return Ok(());
        }
        if self.external.pending() > 0 {
            // Ring and library completions both signal the eventfd: wait on that.
            self.flush();
            return self.wait_eventfd(None).map(|_| ());
        }
        if self.in_kernel == 0 {
            return Ok(());
        }
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Parks `op` in a slot and queues it for the SQ; an op that cannot be expressed fails
    /// early (delivered by the next `reap`).
    fn enqueue(&mut self, op: BlockOp, tag: u64, group: Option<u32>) {
        self.enqueue_in(op, tag, group, None)
    }

    /// [`enqueue`](Self::enqueue), issued on the registration of `unit` when `op` lies inside
    /// it and the table has (or can make) room for it.
    fn enqueue_in(&mut self, op: BlockOp, tag: u64, group: Option<u32>, unit: Option<&BufferUnit>) {
        // The final result is the byte count as an i32; refuse what cannot be reported, and
        // data ops without a buffer (never produced by the core; a guard, not a path).
        let invalid = match op.kind {
            BlockOpKind::Read | BlockOpKind::Write { .. } => {
                op.len > i32::MAX as u32 || (op.len > 0 && op.buf.is_null())
            }
            BlockOpKind::Flush => false,
            BlockOpKind::Zeroes { len, plan } => {
                if len == 0 {
                    // Nothing to do (fallocate would answer EINVAL to a zero length).
                    self.fail_early(tag, group, 0);
                    return;
                }
                if plan.contains(&ZeroMethod::WriteZeroes) && self.zero_buf.is_none() {
                    self.zero_buf = Some(vec![0u8; ZERO_CHUNK + AlignedZeroes::ALIGN]);
                }
                // `stage` indexes the plan as a u8.
                plan.is_empty()
                    || plan.len() > usize::from(u8::MAX)
                    || len > i64::MAX as u64
                    || op.offset > i64::MAX as u64
            }
        };
        if invalid {
            self.fail_early(tag, group, -libc::EINVAL);
            return;
        }
        let file_slot = op
            .file
            .and_then(|id| self.files.get(&self.ring, id, 0, &op.fd));
        if let Some(slot) = file_slot {
            // Held until the op is released, so that the slot keeps this file.
            self.files.hold(slot);
        }
        let buf_slot = match unit {
            Some(unit) if self.buffers.enabled => unit.extent_of(&op).and_then(|extent| {
                let span = Span {
                    base: unit.base,
                    len: unit.len,
                    extent,
                };
                // The table has FIXED_BUFFER_SLOTS (< 2^16) entries: the index fits.
                let slot = self
                    .buffers
                    .get(&self.ring, unit.owner, unit.index, &span)?;
                Some(slot as u16)
            }),
            _ => None,
        };
        let entry = InFlight {
            op,
            tag,
            done: 0,
            transient_retries: 0,
            stage: 0,
            zeroed: 0,
            group,
            timer: None,
            file_slot,
            buf_slot,
        };
        self.park(entry);
    }

    /// Puts `entry` in a free slot and queues it for the SQ.
    fn park(&mut self, entry: InFlight) {
        let idx = match self.free_slots.pop() {
            Some(idx) => {
                self.slots[idx as usize] = Some(entry);
                idx
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        self.overflow.push_back(idx);
        self.push_overflow();
    }

    /// Queues an `IORING_OP_ASYNC_CANCEL` for the op (or timer) in slot `idx`; `false` when
    /// the SQ or the CQ budget has no room for it now.
    fn push_cancel(&mut self, idx: usize) -> bool {
        if self.in_kernel >= self.max_in_kernel {
            // No CQ budget for the cancel's own completion now: not cancelled.
            return false;
        }
        let sqe = opcode::AsyncCancel::new(idx as u64)
            .build()
            .user_data(CANCEL_USER_DATA | idx as u64);
        let mut sq = self.ring.submission();
        // SAFETY: an ASYNC_CANCEL SQE names no buffer or descriptor, only the user_data of
        // the op to cancel.
        if sq.is_full() || unsafe { sq.push(&sqe) }.is_err() {
            return false;
        }
        sq.sync();
        drop(sq);
        self.in_kernel += 1;
        true
    }

    /// Delivers `res` for an op that never reached the kernel, through the next `reap`.
    fn fail_early(&mut self, tag: u64, group: Option<u32>, res: i32) {
        let done = match group {
            None => Some((tag, res)),
            Some(group) => self.member_done(group, res),
        };
        if let Some(done) = done {
            self.failed_early.push_back(done);
            self.signal_eventfd();
        }
    }

    /// Moves ops from the overflow queue into the SQ while both the SQ and the CQ budget allow.
    fn push_overflow(&mut self) {
        let zeroes = AlignedZeroes::of(&self.zero_buf);
        let mut sq = self.ring.submission();
        while self.in_kernel < self.max_in_kernel && !sq.is_full() {
            let Some(idx) = self.overflow.pop_front() else {
                break;
            };
            let Some(entry) = self.slots[idx as usize].as_ref() else {
                continue;
            };
            let sqe = build_sqe(entry, idx, zeroes);
            // SAFETY: the buffer named by the SQE belongs to the transport's command slot,
            // which the transport keeps allocated and untouched until this op's completion has
            // been reaped (backend contract); the fd stays open for the life of the namespace,
            // which outlives its in-flight ops, and a registered slot keeps its file while an
            // op holds it (`Table::hold`). `push` cannot fail: `is_full` was checked above.
            if unsafe { sq.push(&sqe) }.is_err() {
                self.overflow.push_front(idx);
                break;
            }
            self.in_kernel += 1;
        }
        sq.sync();
    }

    /// Waits until the eventfd is readable; `Ok(false)` on timeout.
    fn wait_eventfd(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.eventfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        loop {
            // SAFETY: one valid pollfd on the stack, count 1.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n >= 0 {
                return Ok(n > 0);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    fn drain_eventfd(&self) {
        let mut counter = 0u64;
        // SAFETY: reads 8 bytes into a local u64 from a descriptor we own; a non-blocking
        // eventfd read either fills all 8 bytes or fails with EAGAIN.
        unsafe {
            libc::read(
                self.eventfd.as_raw_fd(),
                (&mut counter as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }

    /// Makes the eventfd readable so that the reactor calls `reap` (for ops failed early).
    fn signal_eventfd(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a local u64 to a descriptor we own.
        unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

impl IoSubmit for UringEngine {
    fn wake_at(&mut self, at: std::time::Instant) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }

    fn external(&mut self) -> Option<&Arc<ExternalCompletions>> {
        Some(&self.external)
    }

    fn submit(&mut self, op: BlockOp, tag: u64) {
        self.enqueue(op, tag, None);
    }

    fn submit_in(&mut self, op: BlockOp, tag: u64, unit: &BufferUnit) {
        self.enqueue_in(op, tag, None, Some(unit));
    }

    /// An op not yet handed to the kernel is taken back and completes with `-ECANCELED`; one
    /// in the kernel gets an `IORING_OP_ASYNC_CANCEL` naming its slot (Linux 5.5+), which
    /// cancels it if it is still waiting (it completes with `-ECANCELED`) and leaves it alone
    /// if it is running (it completes normally). Group members are never cancelled (one
    /// completion stands for all of them).
    fn cancel(&mut self, tag: u64) -> bool {
        let Some(idx) = self.slots.iter().position(|s| {
            s.as_ref()
                .is_some_and(|e| e.tag == tag && e.group.is_none())
        }) else {
            return false;
        };
        if let Some(pos) = self.overflow.iter().position(|&i| i as usize == idx) {
            // Never submitted, or a remainder waiting for room: the kernel holds nothing of it.
            self.overflow.remove(pos);
            if let Some(done) = self.release(idx, -libc::ECANCELED) {
                self.failed_early.push_back(done);
                self.signal_eventfd();
            }
            return true;
        }
        self.push_cancel(idx)
    }

    /// An `IORING_OP_TIMEOUT` in a slot of its own (Linux 5.4+), so that `cancel`, `in_flight`
    /// and the CQ budget treat it like an op.
    fn submit_after(
        &mut self,
        delay: Duration,
        buf: *mut u8,
        len: u32,
        tag: u64,
        then: Deferred,
    ) -> bool {
        self.park(InFlight {
            op: BlockOp {
                fd: -1,
                file: None,
                kind: BlockOpKind::Flush,
                offset: 0,
                buf,
                len,
            },
            tag,
            done: 0,
            transient_retries: 0,
            stage: 0,
            zeroed: 0,
            group: None,
            file_slot: None,
            buf_slot: None,
            timer: Some(Box::new(Timer {
                timespec: delay.into(),
                then,
            })),
        });
        true
    }

    fn submit_group(&mut self, ops: &[BlockOp], tag: u64) {
        match ops {
            [] => self.fail_early(tag, None, 0),
            [op] => self.enqueue(*op, tag, None),
            _ => {
                let g = Group {
                    tag,
                    remaining: ops.len(),
                    result: 0,
                };
                let group = match self.free_groups.pop() {
                    Some(i) => {
                        self.groups[i as usize] = Some(g);
                        i
                    }
                    None => {
                        self.groups.push(Some(g));
                        (self.groups.len() - 1) as u32
                    }
                };
                for op in ops {
                    self.enqueue(*op, tag, Some(group));
                }
            }
        }
    }
}

impl Drop for UringEngine {
    /// The kernel may still be writing into transport buffers: wait for every op that reached
    /// the ring before the ring (and then those buffers) go away.
    fn drop(&mut self) {
        self.overflow.clear();
        // Injected delays would hold the exit up for their whole length: cancel them (their
        // deferred work never runs; the commands are gone with their connections).
        let timers: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].as_ref().is_some_and(|e| e.timer.is_some()))
            .collect();
        for idx in timers {
            self.push_cancel(idx);
        }
        // A backend library may still write into transport buffers too; its completions only
        // touch the shared channel, so waiting here is about the buffers, and bounded.
        let deadline = Instant::now() + EXTERNAL_DRAIN_TIMEOUT;
        while self.external.pending() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::error!(
                    pending = self.external.pending(),
                    "giving up waiting for backend library ops at shutdown"
                );
                break;
            }
            let _ = self.wait_eventfd(Some(left));
            self.drain_eventfd();
            self.external.drain(|_, _| {});
        }
        let mut failures = 0;
        while self.in_kernel > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    failures += 1;
                    if failures > 100 {
                        tracing::error!(error = %e, in_kernel = self.in_kernel,
                            "giving up waiting for io_uring ops at shutdown");
                        return;
                    }
                }
            }
            let reaped = self.ring.completion().count();
            self.in_kernel = self.in_kernel.saturating_sub(reaped);
        }
    }
}
