//! Compare (NVM Command Set 1.0 §3.2.1) and the fused Compare and Write (NVMe Base 2.0
//! §3.4.2) of an I/O queue: the stored data is read through the reactor's ring into a buffer
//! of the queue's own and compared on completion; a fused pair holds its range in the
//! namespace's write lock from its Compare's read to its Write's completion. `fused` pairs the
//! two commands; this runs them.

use super::{
    check, command, io_error, range, slba, start_write, started, Extent, IoContext, IoState,
    NvmCommand,
};
use crate::command::{Completion, Exec};
use crate::health::IoCounters;
use crate::namespace::Namespace;
use crate::wire::{Sqe, Status};
use crate::write_lock::Hold;
use storage::aligned::AlignedBuf;
use storage::{BackendRequest, BlockError, IoSubmit, Started};

/// A Compare whose read is in flight: `stored` receives the namespace's data, `host` is the
/// host's copy, compared when the read completes.
#[derive(Debug)]
pub(crate) struct PendingCompare {
    cid: u16,
    stored: AlignedBuf,
    host: Vec<u8>,
}

/// Compare (NVM Command Set 1.0 §3.2.1): the stored data is read like any other Read (through
/// the reactor's ring, never synchronously) into a buffer of the queue's own, and compared
/// with the host's data on completion ([`compare_finish`]). The buffer lives in the queue's
/// I/O state, which lasts until the queue's ops have completed, like transport buffers.
#[allow(clippy::too_many_arguments)]
pub(super) fn compare(
    ns: &Namespace,
    counters: &IoCounters,
    compares: &mut Vec<PendingCompare>,
    sqe: &Sqe,
    data: &[u8],
    ext: Extent,
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Exec {
    // The completion is matched by CID: a host reusing the CID of a Compare still in flight
    // (NVMe Base 2.0 §4.2: CIDs are unique among outstanding commands) is refused rather than
    // allowed to free a buffer the kernel is still reading into.
    if compares.iter().any(|c| c.cid == sqe.cid) {
        return Completion::fail(Status::CID_CONFLICT).into();
    }
    let len = ext.bytes as usize;
    let mut stored = AlignedBuf::new(len);
    let read = BackendRequest::Read { offset: ext.offset };
    match ns.backend.start(read, &mut stored[..len], tag, io) {
        Started::Done(Err(e)) => io_error(counters, sqe, BlockError::from_io(&e), ext.slba).into(),
        Started::Done(Ok(())) => compared(&stored[..len], &data[..len], ext.slba).into(),
        Started::Submitted => {
            compares.push(PendingCompare {
                cid: sqe.cid,
                stored,
                host: data[..len].to_vec(),
            });
            Exec::Submitted
        }
    }
}

fn compared(stored: &[u8], host: &[u8], slba: u64) -> Completion {
    if stored != host {
        return Completion::fail(Status::COMPARE_FAILURE).with_lba(slba);
    }
    Completion::ok()
}

/// The second half (Write) of a fused Compare and Write (NVMe Base 2.0 §3.4.2: atomic with
/// respect to every other write of these LBAs). Once its Compare has data and the namespace's
/// write lock grants the range, the Compare's read is submitted under this Write's tag (the
/// Compare itself stays held). On that read's completion ([`fused_compare_finish`]) the
/// Compare completes through `state.fusing.completed` and, if the data matched, the queue
/// runs this Write again, which submits it still holding the range until its own completion.
pub(super) fn fused_write(
    cx: &mut IoContext,
    cmd: &NvmCommand,
    sqe: &Sqe,
    data: &mut [u8],
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Exec {
    let (ctrl, subsys, state) = (cx.ctrl, cx.subsys, &mut *cx.state);
    if let Some(i) = state
        .fusing
        .compared
        .iter()
        .position(|(c, _)| *c == sqe.cid)
    {
        let (_, hold) = state.fusing.compared.swap_remove(i);
        return submit_fused_write(cx, cmd, sqe, data, hold, tag, io);
    }
    let Some(pair) = state.fusing.pair(sqe.cid) else {
        return Completion::err(Status::ABORTED_MISSING_FUSED).into();
    };
    let Some(first_len) = pair.data.as_ref().map(Vec::len) else {
        // The Compare's data has not arrived yet.
        return Exec::Blocked;
    };
    let first = pair.first;
    // Both halves are checked again against the namespace table of now.
    let fail_both = |state: &mut IoState, first_c: Completion, second_c: Completion| {
        state.fusing.take(sqe.cid);
        state.fusing.completed.push((first, first_c));
        Exec::Done(second_c)
    };
    // `fused` pairs a Compare (first) with a Write (second) only.
    let Some(compare_cmd) = command(first.opcode) else {
        return fail_both(
            state,
            Completion::fail(Status::INVALID_OPCODE),
            Completion::err(Status::ABORTED_FAILED_FUSED),
        );
    };
    let ext = match check(ctrl, subsys, state, compare_cmd, &first, first_len as u32) {
        Ok(Some(e)) => e,
        Ok(None) => unreachable!("Compare addresses LBAs"),
        Err(c) => return fail_both(state, c, Completion::err(Status::ABORTED_FAILED_FUSED)),
    };
    if let Err(c) = check(ctrl, subsys, state, cmd, sqe, data.len() as u32) {
        return fail_both(state, Completion::err(Status::ABORTED_FAILED_FUSED), c);
    }
    let Some(ns) = state.table.get(sqe.nsid).cloned() else {
        let c = Completion::fail(Status::INVALID_NAMESPACE);
        return fail_both(state, c, Completion::err(Status::ABORTED_FAILED_FUSED));
    };
    let pair = state.fusing.pair(sqe.cid).expect("pair found above");
    let hold = pair
        .hold
        .get_or_insert_with(|| Hold::new(&ns.writes, pair.token));
    if !hold
        .locks()
        .try_fused(hold.token(), range(ext), io.external())
    {
        return Exec::Blocked;
    }
    let mut pair = state.fusing.take(sqe.cid).expect("pair found above");
    let host = pair.data.take().unwrap_or_default();
    let hold = pair.hold.take().expect("hold set above");
    // The Compare reads like any Compare (through the reactor's ring, never synchronously).
    if state.compares.iter().any(|c| c.cid == sqe.cid) {
        let c = Completion::fail(Status::CID_CONFLICT);
        state.fusing.completed.push((first, c));
        return Completion::err(Status::ABORTED_FAILED_FUSED).into();
    }
    let len = ext.bytes as usize;
    let mut stored = AlignedBuf::new(len);
    let read = BackendRequest::Read { offset: ext.offset };
    let c = match ns.backend.start(read, &mut stored[..len], tag, io) {
        Started::Submitted => {
            state.compares.push(PendingCompare {
                cid: sqe.cid,
                stored,
                host: host[..len].to_vec(),
            });
            state.fusing.comparing.push((sqe.cid, first, hold));
            return Exec::Submitted;
        }
        Started::Done(Err(e)) => {
            io_error(&state.counters, &first, BlockError::from_io(&e), ext.slba)
        }
        Started::Done(Ok(())) => compared(&stored[..len], &host[..len], ext.slba),
    };
    let matched = c.status.is_success();
    state.fusing.completed.push((first, c));
    if !matched {
        // NVMe Base 2.0 §3.4.2: the Write is not executed.
        return Completion::err(Status::ABORTED_FAILED_FUSED).into();
    }
    submit_fused_write(cx, cmd, sqe, data, hold, tag, io)
}

/// The Write of a fused pair whose Compare matched; `hold` keeps the range until it completes.
fn submit_fused_write(
    cx: &mut IoContext,
    cmd: &NvmCommand,
    sqe: &Sqe,
    data: &mut [u8],
    hold: Hold,
    tag: u64,
    io: &mut dyn IoSubmit,
) -> Exec {
    let (ctrl, subsys, state) = (cx.ctrl, cx.subsys, &mut *cx.state);
    // Checked again: a reload may have changed the namespace while the Compare read.
    let ext = match check(ctrl, subsys, state, cmd, sqe, data.len() as u32) {
        Ok(Some(e)) => e,
        Ok(None) => unreachable!("Write addresses LBAs"),
        Err(c) => return c.into(),
    };
    let Some(ns) = state.table.get(sqe.nsid).cloned() else {
        return Completion::fail(Status::INVALID_NAMESPACE).into();
    };
    let r = start_write(ctrl, &ns, sqe, data, ext, tag, io);
    if matches!(r, Started::Submitted) {
        // Held until `finish` of this Write.
        state.fusing.running.push((sqe.cid, hold));
    }
    started(&state.counters, &ns, sqe, r, ext)
}

/// The Compare read of a fused pair completed (under its Write's CID, `sqe`): the Compare
/// completes now; `None` if it matched (the queue runs the Write again, which submits it).
pub(super) fn fused_compare_finish(
    state: &mut IoState,
    i: usize,
    sqe: &Sqe,
    result: i32,
) -> Option<Completion> {
    let (_, first, hold) = state.fusing.comparing.swap_remove(i);
    let c = compare_finish(state, sqe, &first, result);
    let matched = c.status.is_success();
    state.fusing.completed.push((first, c));
    if matched {
        state.fusing.compared.push((sqe.cid, hold));
        return None;
    }
    // NVMe Base 2.0 §3.4.2: the Write is not executed; its range is free again.
    drop(hold);
    Some(Completion::err(Status::ABORTED_FAILED_FUSED))
}

/// The read of a Compare completed (`result`: bytes read or -errno); `key` is the command the
/// read was submitted for, `sqe` the Compare.
pub(super) fn compare_finish(state: &mut IoState, key: &Sqe, sqe: &Sqe, result: i32) -> Completion {
    let Some(i) = state.compares.iter().position(|c| c.cid == key.cid) else {
        tracing::error!(
            cid = key.cid,
            "completion for a Compare that is not pending"
        );
        return Completion::fail(Status::INTERNAL_ERROR);
    };
    let pending = state.compares.swap_remove(i);
    if result < 0 {
        return io_error(
            &state.counters,
            sqe,
            BlockError::from_errno(-result),
            slba(sqe),
        );
    }
    let len = pending.host.len();
    if result as usize != len {
        return io_error(&state.counters, sqe, BlockError::Media, slba(sqe));
    }
    compared(&pending.stored[..len], &pending.host, slba(sqe))
}
