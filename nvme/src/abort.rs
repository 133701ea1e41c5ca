//! Abort requests between a controller's admin queue and its I/O queues (NVMe Base 2.0 §5.1).
//!
//! An Abort arrives on the admin queue and names a command of an I/O queue, which is served by
//! another connection, often on another reactor thread. The admin handler posts the request on
//! the controller's `AbortBoard` and holds the Abort; the I/O queue takes the requests naming
//! it at its next poll, its transport looks for the command (waiting for data, for a buffer,
//! behind a fused pair's range lock, in a back-pressure queue, or in the backend) and says
//! whether it aborted it; the admin queue's poll then completes the Abort with that answer in
//! Dword 0 bit 0 (0 = aborted, 1 = not aborted). Nothing here blocks: a mutex guards the
//! bookkeeping only, and an atomic count lets the polls skip it while no Abort is pending.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::spec::Status;

/// Abort commands a controller keeps outstanding at once: ACL in Identify Controller is 0's
/// based (NVMe Base 2.0 Figure 275: 3 → 4).
pub const MAX_OUTSTANDING_ABORTS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the I/O queue to take it.
    Posted,
    /// The I/O queue's transport is looking for, or cancelling, the command.
    Taken,
    /// Answered: the admin queue completes the Abort.
    Done { aborted: bool },
}

#[derive(Debug, Clone, Copy)]
struct Request {
    sqid: u16,
    cid: u16,
    /// CID of the Abort command itself (on the admin queue).
    abort_cid: u16,
    state: State,
}

#[derive(Debug, Default)]
struct Inner {
    requests: Vec<Request>,
    /// I/O queues connected now: a request for another queue is answered at once.
    live: BTreeSet<u16>,
}

/// One controller's outstanding Abort requests.
#[derive(Debug, Default)]
pub struct AbortBoard {
    /// `requests.len()`, read without the lock by the polls.
    outstanding: AtomicUsize,
    inner: Mutex<Inner>,
}

impl AbortBoard {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Bookkeeping only (no I/O under the lock): consistent even after a panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, g: &Inner) {
        self.outstanding.store(g.requests.len(), Ordering::Release);
    }

    /// I/O queue `sqid` is connected: Aborts may name its commands.
    pub fn open_queue(&self, sqid: u16) {
        self.inner().live.insert(sqid);
    }

    /// I/O queue `sqid` is gone: nothing of it can be aborted any more, and the requests it had
    /// not answered are answered "not aborted" (its commands completed or died with it).
    pub fn close_queue(&self, sqid: u16) {
        let mut g = self.inner();
        g.live.remove(&sqid);
        for r in g.requests.iter_mut().filter(|r| r.sqid == sqid) {
            if !matches!(r.state, State::Done { .. }) {
                r.state = State::Done { aborted: false };
            }
        }
    }

    /// Posts the Abort `abort_cid` of command `cid` on I/O queue `sqid`. `Ok(false)`: the queue
    /// is not connected, so the command cannot be outstanding (not aborted, answer now);
    /// `Ok(true)`: posted, the Abort is held until [`AbortBoard::take_answers`] returns it.
    /// Err: Abort Command Limit Exceeded (NVMe Base 2.0 §5.1: more than ACL + 1 Aborts).
    pub fn post(&self, sqid: u16, cid: u16, abort_cid: u16) -> Result<bool, Status> {
        let mut g = self.inner();
        if !g.live.contains(&sqid) {
            return Ok(false);
        }
        if g.requests.len() >= MAX_OUTSTANDING_ABORTS {
            return Err(Status::ABORT_COMMAND_LIMIT_EXCEEDED);
        }
        g.requests.push(Request {
            sqid,
            cid,
            abort_cid,
            state: State::Posted,
        });
        self.publish(&g);
        Ok(true)
    }

    /// The CIDs of queue `sqid` that Aborts ask for and that it has not taken yet.
    pub fn take_requests(&self, sqid: u16) -> Vec<u16> {
        if self.outstanding.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut g = self.inner();
        let mut cids = Vec::new();
        for r in g.requests.iter_mut() {
            if r.sqid == sqid && r.state == State::Posted {
                r.state = State::Taken;
                if !cids.contains(&r.cid) {
                    cids.push(r.cid);
                }
            }
        }
        cids
    }

    /// Queue `sqid`'s answer for command `cid` (every Abort naming it gets the same answer).
    pub fn answer(&self, sqid: u16, cid: u16, aborted: bool) {
        let mut g = self.inner();
        for r in g.requests.iter_mut() {
            if r.sqid == sqid && r.cid == cid && r.state == State::Taken {
                r.state = State::Done { aborted };
            }
        }
    }

    /// Answered Aborts, removed from the board: (Abort CID, whether the command was aborted).
    pub fn take_answers(&self) -> Vec<(u16, bool)> {
        if self.outstanding.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut g = self.inner();
        let mut out = Vec::new();
        g.requests.retain(|r| match r.state {
            State::Done { aborted } => {
                out.push((r.abort_cid, aborted));
                false
            }
            _ => true,
        });
        self.publish(&g);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_goes_posted_taken_answered() {
        let b = AbortBoard::default();
        assert_eq!(b.post(1, 7, 3), Ok(false), "queue 1 is not connected");
        b.open_queue(1);
        assert_eq!(b.post(1, 7, 3), Ok(true));
        assert!(b.take_answers().is_empty());
        assert!(b.take_requests(2).is_empty(), "another queue");
        assert_eq!(b.take_requests(1), vec![7]);
        assert!(b.take_requests(1).is_empty(), "taken once");
        b.answer(1, 7, true);
        assert_eq!(b.take_answers(), vec![(3, true)]);
        assert!(b.take_answers().is_empty(), "answered once");
    }

    #[test]
    fn closing_a_queue_answers_not_aborted() {
        let b = AbortBoard::default();
        b.open_queue(1);
        assert_eq!(b.post(1, 7, 3), Ok(true));
        assert_eq!(b.post(1, 8, 4), Ok(true));
        assert_eq!(b.take_requests(1), vec![7, 8]);
        b.answer(1, 8, true);
        b.close_queue(1);
        let mut a = b.take_answers();
        a.sort();
        assert_eq!(a, vec![(3, false), (4, true)]);
        assert_eq!(b.post(1, 9, 5), Ok(false), "closed");
    }

    #[test]
    fn more_than_the_abort_command_limit_is_refused() {
        let b = AbortBoard::default();
        b.open_queue(1);
        for cid in 0..MAX_OUTSTANDING_ABORTS as u16 {
            assert_eq!(b.post(1, cid, 100 + cid), Ok(true));
        }
        assert_eq!(
            b.post(1, 50, 200),
            Err(Status::ABORT_COMMAND_LIMIT_EXCEEDED)
        );
    }
}
