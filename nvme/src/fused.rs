//! Pairing of fused operations on one I/O queue (NVMe Base 2.0 §3.4.2; the only fused
//! operation of the NVM Command Set is Compare (FUSE 01b) followed by Write (FUSE 10b) on the
//! same LBA range, NVM Command Set 1.0 §3.2.1). Pure bookkeeping: `nvm` runs the pair.
//!
//! The two commands are adjacent in the submission queue, so pairing happens in `prepare`
//! (called in capsule order). Their data may arrive in any order, so `execute` of either
//! half may come first: the Compare's data is kept here until the Write runs both, and a
//! Write whose Compare has no data yet is parked (`Exec::Blocked`).

use crate::command::Completion;
use crate::spec::{nvm_opcode, sqe_flags};
use crate::wire::{Sqe, Status};
use crate::write_lock::{self, Begun, Hold, Token};

/// A Compare (first half) whose partner was prepared.
#[derive(Debug)]
pub(crate) struct Pair {
    pub first: Sqe,
    pub second_cid: u16,
    pub token: Token,
    /// The Compare's data, once its `execute` ran.
    pub data: Option<Vec<u8>>,
    /// Set once the pair registered its intent on the namespace; dropped with the pair.
    pub hold: Option<Hold>,
}

#[derive(Debug)]
enum Open {
    /// The last prepared command was an admitted first half; its data once executed.
    Admitted(Sqe, Option<Vec<u8>>),
    /// The last prepared command was a first half that failed admission.
    Failed,
}

#[derive(Debug, Default)]
pub(crate) struct Fusing {
    open: Option<Open>,
    pairs: Vec<Pair>,
    /// First halves that were broken before their `execute`: the status to complete with.
    broken: Vec<(u16, Status)>,
    /// First halves completed outside their own `execute` (the queue sends them from `poll`).
    pub completed: Vec<(Sqe, Completion)>,
    /// Pairs whose Compare read is in flight (under the Write's cid and tag), by Write cid:
    /// the Compare and the namespace lock.
    pub comparing: Vec<(u16, Sqe, Hold)>,
    /// Pairs whose Compare matched, by Write cid: the lock their Write is submitted under
    /// when the queue runs it again.
    pub compared: Vec<(u16, Hold)>,
    /// Pairs whose Write is in flight, by Write cid: their namespace lock.
    pub running: Vec<(u16, Hold)>,
    /// Ordinary writes parked behind a fused pair, by cid: their place in the namespace's
    /// queue.
    pub waiting_writes: Vec<(u16, Hold)>,
    /// Writes and Write Zeroes submitted to the backend, by cid: how they hold their
    /// namespace's write lock and which lock (`WriteLocks::id`), released on completion.
    pub writes: Vec<(u16, Begun, u64)>,
}

/// What `prepare` does around the ordinary admission of a command.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Not fused.
    Plain,
    /// A first half: open a pair if admitted.
    First,
    /// A second half matching the open first half (and its data if already executed).
    Second(Sqe, Option<Vec<u8>>),
}

/// What `execute` should do with a first half.
#[derive(Debug)]
pub(crate) enum First {
    /// Complete it now with this status (its pair broke).
    Fail(Status),
    /// Keep it (held) until its second half runs.
    Hold,
}

impl Fusing {
    /// Pairing at `prepare`, in submission order, before the ordinary admission of `sqe`:
    /// `Err` refuses it (a broken pair); `Ok` says what `admitted` records afterwards.
    #[inline]
    pub fn plan(&mut self, sqe: &Sqe) -> Result<Plan, Status> {
        // The common case: not fused, and no first half waiting for its partner.
        if sqe.fuse() == 0 && self.open.is_none() {
            return Ok(Plan::Plain);
        }
        self.plan_fused(sqe)
    }

    #[cold]
    fn plan_fused(&mut self, sqe: &Sqe) -> Result<Plan, Status> {
        let open = self.open.take();
        match sqe.fuse() {
            0 => {
                self.break_open(open, Status::ABORTED_MISSING_FUSED);
                Ok(Plan::Plain)
            }
            sqe_flags::FUSE_FIRST => {
                self.break_open(open, Status::ABORTED_MISSING_FUSED);
                // Compare and Write is the only fused operation of the NVM Command Set.
                if sqe.opcode != nvm_opcode::COMPARE {
                    return Err(Status::INVALID_FIELD.with_dnr());
                }
                Ok(Plan::First)
            }
            sqe_flags::FUSE_SECOND => match open {
                Some(Open::Admitted(first, data)) => {
                    // NVM Command Set 1.0 §3.2.1: both commands address the same LBAs.
                    let same_range = sqe.nsid == first.nsid
                        && sqe.cdw10 == first.cdw10
                        && sqe.cdw11 == first.cdw11
                        && sqe.cdw12 & 0xffff == first.cdw12 & 0xffff;
                    if sqe.opcode != nvm_opcode::WRITE || !same_range {
                        self.break_first(first, data, Status::INVALID_FIELD.with_dnr());
                        return Err(Status::INVALID_FIELD.with_dnr());
                    }
                    Ok(Plan::Second(first, data))
                }
                Some(Open::Failed) => Err(Status::ABORTED_FAILED_FUSED),
                None => Err(Status::ABORTED_MISSING_FUSED),
            },
            _ => {
                self.break_open(open, Status::ABORTED_MISSING_FUSED);
                Err(Status::INVALID_FIELD.with_dnr())
            }
        }
    }

    /// After the ordinary admission of `sqe` (`ok`: admitted).
    #[inline]
    pub fn admitted(&mut self, plan: Plan, sqe: &Sqe, ok: bool) {
        if !matches!(plan, Plan::Plain) {
            self.admitted_fused(plan, sqe, ok);
        }
    }

    #[cold]
    fn admitted_fused(&mut self, plan: Plan, sqe: &Sqe, ok: bool) {
        match plan {
            Plan::Plain => {}
            Plan::First if ok => self.open = Some(Open::Admitted(*sqe, None)),
            Plan::First => self.open = Some(Open::Failed),
            Plan::Second(first, data) if ok => self.pairs.push(Pair {
                first,
                second_cid: sqe.cid,
                token: write_lock::new_token(),
                data,
                hold: None,
            }),
            Plan::Second(first, data) => {
                self.break_first(first, data, Status::ABORTED_FAILED_FUSED)
            }
        }
    }

    fn break_open(&mut self, open: Option<Open>, status: Status) {
        if let Some(Open::Admitted(first, data)) = open {
            self.break_first(first, data, status);
        }
    }

    /// A first half whose pair will never run: completed now if it is already held, else
    /// when it executes.
    fn break_first(&mut self, first: Sqe, data: Option<Vec<u8>>, status: Status) {
        tracing::debug!(
            cid = first.cid,
            ?status,
            "fused Compare without a matching Write"
        );
        if data.is_some() {
            self.completed.push((first, Completion::err(status)));
        } else {
            self.broken.push((first.cid, status));
        }
    }

    /// `execute` of a first half: keeps its data for the pair.
    pub fn first(&mut self, sqe: &Sqe, data: &[u8]) -> First {
        if let Some(i) = self.broken.iter().position(|(c, _)| *c == sqe.cid) {
            return First::Fail(self.broken.swap_remove(i).1);
        }
        if let Some(Open::Admitted(s, d)) = &mut self.open {
            if s.cid == sqe.cid {
                *d = Some(data.to_vec());
                return First::Hold;
            }
        }
        match self.pairs.iter_mut().find(|p| p.first.cid == sqe.cid) {
            Some(p) => {
                p.data = Some(data.to_vec());
                First::Hold
            }
            // Not reachable through `prepare`; refuse rather than hold forever.
            None => First::Fail(Status::ABORTED_MISSING_FUSED),
        }
    }

    /// The pair whose second half is `cid`.
    pub fn pair(&mut self, cid: u16) -> Option<&mut Pair> {
        self.pairs.iter_mut().find(|p| p.second_cid == cid)
    }

    /// Removes the pair of second half `cid` (it ran).
    pub fn take(&mut self, cid: u16) -> Option<Pair> {
        let i = self.pairs.iter().position(|p| p.second_cid == cid)?;
        Some(self.pairs.swap_remove(i))
    }
}
