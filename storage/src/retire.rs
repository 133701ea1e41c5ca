//! Identities that are never handed out twice, and the count of those retired, for the
//! resources io_uring rings register on first use: backend files (`fileid`) and transport
//! data buffers (`fixedbuf`).
//!
//! Backends and transports are shared with, or outlive, the rings that register them, so
//! rings key their tables by identity (never by descriptor number or address, which the next
//! open or mapping may reuse) and compare [`Registry::retired_count`] with the count of their
//! last sweep once per turn: unchanged means nothing they hold went away (one atomic load).

use std::collections::BTreeSet;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One kind of identity: which are live, and how many have been retired.
#[derive(Debug)]
pub struct Registry {
    next: AtomicU64,
    live: Mutex<BTreeSet<NonZeroU64>>,
    retired: AtomicU64,
}

impl Registry {
    pub const fn new() -> Self {
        Registry {
            next: AtomicU64::new(0),
            live: Mutex::new(BTreeSet::new()),
            retired: AtomicU64::new(0),
        }
    }

    fn live(&self) -> MutexGuard<'_, BTreeSet<NonZeroU64>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new identity, live until [`retire`](Self::retire). Counting from 1, a u64 does not
    /// wrap to 0 in the life of a process.
    pub fn issue(&self) -> NonZeroU64 {
        let id = NonZeroU64::MIN.saturating_add(self.next.fetch_add(1, Ordering::Relaxed));
        self.live().insert(id);
        id
    }

    /// `id` is gone for good; the count rings compare moves on.
    pub fn retire(&self, id: NonZeroU64) {
        self.live().remove(&id);
        self.retired.fetch_add(1, Ordering::Release);
    }

    /// How many identities have been retired so far; only grows.
    #[inline]
    pub fn retired_count(&self) -> u64 {
        self.retired.load(Ordering::Acquire)
    }

    /// Calls `f` for each of `ids` that has been retired, under one lock.
    pub fn retired_among(
        &self,
        ids: impl Iterator<Item = NonZeroU64>,
        mut f: impl FnMut(NonZeroU64),
    ) {
        let live = self.live();
        for id in ids {
            if !live.contains(&id) {
                f(id);
            }
        }
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_never_reused_and_retire_once_counted() {
        let r = Registry::new();
        let a = r.issue();
        let b = r.issue();
        assert_ne!(a, b);
        assert_eq!(r.retired_count(), 0);
        r.retire(a);
        assert_eq!(r.retired_count(), 1);
        let c = r.issue();
        assert!(
            c != a && c != b,
            "a new identity never repeats a retired one"
        );
        let mut gone = Vec::new();
        r.retired_among([a, b, c].into_iter(), |id| gone.push(id));
        assert_eq!(gone, vec![a]);
    }
}
