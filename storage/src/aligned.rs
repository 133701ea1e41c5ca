//! The one aligned buffer type: zeroed heap memory aligned to 4096 bytes, which O_DIRECT file
//! and block-device I/O require and which matches the transports' per-slot data buffers.
//! Used by the Compare read buffers of I/O queues and by every test and fuzz target that
//! needs a data buffer shaped like a transport's.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zero-initialised, 4096-byte aligned, fixed-size byte buffer (like a `Box<[u8]>`).
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>; shared access only
// reads through `&self`.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above: `&AlignedBuf` only gives out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub const ALIGN: usize = 4096;

    /// `len` zeroed bytes; aborts like `Vec` when the allocation fails.
    pub fn new(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: NonNull::dangling(),
                len,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, Self::ALIGN).expect("buffer length overflows isize")
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed) bytes, or dangling with len 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with exactly this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_sized() {
        for len in [0, 1, 512, 4096, 4097, 1 << 20] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.len(), len);
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % AlignedBuf::ALIGN, 0, "len {len}");
            }
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xa5);
            assert!(b.iter().all(|&x| x == 0xa5));
        }
    }
}
