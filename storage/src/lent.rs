//! Bytes of a namespace's memory lent to a transport (`Backend::lend`).
//!
//! Why lending a read is sound, and what a concurrent write to the range means for the host,
//! is argued where the memory lives (`ram` module comment). This module holds only the handle:
//! the trait layer knows no mapping, so a [`Lent`] keeps whatever memory the backend lent
//! alive through [`LendableMemory`].

use std::sync::Arc;

/// Memory a backend lends out in [`Lent`] ranges.
///
/// # Safety
///
/// `[base(), base() + size())` is mapped and readable, at the same address and for the same
/// length, for as long as the value lives, and is never written through a Rust reference
/// (only through raw-pointer copies), so that shared slices of it may be handed out.
pub unsafe trait LendableMemory: Send + Sync {
    fn base(&self) -> *const u8;
    fn size(&self) -> usize;
}

/// Bytes of a namespace's memory lent to a transport to send as a read's data, without a
/// copy into the command's buffer.
#[derive(Clone)]
pub struct Lent {
    /// Keeps the memory `ptr` points into alive (never read otherwise).
    _mem: Arc<dyn LendableMemory>,
    /// `mem.base() + offset`, taken once in `new`: `as_bytes` runs once per gather write of
    /// the read's data, and `base()` is a call through the trait object.
    ptr: *const u8,
    offset: usize,
    len: usize,
}

// SAFETY: `ptr` points into `mem`, which is `Send + Sync` and kept alive by the `Arc` beside
// it; the pointer is only read through (`as_bytes`), as the memory's own contract allows from
// any thread.
unsafe impl Send for Lent {}
// SAFETY: as above: `&Lent` gives only shared reads of memory that is `Sync`.
unsafe impl Sync for Lent {}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Lent {
    /// `[offset, offset + len)` of `mem`, if it lies inside.
    pub fn new<M: LendableMemory + 'static>(mem: &Arc<M>, offset: u64, len: usize) -> Option<Self> {
        let end = offset.checked_add(len as u64)?;
        if end > mem.size() as u64 {
            return None;
        }
        // SAFETY: `offset + len <= size()` (checked above), so the result stays inside (or one
        // past the end of) the mapping `base()` starts.
        let ptr = unsafe { mem.base().add(offset as usize) };
        Some(Lent {
            _mem: Arc::clone(mem) as Arc<dyn LendableMemory>,
            ptr,
            offset: offset as usize,
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `len` bytes only (a transport sends no more than the command asked for).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The bytes, for the iovec of a gather write (or a copy into a transport buffer where
    /// the bytes cannot be sent from here). They may change while borrowed, when a write to
    /// the same blocks runs on another queue: a reader gets some mix of old and new bytes,
    /// which NVMe allows for overlapping commands (`ram` module comment).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `[offset, offset + len)` was checked against the memory's length in `new`,
        // and the `Arc` keeps the memory alive at its address for as long as `self` (so for
        // the borrow); `LendableMemory`'s contract says no `&mut` ever aliases it. Concurrent
        // raw writes from other reactor threads change the bytes under the slice exactly as a
        // device's DMA changes a page under a reader, which the kernel's copy in `writev`
        // tolerates.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
