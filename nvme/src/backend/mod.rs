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
