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
//!
//! While no fused pair is registered (the common case) an ordinary write only counts itself
//! in `unlisted` (no lock, no range): a pair registering later waits until every such write
//! has drained, as it waits for overlapping listed ones. Both sides publish first and check
//! the other's counter second (sequentially consistent), so a write either sees the pair and
//! lists its range, or the pair sees the write's count.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use storage::ExternalCompletions;

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

#[derive(Debug)]
pub struct WriteLocks {
    /// Tells this lock from one that replaced it (a write completing after its namespace was
    /// replaced must not end on the new one).
    id: u64,
    /// Fused waiters in `inner.queue` (changed under the mutex, read without it).
    fused: AtomicUsize,
    /// Ordinary writes in flight that started while no fused pair was registered: not in
    /// `inner.writes`.
    unlisted: AtomicUsize,
    inner: Mutex<Inner>,
}

/// How an ordinary write was let in; [`WriteLocks::end_write`] takes it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begun {
    /// Counted in `unlisted` (no fused pair was registered).
    Counted,
    /// Its range is listed in `writes`.
    Listed,
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

impl Default for WriteLocks {
    fn default() -> WriteLocks {
        WriteLocks {
            id: new_token(),
            fused: AtomicUsize::new(0),
            unlisted: AtomicUsize::new(0),
            inner: Mutex::default(),
        }
    }
}

impl WriteLocks {
    pub fn id(&self) -> u64 {
        self.id
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The bookkeeping stays consistent even if a holder panicked (no I/O under the lock).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An ordinary write may start unless a fused pair that came before it holds or waits
    /// for an overlapping range; `Some` registers it in flight (release with
    /// [`WriteLocks::end_write`]). `None` queues it as a waiter under `token` (assigned on
    /// the first refusal, so the common path takes no token; a retry passes it back, and
    /// [`WriteLocks::release`] drops it if the write goes away).
    #[inline]
    pub fn try_begin_write(
        &self,
        token: &mut Option<Token>,
        r: Range,
        waker: Option<&Arc<ExternalCompletions>>,
    ) -> Option<Begun> {
        if token.is_none() && self.try_count() {
            return Some(Begun::Counted);
        }
        self.begin_listed(token, r, waker)
    }

    /// The write path's first try: `true` when no fused pair is registered, the write is then
    /// counted ([`Begun::Counted`]).
    #[inline(always)]
    pub fn try_count(&self) -> bool {
        self.unlisted.fetch_add(1, Ordering::SeqCst);
        if self.fused.load(Ordering::SeqCst) == 0 {
            return true;
        }
        self.end_counted();
        false
    }

    /// [`WriteLocks::try_begin_write`] while a fused pair is registered (or on a retry).
    #[cold]
    fn begin_listed(
        &self,
        token: &mut Option<Token>,
        r: Range,
        waker: Option<&Arc<ExternalCompletions>>,
    ) -> Option<Begun> {
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
            return None;
        }
        if let Some(p) = pos {
            g.queue.remove(p);
        }
        g.writes.push(r);
        Some(Begun::Listed)
    }

    #[inline(always)]
    pub fn end_write(&self, r: Range, begun: Begun) {
        match begun {
            Begun::Counted => self.end_counted(),
            Begun::Listed => self.end_listed(r),
        }
    }

    /// The last counted write drained while a fused pair waits: wake the waiters (which
    /// ranges the counted writes had is not known).
    #[inline(always)]
    fn end_counted(&self) {
        if self.unlisted.fetch_sub(1, Ordering::SeqCst) == 1
            && self.fused.load(Ordering::SeqCst) > 0
        {
            self.wake_all();
        }
    }

    #[cold]
    fn wake_all(&self) {
        let r = Range {
            start: 0,
            end: u64::MAX,
        };
        let wake = wakers(&self.inner().queue, &r);
        wake.iter().for_each(|k| k.wake());
    }

    #[cold]
    fn end_listed(&self, r: Range) {
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
                // Before reading `unlisted`: from now on new writes list their ranges.
                self.fused.fetch_add(1, Ordering::SeqCst);
                g.queue.len() - 1
            }
        };
        let earlier = g.queue[..pos].iter().any(|w| w.range.overlaps(&r));
        !earlier
            && !g.writes.iter().any(|w| w.overlaps(&r))
            && self.unlisted.load(Ordering::SeqCst) == 0
    }

    /// Drops waiter `token`: a fused pair's intent or lock (done, failed, or its queue went
    /// away), or a queued write that went away.
    pub fn release(&self, token: Token) {
        let mut g = self.inner();
        let Some(i) = g.queue.iter().position(|w| w.token == token) else {
            return;
        };
        let gone = g.queue.remove(i);
        if gone.fused {
            self.fused.fetch_sub(1, Ordering::SeqCst);
        }
        let wake = wakers(&g.queue, &gone.range);
        drop(g);
        wake.iter().for_each(|k| k.wake());
    }
}

impl WriteLocks {
    /// Blocks until every write in flight when called has ended, or until `timeout` (then
    /// `false`): an intent over every LBA, as a Preempt and Abort's drain registers, so new
    /// writes wait behind it meanwhile and go on once it returns. For threads that may wait
    /// (a gateway group's watch thread applying another gateway's Preempt and Abort), never
    /// a reactor: it polls the lock every millisecond.
    pub fn drain_blocking(self: &Arc<Self>, timeout: std::time::Duration) -> bool {
        let hold = Hold::new(self, new_token());
        let every_lba = Range {
            start: 0,
            end: u64::MAX,
        };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.try_fused(hold.token(), every_lba, None) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
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

    /// Another gateway's Preempt and Abort: the watch thread waits for the write in flight,
    /// new writes wait meanwhile and go on once it returned.
    #[test]
    fn drain_blocking_waits_for_writes_in_flight() {
        use std::time::Duration;
        let l = Arc::new(WriteLocks::default());
        assert!(l.drain_blocking(Duration::ZERO), "nothing in flight");
        let begun = l.try_begin_write(&mut None, r(0, 4096), None).unwrap();
        assert!(!l.drain_blocking(Duration::from_millis(20)), "timed out");
        let l2 = Arc::clone(&l);
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            l2.end_write(r(0, 4096), begun);
        });
        assert!(l.drain_blocking(Duration::from_secs(10)));
        ender.join().unwrap();
        // The intent is gone: writes are admitted as before.
        assert_eq!(
            l.try_begin_write(&mut None, r(0, 512), None),
            Some(Begun::Counted)
        );
    }

    #[test]
    fn fused_waits_for_writes_and_blocks_new_ones() {
        let l = WriteLocks::default();
        let first = l.try_begin_write(&mut None, r(0, 4096), None);
        assert_eq!(
            first,
            Some(Begun::Counted),
            "no pair: the write only counts"
        );
        let t = new_token();
        assert!(
            !l.try_fused(t, r(0, 512), None),
            "overlapping write in flight"
        );
        // The intent already keeps new overlapping writes out, but not disjoint ones.
        let mut w = None;
        assert_eq!(l.try_begin_write(&mut w, r(256, 1024), None), None);
        let disjoint = l.try_begin_write(&mut None, r(4096, 8192), None);
        assert_eq!(disjoint, Some(Begun::Listed), "a pair is registered");
        l.end_write(r(0, 4096), Begun::Counted);
        assert!(l.try_fused(t, r(0, 512), None));
        assert_eq!(l.try_begin_write(&mut w, r(256, 1024), None), None);
        l.release(t);
        assert_eq!(
            l.try_begin_write(&mut w, r(256, 1024), None),
            Some(Begun::Listed)
        );
        assert!(l.inner().queue.is_empty(), "the write left the queue");
        l.end_write(r(256, 1024), Begun::Listed);
        l.end_write(r(4096, 8192), Begun::Listed);
        assert!(l.inner().writes.is_empty());
        assert_eq!(
            l.try_begin_write(&mut None, r(0, 512), None),
            Some(Begun::Counted)
        );
    }

    #[test]
    fn a_pair_waits_for_every_counted_write() {
        let l = WriteLocks::default();
        // Counted writes have no range: a pair waits for all of them, even disjoint ones.
        let a = l.try_begin_write(&mut None, r(8192, 12288), None).unwrap();
        let b = l.try_begin_write(&mut None, r(16384, 20480), None).unwrap();
        let t = new_token();
        assert!(!l.try_fused(t, r(0, 512), None));
        l.end_write(r(8192, 12288), a);
        assert!(!l.try_fused(t, r(0, 512), None), "one still in flight");
        l.end_write(r(16384, 20480), b);
        assert!(l.try_fused(t, r(0, 512), None));
        l.release(t);
        assert_eq!(l.fused.load(Ordering::SeqCst), 0);
        assert_eq!(l.unlisted.load(Ordering::SeqCst), 0);
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
        assert_eq!(l.try_begin_write(&mut w, r(0, 512), None), None);
        assert!(!l.try_fused(b, r(0, 512), None), "queued behind the write");
        l.release(a);
        let begun = l.try_begin_write(&mut w, r(0, 512), None);
        assert_eq!(begun, Some(Begun::Listed));
        assert!(!l.try_fused(b, r(0, 512), None), "the write is in flight");
        l.end_write(r(0, 512), Begun::Listed);
        assert!(l.try_fused(b, r(0, 512), None));
    }
}
