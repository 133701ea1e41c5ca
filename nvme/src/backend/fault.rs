//! Fault injection for tests (namespace key `faults`): wraps another backend and fails the
//! commands that touch chosen LBA ranges with a chosen errno, before the inner backend sees
//! them. EIO on a read becomes Unrecovered Read Error (SCT 2h, SC 81h), ENOSPC on a write
//! Capacity Exceeded (SCT 0h, SC 81h), through the same mapping as real backend errors
//! (`io::backend_status`), with the same error log entry. Everything else passes through, so
//! a test can prove that a failing range fails only the commands that touch it.

use std::io;
use std::sync::Arc;

use super::{Backend, BackendRequest, Capabilities, IoSubmit, Lent, Started, Zeroing};

/// Which commands a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOn {
    /// Read (and the read of Compare).
    Reads,
    /// Write, Write Zeroes, Dataset Management deallocate.
    Writes,
    Both,
}

/// `[offset, offset + len)` in bytes fails with `errno` for the commands `on` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRule {
    pub offset: u64,
    pub len: u64,
    pub on: FaultOn,
    pub errno: i32,
}

impl FaultRule {
    fn hits(&self, write: bool, offset: u64, len: u64) -> bool {
        let applies = match self.on {
            FaultOn::Reads => !write,
            FaultOn::Writes => write,
            FaultOn::Both => true,
        };
        applies && offset < self.offset.saturating_add(self.len) && self.offset < offset + len
    }
}

#[derive(Debug)]
pub struct FaultBackend {
    inner: Arc<dyn Backend>,
    rules: Vec<FaultRule>,
}

impl FaultBackend {
    pub fn new(inner: Arc<dyn Backend>, rules: Vec<FaultRule>) -> Self {
        FaultBackend { inner, rules }
    }

    fn fault(&self, write: bool, offset: u64, len: u64) -> Option<io::Error> {
        self.rules
            .iter()
            .find(|r| r.hits(write, offset, len))
            .map(|r| io::Error::from_raw_os_error(r.errno))
    }
}

impl Backend for FaultBackend {
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        let len = buf.len() as u64;
        let fault = match request {
            BackendRequest::Read { offset } => self.fault(false, offset, len),
            BackendRequest::Write { offset, .. } => self.fault(true, offset, len),
            BackendRequest::Flush => None,
        };
        match fault {
            Some(e) => Started::Done(Err(e)),
            None => self.inner.start(request, buf, tag, io),
        }
    }

    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        what: Zeroing,
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        match ranges.iter().find_map(|&(o, l)| self.fault(true, o, l)) {
            Some(e) => Started::Done(Err(e)),
            None => self.inner.start_zeroes(ranges, what, tag, io),
        }
    }

    /// Only where no rule fails the read: a faulty range goes through `start`, which fails it.
    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        match self.fault(false, offset, len as u64) {
            Some(_) => None,
            None => self.inner.lend(offset, len),
        }
    }

    fn refresh_capacity(&self) -> Option<u64> {
        self.inner.refresh_capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::aligned::AlignedBuf;
    use crate::backend::ram::RamBackend;
    use crate::backend::test_support::{flush, run, zero_ranges};
    use crate::backend::uring::UringEngine;

    #[test]
    fn faults_hit_only_their_ranges_and_commands() {
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20, 4096).unwrap());
        let rules = vec![
            FaultRule {
                offset: 64 * 1024,
                len: 32 * 1024,
                on: FaultOn::Reads,
                errno: libc::EIO,
            },
            FaultRule {
                offset: 512 * 1024,
                len: 4096,
                on: FaultOn::Writes,
                errno: libc::ENOSPC,
            },
        ];
        let f = FaultBackend::new(ram, rules);
        let mut io = UringEngine::new(4).unwrap();
        let mut buf = AlignedBuf::new(8192);
        let errno = |r: io::Result<()>| r.unwrap_err().raw_os_error();
        let read = |offset| BackendRequest::Read { offset };
        let write = |offset| BackendRequest::Write { offset, fua: false };
        // Reads touching [64K, 96K) fail, on either edge; writes there do not.
        for offset in [60 * 1024, 64 * 1024, 92 * 1024] {
            assert_eq!(
                errno(run(&f, read(offset), &mut buf, &mut io)),
                Some(libc::EIO)
            );
        }
        run(&f, read(56 * 1024), &mut buf, &mut io).unwrap();
        run(&f, read(96 * 1024), &mut buf, &mut io).unwrap();
        // Lent reads (sent from RAM without a copy) only where no rule fails the read: a
        // faulty range must go through `start`, which fails it.
        for offset in [60 * 1024, 64 * 1024, 92 * 1024] {
            assert!(f.lend(offset, 8192).is_none(), "{offset}");
        }
        assert_eq!(f.lend(56 * 1024, 8192).map(|l| l.len()), Some(8192));
        assert!(f.lend(512 * 1024, 8192).is_some(), "write-only rule");
        run(&f, write(64 * 1024), &mut buf, &mut io).unwrap();
        // Writes and zeroing touching [512K, 516K) fail with ENOSPC; reads there do not.
        assert_eq!(
            errno(run(&f, write(508 * 1024), &mut buf, &mut io)),
            Some(libc::ENOSPC)
        );
        run(&f, read(512 * 1024), &mut buf, &mut io).unwrap();
        let ranges = [(0, 4096), (512 * 1024, 4096)];
        let err = zero_ranges(&f, &ranges, Zeroing::Deallocate, &mut io);
        assert_eq!(errno(err), Some(libc::ENOSPC));
        zero_ranges(&f, &ranges[..1], Zeroing::Deallocate, &mut io).unwrap();
        flush(&f, &mut io).unwrap();
        assert_eq!((f.kind(), f.capacity()), ("ram", 1 << 20));
    }
}
