//! Fault injection for tests (namespace key `faults`): wraps another backend and fails or
//! delays the commands that touch chosen LBA ranges, before the inner backend sees them. EIO
//! on a read becomes Unrecovered Read Error (SCT 2h, SC 81h), ENOSPC on a write Capacity
//! Exceeded (SCT 0h, SC 81h), through the same mapping as real backend errors
//! (`nvm::backend_status`), with the same error log entry. Everything else passes through, so
//! a test can prove that a failing range fails only the commands that touch it.
//!
//! Latency: a rule with `latency` holds its commands back for that long before the inner
//! backend starts them (or before the rule's error is reported). The wait is an
//! `IORING_OP_TIMEOUT` on the reactor's ring ([`IoSubmit::submit_after`]), never a sleep: the
//! reactor goes on serving every other command meanwhile, and an Abort cancels the wait like
//! any op, before the storage has seen the command. Flush is never failed or delayed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::error::errno;
use super::{Backend, BackendRequest, Capabilities, Deferred, IoSubmit, Lent, Started, Zeroing};

/// Which commands a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOn {
    /// Read (and the read of Compare).
    Reads,
    /// Write, Write Zeroes, Dataset Management deallocate.
    Writes,
    Both,
}

/// `[offset, offset + len)` in bytes: every `every`-th command of the kinds `on` names that
/// touches it waits `latency` (if any), then fails with `errno` (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRule {
    pub offset: u64,
    pub len: u64,
    pub on: FaultOn,
    pub errno: Option<i32>,
    pub latency: Option<Duration>,
    /// 1: every command touching the range; n: the n-th, 2n-th, … (a rate, counted per
    /// rule over every queue of the namespace).
    pub every: u32,
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

/// What the rules decided for one command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Verdict {
    errno: Option<i32>,
    latency: Option<Duration>,
}

impl Verdict {
    fn and(self, other: Verdict) -> Verdict {
        Verdict {
            errno: self.errno.or(other.errno),
            latency: self.latency.max(other.latency),
        }
    }
}

#[derive(Debug)]
pub struct FaultBackend {
    inner: Arc<dyn Backend>,
    rules: Vec<FaultRule>,
    /// Commands each rule's range has seen (for `every`).
    seen: Vec<AtomicU64>,
}

impl FaultBackend {
    pub fn new(inner: Arc<dyn Backend>, rules: Vec<FaultRule>) -> Self {
        let seen = rules.iter().map(|_| AtomicU64::new(0)).collect();
        FaultBackend { inner, rules, seen }
    }

    /// The strongest of the rules that hit this command: the first error, the longest delay.
    fn judge(&self, write: bool, offset: u64, len: u64) -> Verdict {
        let mut verdict = Verdict::default();
        for (rule, seen) in self.rules.iter().zip(&self.seen) {
            if !rule.hits(write, offset, len) {
                continue;
            }
            let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
            if n % u64::from(rule.every.max(1)) == 0 {
                verdict = verdict.and(Verdict {
                    errno: rule.errno,
                    latency: rule.latency,
                });
            }
        }
        verdict
    }

    /// Carries out `verdict` for a command whose data is `buf`: `start` is the inner backend's
    /// part, run at once or after the delay. `ok` is the result that stands for its inline
    /// success (the byte count of a read or write, 0 otherwise).
    fn carry_out(
        verdict: Verdict,
        buf: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
        ok: i32,
        start: impl FnOnce(&mut [u8], &mut dyn IoSubmit) -> Started + Send + 'static,
    ) -> Started {
        let Some(delay) = verdict.latency else {
            return match verdict.errno {
                Some(errno) => Started::Done(Err(io::Error::from_raw_os_error(errno))),
                None => start(buf, io),
            };
        };
        let then: Deferred = Box::new(move |buf, io| match verdict.errno {
            Some(errno) => Some(-errno),
            None => match start(buf, io) {
                Started::Submitted => None,
                Started::Done(Ok(())) => Some(ok),
                Started::Done(Err(e)) => Some(-e.raw_os_error().unwrap_or(errno::EIO)),
            },
        });
        if io.submit_after(delay, buf.as_mut_ptr(), buf.len() as u32, tag, then) {
            Started::Submitted
        } else {
            // Only the reactor's ring has a timer; tools and tests driving a namespace with
            // another submitter get a clear refusal rather than a silently undelayed command.
            tracing::warn!("injected latency needs the reactor's io_uring; command refused");
            Started::Done(Err(io::Error::from_raw_os_error(errno::EOPNOTSUPP)))
        }
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
        let (verdict, ok) = match request {
            BackendRequest::Read { offset } => (self.judge(false, offset, len), buf.len()),
            BackendRequest::Write { offset, .. } => (self.judge(true, offset, len), buf.len()),
            BackendRequest::Flush => (Verdict::default(), 0),
        };
        let inner = Arc::clone(&self.inner);
        Self::carry_out(verdict, buf, tag, io, ok as i32, move |buf, io| {
            inner.start(request, buf, tag, io)
        })
    }

    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        what: Zeroing,
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        let verdict = ranges.iter().fold(Verdict::default(), |v, &(o, l)| {
            v.and(self.judge(true, o, l))
        });
        if verdict.latency.is_none() {
            // No delay: nothing to keep for later (the common case allocates nothing).
            return match verdict.errno {
                Some(errno) => Started::Done(Err(io::Error::from_raw_os_error(errno))),
                None => self.inner.start_zeroes(ranges, what, tag, io),
            };
        }
        let inner = Arc::clone(&self.inner);
        let ranges = ranges.to_vec();
        Self::carry_out(verdict, &mut [], tag, io, 0, move |_, io| {
            inner.start_zeroes(&ranges, what, tag, io)
        })
    }

    /// Only where no rule touches the read: a faulty or delayed range goes through `start`,
    /// which fails or delays it.
    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        if self.rules.iter().any(|r| r.hits(false, offset, len as u64)) {
            return None;
        }
        self.inner.lend(offset, len)
    }

    fn refresh_capacity(&self) -> Option<u64> {
        self.inner.refresh_capacity()
    }
}

#[cfg(all(test, feature = "engine"))]
mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;
    use crate::ram::RamBackend;
    use crate::test_support::{flush, run, wait_for_completion, zero_ranges};
    use crate::uring::UringEngine;

    #[test]
    fn faults_hit_only_their_ranges_and_commands() {
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20, 4096).unwrap());
        let rules = vec![
            FaultRule {
                offset: 64 * 1024,
                len: 32 * 1024,
                on: FaultOn::Reads,
                errno: Some(libc::EIO),
                latency: None,
                every: 1,
            },
            FaultRule {
                offset: 512 * 1024,
                len: 4096,
                on: FaultOn::Writes,
                errno: Some(libc::ENOSPC),
                latency: None,
                every: 1,
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

    /// A read of `buf` at `offset` started with `tag` (the caller collects its completion).
    fn start_read(f: &FaultBackend, offset: u64, buf: &mut [u8], tag: u64, io: &mut UringEngine) {
        let started = f.start(BackendRequest::Read { offset }, buf, tag, io);
        assert!(matches!(started, Started::Submitted), "{started:?}");
    }

    #[test]
    fn latency_delays_only_its_range_without_blocking_the_ring() {
        // A file namespace (its reads go through the ring) with a 1 s delay on reads of
        // [64K, 68K) and an ENOSPC after 200 ms on writes of [128K, 132K).
        let path = std::env::temp_dir().join(format!("nvmfd-fault-lat-{}.img", std::process::id()));
        let file = crate::file::FileBackend::open(&path, Some(1 << 20), false, 4096);
        let inner: Arc<dyn Backend> = Arc::new(file.unwrap());
        let delay = Duration::from_secs(1);
        let rules = vec![
            FaultRule {
                offset: 64 * 1024,
                len: 4096,
                on: FaultOn::Reads,
                errno: None,
                latency: Some(delay),
                every: 1,
            },
            FaultRule {
                offset: 128 * 1024,
                len: 4096,
                on: FaultOn::Writes,
                errno: Some(libc::ENOSPC),
                latency: Some(Duration::from_millis(200)),
                every: 1,
            },
        ];
        let f = FaultBackend::new(inner, rules);
        let mut io = UringEngine::new(8).unwrap();
        let mut data = AlignedBuf::new(4096);
        data.copy_from_slice(&crate::testing::pattern(4096, 9));
        run(
            &f,
            BackendRequest::Write {
                offset: 64 * 1024,
                fua: false,
            },
            &mut data,
            &mut io,
        )
        .unwrap();
        // The delayed read first, then one outside the range: the second completes while the
        // first still waits, on the same thread (a blocking delay would have held the second
        // back until after the first).
        let (mut slow, mut fast) = (AlignedBuf::new(4096), AlignedBuf::new(4096));
        let started = std::time::Instant::now();
        start_read(&f, 64 * 1024, &mut slow, 1, &mut io);
        start_read(&f, 0, &mut fast, 2, &mut io);
        assert_eq!(wait_for_completion(&mut io), vec![(2, 4096)]);
        assert_eq!(io.in_flight(), 1, "the delayed read is not complete yet");
        assert_eq!(wait_for_completion(&mut io), vec![(1, 4096)]);
        assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
        assert!(slow[..] == data[..], "the delayed read returns the data");
        // Lent reads never bypass a delayed range.
        assert!(f.lend(60 * 1024, 8192).is_none());
        // A delayed error: reported after the delay, through the completion.
        let started = std::time::Instant::now();
        let w = BackendRequest::Write {
            offset: 128 * 1024,
            fua: false,
        };
        assert!(matches!(
            f.start(w, &mut data, 3, &mut io),
            Started::Submitted
        ));
        assert_eq!(wait_for_completion(&mut io), vec![(3, -libc::ENOSPC)]);
        assert!(started.elapsed() >= Duration::from_millis(200));
        // Deallocate touching the delayed write range: one completion, after the delay.
        let ranges = [(0, 4096), (128 * 1024, 4096)];
        let what = Zeroing::Deallocate;
        assert!(matches!(
            f.start_zeroes(&ranges, what, 4, &mut io),
            Started::Submitted
        ));
        assert_eq!(wait_for_completion(&mut io), vec![(4, -libc::ENOSPC)]);
        drop(f);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_delayed_command_is_cancelled_before_the_storage_sees_it() {
        // RAM completes inline, so the delay is all there is: an Abort (IoSubmit::cancel)
        // ends it with -ECANCELED and the write never reaches the data.
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20, 4096).unwrap());
        let rules = vec![FaultRule {
            offset: 0,
            len: 1 << 20,
            on: FaultOn::Writes,
            errno: None,
            latency: Some(Duration::from_secs(60)),
            every: 2,
        }];
        let f = FaultBackend::new(ram, rules);
        let mut io = UringEngine::new(4).unwrap();
        let mut data = AlignedBuf::new(4096);
        data.copy_from_slice(&crate::testing::pattern(4096, 3));
        // `every = 2`: the first write is not delayed, the second is.
        let w = BackendRequest::Write {
            offset: 8192,
            fua: false,
        };
        assert!(matches!(
            f.start(w, &mut data, 1, &mut io),
            Started::Done(Ok(()))
        ));
        let w = BackendRequest::Write {
            offset: 0,
            fua: false,
        };
        assert!(matches!(
            f.start(w, &mut data, 2, &mut io),
            Started::Submitted
        ));
        io.flush();
        assert!(io.cancel(2));
        assert_eq!(wait_for_completion(&mut io), vec![(2, -libc::ECANCELED)]);
        let mut back = AlignedBuf::new(4096);
        run(&f, BackendRequest::Read { offset: 0 }, &mut back, &mut io).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "the aborted write did not happen"
        );
        run(
            &f,
            BackendRequest::Read { offset: 8192 },
            &mut back,
            &mut io,
        )
        .unwrap();
        assert!(back[..] == data[..]);
        // Flush is never delayed; a submitter without a timer refuses a delayed command.
        flush(&f, &mut io).unwrap();
        let mut sync = crate::sync::SyncEngine::default();
        let _ = f.start(w, &mut data, 3, &mut sync); // the third write: not delayed
        let refused = f.start(w, &mut data, 4, &mut sync);
        assert!(
            matches!(&refused, Started::Done(Err(e)) if e.raw_os_error() == Some(libc::EOPNOTSUPP)),
            "{refused:?}"
        );
    }
}
