//! Copy (NVM Command Set 1.0 §3.3.1, Source Range Entries format 0) and Verify (§3.3.5):
//! commands that move data inside the namespace, or only read it, in several backend steps.
//!
//! Each runs as a `Job` of the I/O queue: the source ranges (Verify: the range, in chunks of
//! at most MDTS) are read one after the other into a bounce buffer of the job's own, then
//! (Copy) the buffer is written to the destination. Every step goes through `Backend::start`
//! like any Read or Write — the reactor's ring, never a blocking call — under the command's
//! tag; after each completion `nvm::finish` returns `None` (not done) and the transport runs
//! the command again, which starts the next step. The destination holds its range in the
//! namespace's write lock from the start to the last completion, like a Write.

use std::sync::Arc;

use crate::command::Completion;
use crate::namespace::Namespace;
use crate::spec::nvm_bits::{COPY_SOURCE_RANGE_SIZE, FUA};
use crate::wire::copy::SourceRange;
use crate::wire::{Sqe, Status};
use crate::write_lock::{Begun, Range, WriteLocks};
use storage::aligned::AlignedBuf;
use storage::{BackendRequest, BlockError, IoSubmit, Started};

/// Source ranges per Copy: MSRC = 127 (0's based). 128 format 0 entries are 4 KiB.
pub const MAX_SOURCE_RANGES: usize = 128;

/// Largest Copy (MCL, and MSSRL as far as it can express it) and largest Verify step, in
/// bytes: the size of a job's bounce buffer, allocated per command.
pub const MAX_COPY_BYTES: u64 = 1 << 20;

/// Copy CDW12: NR (7:0, 0's based), Descriptor Format (11:8).
fn ranges(sqe: &Sqe) -> usize {
    (sqe.cdw12 & 0xff) as usize + 1
}

fn descriptor_format(sqe: &Sqe) -> u32 {
    (sqe.cdw12 >> 8) & 0xf
}

/// Bytes of source range entries a Copy must carry (checked at admission).
pub fn data_len(sqe: &Sqe) -> usize {
    ranges(sqe) * COPY_SOURCE_RANGE_SIZE
}

/// One read step: namespace byte offset, length, where in the bounce buffer, its first LBA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Read {
    offset: u64,
    bytes: u64,
    at: usize,
    slba: u64,
}

/// The destination of a Copy and its place in the write lock (released on drop, so a queue
/// that goes away mid-copy frees the range too).
#[derive(Debug)]
struct Dest {
    offset: u64,
    bytes: u64,
    slba: u64,
    fua: bool,
    locks: Arc<WriteLocks>,
    /// How the destination was let into the write lock (given back on drop).
    begun: Begun,
}

impl Drop for Dest {
    fn drop(&mut self) {
        let range = Range {
            start: self.offset,
            end: self.offset + self.bytes,
        };
        self.locks.end_write(range, self.begun);
    }
}

/// The Copy and Verify jobs of one I/O queue.
#[derive(Debug, Default)]
pub(crate) struct Jobs(Vec<Job>);

impl std::ops::Deref for Jobs {
    type Target = Vec<Job>;
    fn deref(&self) -> &Vec<Job> {
        &self.0
    }
}

impl std::ops::DerefMut for Jobs {
    fn deref_mut(&mut self) -> &mut Vec<Job> {
        &mut self.0
    }
}

/// A Copy or Verify in progress on one I/O queue (matched by CID).
#[derive(Debug)]
pub(crate) struct Job {
    pub cid: u16,
    buf: AlignedBuf,
    reads: Vec<Read>,
    next: usize,
    /// Verify reads every chunk into the start of the buffer.
    dest: Option<Dest>,
    writing: bool,
    /// A step is with the backend, reading into or writing from `buf`: the job must not be
    /// dropped or run again before its completion.
    pub in_flight: bool,
}

/// A Copy's source ranges and destination, checked against the namespace and the limits
/// (NVM Command Set 1.0 §3.3.1.1: an unsupported format is Invalid Field; more ranges than
/// MSRC, a range longer than MSSRL or a total beyond MCL is Command Size Limit Exceeded; a
/// range outside the namespace is LBA Out of Range). The caller takes the write lock.
pub(crate) fn plan_copy(
    ns: &Namespace,
    sqe: &Sqe,
    data: &[u8],
) -> Result<(Vec<Read>, u64, u64), Completion> {
    let max_bytes = MAX_COPY_BYTES;
    if descriptor_format(sqe) != 0 {
        return Err(Completion::fail(Status::INVALID_FIELD).at(48));
    }
    let n = ranges(sqe);
    if n > MAX_SOURCE_RANGES {
        return Err(Completion::fail(Status::COMMAND_SIZE_LIMIT_EXCEEDED).at(48));
    }
    let Some(list) = data.get(..n * COPY_SOURCE_RANGE_SIZE) else {
        return Err(Completion::fail(Status::DATA_SGL_LENGTH_INVALID));
    };
    let mut reads = Vec::with_capacity(n);
    let mut total: u64 = 0;
    let (entries, _) = list.as_chunks::<{ SourceRange::SIZE }>();
    for e in entries {
        let SourceRange { slba, blocks } = SourceRange::decode(e);
        let nlb = u64::from(blocks);
        let bytes = nlb << ns.lba_shift;
        if bytes > max_bytes {
            return Err(Completion::fail(Status::COMMAND_SIZE_LIMIT_EXCEEDED).with_lba(slba));
        }
        let (offset, bytes) = lba_range(ns, slba, nlb)?;
        reads.push(Read {
            offset,
            bytes,
            at: total as usize,
            slba,
        });
        total += bytes;
        if total > max_bytes {
            return Err(Completion::fail(Status::COMMAND_SIZE_LIMIT_EXCEEDED).with_lba(slba));
        }
    }
    let sdlba = sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32;
    let (dest, _) = lba_range(ns, sdlba, total >> ns.lba_shift)?;
    Ok((reads, dest, total))
}

/// `nlb` blocks from `slba` as (byte offset, bytes), inside the namespace.
fn lba_range(ns: &Namespace, slba: u64, nlb: u64) -> Result<(u64, u64), Completion> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks && nlb > 0 => Ok((slba << ns.lba_shift, nlb << ns.lba_shift)),
        _ => Err(Completion::fail(Status::LBA_OUT_OF_RANGE).with_lba(slba)),
    }
}

impl Job {
    /// A Copy whose destination range the write lock granted.
    pub(crate) fn copy(
        ns: &Namespace,
        sqe: &Sqe,
        reads: Vec<Read>,
        dest_offset: u64,
        total: u64,
        begun: Begun,
    ) -> Job {
        let slba = sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32;
        Job {
            cid: sqe.cid,
            buf: AlignedBuf::new(total as usize),
            reads,
            next: 0,
            dest: Some(Dest {
                offset: dest_offset,
                bytes: total,
                slba,
                fua: sqe.cdw12 & FUA != 0,
                locks: Arc::clone(&ns.writes),
                begun,
            }),
            writing: false,
            in_flight: false,
        }
    }

    /// A Verify of `nlb` blocks from `slba`, read in steps of at most `step` bytes (a whole
    /// number of blocks, at least one).
    pub(crate) fn verify(ns: &Namespace, sqe: &Sqe, slba: u64, nlb: u64, step: u64) -> Job {
        let per_step = (step >> ns.lba_shift).max(1);
        let step = per_step << ns.lba_shift;
        let mut reads = Vec::new();
        let mut lba = slba;
        while lba < slba + nlb {
            let n = per_step.min(slba + nlb - lba);
            reads.push(Read {
                offset: lba << ns.lba_shift,
                bytes: n << ns.lba_shift,
                at: 0,
                slba: lba,
            });
            lba += n;
        }
        Job {
            cid: sqe.cid,
            buf: AlignedBuf::new(step as usize),
            reads,
            next: 0,
            dest: None,
            writing: false,
            in_flight: false,
        }
    }

    /// Starts the next step; `Ok(true)`: one is in flight (the command is Submitted), `Ok(false)`:
    /// every step is done (complete it with success).
    pub(crate) fn advance(
        &mut self,
        ns: &Namespace,
        tag: u64,
        io: &mut dyn IoSubmit,
        fua_always: bool,
    ) -> Result<bool, StepError> {
        while let Some(r) = self.reads.get(self.next).copied() {
            let buf = &mut self.buf[r.at..r.at + r.bytes as usize];
            match ns
                .backend
                .start(BackendRequest::Read { offset: r.offset }, buf, tag, io)
            {
                Started::Submitted => {
                    self.in_flight = true;
                    return Ok(true);
                }
                Started::Done(Ok(())) => self.next += 1,
                Started::Done(Err(e)) => {
                    return Err(StepError::new(BlockError::from_io(&e), true, r.slba))
                }
            }
        }
        let Some(d) = &self.dest else {
            return Ok(false);
        };
        if self.writing {
            return Ok(false);
        }
        self.writing = true;
        let write = BackendRequest::Write {
            offset: d.offset,
            fua: d.fua || fua_always,
        };
        let (bytes, slba) = (d.bytes as usize, d.slba);
        match ns.backend.start(write, &mut self.buf[..bytes], tag, io) {
            Started::Submitted => {
                self.in_flight = true;
                Ok(true)
            }
            Started::Done(Ok(())) => Ok(false),
            Started::Done(Err(e)) => Err(StepError::new(BlockError::from_io(&e), false, slba)),
        }
    }

    /// The step in flight completed with `result` (bytes or -errno). `Ok(true)`: more steps.
    pub(crate) fn completed(&mut self, result: i32) -> Result<bool, StepError> {
        self.in_flight = false;
        if self.writing {
            let d = self.dest.as_ref().expect("only a Copy writes");
            return match result {
                r if r < 0 => Err(StepError::new(BlockError::from_errno(-r), false, d.slba)),
                r if r as u64 != d.bytes => Err(StepError::new(BlockError::Media, false, d.slba)),
                _ => Ok(false),
            };
        }
        let Some(r) = self.reads.get(self.next).copied() else {
            // Nothing was in flight: a completion the job did not ask for.
            return Err(StepError::new(BlockError::Invalid, true, 0));
        };
        match result {
            res if res < 0 => Err(StepError::new(BlockError::from_errno(-res), true, r.slba)),
            res if res as u64 != r.bytes => Err(StepError::new(BlockError::Media, true, r.slba)),
            _ => {
                self.next += 1;
                Ok(self.next < self.reads.len() || self.dest.is_some())
            }
        }
    }
}

/// A failed step: the error, whether it was a read, and the first LBA of its range (`nvm`
/// maps it to a status like a Read's or a Write's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepError {
    pub error: BlockError,
    pub reading: bool,
    pub slba: u64,
}

impl StepError {
    fn new(error: BlockError, reading: bool, slba: u64) -> Self {
        tracing::debug!(%error, slba, reading, "Copy/Verify step failed");
        Self {
            error,
            reading,
            slba,
        }
    }
}
