//! Per-namespace write exclusion for fused Compare and Write (NVM Command Set 1.0 §3.2.1 and
//! NVMe Base 2.0 §3.4.2: the pair is atomic with respect to every other write to its LBAs).
//!
//! One `WriteLocks` per namespace, shared by every queue of every controller and transport
//! (the namespace table is published to all of them). Ordinary writes register their byte
//! range while in flight; a fused pair first registers an *intent* (from then on new
//! overlapping writes are refused and parked by their transport), and is granted once no
//! overlapping write is in flight. Nothing here blocks: refused callers retry later (the
//! transport re-executes a parked command on its next poll), and the mutex is held only for
//! the bookkeeping, never across I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A half-open byte range `[start, end)` of one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

impl Range {
    fn overlaps(&self, o: &Range) -> bool {
        self.start < o.end && o.start < self.end
    }
}

/// Identifies one fused pair's intent (unique for the life of the process).
pub type Token = u64;

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// A fresh token for a new fused pair.
pub fn new_token() -> Token {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Default)]
pub struct WriteLocks {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Ordinary writes in flight (one entry per command; duplicates allowed).
    writes: Vec<Range>,
    /// Fused pairs in arrival order: waiting for overlapping writes to drain, or running.
    fused: Vec<(Token, Range)>,
}

impl WriteLocks {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The bookkeeping stays consistent even if a holder panicked (no I/O under the lock).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An ordinary write may start unless a fused pair holds or waits for an overlapping
    /// range; `true` registers it (release with [`WriteLocks::end_write`]).
    pub fn try_begin_write(&self, r: Range) -> bool {
        let mut g = self.inner();
        if g.fused.iter().any(|(_, f)| f.overlaps(&r)) {
            return false;
        }
        g.writes.push(r);
        true
    }

    pub fn end_write(&self, r: Range) {
        let mut g = self.inner();
        if let Some(i) = g.writes.iter().position(|w| *w == r) {
            g.writes.swap_remove(i);
        }
    }

    /// Registers (first call) or re-checks the intent of fused pair `token`; `true` when it
    /// may run: no overlapping ordinary write in flight and no earlier overlapping fused pair.
    /// The intent stays until [`WriteLocks::release`], granted or not.
    pub fn try_fused(&self, token: Token, r: Range) -> bool {
        let mut g = self.inner();
        let pos = match g.fused.iter().position(|(t, _)| *t == token) {
            Some(p) => p,
            None => {
                g.fused.push((token, r));
                g.fused.len() - 1
            }
        };
        let earlier = g.fused[..pos].iter().any(|(_, f)| f.overlaps(&r));
        !earlier && !g.writes.iter().any(|w| w.overlaps(&r))
    }

    /// Drops fused pair `token`'s intent or lock (done, failed, or its queue went away).
    pub fn release(&self, token: Token) {
        let mut g = self.inner();
        g.fused.retain(|(t, _)| *t != token);
    }
}

/// A fused pair's registered intent or lock; dropping it releases it (the pair completed,
/// failed, or its queue went away while it waited).
#[derive(Debug)]
pub struct FusedHold {
    locks: Arc<WriteLocks>,
    token: Token,
}

impl FusedHold {
    pub fn new(locks: &Arc<WriteLocks>, token: Token) -> FusedHold {
        FusedHold {
            locks: Arc::clone(locks),
            token,
        }
    }

    /// The lock `try_fused` checks against (a republished namespace shares it).
    pub fn locks(&self) -> &Arc<WriteLocks> {
        &self.locks
    }

    pub fn token(&self) -> Token {
        self.token
    }
}

impl Drop for FusedHold {
    fn drop(&mut self) {
        self.locks.release(self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> Range {
        Range { start, end }
    }

    #[test]
    fn fused_waits_for_writes_and_blocks_new_ones() {
        let l = WriteLocks::default();
        assert!(l.try_begin_write(r(0, 4096)));
        let t = new_token();
        assert!(!l.try_fused(t, r(0, 512)), "overlapping write in flight");
        // The intent already keeps new overlapping writes out, but not disjoint ones.
        assert!(!l.try_begin_write(r(256, 1024)));
        assert!(l.try_begin_write(r(4096, 8192)));
        l.end_write(r(0, 4096));
        assert!(l.try_fused(t, r(0, 512)));
        assert!(!l.try_begin_write(r(0, 1)));
        l.release(t);
        assert!(l.try_begin_write(r(0, 1)));
    }

    #[test]
    fn fused_pairs_run_in_arrival_order() {
        let l = WriteLocks::default();
        let (a, b) = (new_token(), new_token());
        assert!(l.try_fused(a, r(0, 1024)));
        assert!(!l.try_fused(b, r(512, 2048)));
        assert!(!l.try_fused(b, r(512, 2048)), "re-check keeps one intent");
        l.release(a);
        assert!(l.try_fused(b, r(512, 2048)));
        let c = new_token();
        assert!(
            l.try_fused(c, r(2048, 4096)),
            "disjoint pair runs concurrently"
        );
    }
}
