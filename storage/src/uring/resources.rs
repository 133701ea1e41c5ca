//! The two kinds of resource a ring registers ([`table`](super::table)): backend files
//! (`IORING_REGISTER_FILES_*`) and transport data buffers (`IORING_REGISTER_BUFFERS_*`).

use std::io;
use std::os::fd::RawFd;

use io_uring::Submitter;

use super::table::Resource;
use crate::fileid::{self, FileId};
use crate::fixedbuf::{self, OwnerId};

/// Registered files: a backend's file ([`FileId`], one unit) in a slot, so that ops name the
/// slot (IOSQE_FIXED_FILE) instead of the descriptor. An entry costs nothing (the table's
/// size is the limit).
#[derive(Debug)]
pub(super) struct Files;

impl Resource for Files {
    type Owner = FileId;
    type Want = RawFd;
    type Entry = ();

    fn create(submitter: &Submitter<'_>, slots: u32) -> io::Result<()> {
        submitter.register_files_sparse(slots)
    }

    #[inline]
    fn covers(_: &(), _: &RawFd) -> bool {
        // A file's slot serves it for as long as the file lives.
        true
    }

    fn entry_for(_: &RawFd) {}

    #[inline]
    fn cost(_: &()) -> u64 {
        0
    }

    fn fill(submitter: &Submitter<'_>, slot: u32, fd: &RawFd, _: &()) -> io::Result<()> {
        match submitter.register_files_update(slot, &[*fd])? {
            1 => Ok(()),
            n => Err(io::Error::other(format!("{n} of 1 slots updated"))),
        }
    }

    fn empty(submitter: &Submitter<'_>, slot: u32) -> io::Result<()> {
        // -1 empties the slot; the kernel drops its file reference once no request in flight
        // uses it (none here), so the file closes now.
        submitter.register_files_update(slot, &[-1]).map(drop)
    }

    #[inline]
    fn retired_count() -> u64 {
        fileid::retired_count()
    }

    fn retired_among(ids: impl Iterator<Item = FileId>, f: impl FnMut(FileId)) {
        fileid::retired_among(ids, f)
    }

    const REFUSAL_IS_FINAL: bool = false;

    fn log_table_refused(error: &io::Error, slots: u32) {
        // EINVAL before Linux 5.19 (no sparse tables); EMFILE above RLIMIT_NOFILE.
        tracing::warn!(%error, slots,
            "io_uring registered-file table refused; ops name their descriptors");
    }

    fn log_full(slots: usize, _: u64) {
        tracing::warn!(
            slots,
            "io_uring registered-file table full; further files use their descriptors \
             (raise [global] uring_registered_files)"
        );
    }

    fn log_fill_refused(error: &io::Error, slot: u32, _: u64, _: u64) {
        tracing::warn!(
            %error,
            slot,
            "io_uring registered-file update refused; this file uses its descriptor"
        );
    }

    fn empty_failed(error: &io::Error, slot: u32) -> bool {
        tracing::error!(%error, slot,
            "io_uring could not empty a registered-file slot; the removed file stays \
             open until the slot is reused");
        true
    }
}

/// Registered buffers: the leading part of a transport data buffer (unit `index` of an
/// [`OwnerId`]) pinned once, so that reads and writes inside it are `READ_FIXED`/`WRITE_FIXED`.
/// An entry costs the bytes it pins.
#[derive(Debug)]
pub(super) struct Buffers;

/// What an op asks of [`Buffers`]: its unit's `len` bytes at `base`, of which it reaches
/// `extent` bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) base: *mut u8,
    pub(super) len: u32,
    pub(super) extent: u32,
}

impl Resource for Buffers {
    type Owner = OwnerId;
    type Want = Span;
    /// The registered range's start address and length (0: empty).
    type Entry = (usize, u32);

    fn create(submitter: &Submitter<'_>, slots: u32) -> io::Result<()> {
        submitter.register_buffers_sparse(slots)
    }

    #[inline]
    fn covers(&(base, len): &(usize, u32), want: &Span) -> bool {
        base == want.base as usize && want.extent <= len
    }

    fn entry_for(want: &Span) -> (usize, u32) {
        // The largest transfer so far, rounded up to a power of two: a 1 MiB slot used for
        // 4 KiB I/O pins 4 KiB, and a unit grows a bounded number of times.
        let len = u64::from(want.extent)
            .next_power_of_two()
            .max(4096)
            .min(u64::from(want.len)) as u32;
        (want.base as usize, len)
    }

    #[inline]
    fn cost(&(_, len): &(usize, u32)) -> u64 {
        u64::from(len)
    }

    fn fill(
        submitter: &Submitter<'_>,
        slot: u32,
        want: &Span,
        &(_, len): &(usize, u32),
    ) -> io::Result<()> {
        let iov = libc::iovec {
            iov_base: want.base.cast(),
            iov_len: len as usize,
        };
        // SAFETY: `[base, base + len)` lies inside the unit (`extent_of` checked the op, and
        // `len` ≤ the unit's length), which its owner keeps mapped while it does I/O there;
        // the kernel pins the pages, so the entry stays valid memory even after the owner
        // unmaps it, and entries are keyed by owner identity, so no later mapping at the same
        // address is ever issued on it.
        unsafe { submitter.register_buffers_update(slot, &[iov], None) }.map(drop)
    }

    fn empty(submitter: &Submitter<'_>, slot: u32) -> io::Result<()> {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec names no memory: the entry is cleared, and the kernel
        // unpins its pages once no request issued on it is in flight.
        unsafe { submitter.register_buffers_update(slot, &[empty], None) }.map(drop)
    }

    #[inline]
    fn retired_count() -> u64 {
        fixedbuf::retired_count()
    }

    fn retired_among(ids: impl Iterator<Item = OwnerId>, f: impl FnMut(OwnerId)) {
        fixedbuf::retired_among(ids, f)
    }

    /// ENOMEM: RLIMIT_MEMLOCK (without CAP_IPC_LOCK); EFAULT/EOPNOTSUPP: memory the kernel
    /// will not pin. Stop registering rather than retry per op; what is registered stays in
    /// use.
    const REFUSAL_IS_FINAL: bool = true;

    fn log_table_refused(error: &io::Error, _: u32) {
        // EINVAL before Linux 5.19 (no sparse tables).
        tracing::warn!(%error, "io_uring registered-buffer table refused; \
            reads and writes pin their buffers per op");
    }

    fn log_full(entries: usize, budget: u64) {
        tracing::info!(
            budget,
            entries,
            "io_uring registered buffers of this reactor in use; other data buffers are \
             pinned per op (raise [global] uring_fixed_buffers)"
        );
    }

    fn log_fill_refused(error: &io::Error, _: u32, bytes: u64, pinned: u64) {
        tracing::warn!(%error, bytes, pinned,
            "io_uring refused to register a data buffer; further reads and writes on this \
             reactor pin their buffers per op");
    }

    fn empty_failed(error: &io::Error, slot: u32) -> bool {
        // Still pinned, but no owner's unit names it: never issued on again.
        tracing::error!(%error, slot,
            "io_uring could not empty a registered buffer; its memory stays \
             pinned until the reactor exits");
        false
    }
}
