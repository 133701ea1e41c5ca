//! Transport data buffers that an io_uring ring may register (fixed buffers).
//!
//! An O_DIRECT read or write through io_uring pins the pages of its user buffer for the time of
//! the transfer (`get_user_pages` and the matching unpin, per op). A buffer registered with the
//! ring (`IORING_REGISTER_BUFFERS2` / `_UPDATE`) is pinned once, and ops inside it are issued
//! as `READ_FIXED`/`WRITE_FIXED` naming its table index, which skips that per-op pinning.
//!
//! The data buffers are the transports' (NVMe/TCP command slots, NVMe/RDMA pool buffers), and
//! the core hands a backend only a byte slice of one. So the transport says which buffer that
//! slice is part of: it wraps the reactor's submitter in [`WithBuffer`] for the call that runs
//! the command, and ops whose buffer lies inside the [`BufferUnit`] reach the ring through
//! [`IoSubmit::submit_in`]; everything else passes through unchanged. The ring registers a unit
//! on its first op and issues later ops inside it on the registration (`uring` module).
//!
//! The same two rules as for registered files (`fileid`) keep that correct:
//! * A unit is named by its owner's [`OwnerId`], issued once per process, and its index, never
//!   by address: a connection's buffers are unmapped when it goes, and the next mapping may get
//!   the same address; a table keyed by address would then move the new connection's data to
//!   and from the old pages, which the kernel keeps pinned for the registration.
//! * Dropping a [`BufferOwner`] retires its id; each ring compares [`retired_count`] with its
//!   last sweep once per turn and empties the entries of retired owners, so that no ring pins a
//!   closed connection's memory beyond its next turn.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use super::retire::Registry;
use super::{BlockOp, BlockOpKind, Deferred, ExternalCompletions, IoSubmit};

/// Identity of one [`BufferOwner`]: unique for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerId(NonZeroU64);

static OWNERS: Registry = Registry::new();

/// The identity of a transport's buffer memory (a TCP connection's slot mapping, an RDMA
/// pool). Drop it no earlier than the memory stops being used for I/O; rings stop pinning the
/// memory on their next turn after that.
#[derive(Debug)]
pub struct BufferOwner {
    id: OwnerId,
}

impl BufferOwner {
    pub fn new() -> Self {
        BufferOwner {
            id: OwnerId(OWNERS.issue()),
        }
    }

    pub fn id(&self) -> OwnerId {
        self.id
    }
}

impl Default for BufferOwner {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for BufferOwner {
    fn drop(&mut self) {
        OWNERS.retire(self.id.0);
    }
}

/// How many `BufferOwner`s have been dropped in this process.
#[inline]
pub fn retired_count() -> u64 {
    OWNERS.retired_count()
}

/// Which of `ids` belong to dropped `BufferOwner`s, under one lock.
pub fn retired_among(ids: impl Iterator<Item = OwnerId>, mut f: impl FnMut(OwnerId)) {
    OWNERS.retired_among(ids.map(|id| id.0), |id| f(OwnerId(id)));
}

/// One data buffer of an owner: `len` bytes at `base`, the same memory for as long as the
/// owner lives (a TCP command slot, an RDMA pool buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferUnit {
    pub owner: OwnerId,
    pub index: u32,
    pub base: *mut u8,
    pub len: u32,
}

impl BufferUnit {
    /// Bytes of the unit, from its start, that `op` reads or writes: `Some` only for a data op
    /// whose whole buffer lies inside the unit.
    #[inline]
    pub fn extent_of(&self, op: &BlockOp) -> Option<u32> {
        if !matches!(op.kind, BlockOpKind::Read | BlockOpKind::Write { .. }) || op.len == 0 {
            return None;
        }
        let start = (op.buf as usize).checked_sub(self.base as usize)?;
        let end = start.checked_add(op.len as usize)?;
        (end <= self.len as usize).then_some(end as u32)
    }
}

/// The reactor's submitter, for the ops of one command whose data buffer is `unit`: reads and
/// writes go to [`IoSubmit::submit_in`], everything else as it came.
pub struct WithBuffer<'a> {
    io: &'a mut dyn IoSubmit,
    unit: BufferUnit,
}

impl<'a> WithBuffer<'a> {
    pub fn new(io: &'a mut dyn IoSubmit, unit: BufferUnit) -> Self {
        WithBuffer { io, unit }
    }
}

impl IoSubmit for WithBuffer<'_> {
    /// Reads and writes go to `submit_in` as they are: the submitter checks that the op lies
    /// in the unit ([`BufferUnit::extent_of`]) where it registers anything.
    #[inline]
    fn submit(&mut self, op: BlockOp, tag: u64) {
        match op.kind {
            BlockOpKind::Read | BlockOpKind::Write { .. } => self.io.submit_in(op, tag, &self.unit),
            _ => self.io.submit(op, tag),
        }
    }

    fn submit_in(&mut self, op: BlockOp, tag: u64, unit: &BufferUnit) {
        self.io.submit_in(op, tag, unit)
    }

    fn submit_group(&mut self, ops: &[BlockOp], tag: u64) {
        self.io.submit_group(ops, tag)
    }

    fn external(&mut self) -> Option<&Arc<ExternalCompletions>> {
        self.io.external()
    }

    fn cancel(&mut self, tag: u64) -> bool {
        self.io.cancel(tag)
    }

    fn submit_after(
        &mut self,
        delay: Duration,
        buf: *mut u8,
        len: u32,
        tag: u64,
        then: Deferred,
    ) -> bool {
        self.io.submit_after(delay, buf, len, tag, then)
    }

    fn wake_at(&mut self, at: std::time::Instant) {
        self.io.wake_at(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: BlockOpKind, buf: *mut u8, len: u32) -> BlockOp {
        BlockOp {
            fd: -1,
            file: None,
            kind,
            offset: 0,
            buf,
            len,
        }
    }

    #[test]
    fn owners_are_never_reused_and_retire_on_drop() {
        let a = BufferOwner::new();
        let a_id = a.id();
        let before = retired_count();
        drop(a);
        assert!(retired_count() > before);
        let b = BufferOwner::new();
        assert_ne!(b.id(), a_id);
        let mut gone = Vec::new();
        retired_among([a_id, b.id()].into_iter(), |id| gone.push(id));
        assert_eq!(gone, vec![a_id]);
    }

    #[test]
    fn only_data_ops_wholly_inside_the_unit_have_an_extent() {
        let mut mem = vec![0u8; 16384];
        let owner = BufferOwner::new();
        let base = mem[4096..].as_mut_ptr();
        let unit = BufferUnit {
            owner: owner.id(),
            index: 3,
            base,
            len: 8192,
        };
        let at = |off: isize| base.wrapping_offset(off);
        assert_eq!(
            unit.extent_of(&op(BlockOpKind::Read, at(0), 4096)),
            Some(4096)
        );
        assert_eq!(
            unit.extent_of(&op(BlockOpKind::Write { fua: true }, at(4096), 4096)),
            Some(8192)
        );
        // Past the end, before the start, empty, or no data at all: not in the unit.
        assert_eq!(unit.extent_of(&op(BlockOpKind::Read, at(4096), 4097)), None);
        assert_eq!(
            unit.extent_of(&op(BlockOpKind::Read, at(-4096), 4096)),
            None
        );
        assert_eq!(unit.extent_of(&op(BlockOpKind::Read, at(0), 0)), None);
        assert_eq!(unit.extent_of(&op(BlockOpKind::Flush, at(0), 4096)), None);
        // A length that would overflow the address space is refused, not wrapped.
        assert_eq!(
            unit.extent_of(&op(BlockOpKind::Read, at(4096), u32::MAX)),
            None
        );
        drop(mem);
    }

    /// Records which path each op took.
    #[derive(Default)]
    struct Recorder {
        plain: Vec<u64>,
        within: Vec<(u64, u32)>,
    }

    impl IoSubmit for Recorder {
        fn submit(&mut self, _op: BlockOp, tag: u64) {
            self.plain.push(tag);
        }
        fn submit_in(&mut self, _op: BlockOp, tag: u64, unit: &BufferUnit) {
            self.within.push((tag, unit.index));
        }
        fn submit_group(&mut self, _ops: &[BlockOp], tag: u64) {
            self.plain.push(tag);
        }
    }

    #[test]
    fn the_wrapper_routes_reads_and_writes_to_submit_in() {
        let mut mem = vec![0u8; 8192];
        let owner = BufferOwner::new();
        let unit = BufferUnit {
            owner: owner.id(),
            index: 7,
            base: mem.as_mut_ptr(),
            len: 4096,
        };
        let mut rec = Recorder::default();
        {
            let mut io = WithBuffer::new(&mut rec, unit);
            io.submit(op(BlockOpKind::Read, unit.base, 4096), 1);
            io.submit(
                op(BlockOpKind::Read, mem.as_mut_ptr().wrapping_add(4096), 4096),
                2,
            );
            io.submit(op(BlockOpKind::Flush, std::ptr::null_mut(), 0), 3);
            io.submit_group(&[], 4);
        }
        // Both reads reach `submit_in` (which checks the extent); flush and group do not.
        assert_eq!(rec.within, vec![(1, 7), (2, 7)]);
        assert_eq!(rec.plain, vec![3, 4]);
    }
}
