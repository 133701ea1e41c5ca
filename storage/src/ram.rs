//! RAM namespaces: one sparse anonymous mapping, completed inline without the ring.
//!
//! The mapping is `MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`: nothing is committed up front
//! and a page costs memory only once written, so a "1T" RAM namespace on a small machine works
//! until the host actually fills it. Deallocate and Write Zeroes give pages back with
//! `MADV_DONTNEED` (private anonymous pages read as zeroes afterwards, madvise(2)).
//!
//! Aliasing: the mapping is shared by every queue on every reactor thread, exactly like a disk
//! is shared by every I/O queue of a controller. Concurrent overlapping I/O from the host has
//! undefined *content* (NVMe Base 2.0 §3.4.5: no ordering between commands), but never memory
//! unsafety: the backend accesses the mapping only through raw pointers with
//! `ptr::copy_nonoverlapping` / `ptr::write_bytes`, every access is bounds-checked against the
//! mapping length, and the mapping lives until its last holder goes: the backend, and every
//! [`Lent`] range a transport still has queued for sending.
//!
//! Reads lent to the transport ([`Backend::lend`]): instead of copying a read into the
//! command's buffer, the TCP transport sends it straight from the mapping (a gather write: PDU
//! header, then a slice of the mapping), which saves a copy of every byte read. The kernel
//! copies the slice into socket buffers during the `writev`; between a partial write and the
//! next, the slice stays queued and the [`Lent`] keeps the mapping alive (an unmap would make
//! the kernel fault, or read another mapping placed there). What a concurrent write does to the
//! lent bytes is what NVMe allows for a read that overlaps a write: the host may get old, new
//! or mixed data (NVMe Base 2.0 §3.4.5 and NVM Command Set 1.0 §2.1.4.1 give no atomicity
//! beyond AWUN/AWUPF, which a RAM namespace reports as 0, one block, and transports may split a
//! read into several data PDUs anyway). It cannot break the read's promise: the read completes
//! only when its CapsuleResp (or the last C2HData with SUCCESS) arrives, which the transport
//! sends after the last data byte, so every byte is copied by the kernel before the host can
//! know the read finished and issue a write that must not be visible to it. A data digest,
//! however, would be computed before the send and could then disagree with the bytes sent: the
//! transport lends reads only when the host turned data digests off.

use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::Arc;

use nix::sys::mman::{self, MapFlags, MmapAdvise, ProtFlags};

use super::{
    check_range, Backend, BackendError, BackendRequest, Capabilities, IoSubmit, LendableMemory,
    Lent, Started, Zeroing,
};

/// A private anonymous mapping, unmapped when the last holder drops it.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value and unmapped only in Drop; the backend reaches
// it only through raw-pointer copies on bounds-checked ranges, and [`Lent`] only hands the
// kernel read-only views of it (see the module comment), which is sound from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes no references into the mapping.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` (> 0) bytes that read as zeroes until written; `writable` false maps them
    /// read-only (every page then stays the kernel's shared zero page).
    pub(crate) fn anonymous(len: NonZeroUsize, writable: bool) -> nix::Result<Self> {
        let prot = if writable {
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
        } else {
            ProtFlags::PROT_READ
        };
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address aliases nothing.
        let base = unsafe {
            mman::mmap_anonymous(
                None,
                len,
                prot,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }?;
        Ok(Mapping {
            base: base.cast(),
            len: len.get(),
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `anonymous` with exactly this base and length,
        // and no pointer into it outlives `self`: the backend's copies finish before `start`
        // returns, and every `Lent` holds an `Arc` of this mapping.
        if let Err(e) = unsafe { mman::munmap(self.base.cast(), self.len) } {
            tracing::error!(error = %e, "munmap of a RAM namespace failed");
        }
    }
}

// SAFETY: the mapping stays mapped at `base` for `len` bytes until Drop, and the backend
// writes it only through raw-pointer copies (module comment), never through a reference.
unsafe impl LendableMemory for Mapping {
    fn base(&self) -> *const u8 {
        self.base.as_ptr()
    }

    fn size(&self) -> usize {
        self.len
    }
}

#[derive(Debug)]
pub struct RamBackend {
    mem: Arc<Mapping>,
    page_size: usize,
}

impl RamBackend {
    /// Maps `size` bytes; `size` must be a non-zero multiple of `block_size`.
    pub fn new(size: u64, block_size: u32) -> Result<Self, BackendError> {
        let size_err = || BackendError::RamSize { size, block_size };
        if size == 0 || block_size == 0 || !size.is_multiple_of(u64::from(block_size)) {
            return Err(size_err());
        }
        let len = usize::try_from(size).map_err(|_| size_err())?;
        let nz_len = NonZeroUsize::new(len).ok_or_else(size_err)?;
        let mem = Mapping::anonymous(nz_len, true).map_err(|errno| BackendError::Map {
            size,
            source: io::Error::from(errno),
        })?;
        Ok(RamBackend {
            mem: Arc::new(mem),
            page_size: page_size(),
        })
    }

    /// Pointer to byte `offset` of the mapping after checking `[offset, offset + len)` fits.
    fn span(&self, offset: u64, len: usize) -> io::Result<*mut u8> {
        check_range(offset, len as u64, self.mem.len as u64)?;
        // `offset` ≤ the mapping length, which is a usize, so the cast is lossless and the
        // pointer stays inside (or one past the end of) the mapping.
        Ok(self.mem.base.as_ptr().wrapping_add(offset as usize))
    }

    /// Zeroes `[offset, offset + len)`: whole pages are dropped with MADV_DONTNEED (memory goes
    /// back to the system), the unaligned head and tail are cleared explicitly.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let len_usize =
            usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let start = self.span(offset, len_usize)?;
        let offset = offset as usize;
        let end = offset + len_usize;
        let page_start = offset.next_multiple_of(self.page_size);
        let page_end = end - end % self.page_size;
        if page_start < page_end {
            // SAFETY: [page_start, page_end) lies inside the mapping (checked by `span`) and is
            // page-aligned as madvise requires. Dropping pages of a private anonymous mapping
            // makes them read as zeroes; a concurrent copy into them sees either old data or
            // zeroes, never unmapped memory (the range stays mapped); so does the kernel
            // copying a lent read out of them.
            let addr = unsafe { NonNull::new_unchecked(self.mem.base.as_ptr().add(page_start)) };
            unsafe {
                mman::madvise(
                    addr.cast(),
                    page_end - page_start,
                    MmapAdvise::MADV_DONTNEED,
                )
            }
            .map_err(io::Error::from)?;
            self.fill_zero(start, page_start - offset);
            // SAFETY: `page_end` ≤ `end` ≤ mapping length.
            let tail = unsafe { self.mem.base.as_ptr().add(page_end) };
            self.fill_zero(tail, end - page_end);
        } else {
            self.fill_zero(start, len_usize);
        }
        Ok(())
    }

    fn fill_zero(&self, ptr: *mut u8, len: usize) {
        if len > 0 {
            // SAFETY: callers pass a range inside the mapping; see the module comment on
            // concurrent access.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
        }
    }
}

impl Backend for RamBackend {
    fn capacity(&self) -> u64 {
        self.mem.len as u64
    }

    fn kind(&self) -> &'static str {
        "ram"
    }

    /// MADV_DONTNEED on private anonymous pages: they read back as zeroes (madvise(2)).
    /// No volatile cache: a completed write is in the namespace's memory, where a Flush can
    /// take it no further (it is lost at exit either way); reporting a cache would only make
    /// hosts send Flushes that change nothing.
    fn capabilities(&self) -> Capabilities {
        Capabilities::ZEROING
    }

    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        _tag: u64,
        _io: &mut dyn IoSubmit,
    ) -> Started {
        let result = match request {
            BackendRequest::Read { offset } => self.span(offset, buf.len()).map(|src| {
                // SAFETY: `src..src+buf.len()` is inside the mapping; `buf` is a distinct
                // allocation owned by the transport, so the ranges cannot overlap.
                unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) }
            }),
            BackendRequest::Write { offset, fua: _ } => self.span(offset, buf.len()).map(|dst| {
                // SAFETY: as for reads, in the other direction. FUA needs nothing: RAM has no
                // cache below it and no durability to promise.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, buf.len()) }
            }),
            // Nothing volatile to write back: the mapping is the medium.
            BackendRequest::Flush => Ok(()),
        };
        Started::Done(result)
    }

    /// The read's bytes straight from the mapping (module comment).
    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        Lent::new(&self.mem, offset, len)
    }

    /// Inline, like reads and writes: dropping anonymous pages is memory management, not I/O.
    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        _what: Zeroing,
        _tag: u64,
        _io: &mut dyn IoSubmit,
    ) -> Started {
        for &(offset, len) in ranges {
            if let Err(e) = check_range(offset, len, self.mem.len as u64) {
                return Started::Done(Err(e));
            }
        }
        Started::Done(ranges.iter().try_for_each(|&(o, l)| self.zero_range(o, l)))
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests;
