//! Reservation commands on an I/O queue beyond `reservation::execute`: the wait of a Preempt
//! and Abort for the preempted hosts' writes in flight, and the commands that run on the
//! persistence thread.

use crate::command::{Completion, Exec};
use crate::namespace::Namespace;
use crate::reservation;
use crate::spec::nvm_opcode;
use crate::wire::Sqe;
use crate::write_lock::{Hold, Range};
use std::sync::Arc;
use storage::{ExternalCompletions, IoSubmit};

/// A successful Reservation Acquire with action Preempt and Abort (NVM Command Set 1.0
/// §6.6.3 / NVMe Base 2.0 §8.19.7): besides the preemption, commands of the preempted hosts
/// are aborted. The preemption already refuses their new commands (reservation conflict);
/// what remains are the writes in flight, which could still change the media after the
/// preempting host was told it owns the namespace — a fencing host relies on that not
/// happening. As the Linux target does (it waits for the preempted controllers' outstanding
/// commands before completing), the command completes only once every write in flight on the
/// namespace when the preemption was made has drained.
pub(super) fn preempts_with_abort(sqe: &Sqe, done: &Completion) -> bool {
    sqe.opcode == nvm_opcode::RESERVATION_ACQUIRE
        && sqe.cdw10 & 0x7 == crate::spec::resv::ACQUIRE_PREEMPT_ABORT
        && done.status.is_success()
}

/// Makes the Preempt and Abort `cid`, whose reservation change is done, wait in `drains` for
/// the writes in flight on `ns` to drain, with `done` to complete it with then.
pub(super) fn preempt_abort_wait(
    drains: &mut Vec<(u16, Hold, Completion)>,
    ns: &Namespace,
    cid: u16,
    done: Completion,
) {
    drains.push((
        cid,
        Hold::new(&ns.writes, crate::write_lock::new_token()),
        done,
    ));
}

/// Checks the Preempt and Abort waiting in `drains[i]`: its first check registers a write-lock
/// intent over the whole namespace (the fused-pair mechanism of `write_lock`, which from then
/// on parks new writes behind it and is granted once no earlier write is in flight); once
/// granted, the command completes and the intent is dropped (parked writes go on). Until then
/// `Blocked`: the lock wakes this reactor when the last write drains, and the command's next
/// run checks again.
pub(super) fn preempt_abort_drained(
    drains: &mut Vec<(u16, Hold, Completion)>,
    i: usize,
    io: &mut dyn IoSubmit,
) -> Exec {
    let hold = &drains[i].1;
    if !hold
        .locks()
        .try_fused(hold.token(), EVERY_LBA, io.external())
    {
        return Exec::Blocked;
    }
    drains.swap_remove(i).2.into()
}

/// The whole namespace as a write-lock range.
const EVERY_LBA: Range = Range {
    start: 0,
    end: u64::MAX,
};

/// A reservation command that may read or write its store (the PTPL state file, a gateway
/// group's RADOS object) runs on the persistence thread (no fsync or network wait on a
/// reactor); the command completes when its outcome is back ([`finish`]).
#[cold]
pub(super) fn offload_reservation(
    changes: &mut Vec<(u16, reservation::PendingChange)>,
    done: &Arc<ExternalCompletions>,
    ns: Arc<Namespace>,
    host: reservation::HostId,
    sqe: &Sqe,
    data: &[u8],
    tag: u64,
) -> Exec {
    // The parameter data is 8 or 16 bytes (`reservation::data_limit`): copied, so the
    // transport's buffer is free at once. A Report's buffer is filled by its next run.
    let params = if sqe.opcode == nvm_opcode::RESERVATION_REPORT {
        Vec::new()
    } else {
        data.to_vec()
    };
    let command = *sqe;
    let job = move || {
        if command.opcode == nvm_opcode::RESERVATION_REPORT {
            return reservation::refresh(&ns.reservations);
        }
        let mut params = params;
        reservation::execute(&ns.reservations, host, &command, &mut params)
    };
    match reservation::offload(done, tag, job) {
        Ok(pending) => {
            changes.push((sqe.cid, pending));
            Exec::Submitted
        }
        Err(status) => Completion::fail(status).into(),
    }
}
