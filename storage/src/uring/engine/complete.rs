//! What a completion means: transient errors retried, short transfers resubmitted for the
//! remainder, zeroing methods tried in turn, delays run, groups completed once.

use super::{UringEngine, CANCEL_USER_DATA, MAX_TRANSIENT_RETRIES};
use crate::{BlockOpKind, ZeroMethod};

impl UringEngine {
    /// Handles one CQE; returns the completion to deliver, if the op is finished.
    pub(super) fn complete_one(&mut self, user_data: u64, res: i32) -> Option<(u64, i32)> {
        if user_data & CANCEL_USER_DATA != 0 {
            // The ASYNC_CANCEL's own completion (0, -ENOENT, -EALREADY): what counts is the
            // target op's completion, which always follows.
            tracing::debug!(res, "io_uring cancel request completed");
            return None;
        }
        let idx = user_data as usize;
        let Some(entry) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            tracing::error!(user_data, res, "io_uring completion for an unknown slot");
            return None;
        };
        if entry.timer.is_some() {
            return self.timer_done(idx, res);
        }
        if res == -libc::EAGAIN || res == -libc::EINTR {
            if entry.transient_retries < MAX_TRANSIENT_RETRIES {
                entry.transient_retries += 1;
                self.overflow.push_back(idx as u32);
                return None;
            }
            return self.release(idx, res);
        }
        if let BlockOpKind::Zeroes { len, plan } = entry.op.kind {
            let method = plan[usize::from(entry.stage)];
            if res < 0 {
                // The file system or device lacks this method (fallocate: EOPNOTSUPP, or
                // EINVAL for a mode the file system does not know; uring_cmd: EOPNOTSUPP on
                // kernels before 6.12): try the next one, from the start of the range.
                let unsupported = matches!(-res, libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL);
                if unsupported
                    && method != ZeroMethod::WriteZeroes
                    && usize::from(entry.stage) + 1 < plan.len()
                {
                    tracing::debug!(?method, res, "zeroing method unsupported; trying the next");
                    entry.stage += 1;
                    entry.zeroed = 0;
                    self.overflow.push_back(idx as u32);
                    return None;
                }
                return self.release(idx, res);
            }
            if method == ZeroMethod::WriteZeroes {
                if res == 0 {
                    return self.release(idx, -libc::EIO);
                }
                entry.zeroed += res as u64;
                if entry.zeroed < len {
                    self.overflow.push_back(idx as u32);
                    return None;
                }
            }
            return self.release(idx, 0);
        }
        if res < 0 {
            return self.release(idx, res);
        }
        match entry.op.kind {
            BlockOpKind::Flush | BlockOpKind::Zeroes { .. } => self.release(idx, 0),
            BlockOpKind::Read | BlockOpKind::Write { .. } => {
                let remaining = entry.op.len - entry.done;
                let res = res as u32;
                if res > remaining {
                    // Never happens with a correct kernel; refuse to trust the count.
                    tracing::error!(res, remaining, "io_uring reported more bytes than asked");
                    return self.release(idx, -libc::EIO);
                }
                if res == 0 && remaining > 0 {
                    // A read hit end of file (the backing file shrank below the namespace
                    // capacity) or a write made no progress: the range cannot be served.
                    // Linux nvmet does the same (io-cmd-file.c: short transfer → -EIO).
                    return self.release(idx, -libc::EIO);
                }
                entry.done += res;
                if entry.done < entry.op.len {
                    // Short transfer (signal, page-cache pressure, a split at a device limit):
                    // send the rest. With O_DIRECT the kernel only splits on logical-block
                    // boundaries, so the remainder stays aligned; if it is not, the retry fails
                    // with -EINVAL and that is reported.
                    self.overflow.push_back(idx as u32);
                    return None;
                }
                let total = entry.op.len as i32;
                self.release(idx, total)
            }
        }
    }

    /// A `submit_after` delay ended: `-ETIME` is the timer expiring, and then the deferred
    /// work runs (it may submit an op under the same tag, which then completes the command);
    /// `-ECANCELED` is an Abort that came first, anything else a ring failure, both delivered
    /// without running it.
    pub(super) fn timer_done(&mut self, idx: usize, res: i32) -> Option<(u64, i32)> {
        let entry = self.slots[idx].take().expect("checked by the caller");
        self.free_slots.push(idx as u32);
        let timer = entry.timer.expect("checked by the caller");
        if res != -libc::ETIME {
            return Some((entry.tag, res));
        }
        let (buf, len) = (entry.op.buf, entry.op.len as usize);
        let data: &mut [u8] = if buf.is_null() || len == 0 {
            &mut []
        } else {
            // SAFETY: the command's buffer as given to `submit_after`, which the transport
            // keeps allocated and untouched until this tag's completion has been delivered
            // (backend contract); it has not been: this is the first result for the tag.
            unsafe { std::slice::from_raw_parts_mut(buf, len) }
        };
        (timer.then)(data, self).map(|res| (entry.tag, res))
    }

    /// Frees a slot; returns the completion to deliver (none yet for a member of a group
    /// whose other ops are still running).
    pub(super) fn release(&mut self, idx: usize, res: i32) -> Option<(u64, i32)> {
        let entry = self.slots[idx].take().expect("slot released twice");
        self.free_slots.push(idx as u32);
        if let Some(slot) = entry.file_slot {
            self.files.put(slot);
        }
        match entry.group {
            None => Some((entry.tag, res)),
            Some(group) => self.member_done(group, res),
        }
    }

    pub(super) fn member_done(&mut self, group: u32, res: i32) -> Option<(u64, i32)> {
        let g = self.groups[group as usize]
            .as_mut()
            .expect("group member after the group completed");
        if res < 0 && g.result == 0 {
            g.result = res;
        }
        g.remaining -= 1;
        if g.remaining > 0 {
            return None;
        }
        let g = self.groups[group as usize].take().expect("checked above");
        self.free_groups.push(group);
        Some((g.tag, g.result))
    }
}
