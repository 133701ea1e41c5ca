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
mod tests;
