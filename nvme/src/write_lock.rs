//! Per-namespace write exclusion for fused Compare and Write (NVM Command Set 1.0 §3.2.1 and
//! NVMe Base 2.0 §3.4.2: the pair is atomic with respect to every other write to its LBAs).
//!
//! One `WriteLocks` per namespace, shared by every queue of every controller and transport
//! (the namespace table is published to all of them). Ordinary writes register their byte
//! range while in flight; a fused pair first registers an *intent* (from then on new
//! overlapping writes are refused and parked by their transport), and is granted once no
//! overlapping write is in flight. A refused write queues too, so waiters of both kinds are
//! served in arrival order (a stream of fused pairs cannot starve a write, nor the reverse).
//! Nothing here blocks: refused callers retry later (the transport re-executes a parked
//! command on its next poll), and the mutex is held only for the bookkeeping, never across
//! I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::ExternalCompletions;

/// How to wake the reactor of a parked command (`None`: it is retried at its next poll).
pub type Waker = Option<Arc<ExternalCompletions>>;

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
    /// Waiters in arrival order: fused pairs (waiting for overlapping writes to drain, or
    /// running) and refused ordinary writes (`fused` false).
    queue: Vec<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    token: Token,
    range: Range,
    fused: bool,
    waker: Waker,
}

/// Wakes every waiter overlapping `r` (each reactor once), after the lock is dropped.
fn wakers(queue: &[Waiter], r: &Range) -> Vec<Arc<ExternalCompletions>> {
    let mut out: Vec<Arc<ExternalCompletions>> = Vec::new();
    for w in queue.iter().filter(|w| w.range.overlaps(r)) {
        if let Some(k) = &w.waker {
            if !out.iter().any(|o| Arc::ptr_eq(o, k)) {
                out.push(Arc::clone(k));
            }
        }
    }
    out
}

impl WriteLocks {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The bookkeeping stays consistent even if a holder panicked (no I/O under the lock).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An ordinary write may start unless a fused pair that came before it holds or waits
    /// for an overlapping range; `true` registers it in flight (release with
    /// [`WriteLocks::end_write`]). `false` queues it as a waiter under `token` (assigned on
    /// the first refusal, so the common path takes no token; a retry passes it back, and
    /// [`WriteLocks::release`] drops it if the write goes away).
    pub fn try_begin_write(
        &self,
        token: &mut Option<Token>,
        r: Range,
        waker: Option<&Arc<ExternalCompletions>>,
    ) -> bool {
        let mut g = self.inner();
        let pos = token.and_then(|t| g.queue.iter().position(|w| w.token == t));
        let before = &g.queue[..pos.unwrap_or(g.queue.len())];
        if before.iter().any(|w| w.fused && w.range.overlaps(&r)) {
            if pos.is_none() {
                let t = *token.get_or_insert_with(new_token);
                g.queue.push(Waiter {
                    token: t,
                    range: r,
                    fused: false,
                    waker: waker.cloned(),
                });
            }
            return false;
        }
        if let Some(p) = pos {
            g.queue.remove(p);
        }
        g.writes.push(r);
        true
    }

    pub fn end_write(&self, r: Range) {
        let mut g = self.inner();
        if let Some(i) = g.writes.iter().position(|w| *w == r) {
            g.writes.swap_remove(i);
        }
        let wake = wakers(&g.queue, &r);
        drop(g);
        wake.iter().for_each(|k| k.wake());
    }

    /// Registers (first call) or re-checks the intent of fused pair `token`; `true` when it
    /// may run: no overlapping ordinary write in flight and no earlier overlapping fused pair.
    /// The intent stays until [`WriteLocks::release`], granted or not.
    pub fn try_fused(
        &self,
        token: Token,
        r: Range,
        waker: Option<&Arc<ExternalCompletions>>,
    ) -> bool {
        let mut g = self.inner();
        let pos = match g.queue.iter().position(|w| w.token == token) {
            Some(p) => p,
            None => {
                g.queue.push(Waiter {
                    token,
                    range: r,
                    fused: true,
                    waker: waker.cloned(),
                });
                g.queue.len() - 1
            }
        };
        let earlier = g.queue[..pos].iter().any(|w| w.range.overlaps(&r));
        !earlier && !g.writes.iter().any(|w| w.overlaps(&r))
    }

    /// Drops waiter `token`: a fused pair's intent or lock (done, failed, or its queue went
    /// away), or a queued write that went away.
    pub fn release(&self, token: Token) {
        let mut g = self.inner();
        let Some(i) = g.queue.iter().position(|w| w.token == token) else {
            return;
        };
        let gone = g.queue.remove(i);
        let wake = wakers(&g.queue, &gone.range);
        drop(g);
        wake.iter().for_each(|k| k.wake());
    }
}

/// A registered waiter (a fused pair's intent or lock, or a queued write); dropping it
/// releases it (the pair completed, failed, or its queue went away while it waited).
#[derive(Debug)]
pub struct Hold {
    locks: Arc<WriteLocks>,
    token: Token,
}

impl Hold {
    pub fn new(locks: &Arc<WriteLocks>, token: Token) -> Hold {
        Hold {
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

impl Drop for Hold {
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
        assert!(l.try_begin_write(&mut None, r(0, 4096), None));
        let t = new_token();
        assert!(
            !l.try_fused(t, r(0, 512), None),
            "overlapping write in flight"
        );
        // The intent already keeps new overlapping writes out, but not disjoint ones.
        let mut w = None;
        assert!(!l.try_begin_write(&mut w, r(256, 1024), None));
        assert!(l.try_begin_write(&mut None, r(4096, 8192), None));
        l.end_write(r(0, 4096));
        assert!(l.try_fused(t, r(0, 512), None));
        assert!(!l.try_begin_write(&mut w, r(256, 1024), None));
        l.release(t);
        assert!(l.try_begin_write(&mut w, r(256, 1024), None));
        assert!(l.inner().queue.is_empty(), "the write left the queue");
    }

    #[test]
    fn fused_pairs_run_in_arrival_order() {
        let l = WriteLocks::default();
        let (a, b) = (new_token(), new_token());
        assert!(l.try_fused(a, r(0, 1024), None));
        assert!(!l.try_fused(b, r(512, 2048), None));
        assert!(
            !l.try_fused(b, r(512, 2048), None),
            "re-check keeps one intent"
        );
        l.release(a);
        assert!(l.try_fused(b, r(512, 2048), None));
        let c = new_token();
        assert!(
            l.try_fused(c, r(2048, 4096), None),
            "disjoint pair runs concurrently"
        );
    }

    #[test]
    fn a_refused_write_goes_before_later_pairs() {
        let l = WriteLocks::default();
        let (a, mut w, b) = (new_token(), None, new_token());
        assert!(l.try_fused(a, r(0, 512), None));
        assert!(!l.try_begin_write(&mut w, r(0, 512), None));
        assert!(!l.try_fused(b, r(0, 512), None), "queued behind the write");
        l.release(a);
        assert!(l.try_begin_write(&mut w, r(0, 512), None));
        assert!(!l.try_fused(b, r(0, 512), None), "the write is in flight");
        l.end_write(r(0, 512));
        assert!(l.try_fused(b, r(0, 512), None));
    }
}
