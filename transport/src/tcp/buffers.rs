//! Per-command data buffers: one anonymous mapping per queue, cut into equal page-aligned
//! slots (ARCHITECTURE.md, backend contract: 4096-aligned, sized to MDTS, allocated once when the
//! queue size is known, never per I/O). Pages materialise on first touch, so a deep queue
//! of 1 MiB slots costs address space, not memory, until it is used.
//!
//! Each slot is a [`BufferUnit`] of the mapping's [`BufferOwner`], which the reactor's ring may
//! register for fixed-buffer I/O (`storage::fixedbuf`): the ring registers only as much
//! of a slot as its transfers used, and stops pinning it on the turn after the mapping goes.

use std::io;
use std::ptr::NonNull;

use storage::fixedbuf::{BufferOwner, BufferUnit};

const PAGE: usize = 4096;

/// `count` buffers of `slot_size` bytes (rounded up to a page), each page-aligned.
#[derive(Debug)]
pub struct SlotBuffers {
    base: NonNull<u8>,
    slot_size: usize,
    count: usize,
    owner: BufferOwner,
}

// SAFETY: the mapping is exclusively owned by this value; access goes through `&self` /
// `&mut self`, so the usual borrow rules serialise it like a `Box<[u8]>`.
unsafe impl Send for SlotBuffers {}

impl SlotBuffers {
    pub fn new(count: usize, slot_size: usize) -> io::Result<Self> {
        let slot_size = slot_size.max(PAGE).next_multiple_of(PAGE);
        let len = count
            .max(1)
            .checked_mul(slot_size)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected. The
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Self {
            base,
            slot_size,
            count: count.max(1),
            owner: BufferOwner::new(),
        })
    }

    /// No buffers at all (a connection that failed to allocate and is closing).
    pub fn empty() -> Self {
        Self {
            base: NonNull::dangling(),
            slot_size: 0,
            count: 0,
            owner: BufferOwner::new(),
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Slot `slot` as a buffer a ring may register (`slot` < `count`).
    pub fn unit(&self, slot: usize) -> BufferUnit {
        assert!(slot < self.count, "slot {slot} out of {}", self.count);
        BufferUnit {
            owner: self.owner.id(),
            index: slot as u32,
            base: self.base.as_ptr().wrapping_add(slot * self.slot_size),
            // Slots are at most MAX_DATA_TRANSFER (16 MiB) plus in-capsule data.
            len: u32::try_from(self.slot_size).unwrap_or(u32::MAX),
        }
    }

    pub fn get(&self, slot: usize) -> &[u8] {
        assert!(slot < self.count, "slot {slot} out of {}", self.count);
        // SAFETY: `slot < count`, so the range lies inside the live mapping; the shared
        // borrow of `self` excludes writers.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(slot * self.slot_size),
                self.slot_size,
            )
        }
    }

    pub fn get_mut(&mut self, slot: usize) -> &mut [u8] {
        assert!(slot < self.count, "slot {slot} out of {}", self.count);
        // SAFETY: as in `get`, with the exclusive borrow of `self` excluding every other
        // access; slots do not overlap.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.as_ptr().add(slot * self.slot_size),
                self.slot_size,
            )
        }
    }
}

impl Drop for SlotBuffers {
    fn drop(&mut self) {
        if self.count == 0 {
            return;
        }
        // SAFETY: unmaps exactly the mapping created in `new`; no slice into it outlives
        // `self` (the connection keeps the buffers until no backend op references them).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.slot_size * self.count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_disjoint_and_zeroed() {
        let mut b = SlotBuffers::new(3, 5000).unwrap();
        assert_eq!(b.slot_size(), 8192);
        for i in 0..3 {
            let s = b.get_mut(i);
            assert_eq!(s.as_ptr() as usize % 4096, 0);
            assert!(s.iter().all(|&x| x == 0));
            s.fill(i as u8 + 1);
        }
        for i in 0..3 {
            assert!(b.get(i).iter().all(|&x| x == i as u8 + 1));
        }
        // Each slot is one unit of the mapping's owner, covering exactly the slot.
        let units: Vec<_> = (0..3).map(|i| b.unit(i)).collect();
        for (i, u) in units.iter().enumerate() {
            assert_eq!((u.owner, u.index), (units[0].owner, i as u32));
            assert_eq!((u.base.cast_const(), u.len), (b.get(i).as_ptr(), 8192));
        }
        let other = SlotBuffers::new(1, 4096).unwrap();
        assert_ne!(
            other.unit(0).owner,
            units[0].owner,
            "every mapping its own owner"
        );
    }
}
