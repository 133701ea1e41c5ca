//! Null namespaces (`null_size`): reads return zeroes, writes are dropped, like Linux's
//! null_blk and SPDK's null bdev, so that a benchmark measures the target and the transport,
//! not a memory copy or a device. Everything completes inline; nothing is stored.
//!
//! Reads are lent to the transport ([`Backend::lend`]) from a read-only anonymous mapping that
//! never leaves the kernel's shared zero page: it costs address space, not memory, and nothing
//! can write it, so none of the RAM namespace's concurrency questions arise.

use std::num::NonZeroUsize;
use std::sync::Arc;

use super::ram::Mapping;
use super::{
    check_range, Backend, BackendError, BackendRequest, Capabilities, IoSubmit, Lent, Started,
    Zeroing,
};

/// Size of the zero window reads are lent from; longer reads are cleared in the command's
/// buffer instead (the window is address space only, so it is sized for large MDTS values).
const ZERO_WINDOW: NonZeroUsize = NonZeroUsize::new(8 << 20).unwrap();

#[derive(Debug)]
pub struct NullBackend {
    capacity: u64,
    zeroes: Arc<Mapping>,
}

impl NullBackend {
    /// `size` must be a non-zero multiple of `block_size` (as for RAM namespaces).
    pub fn new(size: u64, block_size: u32) -> Result<Self, BackendError> {
        if size == 0 || block_size == 0 || !size.is_multiple_of(u64::from(block_size)) {
            return Err(BackendError::NullSize { size, block_size });
        }
        let zeroes = Mapping::anonymous(ZERO_WINDOW, false).map_err(|errno| BackendError::Map {
            size: ZERO_WINDOW.get() as u64,
            source: errno.into(),
        })?;
        Ok(NullBackend {
            capacity: size,
            zeroes: Arc::new(zeroes),
        })
    }
}

impl Backend for NullBackend {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn kind(&self) -> &'static str {
        "null"
    }

    /// Every block reads as zeroes, always: deallocated ones included. No volatile cache:
    /// writes are dropped at once, so there is nothing a Flush could make durable.
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
            // The transport's buffer holds whatever the slot carried last: clear it.
            BackendRequest::Read { offset } => {
                check_range(offset, buf.len() as u64, self.capacity).map(|()| buf.fill(0))
            }
            BackendRequest::Write { offset, .. } => {
                check_range(offset, buf.len() as u64, self.capacity)
            }
            BackendRequest::Flush => Ok(()),
        };
        Started::Done(result)
    }

    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        check_range(offset, len as u64, self.capacity).ok()?;
        Lent::new(&self.zeroes, 0, len)
    }

    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        _what: Zeroing,
        _tag: u64,
        _io: &mut dyn IoSubmit,
    ) -> Started {
        Started::Done(
            ranges
                .iter()
                .try_for_each(|&(o, l)| check_range(o, l, self.capacity)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::InlineOnly;
    use std::io;

    fn done(s: Started) -> io::Result<()> {
        match s {
            Started::Done(r) => r,
            Started::Submitted => panic!("null backend must complete inline"),
        }
    }

    #[test]
    fn null_reads_zeroes_drops_writes_and_checks_ranges() {
        // 1 TiB without any memory behind it.
        let tib = 1u64 << 40;
        let null = NullBackend::new(tib, 4096).unwrap();
        assert_eq!((null.kind(), null.capacity()), ("null", tib));
        let mut io = InlineOnly;
        let mut buf = vec![0xa5u8; 8192];
        let write = BackendRequest::Write {
            offset: tib - 8192,
            fua: true,
        };
        done(null.start(write, &mut buf, 1, &mut io)).unwrap();
        let read = BackendRequest::Read { offset: tib - 8192 };
        done(null.start(read, &mut buf, 2, &mut io)).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "reads return zeroes");
        done(null.start(BackendRequest::Flush, &mut [], 3, &mut io)).unwrap();
        let past = BackendRequest::Read { offset: tib - 4096 };
        let err = done(null.start(past, &mut buf, 4, &mut io)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        let ranges = [(0, 4096), (tib - 4096, 4096)];
        done(null.start_zeroes(&ranges, Zeroing::Deallocate, 5, &mut io)).unwrap();
        assert!(done(null.start_zeroes(&[(tib, 1)], Zeroing::Deallocate, 6, &mut io)).is_err());
        // Lent reads: zeroes, range-checked, none longer than the window.
        let lent = null.lend(tib - 8192, 8192).unwrap();
        assert_eq!(lent.len(), 8192);
        assert!(lent.as_bytes().iter().all(|&b| b == 0));
        assert!(null.lend(tib - 4096, 8192).is_none());
        assert!(null.lend(0, ZERO_WINDOW.get() + 4096).is_none());
        assert!(matches!(
            NullBackend::new(1000, 512),
            Err(BackendError::NullSize { .. })
        ));
    }
}
