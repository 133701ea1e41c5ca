//! Block backends behind one small interface (the cloud-hypervisor `AsyncIo` shape).
//!
//! The dispatch core turns an NVM command into at most one [`BlockOp`] and hands it to an
//! [`IoSubmit`] implementation owned by the reactor (an io_uring). RAM namespaces complete
//! inline without an op. The result comes back through `Queue::finish` as the io_uring `res`
//! value (bytes transferred, or `-errno`).

use std::io::Write as _;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What one backend operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOpKind {
    Read,
    /// `fua`: NVMe FUA → `RWF_DSYNC` on this write only (NVMe Base 2.0 §6.15 / NVM 1.0 §3.2.6).
    Write {
        fua: bool,
    },
    /// NVMe Flush → `fdatasync`.
    Flush,
    /// Deallocate / Write Zeroes of `[offset, offset + len)` (`BlockOp::len` and `buf` unused):
    /// the engine tries the methods of `plan` in order, moving to the next one when the kernel
    /// says a method is not supported for this file or device, and completes with 0.
    Zeroes {
        len: u64,
        plan: &'static [ZeroMethod],
    },
}

/// One way of making a range read as zeroes (or of discarding it), as the engine issues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroMethod {
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: a file drops the blocks (a hole reads as zeroes);
    /// a block device issues write-zeroes that may unmap (the kernel's `blkdev_fallocate`
    /// chooses; no fallback to writing zero pages, and no NOUNMAP zero-out afterwards).
    PunchHole,
    /// `fallocate(ZERO_RANGE | KEEP_SIZE)`: zeroes with the blocks kept allocated (block
    /// devices: write-zeroes with NOUNMAP, or zero pages written by the kernel).
    ZeroRange,
    /// `BLOCK_URING_CMD_DISCARD` (Linux 6.12+): discard only, for devices without
    /// write-zeroes (dm-thin); what reads return afterwards is the device's business.
    Discard,
    /// Plain writes from a zero buffer (files on filesystems without fallocate modes).
    WriteZeroes,
}

#[cfg(feature = "engine")]
impl ZeroMethod {
    /// The fallocate(2) mode of the methods that are one (the ring uses it; so can test
    /// engines that perform ops with plain system calls).
    pub fn fallocate_mode(self) -> Option<i32> {
        match self {
            ZeroMethod::PunchHole => Some(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE),
            ZeroMethod::ZeroRange => Some(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE),
            ZeroMethod::Discard | ZeroMethod::WriteZeroes => None,
        }
    }
}

impl ZeroMethod {
    /// Files: Deallocate punches a hole; Write Zeroes keeps the blocks allocated. Either way
    /// the range reads back as zeroes, by writing them if the filesystem can do neither.
    pub const FILE_DEALLOCATE: &'static [ZeroMethod] = &[
        ZeroMethod::PunchHole,
        ZeroMethod::ZeroRange,
        ZeroMethod::WriteZeroes,
    ];
    pub const FILE_WRITE_ZEROES: &'static [ZeroMethod] = &[
        ZeroMethod::ZeroRange,
        ZeroMethod::PunchHole,
        ZeroMethod::WriteZeroes,
    ];
    /// Block devices with write-zeroes: Dataset Management deallocate and Write Zeroes with
    /// DEAC are an unmapping write-zeroes (zeroes guaranteed, unmapping welcome); the NOUNMAP
    /// form only if the device refuses that.
    pub const BDEV_WRITE_ZEROES_DEAC: &'static [ZeroMethod] =
        &[ZeroMethod::PunchHole, ZeroMethod::ZeroRange];
    /// Block devices that can only discard (dm-thin): Dataset Management deallocate is a
    /// discard (thin volumes give the space back; no zeroes promised, and DLFEAT says so).
    pub const BDEV_DISCARD: &'static [ZeroMethod] = &[ZeroMethod::Discard];
    /// Block devices, Write Zeroes: zeroes, blocks stay provisioned.
    pub const BDEV_WRITE_ZEROES: &'static [ZeroMethod] = &[ZeroMethod::ZeroRange];
}

/// A backend operation for the reactor's ring.
///
/// `buf`/`len` point into the transport's per-command data buffer, which stays allocated and
/// untouched until the completion for this op has been delivered (transport contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockOp {
    pub fd: RawFd,
    /// The identity of `fd`'s [`fileid::BackendFile`], under which a ring may register it
    /// (`None`: the op is issued on `fd` as it is).
    pub file: Option<fileid::FileId>,
    pub kind: BlockOpKind,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: u32,
}

/// The reactor side of backend I/O. `submit` never fails synchronously: if the ring cannot take
/// the op now it queues it, and a failure to submit is delivered later as a negative result
/// for `tag`.
pub trait IoSubmit {
    fn submit(&mut self, op: BlockOp, tag: u64);

    /// [`submit`](Self::submit) of an op whose buffer lies inside `unit`, a transport data
    /// buffer the submitter may register and issue the op on (io_uring fixed buffers, see
    /// `fixedbuf`). Submitters without registered buffers submit it as any other op.
    fn submit_in(&mut self, op: BlockOp, tag: u64, _unit: &fixedbuf::BufferUnit) {
        self.submit(op, tag)
    }

    /// Submits `ops` as one unit (the ranges of one Dataset Management command): a single
    /// completion for `tag` once every op is done, 0 if all succeeded, else the first error.
    fn submit_group(&mut self, ops: &[BlockOp], tag: u64);

    /// Where backends that complete I/O on threads of their own (librbd) deliver results for
    /// this reactor; the reactor reaps them together with its ring's completions. `None`: this
    /// submitter has no such channel, and those backends fail the request instead.
    fn external(&mut self) -> Option<&Arc<ExternalCompletions>> {
        None
    }

    /// Asks to cancel the op submitted with `tag` (an Abort, NVMe Base 2.0 §5.1). `true`: the
    /// request is on its way, and the op's one completion still comes, with `-ECANCELED` if
    /// it was cancelled or its own result if it was already running. `false`: this submitter
    /// cannot cancel it (done at submit time, a group, a library's own thread).
    fn cancel(&mut self, _tag: u64) -> bool {
        false
    }

    /// Runs `then` on this submitter's thread once `delay` has passed, without blocking that
    /// thread in the meantime (the injected latency of `fault`). `buf`/`len` are the command's
    /// data buffer, as in [`BlockOp`] and under the same lifetime rule; `then` gets them back
    /// as a slice. Cancellable like an op ([`cancel`](Self::cancel) with `tag`): cancelled
    /// while it waits, `then` is dropped without running and `tag` completes with
    /// `-ECANCELED`. `false`: this submitter has no timer; nothing was queued.
    fn submit_after(
        &mut self,
        _delay: std::time::Duration,
        _buf: *mut u8,
        _len: u32,
        _tag: u64,
        _then: Deferred,
    ) -> bool {
        false
    }

    /// A command waits (`Outcome::Blocked`) for a QoS limit that allows it at `at`: tick this
    /// submitter's connections then (or soon after), so that the transport runs it again.
    /// Default: nothing sooner than the periodic tick (the dispatch contract's ≤ 100 ms).
    fn wake_at(&mut self, _at: std::time::Instant) {}
}

/// Work that [`IoSubmit::submit_after`] runs once its delay has passed: given the command's
/// data buffer and the submitter, it starts what was deferred (as [`Backend::start`] would)
/// and returns the result to deliver for the tag now (bytes or `-errno`, like a CQE's `res`),
/// or `None` when it submitted an op whose completion for the same tag follows.
pub type Deferred = Box<dyn FnOnce(&mut [u8], &mut dyn IoSubmit) -> Option<i32> + Send>;

/// Completions produced outside the reactor's ring, by a backend library's own threads.
///
/// The backend calls [`begin`](Self::begin) before it hands an op to its library and then
/// exactly one of [`complete`](Self::complete) (from any thread, once the library is done with
/// the buffer) or [`abandon`](Self::abandon) (the library refused the op synchronously and will
/// never touch the buffer). `complete` queues `(tag, result)` and makes the notifier eventfd
/// readable; the owner drains the queue with [`drain`](Self::drain) when it sees the eventfd.
/// `pending` counts ops handed out and not yet drained, so that the reactor keeps transport
/// buffers alive while a library may still write into them (backend contract).
#[derive(Debug)]
pub struct ExternalCompletions {
    done: Mutex<Vec<(u64, i32)>>,
    pending: AtomicUsize,
    notify: std::fs::File,
    /// Set by `wake`: commands parked on this reactor may go on (`take_wake`).
    woken: std::sync::atomic::AtomicBool,
}

impl ExternalCompletions {
    /// `notify`: an eventfd (non-blocking) the owner watches; written once per completion.
    pub fn new(notify: OwnedFd) -> Self {
        Self {
            done: Mutex::new(Vec::new()),
            pending: AtomicUsize::new(0),
            notify: std::fs::File::from(notify),
            woken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Another thread released what a command parked on this reactor waited for (the write
    /// lock of a fused Compare and Write): wake the owner, which then ticks its connections
    /// (they run their blocked commands again).
    pub fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.signal();
    }

    /// Whether `wake` was called since the last call.
    pub fn take_wake(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }

    /// An op is about to be handed to a library that will call `complete` for it.
    pub fn begin(&self) {
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// The library refused an op synchronously (no completion will follow).
    pub fn abandon(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// Result of an op started with `begin`: bytes transferred or `-errno`, as io_uring reports
    /// it. Safe to call from any thread; never blocks on the reactor.
    pub fn complete(&self, tag: u64, result: i32) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((tag, result));
        // The push happens before the eventfd write, and the owner reads the eventfd before it
        // takes the queue: a completion is never left queued without a pending wake-up.
        self.signal();
    }

    fn signal(&self) {
        // One write(2) of 8 bytes adds 1 to the eventfd's counter. A full counter (EAGAIN)
        // still leaves the eventfd readable, which is all that matters.
        let _ = (&self.notify).write(&1u64.to_ne_bytes());
    }

    /// Hands every queued completion to `f`. The caller drains the eventfd first.
    pub fn drain(&self, mut f: impl FnMut(u64, i32)) {
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()));
        self.pending.fetch_sub(done.len(), Ordering::AcqRel);
        for (tag, result) in done {
            f(tag, result);
        }
    }

    /// Ops begun and not yet drained.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Completions queued and not yet drained.
    pub fn ready(&self) -> bool {
        !self
            .done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

/// A data-moving request for one namespace, in bytes (the core has already converted LBAs and
/// checked the range against `capacity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendRequest {
    Read { offset: u64 },
    Write { offset: u64, fua: bool },
    Flush,
}

/// What [`Backend::start_zeroes`] is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeroing {
    /// Dataset Management with the Deallocate attribute: give the space back; the ranges read
    /// as zeroes afterwards only where the backend reports `zeroes_after_deallocate`.
    Deallocate,
    /// Write Zeroes: the range must read as zeroes; `deallocate` (DEAC) allows unmapping.
    WriteZeroes { deallocate: bool },
}

/// How a backend took a request.
#[derive(Debug)]
pub enum Started {
    /// Completed inline (RAM, or an error before anything was submitted).
    Done(std::io::Result<()>),
    /// One `BlockOp` was submitted with the given tag; its result arrives via `Queue::finish`.
    Submitted,
}

/// What a backend can do, as Identify reports it (NVM Command Set 1.0 §4.1.5.1 DLFEAT, NVMe
/// Base 2.0 §5.17.2.1 ONCS, Identify Controller NVM CNS 06h). A limit of 0 means "not known",
/// which Identify reports as 0 ("no limit reported"), never as an invented value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Dataset Management deallocate gives space back (hole punch, discard, page drop). When
    /// false the backend completes deallocate as the hint it is, without touching the data.
    pub deallocate: bool,
    /// Deallocated blocks read back as zeroes (DLFEAT 001b): guaranteed, not "usually".
    pub zeroes_after_deallocate: bool,
    /// Write Zeroes with DEAC deallocates (DLFEAT bit 3).
    pub write_zeroes_deallocates: bool,
    /// Largest deallocate the storage takes as one operation, in bytes (0: not known).
    pub max_deallocate_bytes: u64,
    /// Largest write-zeroes the storage takes as one operation, in bytes (0: not known).
    pub max_write_zeroes_bytes: u64,
    /// The storage's physical block: smaller writes are read-modify-write (0: not known).
    pub physical_block_bytes: u32,
    /// The size writes are best issued in (block devices: `optimal_io_size`; 0: not known).
    pub optimal_io_bytes: u32,
    /// A write can complete before it is durable, and Flush (or FUA) is what makes it so: a
    /// page cache, a device's write-back cache, librbd's cache. Identify Controller VWC
    /// (NVMe Base 2.0 §5.17.2.1) is present when a namespace of the subsystem has one.
    pub volatile_cache: bool,
}

impl Capabilities {
    /// Deallocate gives space back and reads back as zeroes, Write Zeroes with DEAC
    /// deallocates, no limit known, no volatile cache: what RAM, null, file and RBD
    /// namespaces promise (file and RBD then add their caches).
    pub const ZEROING: Capabilities = Capabilities {
        deallocate: true,
        zeroes_after_deallocate: true,
        write_zeroes_deallocates: true,
        max_deallocate_bytes: 0,
        max_write_zeroes_bytes: 0,
        physical_block_bytes: 0,
        optimal_io_bytes: 0,
        volatile_cache: false,
    };
}

/// The storage behind one namespace. Shared by every queue of every controller that sees the
/// namespace, so implementations are `Send + Sync` and keep no per-I/O locks.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Usable size in bytes (a multiple of the namespace's LBA size).
    fn capacity(&self) -> u64;
    /// Short name for logs and the control CLI: "ram", "file", "block".
    fn kind(&self) -> &'static str;
    /// What Identify may promise for this namespace (fixed for the backend's lifetime).
    fn capabilities(&self) -> Capabilities;
    /// Starts a read (fills `buf`), write (from `buf`) or flush (`buf` empty).
    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started;
    /// Dataset Management deallocate or Write Zeroes of `ranges` (byte offset, length;
    /// checked by the core), started like [`start`](Self::start): one completion for all
    /// ranges, result 0. Never blocks the calling (reactor) thread on the storage.
    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        what: Zeroing,
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started;
    /// The bytes of a read of `[offset, offset + len)` where the backend keeps them in memory
    /// (RAM and null namespaces), for a transport to send them without copying them into the
    /// command's buffer first (`ram` module comment: validity and concurrent writes). Checked
    /// against the capacity like `start`; `None`: read through `start` instead.
    fn lend(&self, _offset: u64, _len: usize) -> Option<Lent> {
        None
    }
    /// For storage that can be resized underneath nvmfd (an RBD image after `rbd resize`):
    /// re-reads the size and returns the new `capacity` if it changed since the last call.
    /// Called from the target's periodic check, never on the I/O path; may block briefly.
    fn refresh_capacity(&self) -> Option<u64> {
        None
    }
}

// The trait layer: what the protocol crate sees, free of system-call dependencies.
pub mod aligned;
pub mod error;
pub mod fault;
pub mod fileid;
pub mod fixedbuf;
mod lent;
pub mod retire;
pub mod testing;

pub use error::BlockError;
pub use lent::{LendableMemory, Lent};

// The engines and backends (cargo feature `engine`, on by default): io_uring, libc, nix,
// librbd.
#[cfg(feature = "engine")]
pub mod bdev;
#[cfg(feature = "engine")]
pub mod file;
#[cfg(feature = "engine")]
pub mod null;
#[cfg(feature = "engine")]
pub mod ram;
#[cfg(feature = "rbd")]
pub mod rbd;
#[cfg(feature = "engine")]
pub mod sync;
#[cfg(all(test, feature = "engine"))]
pub(crate) mod test_support;
#[cfg(feature = "engine")]
pub mod uring;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a namespace's blocks live. Backend-neutral so that configuration code can build it
/// without knowing the backends; [`open`] turns it into an `Arc<dyn Backend>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// Anonymous memory of `size` bytes (contents lost on exit).
    Ram { size: u64 },
    /// `size` bytes that read as zeroes and drop writes (benchmarks).
    Null { size: u64 },
    /// A regular file, created or extended to `size` when given; O_DIRECT when `direct_io`.
    File {
        path: PathBuf,
        size: Option<u64>,
        direct_io: bool,
    },
    /// A block device; its size is the device size.
    Block { path: PathBuf },
    /// A Ceph RBD image (backend built with the cargo feature `rbd`); its size is the image
    /// size and follows `rbd resize`.
    Rbd(RbdTarget),
    /// `inner` with injected failures (tests: see `fault`).
    Faulty {
        inner: Box<BackendConfig>,
        rules: Vec<fault::FaultRule>,
    },
}

/// Where an RBD namespace's image lives and how to reach the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdTarget {
    pub pool: String,
    /// RADOS namespace inside the pool (`pool/namespace/image`), if any.
    pub namespace: Option<String>,
    pub image: String,
    /// ceph.conf to read; `None`: librados' default search ($CEPH_CONF, /etc/ceph/ceph.conf…).
    pub ceph_conf: Option<PathBuf>,
    /// Client id without the `client.` prefix; `None`: librados' default (`admin`).
    pub client_id: Option<String>,
}

impl RbdTarget {
    /// `pool/image` or `pool/namespace/image`, as `rbd` itself names images.
    pub fn spec(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{}/{}", self.pool, ns, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }
}

/// Why a namespace's backing store could not be opened. Every variant names what was being
/// opened so that the daemon's log line is actionable on its own.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("block size {block_size} is not a power of two between 512 and 65536")]
    InvalidBlockSize { block_size: u32 },
    #[error("RAM namespace size {size} is not a non-zero multiple of the block size {block_size}")]
    RamSize { size: u64, block_size: u32 },
    #[error(
        "null namespace size {size} is not a non-zero multiple of the block size {block_size}"
    )]
    NullSize { size: u64, block_size: u32 },
    #[error("cannot map {size} bytes of anonymous memory for a RAM namespace")]
    Map {
        size: u64,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot open", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot stat", path.display())]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot extend to {size} bytes", path.display())]
    Resize {
        path: PathBuf,
        size: u64,
        #[source]
        source: io::Error,
    },
    #[error("{}: neither a regular file nor a block device", path.display())]
    UnsupportedFileType { path: PathBuf },
    #[error("{}: not a block device", path.display())]
    NotABlockDevice { path: PathBuf },
    #[error("{}: `size` applies to regular files only; a block device has its own size", path.display())]
    SizeOnBlockDevice { path: PathBuf },
    #[error("{}: {size} bytes is less than one {block_size}-byte block", path.display())]
    TooSmall {
        path: PathBuf,
        size: u64,
        block_size: u32,
    },
    #[error("{}: logical block size {device_block_size} is larger than the namespace block size {block_size}", path.display())]
    DeviceBlockSize {
        path: PathBuf,
        device_block_size: u32,
        block_size: u32,
    },
    #[error("RBD image {spec}: {step} failed")]
    Rbd {
        spec: String,
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("RBD image {spec}: {size} bytes is less than one {block_size}-byte block")]
    RbdTooSmall {
        spec: String,
        size: u64,
        block_size: u32,
    },
    #[error("RBD image {spec}: this nvmfd was built without RBD support (cargo feature `rbd`)")]
    RbdNotBuilt { spec: String },
    #[error("{}: {request} failed", path.display())]
    Ioctl {
        path: PathBuf,
        request: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Opens the storage for one namespace with LBAs of `block_size` bytes.
///
/// A `File` config whose path turns out to be a block device is opened as one (configuration
/// has a single `path` key for both), provided it carries no `size`.
#[cfg(feature = "engine")]
pub fn open(config: &BackendConfig, block_size: u32) -> Result<Arc<dyn Backend>, BackendError> {
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(BackendError::InvalidBlockSize { block_size });
    }
    Ok(match config {
        BackendConfig::Faulty { inner, rules } => Arc::new(fault::FaultBackend::new(
            open(inner, block_size)?,
            rules.clone(),
        )),
        BackendConfig::Ram { size } => Arc::new(ram::RamBackend::new(*size, block_size)?),
        BackendConfig::Null { size } => Arc::new(null::NullBackend::new(*size, block_size)?),
        BackendConfig::Block { path } => Arc::new(bdev::BlockBackend::open(path, block_size)?),
        #[cfg(feature = "rbd")]
        BackendConfig::Rbd(target) => Arc::new(rbd::RbdBackend::open(target, block_size)?),
        #[cfg(not(feature = "rbd"))]
        BackendConfig::Rbd(target) => {
            return Err(BackendError::RbdNotBuilt {
                spec: target.spec(),
            })
        }
        BackendConfig::File {
            path,
            size,
            direct_io,
        } => {
            if is_block_device(path)? {
                if size.is_some() {
                    return Err(BackendError::SizeOnBlockDevice { path: path.clone() });
                }
                Arc::new(bdev::BlockBackend::open(path, block_size)?)
            } else {
                Arc::new(file::FileBackend::open(
                    path, *size, *direct_io, block_size,
                )?)
            }
        }
    })
}

/// True if `path` exists and is a block device; a missing path is not an error here (the file
/// backend may create it).
#[cfg(feature = "engine")]
fn is_block_device(path: &std::path::Path) -> Result<bool, BackendError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.file_type().is_block_device()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BackendError::Stat {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Checks that `[offset, offset + len)` lies inside `capacity` (the core already does; backends
/// re-check because an out-of-range op would touch memory or another file's blocks).
#[cfg(feature = "engine")]
pub(crate) fn check_range(offset: u64, len: u64, capacity: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

#[cfg(all(test, feature = "engine"))]
mod tests {
    use super::*;

    #[test]
    fn open_dispatches_by_config() {
        let ram = open(&BackendConfig::Ram { size: 1 << 20 }, 4096).unwrap();
        assert_eq!((ram.kind(), ram.capacity()), ("ram", 1 << 20));

        let path = std::env::temp_dir().join(format!("nvmfd-open-{}.img", std::process::id()));
        let cfg = BackendConfig::File {
            path: path.clone(),
            size: Some(1 << 20),
            direct_io: true,
        };
        let file = open(&cfg, 512).unwrap();
        assert_eq!((file.kind(), file.capacity()), ("file", 1 << 20));
        drop(file);

        let err = open(&BackendConfig::Block { path: path.clone() }, 512).unwrap_err();
        assert!(matches!(err, BackendError::NotABlockDevice { .. }));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn open_rejects_bad_block_sizes() {
        for bs in [0, 256, 1000, 3000, 1 << 17] {
            let err = open(&BackendConfig::Ram { size: 1 << 20 }, bs).unwrap_err();
            assert!(
                matches!(err, BackendError::InvalidBlockSize { block_size } if block_size == bs)
            );
        }
        assert!(matches!(
            open(&BackendConfig::Ram { size: 1000 }, 512),
            Err(BackendError::RamSize { .. })
        ));
    }

    #[test]
    fn errors_name_the_path_and_keep_the_source() {
        use std::error::Error;
        let cfg = BackendConfig::File {
            path: "/nonexistent-dir/x.img".into(),
            size: None,
            direct_io: true,
        };
        let err = open(&cfg, 512).unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir/x.img"), "{err}");
        let source = err
            .source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .unwrap();
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
    }
}
