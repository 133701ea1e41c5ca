//! Block backends behind one small interface (the cloud-hypervisor `AsyncIo` shape).
//!
//! The dispatch core turns an NVM command into at most one [`BlockOp`] and hands it to an
//! [`IoSubmit`] implementation owned by the reactor (an io_uring). RAM namespaces complete
//! inline without an op. The result comes back through `Queue::finish` as the io_uring `res`
//! value (bytes transferred, or `-errno`).

use std::os::fd::RawFd;

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
}

/// A backend operation for the reactor's ring.
///
/// `buf`/`len` point into the transport's per-command data buffer, which stays allocated and
/// untouched until the completion for this op has been delivered (transport contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockOp {
    pub fd: RawFd,
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
}

/// A data-moving request for one namespace, in bytes (the core has already converted LBAs and
/// checked the range against `capacity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendRequest {
    Read { offset: u64 },
    Write { offset: u64, fua: bool },
    Flush,
}

/// How a backend took a request.
#[derive(Debug)]
pub enum Started {
    /// Completed inline (RAM, or an error before anything was submitted).
    Done(std::io::Result<()>),
    /// One `BlockOp` was submitted with the given tag; its result arrives via `Queue::finish`.
    Submitted,
}

/// The storage behind one namespace. Shared by every queue of every controller that sees the
/// namespace, so implementations are `Send + Sync` and keep no per-I/O locks.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Usable size in bytes (a multiple of the namespace's LBA size).
    fn capacity(&self) -> u64;
    /// Short name for logs and the control CLI: "ram", "file", "block".
    fn kind(&self) -> &'static str;
    /// Starts a read (fills `buf`), write (from `buf`) or flush (`buf` empty).
    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started;
    /// Dataset Management deallocate: the range reads back as zeroes afterwards
    /// (hole punch, BLKDISCARD + zeroing guarantee, or RAM page drop).
    fn deallocate(&self, offset: u64, len: u64) -> std::io::Result<()>;
    /// Write Zeroes.
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()>;
}
