//! The io_uring engine: one ring per reactor thread, implementing [`IoSubmit`].
//!
//! Life of an op: `submit` parks it in a slot and pushes an SQE if the submission queue has room
//! (otherwise it waits in the overflow queue); the reactor calls [`UringEngine::flush`] once per
//! loop iteration, which enters the kernel once for the whole batch; the ring posts completions
//! and signals the registered eventfd ([`UringEngine::fd`]), which the reactor watches with
//! epoll; [`UringEngine::reap`] then hands `(tag, res)` pairs to the reactor, which routes them
//! to `Queue::finish` through the transport. After reaping, call `flush` again so that ops parked
//! in the overflow queue (or resubmitted remainders) reach the kernel.
//!
//! Crash safety (what a successful completion promises):
//! * `Write { fua: true }` is issued with `RWF_DSYNC`: the kernel completes it only after the
//!   data and the metadata needed to read it back (allocation, size) are on stable media — the
//!   per-I/O equivalent of `O_DSYNC`, which is exactly NVMe FUA (NVM Command Set 1.0 §3.2.6).
//! * `Flush` is `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC` (= `fdatasync`): every write that
//!   completed before the flush was submitted is durable when it completes, which is what NVMe
//!   Flush promises for the volatile write cache (NVMe Base 2.0 §7.1).
//! * Plain writes may sit in the page cache (buffered files) or the device cache; the namespace
//!   therefore reports a volatile write cache and the host sends Flush / FUA when it needs them.
//!
//! Registered files (`RingOptions::registered_files`): an op on a backend's file
//! (`BlockOp::file`) names a slot of the ring's registered-file table instead of the descriptor
//! (IOSQE_FIXED_FILE), which spares the kernel the descriptor lookup and the file reference
//! count round trip per op (`fget`/`fput`: an atomic on a cache line every reactor that uses
//! the namespace shares). The table is keyed by [`FileId`], never by descriptor number, and
//! a slot whose backend is gone is emptied on the ring's next turn (`fileid` module comment).
//! A full table, or a kernel without sparse tables (before 5.19), means plain descriptors.
//!
//! Fixed buffers (`RingOptions::fixed_buffer_bytes`): a read or write submitted with
//! [`IoSubmit::submit_in`] lies inside a transport data buffer ([`BufferUnit`]); the ring
//! registers that buffer on its first op (`IORING_REGISTER_BUFFERS_UPDATE`, which pins its
//! pages once) and issues later ops inside it as `READ_FIXED`/`WRITE_FIXED`, so the kernel no
//! longer pins and unpins the pages of every O_DIRECT transfer. A unit's registration covers
//! the largest transfer seen in it (a power of two, at least a page), so a 1 MiB command slot
//! used for 4 KiB I/O pins 4 KiB; the sum of the registrations stays within the budget, and
//! ops beyond it use their buffers as they are. Entries are keyed by owner identity and
//! emptied on the turn after their owner goes (`fixedbuf` module comment).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring, Submitter};

use super::fileid::{self, FileId};
use super::fixedbuf::{self, BufferUnit, OwnerId};
use super::{BlockOp, BlockOpKind, Deferred, ExternalCompletions, IoSubmit, ZeroMethod};

/// How often an op that the kernel bounced with `-EAGAIN`/`-EINTR` is retried before that error
/// is reported to the host. io_uring normally retries internally (io-wq punt), so this only
/// bounds a pathological loop.
const MAX_TRANSIENT_RETRIES: u8 = 8;

/// How long dropping the engine waits for ops a backend library (librbd) still holds. Those
/// may hang on an unreachable cluster; past this the process is exiting anyway.
const EXTERNAL_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Size of the shared zero buffer `ZeroMethod::WriteZeroes` writes from, one write per chunk.
const ZERO_CHUNK: usize = 1 << 20;

/// `BLOCK_URING_CMD_DISCARD` = `_IO(0x12, 0)` (include/uapi/linux/fs.h, Linux 6.12): discard of
/// `[sqe->addr, sqe->addr + sqe->addr3)` on a block device opened for writing.
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

/// How a reactor's ring is set up (`[global] uring_sqpoll`, `uring_registered_files`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingOptions {
    /// `IORING_SETUP_SQPOLL`: a kernel thread polls the submission queue, so submitting costs
    /// no system call while it is awake; it sleeps after this many milliseconds without
    /// submissions (the next submit wakes it with one `io_uring_enter`). `None`: the reactor
    /// submits with `io_uring_enter` itself, once per turn.
    pub sqpoll_idle_ms: Option<u32>,
    /// Slots of the ring's registered-file table (`IORING_REGISTER_FILES_SPARSE`): the first
    /// op on a backend's file puts it in a free slot, and later ops name the slot. 0: no
    /// table, every op names its descriptor. The kernel refuses more slots than
    /// `RLIMIT_NOFILE`; a refused table means no table, and one log line.
    pub registered_files: u32,
    /// Bytes of transport data buffers the ring may keep registered (pinned) for
    /// `READ_FIXED`/`WRITE_FIXED`; 0: no registered buffers, every op pins its own pages.
    /// A kernel without sparse buffer tables (before 5.19), or one that refuses the pinning
    /// (RLIMIT_MEMLOCK without CAP_IPC_LOCK), means none, and one log line.
    pub fixed_buffer_bytes: u64,
}

/// Entries of a ring's registered-buffer table (the kernel takes up to 16384,
/// IORING_MAX_REG_BUFFERS): one per transport data buffer in use on the reactor, e.g. 32
/// connections with 128 commands in flight each.
pub const FIXED_BUFFER_SLOTS: u32 = 4096;

/// Errors creating a ring.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// The kernel refuses io_uring to this process: `kernel.io_uring_disabled`, a seccomp
    /// profile (containers), or a kernel built without it.
    #[error("io_uring is not available to this process (kernel.io_uring_disabled, seccomp, or CONFIG_IO_URING=n)")]
    Unavailable(#[source] io::Error),
    #[error("io_uring_setup with {entries} entries failed")]
    Setup {
        entries: u32,
        #[source]
        source: io::Error,
    },
    /// The kernel has io_uring but not the opcodes the engine uses (IORING_OP_READ / WRITE
    /// arrived in Linux 5.6).
    #[error("this kernel's io_uring lacks {opcode} (Linux 5.6 or later is required)")]
    MissingOpcode { opcode: &'static str },
    #[error("creating the completion eventfd failed")]
    Eventfd(#[source] io::Error),
    #[error("registering the completion eventfd with the ring failed")]
    RegisterEventfd(#[source] io::Error),
}

/// One op the engine is responsible for until its completion has been reaped.
#[derive(Debug)]
struct InFlight {
    op: BlockOp,
    tag: u64,
    /// Bytes already transferred by earlier (short) completions.
    done: u32,
    transient_retries: u8,
    /// `Zeroes`: index into the plan of the method being tried, and bytes already written by
    /// `ZeroMethod::WriteZeroes`.
    stage: u8,
    zeroed: u64,
    /// Member of a group (`submit_group`): index into `groups`.
    group: Option<u32>,
    /// The registered-file slot the op is issued on (`None`: `op.fd`). Held, so that the slot
    /// keeps this file until the op is released.
    file_slot: Option<u32>,
    /// The registered buffer the op's buffer lies in (`None`: a plain READ/WRITE).
    buf_slot: Option<u16>,
    /// A delay (`submit_after`) rather than an op: the slot's SQE is an `IORING_OP_TIMEOUT`
    /// and `op` carries only the command's buffer for `Timer::then`.
    timer: Option<Box<Timer>>,
}

/// A pending `submit_after`. Boxed so that the timespec keeps its address while the slot
/// vector grows: the kernel reads it when it takes the SQE, which with SQPOLL is whenever.
struct Timer {
    timespec: types::Timespec,
    then: Deferred,
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer").finish_non_exhaustive()
    }
}

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
    ring: IoUring,
    eventfd: OwnedFd,
    /// Ops by slot index; the SQE `user_data` is the slot index, not the caller's tag, so that a
    /// resubmitted remainder can never be confused with anything else.
    slots: Vec<Option<InFlight>>,
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
    files: FileTable,
    buffers: BufferTable,
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
        let files = FileTable::new(&ring.submitter(), options.registered_files);
        let buffers = BufferTable::new(&ring.submitter(), options.fixed_buffer_bytes);
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
        let registered = self.buffers.owners.iter().flat_map(|(_, units)| units);
        let count = registered.filter(|&&slot| slot != NO_ENTRY).count();
        (count, self.buffers.pinned)
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

    /// Handles one CQE; returns the completion to deliver, if the op is finished.
    fn complete_one(&mut self, user_data: u64, res: i32) -> Option<(u64, i32)> {
        if user_data & CANCEL_USER_DATA != 0 {
            // The ASYNC_CANCEL's own completion (0, -ENOENT, -EALREADY): what counts is the
            // target op's completion, which always follows.
            tracing::debug!(res, "io_uring cancel request completed");
            return None;
        }
        let idx = user_data as usize;
        let Some(entry) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            tracing::error!(user_data, res, "io_uring completion for an unknown slot");
            return None;
        };
        if entry.timer.is_some() {
            return self.timer_done(idx, res);
        }
        if res == -libc::EAGAIN || res == -libc::EINTR {
            if entry.transient_retries < MAX_TRANSIENT_RETRIES {
                entry.transient_retries += 1;
                self.overflow.push_back(idx as u32);
                return None;
            }
            return self.release(idx, res);
        }
        if let BlockOpKind::Zeroes { len, plan } = entry.op.kind {
            let method = plan[usize::from(entry.stage)];
            if res < 0 {
                // The file system or device lacks this method (fallocate: EOPNOTSUPP, or
                // EINVAL for a mode the file system does not know; uring_cmd: EOPNOTSUPP on
                // kernels before 6.12): try the next one, from the start of the range.
                let unsupported = matches!(-res, libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL);
                if unsupported
                    && method != ZeroMethod::WriteZeroes
                    && usize::from(entry.stage) + 1 < plan.len()
                {
                    tracing::debug!(?method, res, "zeroing method unsupported; trying the next");
                    entry.stage += 1;
                    entry.zeroed = 0;
                    self.overflow.push_back(idx as u32);
                    return None;
                }
                return self.release(idx, res);
            }
            if method == ZeroMethod::WriteZeroes {
                if res == 0 {
                    return self.release(idx, -libc::EIO);
                }
                entry.zeroed += res as u64;
                if entry.zeroed < len {
                    self.overflow.push_back(idx as u32);
                    return None;
                }
            }
            return self.release(idx, 0);
        }
        if res < 0 {
            return self.release(idx, res);
        }
        match entry.op.kind {
            BlockOpKind::Flush | BlockOpKind::Zeroes { .. } => self.release(idx, 0),
            BlockOpKind::Read | BlockOpKind::Write { .. } => {
                let remaining = entry.op.len - entry.done;
                let res = res as u32;
                if res > remaining {
                    // Never happens with a correct kernel; refuse to trust the count.
                    tracing::error!(res, remaining, "io_uring reported more bytes than asked");
                    return self.release(idx, -libc::EIO);
                }
                if res == 0 && remaining > 0 {
                    // A read hit end of file (the backing file shrank below the namespace
                    // capacity) or a write made no progress: the range cannot be served.
                    // Linux nvmet does the same (io-cmd-file.c: short transfer → -EIO).
                    return self.release(idx, -libc::EIO);
                }
                entry.done += res;
                if entry.done < entry.op.len {
                    // Short transfer (signal, page-cache pressure, a split at a device limit):
                    // send the rest. With O_DIRECT the kernel only splits on logical-block
                    // boundaries, so the remainder stays aligned; if it is not, the retry fails
                    // with -EINVAL and that is reported.
                    self.overflow.push_back(idx as u32);
                    return None;
                }
                let total = entry.op.len as i32;
                self.release(idx, total)
            }
        }
    }

    /// A `submit_after` delay ended: `-ETIME` is the timer expiring, and then the deferred
    /// work runs (it may submit an op under the same tag, which then completes the command);
    /// `-ECANCELED` is an Abort that came first, anything else a ring failure, both delivered
    /// without running it.
    fn timer_done(&mut self, idx: usize, res: i32) -> Option<(u64, i32)> {
        let entry = self.slots[idx].take().expect("checked by the caller");
        self.free_slots.push(idx as u32);
        let timer = entry.timer.expect("checked by the caller");
        if res != -libc::ETIME {
            return Some((entry.tag, res));
        }
        let (buf, len) = (entry.op.buf, entry.op.len as usize);
        let data: &mut [u8] = if buf.is_null() || len == 0 {
            &mut []
        } else {
            // SAFETY: the command's buffer as given to `submit_after`, which the transport
            // keeps allocated and untouched until this tag's completion has been delivered
            // (backend contract); it has not been: this is the first result for the tag.
            unsafe { std::slice::from_raw_parts_mut(buf, len) }
        };
        (timer.then)(data, self).map(|res| (entry.tag, res))
    }

    /// Frees a slot; returns the completion to deliver (none yet for a member of a group
    /// whose other ops are still running).
    fn release(&mut self, idx: usize, res: i32) -> Option<(u64, i32)> {
        let entry = self.slots[idx].take().expect("slot released twice");
        self.free_slots.push(idx as u32);
        if let Some(slot) = entry.file_slot {
            self.files.put(slot);
        }
        match entry.group {
            None => Some((entry.tag, res)),
            Some(group) => self.member_done(group, res),
        }
    }

    fn member_done(&mut self, group: u32, res: i32) -> Option<(u64, i32)> {
        let g = self.groups[group as usize]
            .as_mut()
            .expect("group member after the group completed");
        if res < 0 && g.result == 0 {
            g.result = res;
        }
        g.remaining -= 1;
        if g.remaining > 0 {
            return None;
        }
        let g = self.groups[group as usize].take().expect("checked above");
        self.free_groups.push(group);
        Some((g.tag, g.result))
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
        let file_slot = op.file.and_then(|id| self.files.get(&self.ring, id, op.fd));
        let buf_slot = match unit {
            Some(unit) if self.buffers.enabled => unit
                .extent_of(&op)
                .and_then(|extent| self.buffers.get(&self.ring, unit, extent)),
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
            // op holds it (`FileTable::put`). `push` cannot fail: `is_full` was checked above.
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

/// The ring's registered-file table: which backend file ([`FileId`]) sits in which slot.
///
/// Lifetime rule (`fileid` module comment): a slot is filled on the first op on a file and
/// emptied by the first sweep after the file's backend dropped it, unless an op parked in the
/// engine still holds the slot (the backend contract says that cannot happen; if it does, the
/// slot waits for the op rather than ever naming another file).
#[derive(Debug)]
struct FileTable {
    /// Registered files, sorted by id: `(id, slot)`.
    by_id: Vec<(FileId, u32)>,
    /// Ops in the engine per slot.
    holds: Vec<u32>,
    free: Vec<u32>,
    /// `fileid::retired_count()` at the last sweep that left no retired file behind.
    seen_retired: u64,
    /// The kernel took the table (false: registered files off, or refused).
    enabled: bool,
    /// One log line each for a full table and a refused slot update.
    warned_full: bool,
    warned_update: bool,
}

impl FileTable {
    fn new(submitter: &Submitter<'_>, slots: u32) -> Self {
        let enabled = slots > 0
            && match submitter.register_files_sparse(slots) {
                Ok(()) => true,
                Err(e) => {
                    // EINVAL before Linux 5.19 (no sparse tables); EMFILE above RLIMIT_NOFILE.
                    tracing::warn!(error = %e, slots,
                        "io_uring registered-file table refused; ops name their descriptors");
                    false
                }
            };
        let slots = if enabled { slots } else { 0 };
        FileTable {
            by_id: Vec::new(),
            holds: vec![0; slots as usize],
            free: (0..slots).rev().collect(),
            seen_retired: fileid::retired_count(),
            enabled,
            warned_full: false,
            warned_update: false,
        }
    }

    /// The slot to issue an op on `id` (descriptor `fd`) on, registering the file on first use,
    /// and held until [`put`](Self::put); `None`: issue it on `fd`.
    /// (`ring`, not its submitter: building that costs instructions on every op.)
    #[inline]
    fn get(&mut self, ring: &IoUring, id: FileId, fd: RawFd) -> Option<u32> {
        if !self.enabled {
            return None;
        }
        let slot = match self.by_id.binary_search_by_key(&id, |&(i, _)| i) {
            Ok(pos) => self.by_id[pos].1,
            Err(_) => self.register(&ring.submitter(), id, fd)?,
        };
        self.holds[slot as usize] += 1;
        Some(slot)
    }

    fn put(&mut self, slot: u32) {
        self.holds[slot as usize] -= 1;
    }

    #[cold]
    fn register(&mut self, submitter: &Submitter<'_>, id: FileId, fd: RawFd) -> Option<u32> {
        if self.free.is_empty() {
            // A removed namespace's slot may be waiting for this turn's sweep.
            let retired = fileid::retired_count();
            if retired != self.seen_retired {
                self.sweep_retired(submitter, retired);
            }
        }
        let Some(slot) = self.free.pop() else {
            if !self.warned_full {
                self.warned_full = true;
                tracing::warn!(
                    slots = self.holds.len(),
                    "io_uring registered-file table full; further files use their descriptors \
                     (raise [global] uring_registered_files)"
                );
            }
            return None;
        };
        match submitter.register_files_update(slot, &[fd]) {
            Ok(1) => {}
            result => {
                self.free.push(slot);
                if !self.warned_update {
                    self.warned_update = true;
                    tracing::warn!(
                        ?result,
                        slot,
                        "io_uring registered-file update refused; this file uses its descriptor"
                    );
                }
                return None;
            }
        }
        let pos = self
            .by_id
            .binary_search_by_key(&id, |&(i, _)| i)
            .unwrap_err();
        self.by_id.insert(pos, (id, slot));
        Some(slot)
    }

    /// Empties the slots of files whose backends are gone (one atomic load when none went:
    /// inlined into every `flush`, the rest out of line).
    #[inline]
    fn sweep(&mut self, ring: &IoUring) {
        if !self.enabled {
            return;
        }
        let retired = fileid::retired_count();
        if retired != self.seen_retired {
            self.sweep_retired(&ring.submitter(), retired);
        }
    }

    #[cold]
    #[inline(never)]
    fn sweep_retired(&mut self, submitter: &Submitter<'_>, retired: u64) {
        let mut gone = Vec::new();
        fileid::retired_among(self.by_id.iter().map(|&(id, _)| id), |id| gone.push(id));
        let mut held = false;
        for id in gone {
            let pos = self
                .by_id
                .binary_search_by_key(&id, |&(i, _)| i)
                .expect("listed above");
            let slot = self.by_id[pos].1;
            if self.holds[slot as usize] > 0 {
                held = true;
                continue;
            }
            // -1 empties the slot; the kernel drops its file reference once no request in
            // flight uses it (none here), so the file closes now.
            if let Err(e) = submitter.register_files_update(slot, &[-1]) {
                tracing::error!(error = %e, slot,
                    "io_uring could not empty a registered-file slot; the removed file stays \
                     open until the slot is reused");
            }
            self.by_id.remove(pos);
            self.free.push(slot);
        }
        if !held {
            self.seen_retired = retired;
        }
    }
}

/// The ring's registered-buffer table: which transport buffer ([`BufferUnit`], by owner and
/// index) sits in which entry, and how much of it is registered.
///
/// Entries are only ever replaced by a larger registration of the same unit (same address) or
/// emptied once their owner is gone, so an op pushed with an entry's index finds its buffer
/// inside that entry whenever the kernel takes the SQE; an op in flight keeps the kernel's
/// reference to the registration it was issued on (io_uring resource nodes), so replacing or
/// emptying an entry never pulls pages from under a running transfer.
#[derive(Debug)]
struct BufferTable {
    /// Owners with registered units, sorted by id (a few per reactor: its connections), each
    /// with its units' entries by unit index (`NO_ENTRY`: not registered), so that an op's
    /// lookup is a search among owners and one index.
    owners: Vec<(OwnerId, Vec<u16>)>,
    /// Per entry: the registered range's start address and length (0: empty).
    entries: Vec<(usize, u32)>,
    free: Vec<u16>,
    /// The sum of the registered lengths, and its limit (`RingOptions::fixed_buffer_bytes`).
    pinned: u64,
    budget: u64,
    /// `fixedbuf::retired_count()` at the last sweep.
    seen_retired: u64,
    /// The kernel took the table.
    enabled: bool,
    /// The kernel refused a registration: no new ones.
    refused: bool,
    warned_full: bool,
}

/// `BufferTable::owners` value of a unit without an entry.
const NO_ENTRY: u16 = u16::MAX;

impl BufferTable {
    fn new(submitter: &Submitter<'_>, budget: u64) -> Self {
        let enabled = budget > 0
            && match submitter.register_buffers_sparse(FIXED_BUFFER_SLOTS) {
                Ok(()) => true,
                Err(e) => {
                    // EINVAL before Linux 5.19 (no sparse tables).
                    tracing::warn!(error = %e, "io_uring registered-buffer table refused; \
                        reads and writes pin their buffers per op");
                    false
                }
            };
        let slots = if enabled { FIXED_BUFFER_SLOTS } else { 0 };
        BufferTable {
            owners: Vec::new(),
            entries: vec![(0, 0); slots as usize],
            free: (0..slots as u16).rev().collect(),
            pinned: 0,
            budget,
            seen_retired: fixedbuf::retired_count(),
            enabled,
            refused: false,
            warned_full: false,
        }
    }

    /// The entry to issue an op reaching `extent` bytes into `unit` on, registering or growing
    /// the unit's registration when needed; `None`: issue it on its buffer as it is.
    #[inline]
    fn get(&mut self, ring: &IoUring, unit: &BufferUnit, extent: u32) -> Option<u16> {
        if !self.enabled {
            return None;
        }
        let slot = match self.owners.binary_search_by_key(&unit.owner, |o| o.0) {
            Ok(pos) => self.owners[pos]
                .1
                .get(unit.index as usize)
                .copied()
                .unwrap_or(NO_ENTRY),
            Err(_) => NO_ENTRY,
        };
        if slot != NO_ENTRY {
            let (base, len) = self.entries[usize::from(slot)];
            if base == unit.base as usize && extent <= len {
                return Some(slot);
            }
        }
        self.update(&ring.submitter(), unit, extent, slot)
    }

    /// Registers `unit` (or, when it has entry `held`, registers it again, larger).
    #[cold]
    fn update(
        &mut self,
        submitter: &Submitter<'_>,
        unit: &BufferUnit,
        extent: u32,
        held: u16,
    ) -> Option<u16> {
        if self.refused {
            return None;
        }
        // The largest transfer so far, rounded up to a power of two: a 1 MiB slot used for
        // 4 KiB I/O pins 4 KiB, and a unit grows a bounded number of times.
        let len = u64::from(extent)
            .next_power_of_two()
            .max(4096)
            .min(u64::from(unit.len)) as u32;
        let old = if held == NO_ENTRY {
            0
        } else {
            self.entries[usize::from(held)].1
        };
        let fits = |t: &Self| t.pinned - u64::from(old) + u64::from(len) <= t.budget;
        if (held == NO_ENTRY && self.free.is_empty()) || !fits(self) {
            // A closed connection's buffers may be waiting for this turn's sweep (which
            // leaves a live owner's entries, `held` among them, alone).
            let retired = fixedbuf::retired_count();
            if retired != self.seen_retired {
                self.sweep_retired(submitter, retired);
            }
        }
        let slot = match (held, self.free.last()) {
            (NO_ENTRY, Some(&slot)) => slot,
            (NO_ENTRY, None) => return self.full(),
            (held, _) => held,
        };
        if !fits(self) {
            return self.full();
        }
        let iov = libc::iovec {
            iov_base: unit.base.cast(),
            iov_len: len as usize,
        };
        // SAFETY: `[base, base + len)` lies inside the unit (`extent_of` checked the op, and
        // `len` ≤ the unit's length), which its owner keeps mapped while it does I/O there;
        // the kernel pins the pages, so the entry stays valid memory even after the owner
        // unmaps it, and entries are keyed by owner identity, so no later mapping at the same
        // address is ever issued on it.
        if let Err(e) = unsafe { submitter.register_buffers_update(u32::from(slot), &[iov], None) }
        {
            // ENOMEM: RLIMIT_MEMLOCK (without CAP_IPC_LOCK); EFAULT/EOPNOTSUPP: memory the
            // kernel will not pin. Stop registering rather than retry per op; what is
            // registered stays in use.
            self.refused = true;
            tracing::warn!(error = %e, bytes = len, pinned = self.pinned,
                "io_uring refused to register a data buffer; further reads and writes on this \
                 reactor pin their buffers per op");
            return None;
        }
        self.pinned = self.pinned - u64::from(old) + u64::from(len);
        self.entries[usize::from(slot)] = (unit.base as usize, len);
        if held == NO_ENTRY {
            self.free.pop();
            let pos = match self.owners.binary_search_by_key(&unit.owner, |o| o.0) {
                Ok(pos) => pos,
                Err(pos) => {
                    self.owners.insert(pos, (unit.owner, Vec::new()));
                    pos
                }
            };
            let units = &mut self.owners[pos].1;
            let index = unit.index as usize;
            if units.len() <= index {
                units.resize(index + 1, NO_ENTRY);
            }
            units[index] = slot;
        }
        Some(slot)
    }

    #[cold]
    fn full(&mut self) -> Option<u16> {
        if !self.warned_full {
            self.warned_full = true;
            tracing::info!(
                budget = self.budget,
                entries = self.entries.len(),
                "io_uring registered buffers of this reactor in use; other data buffers are \
                 pinned per op (raise [global] uring_fixed_buffers)"
            );
        }
        None
    }

    /// Empties the entries of buffers whose owners are gone (one atomic load when none went).
    #[inline]
    fn sweep(&mut self, ring: &IoUring) {
        if self.owners.is_empty() {
            return;
        }
        let retired = fixedbuf::retired_count();
        if retired != self.seen_retired {
            self.sweep_retired(&ring.submitter(), retired);
        }
    }

    #[cold]
    #[inline(never)]
    fn sweep_retired(&mut self, submitter: &Submitter<'_>, retired: u64) {
        let mut gone = Vec::new();
        fixedbuf::retired_among(self.owners.iter().map(|o| o.0), |owner| gone.push(owner));
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for owner in gone {
            let pos = self
                .owners
                .binary_search_by_key(&owner, |o| o.0)
                .expect("listed above");
            let (_, units) = self.owners.remove(pos);
            for slot in units.into_iter().filter(|&s| s != NO_ENTRY) {
                // SAFETY: an empty iovec names no memory: the entry is cleared, and the kernel
                // unpins its pages once no request issued on it is in flight.
                if let Err(e) =
                    unsafe { submitter.register_buffers_update(u32::from(slot), &[empty], None) }
                {
                    // Still pinned, but no owner's unit names it: never issued on again.
                    tracing::error!(error = %e, slot,
                        "io_uring could not empty a registered buffer; its memory stays \
                         pinned until the reactor exits");
                    continue;
                }
                self.pinned -= u64::from(self.entries[usize::from(slot)].1);
                self.entries[usize::from(slot)] = (0, 0);
                self.free.push(slot);
            }
        }
        self.seen_retired = retired;
    }
}

/// io_uring_setup failures that mean "not allowed here" (rather than "bad arguments" or "out of
/// memory") get their own variant, so the daemon can say what to change.
fn classify_setup_error(entries: u32, source: io::Error) -> UringError {
    match source.raw_os_error() {
        // EPERM: kernel.io_uring_disabled=2, or =1 without membership in
        // kernel.io_uring_group; also what seccomp profiles (Docker's default) return.
        // ENOSYS: CONFIG_IO_URING=n or a seccomp ENOSYS policy. EACCES: LSM denial.
        Some(libc::EPERM) | Some(libc::ENOSYS) | Some(libc::EACCES) => {
            UringError::Unavailable(source)
        }
        _ => UringError::Setup { entries, source },
    }
}

/// Fails early, with a clear message, on kernels whose ring would reject every op.
fn check_opcodes(ring: &IoUring) -> Result<(), UringError> {
    let mut probe = io_uring::Probe::new();
    if ring.submitter().register_probe(&mut probe).is_err() {
        // IORING_REGISTER_PROBE itself is 5.6+: no probe means no IORING_OP_READ either.
        return Err(UringError::MissingOpcode {
            opcode: "IORING_REGISTER_PROBE",
        });
    }
    let needed = [
        (opcode::Read::CODE, "IORING_OP_READ"),
        (opcode::Write::CODE, "IORING_OP_WRITE"),
        (opcode::Fsync::CODE, "IORING_OP_FSYNC"),
        (opcode::Fallocate::CODE, "IORING_OP_FALLOCATE"),
    ];
    for (code, name) in needed {
        if !probe.is_supported(code) {
            return Err(UringError::MissingOpcode { opcode: name });
        }
    }
    Ok(())
}

/// `user_data` bit of an `IORING_OP_ASYNC_CANCEL` SQE; op SQEs carry their slot index, which
/// never reaches it.
const CANCEL_USER_DATA: u64 = 1 << 63;

/// The engine's zero buffer as the kernel sees it: `ZERO_CHUNK` bytes at a 4096-aligned
/// address (O_DIRECT), or null before any op needed it.
#[derive(Clone, Copy)]
struct AlignedZeroes(*const u8);

impl AlignedZeroes {
    const ALIGN: usize = 4096;

    fn of(buf: &Option<Vec<u8>>) -> Self {
        AlignedZeroes(buf.as_ref().map_or(std::ptr::null(), |b| {
            // The vector has ALIGN spare bytes, so the aligned start leaves ZERO_CHUNK.
            b.as_ptr()
                .wrapping_add(b.as_ptr().align_offset(Self::ALIGN))
        }))
    }
}

/// Runs `$body` with `$fd` bound to the op's file as the opcode builders take it: its
/// registered slot (`types::Fixed`, which sets IOSQE_FIXED_FILE) or its descriptor.
macro_rules! with_file {
    ($entry:expr, $fd:ident => $body:expr) => {
        match $entry.file_slot {
            Some(slot) => {
                let $fd = types::Fixed(slot);
                $body
            }
            None => {
                let $fd = types::Fd($entry.op.fd);
                $body
            }
        }
    };
}

fn build_sqe(entry: &InFlight, user_data: u32, zeroes: AlignedZeroes) -> squeue::Entry {
    let op = &entry.op;
    let offset = op.offset + u64::from(entry.done);
    let len = op.len - entry.done;
    // `done` ≤ `len` ≤ the caller's buffer, so the pointer stays inside that buffer.
    let buf = op.buf.wrapping_add(entry.done as usize);
    if let Some(timer) = &entry.timer {
        // A pure timer (count 0): completes with -ETIME when it expires.
        return opcode::Timeout::new(&timer.timespec)
            .build()
            .user_data(u64::from(user_data));
    }
    if let Some(index) = entry.buf_slot {
        // On a registered buffer (only reads and writes get one). The remainder of a short
        // transfer starts further inside the same registration.
        let sqe = with_file!(entry, fd => match op.kind {
            BlockOpKind::Read => Some(opcode::ReadFixed::new(fd, buf, len, index)
                .offset(offset)
                .build()),
            BlockOpKind::Write { fua } => Some(opcode::WriteFixed::new(fd, buf, len, index)
                .offset(offset)
                .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                .build()),
            BlockOpKind::Flush | BlockOpKind::Zeroes { .. } => None,
        });
        if let Some(sqe) = sqe {
            return sqe.user_data(u64::from(user_data));
        }
    }
    let sqe = with_file!(entry, fd => match op.kind {
        BlockOpKind::Read => opcode::Read::new(fd, buf, len).offset(offset).build(),
        BlockOpKind::Write { fua } => opcode::Write::new(fd, buf, len)
            .offset(offset)
            .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
            .build(),
        BlockOpKind::Flush => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        BlockOpKind::Zeroes { len, plan } => match plan[usize::from(entry.stage)] {
            method @ (ZeroMethod::PunchHole | ZeroMethod::ZeroRange) => {
                opcode::Fallocate::new(fd, len)
                    .offset(op.offset)
                    .mode(method.fallocate_mode().unwrap_or(0))
                    .build()
            }
            ZeroMethod::Discard => {
                // sqe->addr = start, sqe->addr3 (the first 8 bytes of the command area) =
                // length (block/ioctl.c, blkdev_uring_cmd).
                let mut cmd = [0u8; 16];
                cmd[..8].copy_from_slice(&len.to_le_bytes());
                // IOSQE_ASYNC: issued inline, the kernel marks the discard bio REQ_NOWAIT
                // (blkdev_cmd_discard), and a bio-based device without nowait support — dm-thin,
                // the device this method exists for — fails it with EOPNOTSUPP instead of
                // EAGAIN, so io_uring never retries it from a worker. Forced to io-wq, the
                // discard may block there, never on the reactor.
                opcode::UringCmd16::new(fd, BLOCK_URING_CMD_DISCARD)
                    .addr(Some(op.offset))
                    .cmd(cmd)
                    .build()
                    .flags(squeue::Flags::ASYNC)
            }
            ZeroMethod::WriteZeroes => {
                let n = (len - entry.zeroed).min(ZERO_CHUNK as u64) as u32;
                opcode::Write::new(fd, zeroes.0, n)
                    .offset(op.offset + entry.zeroed)
                    .build()
            }
        },
    });
    sqe.user_data(u64::from(user_data))
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

/// For tests of "no blocking call on a reactor": makes the calling thread fail, with
/// `ENOTRECOVERABLE`, every system call that waits for storage (seccomp filters are per
/// thread, and threads it creates inherit them). The reactor's own calls — io_uring_enter, the
/// eventfd read/write, poll — stay allowed. Irreversible for the thread: call it on a thread
/// of its own.
pub fn forbid_blocking_storage_calls_on_this_thread() {
    let forbidden = [
        libc::SYS_fallocate,
        libc::SYS_ioctl,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_preadv2,
        libc::SYS_pwritev2,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_sync_file_range,
    ];
    let stmt = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    // A = seccomp_data.nr; for each forbidden number: if equal, return the errno.
    let mut prog = vec![stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0)];
    for nr in forbidden {
        prog.push(stmt(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            nr as u32,
            0,
            1,
        ));
        prog.push(stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOTRECOVERABLE as u32,
            0,
            0,
        ));
    }
    prog.push(stmt(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ALLOW,
        0,
        0,
    ));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with integer arguments; then a pointer to a filter program that lives
    // on this stack frame for the duration of the call (the kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let rc = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        );
        assert_eq!(rc, 0, "seccomp: {}", io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;
    use crate::fileid::BackendFile;
    use crate::test_support::{scratch_file, scratch_file_in, wait_for_completion, CloseWatch};
    use crate::testing::pattern;
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    fn op(file: &File, kind: BlockOpKind, offset: u64, buf: &mut [u8]) -> BlockOp {
        BlockOp {
            fd: file.as_raw_fd(),
            file: None,
            kind,
            offset,
            buf: buf.as_mut_ptr(),
            len: buf.len() as u32,
        }
    }

    /// Reaps until `count` completions have arrived.
    fn collect(io: &mut UringEngine, count: usize) -> Vec<(u64, i32)> {
        let mut all = Vec::new();
        while all.len() < count {
            all.extend(wait_for_completion(io));
        }
        all.sort();
        all
    }

    #[test]
    fn uring_overflow_queue_and_batching() {
        overflow_queue_and_batching(RingOptions::default());
    }

    #[test]
    fn uring_sqpoll_ring_overflow_queue_and_batching() {
        // The same through an SQPOLL ring: the kernel thread takes the SQ, a full SQ is
        // waited for, the eventfd still signals completions. (Unprivileged SQPOLL needs
        // Linux 5.11; the test kernels are newer.)
        overflow_queue_and_batching(RingOptions {
            sqpoll_idle_ms: Some(10),
            ..RingOptions::default()
        });
    }

    fn overflow_queue_and_batching(options: RingOptions) {
        // 4 SQ entries (8 CQ), 64 ops submitted before a single flush: most wait in the overflow
        // queue and are fed to the kernel as completions are reaped.
        let name = match options.sqpoll_idle_ms {
            Some(_) => "overflow-sqpoll",
            None => "overflow",
        };
        let (path, file) = scratch_file(name, 1 << 20);
        let mut io = UringEngine::with_options(4, options).unwrap();
        assert_eq!(io.sqpoll(), options.sqpoll_idle_ms.is_some());
        let mut bufs: Vec<AlignedBuf> = (0..64)
            .map(|i| {
                let mut b = AlignedBuf::new(4096);
                b.copy_from_slice(&pattern(4096, i));
                b
            })
            .collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            let fua = i % 3 == 0;
            io.submit(
                op(&file, BlockOpKind::Write { fua }, i as u64 * 4096, b),
                1000 + i as u64,
            );
        }
        assert_eq!(io.in_flight(), 64);
        let done = collect(&mut io, 64);
        assert_eq!(done, (0..64).map(|i| (1000 + i, 4096)).collect::<Vec<_>>());
        assert_eq!(io.in_flight(), 0);
        for (i, b) in bufs.iter().enumerate() {
            let mut back = vec![0u8; 4096];
            file.read_exact_at(&mut back, i as u64 * 4096).unwrap();
            assert!(back[..] == b[..], "block {i}");
        }

        // Read them back through the ring, plus one flush, again all queued at once.
        let mut rbufs: Vec<AlignedBuf> = (0..64).map(|_| AlignedBuf::new(4096)).collect();
        for (i, b) in rbufs.iter_mut().enumerate() {
            io.submit(op(&file, BlockOpKind::Read, i as u64 * 4096, b), i as u64);
        }
        io.submit(op(&file, BlockOpKind::Flush, 0, &mut []), 999);
        let done = collect(&mut io, 65);
        assert_eq!(done.last(), Some(&(999, 0)));
        assert!(done[..64]
            .iter()
            .enumerate()
            .all(|(i, &(t, r))| t == i as u64 && r == 4096));
        assert!(rbufs.iter().zip(&bufs).all(|(r, w)| r[..] == w[..]));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_cancel_stops_a_waiting_op_and_leaves_finished_ones_alone() {
        // A read from an empty pipe waits in the kernel until cancelled.
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 returns.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned here only.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut io = UringEngine::new(8).unwrap();
        let mut buf = AlignedBuf::new(4096);
        let read = BlockOp {
            fd: rx.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Read,
            offset: 0,
            buf: buf.as_mut_ptr(),
            len: 4096,
        };
        io.submit(read, 7);
        io.flush();
        assert!(io.cancel(7), "in the kernel: cancel requested");
        io.flush();
        assert_eq!(collect(&mut io, 1), vec![(7, -libc::ECANCELED)]);
        assert!(!io.cancel(7), "gone");
        // Cancelled before it reached the kernel: taken back, no SQE.
        io.submit(read, 8);
        assert!(io.cancel(8));
        assert_eq!(collect(&mut io, 1), vec![(8, -libc::ECANCELED)]);
        // A read that already has its data completes normally.
        drop(tx);
        io.submit(read, 9);
        io.flush();
        assert_eq!(
            collect(&mut io, 1),
            vec![(9, -libc::EIO)],
            "EOF: a short read"
        );
        assert_eq!(io.in_flight(), 0);
        drop(rx);
    }

    #[test]
    fn uring_errors_are_delivered_as_negative_results() {
        let (path, file) = scratch_file("errors", 8192);
        let mut io = UringEngine::new(8).unwrap();
        let mut buf = AlignedBuf::new(4096);
        // Bad descriptor: the kernel answers -EBADF in the CQE.
        let mut bad = op(&file, BlockOpKind::Read, 0, &mut buf);
        bad.fd = -1;
        io.submit(bad, 1);
        // Writing through a read-only descriptor: -EBADF too.
        let ro = File::open(&path).unwrap();
        io.submit(op(&ro, BlockOpKind::Write { fua: false }, 0, &mut buf), 2);
        // Read wholly past EOF: 0 bytes → -EIO (cannot serve the range).
        io.submit(op(&file, BlockOpKind::Read, 1 << 20, &mut buf), 3);
        // Invalid op rejected before the kernel, still delivered through reap + eventfd.
        let mut null = op(&file, BlockOpKind::Read, 0, &mut buf);
        null.buf = std::ptr::null_mut();
        io.submit(null, 4);
        let done = collect(&mut io, 4);
        assert_eq!(
            done,
            vec![
                (1, -libc::EBADF),
                (2, -libc::EBADF),
                (3, -libc::EIO),
                (4, -libc::EINVAL)
            ]
        );
        assert_eq!(io.in_flight(), 0);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_one_flush_submits_a_batch_with_a_failing_op_in_it() {
        // The reactor calls flush once and then sleeps in epoll: every op of the batch must have
        // reached the kernel by then, even when one of them fails at submission.
        // Two SQ entries for four ops: half the batch starts in the overflow queue.
        let (path, file) = scratch_file("batch", 16384);
        let mut io = UringEngine::new(2).unwrap();
        let mut bufs: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::new(4096)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            let mut o = op(&file, BlockOpKind::Read, i as u64 * 4096, b);
            if i == 1 {
                o.fd = -1;
            }
            io.submit(o, i as u64);
        }
        io.flush();
        // SAFETY: the engine outlives this borrow.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(io.fd()) };
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 4 && std::time::Instant::now() < deadline {
            let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16)).unwrap();
            io.reap(|t, r| got.push((t, r)));
        }
        got.sort();
        assert_eq!(
            got,
            vec![(0, 4096), (1, -libc::EBADF), (2, 4096), (3, 4096)]
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_short_read_at_eof_is_resubmitted_then_fails() {
        // 6 KiB file, 8 KiB read: the kernel returns 6 KiB, the remainder returns 0 → -EIO.
        let (path, file) = scratch_file("short", 6144);
        let mut io = UringEngine::new(8).unwrap();
        let mut buf = AlignedBuf::new(8192);
        io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 7);
        assert_eq!(collect(&mut io, 1), vec![(7, -libc::EIO)]);
        // Extending the file makes the same read whole.
        file.set_len(8192).unwrap();
        io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 8);
        assert_eq!(collect(&mut io, 1), vec![(8, 8192)]);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_short_read_remainder_is_resubmitted_and_completes() {
        // A pipe delivers what is there: 3000 of 8192 bytes first (a short read), the engine
        // resubmits the remaining 5192 into the rest of the buffer, which completes once the
        // writer sends them. The caller sees one completion with the full length.
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let data = pattern(8192, 42);
        let mut io = UringEngine::new(4).unwrap();
        let mut buf = AlignedBuf::new(8192);
        nix::unistd::write(&tx, &data[..3000]).unwrap();
        io.submit(
            BlockOp {
                fd: rx.as_raw_fd(),
                file: None,
                kind: BlockOpKind::Read,
                offset: 0,
                buf: buf.as_mut_ptr(),
                len: 8192,
            },
            11,
        );
        io.flush();
        // Let the first, short completion come back and be resubmitted.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        while io.slots.iter().flatten().all(|e| e.done == 0) {
            assert!(
                std::time::Instant::now() < deadline,
                "short read never completed"
            );
            io.wait().unwrap();
            io.reap(|t, r| got.push((t, r)));
            io.flush();
        }
        assert!(
            got.is_empty(),
            "a short transfer must not be reported: {got:?}"
        );
        assert_eq!(io.in_flight(), 1);
        nix::unistd::write(&tx, &data[3000..]).unwrap();
        assert_eq!(collect(&mut io, 1), vec![(11, 8192)]);
        assert!(buf[..] == data[..]);
    }

    #[test]
    fn uring_random_mixed_io_matches_a_model() {
        // Batches of random non-overlapping reads and writes (some FUA) on an O_DIRECT file,
        // checked against an in-memory copy of what the file must contain.
        const SIZE: usize = 4 << 20;
        let (path, _) = scratch_file("model", SIZE as u64);
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            File::options()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .unwrap()
        };
        let mut model = vec![0u8; SIZE];
        let mut io = UringEngine::new(8).unwrap();
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = move |bound: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % bound
        };
        for round in 0..20u64 {
            // 32 ops per batch over 32 disjoint 128 KiB regions, random offset and length
            // (multiples of 512) inside each region.
            let mut ops = Vec::new();
            for region in 0..32u64 {
                let blocks = 1 + next(256) as usize;
                let start = region * 128 * 1024 + next(256 - blocks as u64 + 1) * 512;
                let len = blocks * 512;
                let kind = match next(3) {
                    0 => BlockOpKind::Read,
                    1 => BlockOpKind::Write { fua: false },
                    _ => BlockOpKind::Write { fua: true },
                };
                let mut buf = AlignedBuf::new(len);
                if kind != BlockOpKind::Read {
                    buf.copy_from_slice(&pattern(len, round * 100 + region));
                }
                ops.push((kind, start, buf));
            }
            for (tag, (kind, start, buf)) in ops.iter_mut().enumerate() {
                let op = op(&file, *kind, *start, buf);
                io.submit(op, tag as u64);
            }
            let done = collect(&mut io, ops.len());
            for (tag, res) in done {
                let (kind, start, buf) = &ops[tag as usize];
                assert_eq!(res, buf.len() as i32, "op {tag}");
                let range = *start as usize..*start as usize + buf.len();
                match kind {
                    BlockOpKind::Read => assert!(buf[..] == model[range], "round {round} op {tag}"),
                    _ => model[range].copy_from_slice(buf),
                }
            }
        }
        let mut whole = vec![0u8; SIZE];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut whole, 0)
            .unwrap();
        assert!(whole == model);
        std::fs::remove_file(path).unwrap();
    }

    /// The raw 64-byte SQE (`struct io_uring_sqe`, include/uapi/linux/io_uring.h): opcode @0,
    /// fd @4, off @8, addr @16, len @24, rw_flags / fsync_flags @28, user_data @32.
    fn sqe_bytes(sqe: &squeue::Entry) -> [u8; 64] {
        const _: () = assert!(std::mem::size_of::<squeue::Entry>() == 64);
        // SAFETY: `squeue::Entry` is `#[repr(C)]` around the 64-byte kernel SQE (size asserted
        // above), and every byte of it is initialised by the builders.
        unsafe { std::mem::transmute_copy(sqe) }
    }

    const NO_ZEROES: AlignedZeroes = AlignedZeroes(std::ptr::null());

    fn field_u32(b: &[u8; 64], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn field_u64(b: &[u8; 64], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn uring_sqe_encodes_fua_flush_and_remainders() {
        let mut buf = [0u8; 8192];
        let base = buf.as_mut_ptr();
        let entry = |kind, done| InFlight {
            op: BlockOp {
                fd: 9,
                file: None,
                kind,
                offset: 1 << 20,
                buf: base,
                len: 8192,
            },
            tag: 1,
            done,
            transient_retries: 0,
            stage: 0,
            zeroed: 0,
            group: None,
            timer: None,
            file_slot: None,
            buf_slot: None,
        };
        // Crash safety: FUA → RWF_DSYNC on that write only; plain writes carry no flag.
        let fua = sqe_bytes(&build_sqe(
            &entry(BlockOpKind::Write { fua: true }, 0),
            5,
            NO_ZEROES,
        ));
        assert_eq!(fua[0], io_uring::opcode::Write::CODE);
        assert_eq!(field_u32(&fua, 28), libc::RWF_DSYNC as u32);
        assert_eq!(field_u64(&fua, 32), 5);
        let plain = sqe_bytes(&build_sqe(
            &entry(BlockOpKind::Write { fua: false }, 0),
            5,
            NO_ZEROES,
        ));
        assert_eq!(field_u32(&plain, 28), 0);
        // Flush → fsync with IORING_FSYNC_DATASYNC (= fdatasync).
        let flush = sqe_bytes(&build_sqe(&entry(BlockOpKind::Flush, 0), 6, NO_ZEROES));
        assert_eq!(flush[0], io_uring::opcode::Fsync::CODE);
        assert_eq!(field_u32(&flush, 28), 1);
        // A resubmitted remainder starts where the short transfer stopped, keeps FUA.
        let rest = sqe_bytes(&build_sqe(
            &entry(BlockOpKind::Write { fua: true }, 4096),
            7,
            NO_ZEROES,
        ));
        assert_eq!(field_u32(&rest, 4), 9);
        assert_eq!(field_u64(&rest, 8), (1 << 20) + 4096);
        assert_eq!(field_u64(&rest, 16), base as u64 + 4096);
        assert_eq!(field_u32(&rest, 24), 4096);
        assert_eq!(field_u32(&rest, 28), libc::RWF_DSYNC as u32);
        let zeroes = |plan, stage| InFlight {
            stage,
            ..entry(BlockOpKind::Zeroes { len: 3 << 30, plan }, 0)
        };
        // Deallocate on a block device: fallocate(PUNCH_HOLE | KEEP_SIZE) — no BLKDISCARD
        // followed by a NOUNMAP zero-out — or, on discard-only devices, the discard command:
        // off @8 = cmd_op, addr @16 = start, addr3 @48 = length.
        let punch = sqe_bytes(&build_sqe(
            &zeroes(ZeroMethod::BDEV_WRITE_ZEROES_DEAC, 0),
            9,
            NO_ZEROES,
        ));
        assert_eq!(punch[0], io_uring::opcode::Fallocate::CODE);
        assert_eq!(field_u64(&punch, 8), 1 << 20);
        assert_eq!(field_u64(&punch, 16), 3 << 30);
        assert_eq!(field_u32(&punch, 24), 0x03);
        let discard = sqe_bytes(&build_sqe(
            &zeroes(ZeroMethod::BDEV_DISCARD, 0),
            9,
            NO_ZEROES,
        ));
        assert_eq!(discard[0], io_uring::opcode::UringCmd16::CODE);
        assert_eq!(field_u32(&discard, 8), 0x1200);
        assert_eq!(field_u64(&discard, 16), 1 << 20);
        assert_eq!(field_u64(&discard, 48), 3 << 30);
        // flags @1: IOSQE_ASYNC on the discard only (a REQ_NOWAIT discard fails on dm-thin).
        assert_eq!(discard[1], squeue::Flags::ASYNC.bits());
        assert_eq!(punch[1], 0);
        // Write Zeroes keeps the blocks: ZERO_RANGE | KEEP_SIZE.
        let zr = sqe_bytes(&build_sqe(
            &zeroes(ZeroMethod::BDEV_WRITE_ZEROES, 0),
            9,
            NO_ZEROES,
        ));
        assert_eq!(
            (zr[0], field_u32(&zr, 24)),
            (io_uring::opcode::Fallocate::CODE, 0x11)
        );
        let read = sqe_bytes(&build_sqe(&entry(BlockOpKind::Read, 512), 8, NO_ZEROES));
        assert_eq!(read[0], io_uring::opcode::Read::CODE);
        assert_eq!(
            (field_u64(&read, 8), field_u32(&read, 24)),
            ((1 << 20) + 512, 7680)
        );
        assert_eq!((read[1], field_u32(&read, 4)), (0, 9), "the descriptor");
        // On a registered file: fd @4 is the slot, flags @1 carry IOSQE_FIXED_FILE, on every
        // kind of op (the discard keeps its IOSQE_ASYNC).
        let fixed = |e: InFlight| InFlight {
            file_slot: Some(3),
            ..e
        };
        for e in [
            entry(BlockOpKind::Read, 512),
            entry(BlockOpKind::Write { fua: true }, 0),
            entry(BlockOpKind::Flush, 0),
            zeroes(ZeroMethod::BDEV_WRITE_ZEROES_DEAC, 0),
            zeroes(ZeroMethod::BDEV_DISCARD, 0),
            zeroes(&[ZeroMethod::WriteZeroes][..], 0),
        ] {
            let kind = e.op.kind;
            let plain = sqe_bytes(&build_sqe(&e, 8, NO_ZEROES));
            let b = sqe_bytes(&build_sqe(&fixed(e), 8, NO_ZEROES));
            assert_eq!(field_u32(&b, 4), 3, "{kind:?}");
            assert_eq!(b[1], plain[1] | squeue::Flags::FIXED_FILE.bits());
            assert_eq!(
                (b[0], &b[8..]),
                (plain[0], &plain[8..]),
                "only fd and flags differ"
            );
        }
        // On a registered buffer: READ_FIXED / WRITE_FIXED with buf_index @40 (u16), the rest
        // as the plain op (a remainder's address and length, FUA); other ops ignore it.
        let in_buffer = |e: InFlight| InFlight {
            buf_slot: Some(0x1234),
            ..e
        };
        for (e, code) in [
            (entry(BlockOpKind::Read, 512), opcode::ReadFixed::CODE),
            (
                entry(BlockOpKind::Write { fua: true }, 0),
                opcode::WriteFixed::CODE,
            ),
        ] {
            let plain = sqe_bytes(&build_sqe(&e, 8, NO_ZEROES));
            let b = sqe_bytes(&build_sqe(&in_buffer(e), 8, NO_ZEROES));
            assert_eq!(b[0], code);
            assert_eq!(u16::from_le_bytes([b[40], b[41]]), 0x1234);
            assert_eq!((&b[1..40], &b[42..]), (&plain[1..40], &plain[42..]));
        }
        let flush = entry(BlockOpKind::Flush, 0);
        assert_eq!(
            sqe_bytes(&build_sqe(&flush, 8, NO_ZEROES)),
            sqe_bytes(&build_sqe(
                &in_buffer(entry(BlockOpKind::Flush, 0)),
                8,
                NO_ZEROES
            ))
        );
    }

    fn zeroes_op(file: &File, offset: u64, len: u64, plan: &'static [ZeroMethod]) -> BlockOp {
        BlockOp {
            fd: file.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Zeroes { len, plan },
            offset,
            buf: std::ptr::null_mut(),
            len: 0,
        }
    }

    #[test]
    fn uring_zeroes_fall_back_and_write_zeroes_in_chunks() {
        // A range over two zero chunks with an odd block count, on an O_DIRECT file: written by
        // hand (plan with only WriteZeroes), and on tmpfs, where ZERO_RANGE is unsupported and
        // the engine moves on to the next method of the plan.
        let len = (ZERO_CHUNK as u64) * 2 + 3 * 512;
        for (base, plan) in [
            ("/var/tmp", &[ZeroMethod::WriteZeroes][..]),
            (
                "/dev/shm",
                &[ZeroMethod::ZeroRange, ZeroMethod::WriteZeroes][..],
            ),
        ] {
            let path = std::path::PathBuf::from(format!(
                "{base}/nvmfd-uring-zeroes-{}.img",
                std::process::id()
            ));
            let data = pattern(len as usize + 1024, 5);
            std::fs::write(&path, &data).unwrap();
            let file = {
                use std::os::unix::fs::OpenOptionsExt;
                let direct = if base == "/var/tmp" {
                    libc::O_DIRECT
                } else {
                    0
                };
                File::options()
                    .read(true)
                    .write(true)
                    .custom_flags(direct)
                    .open(&path)
                    .unwrap()
            };
            let mut io = UringEngine::new(4).unwrap();
            io.submit(zeroes_op(&file, 512, len, plan), 3);
            assert_eq!(collect(&mut io, 1), vec![(3, 0)], "{base}");
            let back = std::fs::read(&path).unwrap();
            assert_eq!(back[..512], data[..512]);
            assert!(back[512..512 + len as usize].iter().all(|&b| b == 0));
            assert_eq!(back[512 + len as usize..], data[512 + len as usize..]);
            std::fs::remove_file(path).unwrap();
        }
    }

    #[test]
    fn uring_zeroes_report_the_last_methods_error() {
        // Every method unsupported (ZERO_RANGE on tmpfs is the only one in the plan): the
        // error reaches the caller instead of a silent success.
        let (path, file) = scratch_file_in("/dev/shm", "nozero", 8192);
        let mut io = UringEngine::new(4).unwrap();
        io.submit(zeroes_op(&file, 0, 4096, ZeroMethod::BDEV_WRITE_ZEROES), 1);
        assert_eq!(collect(&mut io, 1), vec![(1, -libc::EOPNOTSUPP)]);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_group_completes_once_with_the_first_error() {
        let (path, file) = scratch_file("group", 1 << 20);
        file.write_all_at(&pattern(1 << 20, 1), 0).unwrap();
        let mut io = UringEngine::new(2).unwrap();
        let plan = ZeroMethod::FILE_DEALLOCATE;
        // Three ranges, more than the SQ holds at once: one completion, result 0.
        let ops = [
            zeroes_op(&file, 0, 4096, plan),
            zeroes_op(&file, 64 * 1024, 8192, plan),
            zeroes_op(&file, 512 * 1024, 4096, plan),
        ];
        io.submit_group(&ops, 10);
        assert_eq!(collect(&mut io, 1), vec![(10, 0)]);
        let mut back = vec![0u8; 1 << 20];
        file.read_exact_at(&mut back, 0).unwrap();
        for (o, l) in [(0, 4096), (64 * 1024, 8192), (512 * 1024, 4096)] {
            assert!(back[o..o + l].iter().all(|&b| b == 0));
        }
        assert!(back[4096..64 * 1024].iter().any(|&b| b != 0));
        // One member fails in the kernel, one before it: the group reports an error once.
        let mut bad = zeroes_op(&file, 0, 4096, plan);
        bad.fd = -1;
        let empty_plan = BlockOp {
            kind: BlockOpKind::Zeroes {
                len: 4096,
                plan: &[],
            },
            ..ops[0]
        };
        io.submit_group(&[ops[1], bad, empty_plan, ops[2]], 11);
        let done = collect(&mut io, 1);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].0, 11);
        assert!(
            done[0].1 == -libc::EBADF || done[0].1 == -libc::EINVAL,
            "{done:?}"
        );
        // Nothing to do at all.
        io.submit_group(&[], 12);
        assert_eq!(collect(&mut io, 1), vec![(12, 0)]);
        assert_eq!(io.in_flight(), 0);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn no_blocking_storage_call_on_the_reactor_thread() {
        // How "the reactor never blocks on storage" is checked: a thread that cannot make any
        // storage system call (seccomp, above) plays the reactor and runs every backend
        // operation the core issues — read, write, FUA write, flush, deallocate (several
        // ranges), write zeroes with and without DEAC — on a file namespace (O_DIRECT and
        // buffered, on disk and on tmpfs where the zeroing falls back) through its ring. Any
        // synchronous pread / fallocate / ioctl / fdatasync on this thread fails the command.
        use crate::file::FileBackend;
        use crate::test_support::{run, zero, zero_ranges};
        use crate::{Backend, BackendRequest, Zeroing};
        let dir = format!("nvmfd-uring-noblock-{}", std::process::id());
        let cases = [("/var/tmp", true), ("/var/tmp", false), ("/dev/shm", true)];
        let paths: Vec<_> = cases
            .iter()
            .map(|(base, _)| std::path::PathBuf::from(base).join(&dir))
            .collect();
        let backends: Vec<FileBackend> = cases
            .iter()
            .zip(&paths)
            .map(|(&(_, direct), dir)| {
                std::fs::create_dir_all(dir).unwrap();
                let p = dir.join(format!("disk-{direct}.img"));
                FileBackend::open(&p, Some(4 << 20), direct, 4096).unwrap()
            })
            .collect();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // With registered files: their slots are filled from this thread too.
                    let mut io = registered(8);
                    forbid_blocking_storage_calls_on_this_thread();
                    // The filter is in force (else this test could not fail).
                    let (rx, _tx) = nix::unistd::pipe().unwrap();
                    // SAFETY: fdatasync on a pipe descriptor we own; no memory involved.
                    assert_eq!(unsafe { libc::fdatasync(rx.as_raw_fd()) }, -1);
                    assert_eq!(
                        io::Error::last_os_error().raw_os_error(),
                        Some(libc::ENOTRECOVERABLE)
                    );
                    for b in &backends {
                        let b: &dyn Backend = b;
                        let mut w = AlignedBuf::new(64 * 1024);
                        w.copy_from_slice(&pattern(64 * 1024, 3));
                        for fua in [false, true] {
                            run(b, BackendRequest::Write { offset: 0, fua }, &mut w, &mut io)
                                .unwrap();
                        }
                        run(b, BackendRequest::Flush, &mut AlignedBuf::new(0), &mut io).unwrap();
                        let mut r = AlignedBuf::new(64 * 1024);
                        run(b, BackendRequest::Read { offset: 0 }, &mut r, &mut io).unwrap();
                        assert!(r[..] == w[..]);
                        let ranges = [(0, 4096), (16384, 8192), (1 << 20, 1 << 20)];
                        zero_ranges(b, &ranges, Zeroing::Deallocate, &mut io).unwrap();
                        for deallocate in [false, true] {
                            let what = Zeroing::WriteZeroes { deallocate };
                            zero(b, 32768, 8192, what, &mut io).unwrap();
                        }
                        run(b, BackendRequest::Read { offset: 0 }, &mut r, &mut io).unwrap();
                        for (o, l) in [(0, 4096), (16384, 8192), (32768, 8192)] {
                            assert!(r[o..o + l].iter().all(|&x| x == 0));
                        }
                        assert!(r[4096..16384] == w[4096..16384]);
                    }
                    assert_eq!(io.files.by_id.len(), backends.len(), "on registered slots");
                })
                .join()
                .unwrap();
        });
        drop(backends);
        for p in paths {
            let _ = std::fs::remove_dir_all(p);
        }
    }

    /// A ring with a registered-file table of `slots` slots.
    fn registered(slots: u32) -> UringEngine {
        let options = RingOptions {
            registered_files: slots,
            ..RingOptions::default()
        };
        UringEngine::with_options(8, options).unwrap()
    }

    fn file_op(file: &BackendFile, kind: BlockOpKind, offset: u64, buf: &mut [u8]) -> BlockOp {
        crate::file::op_on(file, kind, offset, buf.as_mut_ptr(), buf.len() as u32)
    }

    /// The registered-file slot of the op submitted with `tag`, while it is in the engine.
    fn slot_of(io: &UringEngine, tag: u64) -> Option<u32> {
        io.slots
            .iter()
            .flatten()
            .find(|e| e.tag == tag)
            .expect("op in the engine")
            .file_slot
    }

    fn read_back(io: &mut UringEngine, file: &BackendFile, tag: u64) -> (Option<u32>, Vec<u8>) {
        let mut buf = AlignedBuf::new(4096);
        io.submit(file_op(file, BlockOpKind::Read, 0, &mut buf), tag);
        let slot = slot_of(io, tag);
        assert_eq!(collect(io, 1), vec![(tag, 4096)]);
        (slot, buf.to_vec())
    }

    #[test]
    fn uring_registered_file_closes_on_the_turn_after_its_backend_goes() {
        // The ring's slot holds a reference to the file: until the ring lets go, a removed
        // namespace's file (a block device: its loop device, its LV) stays open. The next
        // turn (`flush`) must let go.
        let (path, file) = scratch_file("regclose", 8192);
        let file = BackendFile::new(file);
        let id = file.id();
        let mut io = registered(4);
        let mut w = AlignedBuf::new(4096);
        w.copy_from_slice(&pattern(4096, 1));
        io.submit(
            file_op(&file, BlockOpKind::Write { fua: true }, 0, &mut w),
            1,
        );
        let slot = slot_of(&io, 1).expect("issued on a registered slot");
        assert_eq!(collect(&mut io, 1), vec![(1, 4096)]);
        let (again, back) = read_back(&mut io, &file, 2);
        assert_eq!(again, Some(slot), "one slot per file");
        assert!(back[..] == w[..]);
        assert_eq!(io.files.by_id, vec![(id, slot)]);

        let watch = CloseWatch::new(&path);
        drop(file);
        assert!(
            !watch.closed_within(100),
            "the descriptor is closed, the ring's slot still holds the file"
        );
        io.flush();
        assert!(
            watch.closed_within(5000),
            "the turn after removal closed it"
        );
        assert!(io.files.by_id.is_empty());
        assert_eq!(io.files.free.len(), 4);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_reused_descriptor_number_never_reaches_the_removed_file() {
        // Namespace A is removed (its backend and descriptor gone, the ring's slot not yet
        // swept) and namespace B opens under A's descriptor number: B's ops must reach B's
        // file, which a table keyed by descriptor number would get wrong.
        let (path_a, fa) = scratch_file("reuse-a", 4096);
        let (path_b, fb) = scratch_file("reuse-b", 4096);
        fa.write_all_at(&pattern(4096, 1), 0).unwrap();
        fb.write_all_at(&pattern(4096, 2), 0).unwrap();
        let mut io = registered(4);
        let mut reused = false;
        // Another test thread may take the freed number first: then try again.
        for attempt in 0..20 {
            let a = BackendFile::new(fa.try_clone().unwrap());
            let n = a.as_raw_fd();
            let (slot_a, back) = read_back(&mut io, &a, 1);
            assert!(slot_a.is_some());
            assert!(back == pattern(4096, 1));
            drop(a);
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own: the lowest free number ≥ n.
            let dup = unsafe { libc::fcntl(fb.as_raw_fd(), libc::F_DUPFD_CLOEXEC, n) };
            assert!(dup >= 0);
            // SAFETY: `dup` was just created and nothing else owns it.
            let b = BackendFile::new(unsafe { File::from_raw_fd(dup) });
            if dup != n {
                drop(b);
                io.flush();
                continue;
            }
            assert_eq!(io.files.by_id.len(), 1, "A's slot is still registered");
            let (slot_b, back) = read_back(&mut io, &b, 2);
            assert!(slot_b.is_some() && slot_b != slot_a, "attempt {attempt}");
            assert!(back == pattern(4096, 2), "B's read reached B's file");
            drop(b);
            io.flush();
            reused = true;
            break;
        }
        assert!(reused, "the descriptor number was never free for reuse");
        assert!(io.files.by_id.is_empty());
        std::fs::remove_file(path_a).unwrap();
        std::fs::remove_file(path_b).unwrap();
    }

    #[test]
    fn uring_full_file_table_falls_back_to_descriptors() {
        let (path_a, fa) = scratch_file("full-a", 4096);
        let (path_b, fb) = scratch_file("full-b", 4096);
        fa.write_all_at(&pattern(4096, 1), 0).unwrap();
        fb.write_all_at(&pattern(4096, 2), 0).unwrap();
        let (a, b) = (BackendFile::new(fa), BackendFile::new(fb));
        let mut io = registered(1);
        let (mut ra, mut rb) = (AlignedBuf::new(4096), AlignedBuf::new(4096));
        io.submit(file_op(&a, BlockOpKind::Read, 0, &mut ra), 1);
        io.submit(file_op(&b, BlockOpKind::Read, 0, &mut rb), 2);
        assert_eq!(slot_of(&io, 1), Some(0));
        assert_eq!(slot_of(&io, 2), None, "no slot left: the descriptor");
        assert!(io.files.warned_full);
        assert_eq!(collect(&mut io, 2), vec![(1, 4096), (2, 4096)]);
        assert!(ra.to_vec() == pattern(4096, 1));
        assert!(rb.to_vec() == pattern(4096, 2));
        // A removed file's slot goes to the next file that needs one.
        drop(a);
        let (slot, back) = read_back(&mut io, &b, 3);
        assert_eq!(slot, Some(0));
        assert!(back == pattern(4096, 2));
        std::fs::remove_file(path_a).unwrap();
        std::fs::remove_file(path_b).unwrap();
    }

    #[test]
    fn uring_refused_file_table_falls_back_to_descriptors() {
        // More slots than RLIMIT_NOFILE (and than the kernel's IORING_MAX_FIXED_FILES): the
        // kernel refuses the table, as a kernel before 5.19 refuses a sparse one.
        let mut io = registered(u32::MAX);
        assert!(!io.files.enabled);
        let (path, f) = scratch_file("refused", 4096);
        f.write_all_at(&pattern(4096, 3), 0).unwrap();
        let f = BackendFile::new(f);
        let (slot, back) = read_back(&mut io, &f, 1);
        assert_eq!(slot, None);
        assert!(back == pattern(4096, 3));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_slot_held_by_a_parked_op_is_not_emptied() {
        // Should a backend go while one of its ops is still in the engine (the contract says
        // it cannot), the slot keeps naming its file until that op is released: never empty
        // or another file under the op's feet.
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let rx = BackendFile::new(File::from(rx));
        let mut io = registered(2);
        let mut buf = AlignedBuf::new(4096);
        io.submit(file_op(&rx, BlockOpKind::Read, 0, &mut buf), 7);
        io.flush();
        drop(rx);
        io.flush();
        assert_eq!(io.files.by_id.len(), 1, "held by the parked read");
        assert!(io.cancel(7));
        io.flush();
        assert_eq!(collect(&mut io, 1), vec![(7, -libc::ECANCELED)]);
        io.flush();
        assert!(
            io.files.by_id.is_empty(),
            "released with the op, swept on the next turn"
        );
        drop(tx);
    }

    /// A ring with a registered-buffer budget of `bytes`.
    fn fixed(bytes: u64) -> UringEngine {
        let options = RingOptions {
            fixed_buffer_bytes: bytes,
            ..RingOptions::default()
        };
        UringEngine::with_options(8, options).unwrap()
    }

    /// The ring's registered buffers as the kernel lists them (`/proc/self/fdinfo`: after
    /// `UserBufs:`, one line per table entry, `index: 0xADDR/LEN` or `index: <none>`).
    fn kernel_buffers(io: &UringEngine) -> Vec<(usize, u32)> {
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", io.ring.as_raw_fd())).unwrap();
        let mut lines = info.lines().skip_while(|l| !l.starts_with("UserBufs:"));
        assert!(lines.next().is_some(), "fdinfo lists UserBufs:\n{info}");
        let entry = |l: &str| {
            let (_, value) = l.trim().split_once(": ")?;
            Some(value.split_once('/').map(|(addr, len)| {
                let addr = usize::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap();
                (addr, len.parse().unwrap())
            }))
        };
        // Before Linux 6.13 an empty entry is listed as the kernel's dummy buffer.
        let dummy = |&(addr, _): &(usize, u32)| addr != usize::MAX;
        lines.map_while(entry).flatten().filter(dummy).collect()
    }

    /// Anonymous memory, as a transport maps its buffers; unmapped on drop.
    struct Mapping(*mut u8, usize);

    impl Mapping {
        fn new(len: usize) -> Self {
            Self::map(std::ptr::null_mut(), len, 0)
        }

        fn map(at: *mut u8, len: usize, fixed: i32) -> Self {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed;
            // SAFETY: an anonymous mapping, anywhere, or (`replaced`) over a mapping this
            // test owns and no longer uses.
            let p = unsafe {
                libc::mmap(
                    at.cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
            Mapping(p.cast(), len)
        }

        /// New memory at this mapping's address, as when a closed connection's buffers are
        /// unmapped and the next connection's mapping gets their address; done in one step
        /// (MAP_FIXED over the old one) so that no other thread's mapping can take the
        /// address in between.
        fn replaced(self) -> Self {
            let (at, len) = (self.0, self.1);
            std::mem::forget(self);
            Self::map(at, len, libc::MAP_FIXED)
        }

        fn bytes(&self) -> &[u8] {
            // SAFETY: the live mapping, read by the test thread while no op is in flight.
            unsafe { std::slice::from_raw_parts(self.0, self.1) }
        }

        fn bytes_mut(&mut self) -> &mut [u8] {
            // SAFETY: as in `bytes`, with `&mut self` the only access.
            unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
        }

        fn unit(&self, owner: &fixedbuf::BufferOwner, index: u32) -> BufferUnit {
            BufferUnit {
                owner: owner.id(),
                index,
                base: self.0,
                len: self.1 as u32,
            }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping created in `map`, which nothing uses any more.
            unsafe { libc::munmap(self.0.cast(), self.1) };
        }
    }

    fn buf_slot_of(io: &UringEngine, tag: u64) -> Option<u16> {
        io.slots
            .iter()
            .flatten()
            .find(|e| e.tag == tag)
            .expect("op in the engine")
            .buf_slot
    }

    /// A scratch file holding `contents` at offset 0, opened O_DIRECT.
    fn direct_file(name: &str, size: u64, contents: &[u8]) -> (std::path::PathBuf, File) {
        let (path, plain) = scratch_file(name, size);
        plain.write_all_at(contents, 0).unwrap();
        plain.sync_all().unwrap();
        use std::os::unix::fs::OpenOptionsExt;
        let f = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        (path, f)
    }

    #[test]
    fn uring_fixed_buffers_carry_the_data_and_grow_with_the_transfer() {
        let (path, f) = direct_file("fixed", 1 << 20, &[]);
        let mut io = fixed(1 << 20);
        assert!(io.buffers.enabled);
        let owner = fixedbuf::BufferOwner::new();
        let (mut a, b) = (Mapping::new(256 << 10), Mapping::new(256 << 10));
        let (ua, ub) = (a.unit(&owner, 0), b.unit(&owner, 1));
        a.bytes_mut()[..65536].copy_from_slice(&pattern(65536, 5));
        let op = |kind, m: &Mapping, offset, len| BlockOp {
            fd: f.as_raw_fd(),
            file: None,
            kind,
            offset,
            buf: m.0,
            len,
        };
        // 4 KiB written from A: A registered for one page, the op a WRITE_FIXED on it.
        io.submit_in(op(BlockOpKind::Write { fua: false }, &a, 0, 4096), 1, &ua);
        let slot_a = buf_slot_of(&io, 1).expect("issued on a registered buffer");
        assert_eq!(collect(&mut io, 1), vec![(1, 4096)]);
        assert_eq!(io.registered_buffers(), (1, 4096));
        assert_eq!(kernel_buffers(&io), vec![(a.0 as usize, 4096)]);
        // 64 KiB from the same unit: the same entry, registered again at 64 KiB.
        io.submit_in(op(BlockOpKind::Write { fua: true }, &a, 0, 65536), 2, &ua);
        assert_eq!(buf_slot_of(&io, 2), Some(slot_a));
        assert_eq!(collect(&mut io, 1), vec![(2, 65536)]);
        assert_eq!(io.registered_buffers(), (1, 65536));
        // Read back into B through its own registration: the bytes A wrote.
        io.submit_in(op(BlockOpKind::Read, &b, 0, 65536), 3, &ub);
        assert!(buf_slot_of(&io, 3).is_some_and(|s| s != slot_a));
        assert_eq!(collect(&mut io, 1), vec![(3, 65536)]);
        assert!(b.bytes()[..65536] == pattern(65536, 5)[..]);
        let mut listed = kernel_buffers(&io);
        listed.sort();
        let mut want = vec![(a.0 as usize, 65536), (b.0 as usize, 65536)];
        want.sort();
        assert_eq!(listed, want, "what the kernel has registered");
        // An op outside the unit it names is issued on its buffer as it is.
        io.submit_in(op(BlockOpKind::Read, &b, 0, 4096), 5, &ua);
        assert_eq!(buf_slot_of(&io, 5), None);
        assert_eq!(collect(&mut io, 1), vec![(5, 4096)]);
        // A smaller op inside a registration is issued on it as it is.
        io.submit_in(op(BlockOpKind::Read, &a, 4096, 4096), 4, &ua);
        assert_eq!(buf_slot_of(&io, 4), Some(slot_a));
        assert_eq!(collect(&mut io, 1), vec![(4, 4096)]);
        assert_eq!(io.registered_buffers(), (2, 131072));
        drop(owner);
        io.flush();
        assert_eq!(io.registered_buffers(), (0, 0));
        assert_eq!(
            kernel_buffers(&io),
            vec![],
            "emptied on the turn after the owner went"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_fixed_buffers_of_a_gone_owner_never_serve_a_new_mapping_at_its_address() {
        // A connection's slot mapping is unmapped when it closes and the next connection's may
        // get the same address, while the ring still holds the old registration (until its
        // next sweep), whose pages the kernel keeps pinned. Keyed by address, the new
        // connection's read would land in the old pages and never reach its buffer.
        let (path, f) = direct_file("fixedreuse", 65536, &pattern(8192, 9));
        let mut io = fixed(1 << 20);
        let op = |buf, len| BlockOp {
            fd: f.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Read,
            offset: 0,
            buf,
            len,
        };
        let old_owner = fixedbuf::BufferOwner::new();
        let old = Mapping::new(8192);
        let addr = old.0;
        io.submit_in(op(addr, 4096), 1, &old.unit(&old_owner, 0));
        assert!(buf_slot_of(&io, 1).is_some());
        assert_eq!(collect(&mut io, 1), vec![(1, 4096)]);
        drop(old_owner);
        let new_owner = fixedbuf::BufferOwner::new();
        let new = old.replaced();
        assert_eq!(new.0, addr, "the same address");
        assert!(new.bytes().iter().all(|&b| b == 0));
        // No sweep in between: the old entry is still registered.
        assert_eq!(io.registered_buffers().0, 1);
        io.submit_in(op(addr, 4096), 2, &new.unit(&new_owner, 0));
        assert_eq!(collect(&mut io, 1), vec![(2, 4096)]);
        assert!(
            new.bytes()[..4096] == pattern(4096, 9)[..],
            "the read reached the new mapping"
        );
        io.flush();
        assert_eq!(io.registered_buffers(), (1, 4096), "the old one swept");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_fixed_buffers_beyond_the_budget_pin_per_op() {
        let (path, f) = direct_file("fixedbudget", 65536, &pattern(16384, 4));
        let mut io = fixed(8192);
        let owner = fixedbuf::BufferOwner::new();
        let maps: Vec<Mapping> = (0..3).map(|_| Mapping::new(16384)).collect();
        for (i, m) in maps.iter().enumerate() {
            let op = BlockOp {
                fd: f.as_raw_fd(),
                file: None,
                kind: BlockOpKind::Read,
                offset: 0,
                buf: m.0,
                len: 4096,
            };
            io.submit_in(op, i as u64, &m.unit(&owner, i as u32));
        }
        assert!(buf_slot_of(&io, 0).is_some() && buf_slot_of(&io, 1).is_some());
        assert_eq!(buf_slot_of(&io, 2), None, "8 KiB of budget: two pages");
        assert!(io.buffers.warned_full);
        assert_eq!(collect(&mut io, 3), vec![(0, 4096), (1, 4096), (2, 4096)]);
        for m in &maps {
            assert!(m.bytes()[..4096] == pattern(4096, 4)[..]);
        }
        // Growing a registered unit past the budget: that op pins per op, the entry stays.
        let op = BlockOp {
            fd: f.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Read,
            offset: 0,
            buf: maps[0].0,
            len: 16384,
        };
        io.submit_in(op, 3, &maps[0].unit(&owner, 0));
        assert_eq!(buf_slot_of(&io, 3), None);
        assert_eq!(collect(&mut io, 1), vec![(3, 16384)]);
        assert!(maps[0].bytes()[..16384] == pattern(16384, 4)[..]);
        assert_eq!(io.registered_buffers(), (2, 8192));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_fixed_buffers_off_or_refused_pin_per_op() {
        let (path, f) = direct_file("fixedoff", 65536, &[]);
        let owner = fixedbuf::BufferOwner::new();
        let m = Mapping::new(8192);
        let op = BlockOp {
            fd: f.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Read,
            offset: 0,
            buf: m.0,
            len: 4096,
        };
        let mut off = fixed(0);
        assert!(!off.buffers.enabled);
        off.submit_in(op, 1, &m.unit(&owner, 0));
        assert_eq!(buf_slot_of(&off, 1), None);
        assert_eq!(collect(&mut off, 1), vec![(1, 4096)]);
        // Memory the kernel will not register (a read-only file mapping: registration pins
        // for writing, which it refuses): the registration fails, the op goes per op, and no
        // later one tries.
        let ro = File::open(&path).unwrap();
        // SAFETY: a new shared read-only mapping of a scratch file, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                ro.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let unit = BufferUnit {
            owner: owner.id(),
            index: 1,
            base: p.cast(),
            len: 8192,
        };
        let mut io = fixed(1 << 20);
        let mut rejected = BlockOp {
            buf: p.cast(),
            kind: BlockOpKind::Write { fua: false },
            ..op
        };
        rejected.len = 4096;
        io.submit_in(rejected, 2, &unit);
        assert_eq!(buf_slot_of(&io, 2), None);
        assert!(io.buffers.refused);
        assert_eq!(collect(&mut io, 1), vec![(2, 4096)]);
        io.submit_in(op, 3, &m.unit(&owner, 0));
        assert_eq!(buf_slot_of(&io, 3), None, "no registration after a refusal");
        assert_eq!(collect(&mut io, 1), vec![(3, 4096)]);
        // SAFETY: the mapping made above; no op uses it any more.
        unsafe { libc::munmap(p, 8192) };
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_setup_errors_are_classified() {
        for errno in [libc::EPERM, libc::ENOSYS, libc::EACCES] {
            let err = classify_setup_error(256, io::Error::from_raw_os_error(errno));
            assert!(matches!(&err, UringError::Unavailable(e) if e.raw_os_error() == Some(errno)));
            assert!(err.to_string().contains("io_uring_disabled"));
        }
        let err = classify_setup_error(256, io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(matches!(err, UringError::Setup { entries: 256, .. }));
    }

    #[test]
    fn uring_engine_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<UringEngine>();
        let engine = UringEngine::new(4).unwrap();
        std::thread::spawn(move || assert_eq!(engine.in_flight(), 0))
            .join()
            .unwrap();
    }

    #[test]
    fn uring_eventfd_signals_readiness() {
        let (path, file) = scratch_file("eventfd", 4096);
        let mut io = UringEngine::new(2).unwrap();
        let mut fds = [nix::poll::PollFd::new(
            // SAFETY: the engine outlives this borrow.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(io.fd()) },
            nix::poll::PollFlags::POLLIN,
        )];
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
            0
        );
        let mut buf = AlignedBuf::new(4096);
        io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 5);
        io.flush();
        io.wait().unwrap();
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).unwrap(),
            1
        );
        let mut got = Vec::new();
        io.reap(|t, r| got.push((t, r)));
        assert_eq!(got, vec![(5, 4096)]);
        // reap drained the eventfd: not readable any more.
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
            0
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_external_completions_arrive_through_reap_with_ring_completions() {
        // A backend library's thread completes ops while the ring completes its own: both wake
        // the same eventfd, `in_flight` counts both until reaped, and every result reaches
        // `reap` with its tag exactly once.
        let (path, file) = scratch_file("external", 8192);
        let mut io = UringEngine::new(4).unwrap();
        let ext = Arc::clone(io.external().unwrap());
        for _ in 0..3 {
            ext.begin();
        }
        ext.begin();
        ext.abandon(); // refused synchronously: no completion follows
        assert_eq!(io.in_flight(), 3);
        let mut buf = AlignedBuf::new(4096);
        io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 100);
        io.flush();
        let worker = {
            let ext = Arc::clone(&ext);
            std::thread::spawn(move || {
                for (tag, res) in [(1u64, 4096), (2, -libc::EIO), (3, 0)] {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    ext.complete(tag, res);
                }
            })
        };
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got.len() < 4 {
            assert!(std::time::Instant::now() < deadline, "got only {got:?}");
            io.wait().unwrap();
            io.reap(|t, r| got.push((t, r)));
        }
        worker.join().unwrap();
        got.sort();
        assert_eq!(got, vec![(1, 4096), (2, -libc::EIO), (3, 0), (100, 4096)]);
        assert_eq!(io.in_flight(), 0);
        assert!(!ext.ready());
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn uring_drop_waits_for_external_ops() {
        // The engine must not go (and let the transport free buffers) while a library holds an
        // op: Drop returns only after the late completion.
        let io = UringEngine::new(2).unwrap();
        let mut io = io;
        let ext = Arc::clone(io.external().unwrap());
        ext.begin();
        let started = std::time::Instant::now();
        let worker = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            ext.complete(9, 0);
        });
        drop(io);
        assert!(started.elapsed() >= std::time::Duration::from_millis(200));
        worker.join().unwrap();
    }

    #[test]
    fn uring_drop_waits_for_in_flight_ops() {
        let (path, file) = scratch_file("drop", 1 << 20);
        let mut buf = AlignedBuf::new(1 << 20);
        {
            let mut io = UringEngine::new(4).unwrap();
            io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 1);
            io.flush();
            // Dropped with the read in the kernel: Drop must wait, so `buf` is safe to free.
        }
        drop(buf);
        std::fs::remove_file(path).unwrap();
    }
}
