//! NVM command set I/O commands (NVM Command Set 1.0 §3): Read, Write, Flush, Write Zeroes,
//! Dataset Management, Compare. Range and length checks happen in `prepare` (before any data
//! moves) and again in `execute` against the namespace table current at that moment.

use std::alloc::{self, Layout};
use std::sync::Arc;

use crate::backend::{BackendRequest, BlockOp, BlockOpKind, IoSubmit, Started};
use crate::controller::{Controller, IoCounters, TerminateReason};
use crate::namespace::Namespace;
use crate::queue::{opcode, Completion, Direction, Exec, Queue, Role};
use crate::wire::{Sqe, Status};

/// CDW12 bit 30: Force Unit Access (Read/Write).
const FUA: u32 = 1 << 30;
/// CDW12 bit 25: Deallocate (Write Zeroes).
const DEAC: u32 = 1 << 25;
/// DSM CDW11 bit 2: Attribute – Deallocate.
const DSM_AD: u32 = 1 << 2;
/// DSM range: context attributes (4), length in LBAs (4), starting LBA (8).
const DSM_RANGE_SIZE: usize = 16;

/// A validated LBA range of one namespace.
#[derive(Debug, Clone)]
struct Extent {
    ns: Arc<Namespace>,
    slba: u64,
    offset: u64,
    bytes: u64,
}

/// The controller status the I/O path needs, read from atomics only.
fn controller_gate(ctrl: &Controller) -> Result<(), Status> {
    match ctrl.terminated() {
        Some(TerminateReason::ControllerReset) | None => {}
        Some(_) => return Err(Status::ABORTED_SQ_DELETION),
    }
    if !ctrl.is_ready() {
        // NVMe Base 2.0 §3.5: no I/O while the controller is not enabled (or reset).
        return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    Ok(())
}

/// Starting LBA (CDW10/11) and 0's based number of blocks (CDW12 15:0) → checked extent.
fn extent(ns: &Arc<Namespace>, slba: u64, nlb: u64) -> Result<Extent, Completion> {
    let end = slba.checked_add(nlb);
    match end {
        Some(end) if end <= ns.blocks && nlb > 0 => Ok(Extent {
            ns: Arc::clone(ns),
            slba,
            offset: slba << ns.lba_shift,
            bytes: nlb << ns.lba_shift,
        }),
        _ => Err(Completion::fail(Status::LBA_OUT_OF_RANGE)
            .at(40)
            .with_lba(slba)),
    }
}

fn slba(sqe: &Sqe) -> u64 {
    sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32
}

fn nlb(sqe: &Sqe) -> u64 {
    (sqe.cdw12 & 0xffff) as u64 + 1
}

/// Backend error → NVMe status (NVMe Base 2.0 Figures 94 and 96). EIO is a media error.
fn backend_status(op: u8, errno: i32) -> Status {
    match errno {
        libc::EIO | libc::EILSEQ | libc::EBADMSG => {
            if op == opcode::READ || op == opcode::COMPARE {
                Status::UNRECOVERED_READ_ERROR
            } else {
                Status::WRITE_FAULT
            }
        }
        libc::ENOSPC | libc::EDQUOT => Status::CAPACITY_EXCEEDED.with_dnr(),
        _ => Status::INTERNAL_ERROR,
    }
}

fn is_media_error(s: Status) -> bool {
    s == Status::UNRECOVERED_READ_ERROR || s == Status::WRITE_FAULT
}

impl Queue {
    fn io_parts(&self) -> Option<(&Arc<Controller>, &crate::queue::IoState)> {
        match (&self.role, &self.io) {
            (Role::Io { ctrl, .. }, Some(io)) => Some((ctrl, io)),
            _ => None,
        }
    }

    /// The namespace `nsid` from the cached table, refreshed when the subsystem published a
    /// new one (one atomic load per command; the lock only after a change).
    fn namespace(&mut self, nsid: u32) -> Result<Arc<Namespace>, Completion> {
        let invalid = || Completion::fail(Status::INVALID_NAMESPACE).at(4);
        let Role::Io { ctrl, .. } = &self.role else {
            return Err(Completion::fail(Status::COMMAND_SEQUENCE_ERROR));
        };
        let subsys = Arc::clone(&ctrl.subsys);
        let Some(io) = self.io.as_mut() else {
            return Err(Completion::fail(Status::COMMAND_SEQUENCE_ERROR));
        };
        if subsys.ns_generation() != io.generation {
            (io.table, io.generation) = subsys.namespaces_with_generation();
        }
        if nsid == 0 || nsid == u32::MAX {
            return Err(invalid());
        }
        io.table.get(nsid).cloned().ok_or_else(invalid)
    }

    /// Everything that can be checked before data moves. Returns the extent for commands
    /// that address LBAs.
    fn io_check(&mut self, sqe: &Sqe, data_len: u32) -> Result<Option<Extent>, Completion> {
        let Some((ctrl, _)) = self.io_parts() else {
            return Err(Completion::fail(Status::COMMAND_SEQUENCE_ERROR));
        };
        controller_gate(ctrl).map_err(Completion::err)?;
        let ns = self.namespace(sqe.nsid)?;
        let writes = matches!(
            sqe.opcode,
            opcode::WRITE | opcode::WRITE_ZEROES | opcode::DATASET_MANAGEMENT
        );
        if writes && ns.read_only {
            return Err(Completion::fail(Status::NAMESPACE_WRITE_PROTECTED));
        }
        match sqe.opcode {
            opcode::READ | opcode::WRITE | opcode::COMPARE => {
                let ext = extent(&ns, slba(sqe), nlb(sqe))?;
                // The SGL must describe exactly NLB blocks (NVMe Base 2.0 §4.3.2).
                if ext.bytes != data_len as u64 {
                    return Err(
                        Completion::fail(Status::DATA_SGL_LENGTH_INVALID).with_lba(ext.slba)
                    );
                }
                Ok(Some(ext))
            }
            opcode::WRITE_ZEROES => Ok(Some(extent(&ns, slba(sqe), nlb(sqe))?)),
            opcode::DATASET_MANAGEMENT => {
                let ranges = (sqe.cdw10 & 0xff) as usize + 1;
                if (data_len as usize) < ranges * DSM_RANGE_SIZE {
                    return Err(Completion::fail(Status::DATA_SGL_LENGTH_INVALID));
                }
                Ok(None)
            }
            opcode::FLUSH => Ok(None),
            _ => Err(Completion::fail(Status::INVALID_OPCODE)),
        }
    }

    /// `prepare` for I/O queues: opcode table, direction, and the checks of `io_check`.
    pub(crate) fn io_admission(
        &mut self,
        sqe: &Sqe,
        data_len: u32,
    ) -> Result<(Direction, u32), Status> {
        let dir = match sqe.opcode {
            opcode::READ => Direction::ControllerToHost,
            opcode::WRITE | opcode::COMPARE | opcode::DATASET_MANAGEMENT => {
                Direction::HostToController
            }
            opcode::FLUSH | opcode::WRITE_ZEROES => Direction::None,
            _ => return Err(Status::INVALID_OPCODE.with_dnr()),
        };
        let max = match dir {
            Direction::None => 0,
            _ if sqe.opcode == opcode::DATASET_MANAGEMENT => (256 * DSM_RANGE_SIZE) as u32,
            _ => u32::MAX,
        };
        self.io_check(sqe, data_len).map_err(|c| c.status)?;
        Ok((dir, max))
    }

    pub(crate) fn io_execute(
        &mut self,
        sqe: &Sqe,
        data: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Exec {
        let ext = match self.io_check(sqe, data.len() as u32) {
            Ok(e) => e,
            Err(c) => return c.into(),
        };
        let Some((ctrl, state)) = self.io_parts() else {
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR).into();
        };
        let counters = Arc::clone(&state.counters);
        let write_through = !ctrl.volatile_write_cache();
        match (sqe.opcode, ext) {
            (opcode::READ, Some(ext)) => {
                IoCounters::add(&counters.read_commands, 1);
                let r = ext.ns.backend.start(
                    BackendRequest::Read { offset: ext.offset },
                    &mut data[..ext.bytes as usize],
                    tag,
                    io,
                );
                self.started(sqe, r, &ext)
            }
            (opcode::WRITE, Some(ext)) => {
                IoCounters::add(&counters.write_commands, 1);
                let fua = sqe.cdw12 & FUA != 0 || write_through;
                let r = ext.ns.backend.start(
                    BackendRequest::Write {
                        offset: ext.offset,
                        fua,
                    },
                    &mut data[..ext.bytes as usize],
                    tag,
                    io,
                );
                self.started(sqe, r, &ext)
            }
            (opcode::FLUSH, _) => match self.namespace(sqe.nsid) {
                Ok(ns) => {
                    let r = ns.backend.start(BackendRequest::Flush, &mut [], tag, io);
                    let ext = Extent {
                        ns,
                        slba: 0,
                        offset: 0,
                        bytes: 0,
                    };
                    self.started(sqe, r, &ext)
                }
                Err(c) => c.into(),
            },
            (opcode::WRITE_ZEROES, Some(ext)) => {
                // DEAC: deallocate instead; DLFEAT promises deallocated blocks read as zero.
                let r = if sqe.cdw12 & DEAC != 0 {
                    ext.ns.backend.deallocate(ext.offset, ext.bytes)
                } else {
                    ext.ns.backend.write_zeroes(ext.offset, ext.bytes)
                };
                self.sync_result(sqe, r, &ext).into()
            }
            (opcode::DATASET_MANAGEMENT, _) => self.dataset_management(sqe, data).into(),
            (opcode::COMPARE, Some(ext)) => self.compare(sqe, data, &ext).into(),
            _ => Completion::fail(Status::INVALID_OPCODE).into(),
        }
    }

    fn started(&mut self, sqe: &Sqe, r: Started, ext: &Extent) -> Exec {
        match r {
            Started::Submitted => Exec::Submitted,
            Started::Done(r) => self.sync_result(sqe, r, ext).into(),
        }
    }

    /// Accounts a completed data command and maps its result.
    fn sync_result(&mut self, sqe: &Sqe, r: std::io::Result<()>, ext: &Extent) -> Completion {
        match r {
            Ok(()) => {
                self.account(sqe.opcode, ext.bytes);
                if sqe.opcode == opcode::READ {
                    Completion::data(ext.bytes as usize)
                } else {
                    Completion::ok()
                }
            }
            Err(e) => self.io_error(sqe, e.raw_os_error().unwrap_or(libc::EIO), ext.slba),
        }
    }

    fn account(&self, op: u8, bytes: u64) {
        if let Some((_, state)) = self.io_parts() {
            match op {
                opcode::READ => IoCounters::add(&state.counters.bytes_read, bytes),
                opcode::WRITE => IoCounters::add(&state.counters.bytes_written, bytes),
                _ => {}
            }
        }
    }

    fn io_error(&self, sqe: &Sqe, errno: i32, lba: u64) -> Completion {
        let status = backend_status(sqe.opcode, errno);
        if is_media_error(status) {
            if let Some((_, state)) = self.io_parts() {
                IoCounters::add(&state.counters.media_errors, 1);
            }
        }
        tracing::debug!(
            nsid = sqe.nsid,
            opcode = sqe.opcode,
            errno,
            lba,
            "backend I/O failed"
        );
        Completion::err(status).with_lba(lba)
    }

    /// Completion of a submitted op: `result` is bytes transferred or -errno. A short
    /// transfer cannot be retried here, so it is an error too.
    pub(crate) fn io_finish(&mut self, sqe: &Sqe, result: i32) -> Completion {
        let expected = match sqe.opcode {
            opcode::READ | opcode::WRITE => self
                .namespace(sqe.nsid)
                .ok()
                .map(|ns| nlb(sqe) << ns.lba_shift),
            _ => None,
        };
        if result < 0 {
            return self.io_error(sqe, -result, slba(sqe));
        }
        if let Some(expected) = expected {
            if result as u64 != expected {
                tracing::warn!(nsid = sqe.nsid, result, expected, "short backend transfer");
                return self.io_error(sqe, libc::EIO, slba(sqe));
            }
        }
        let bytes = result as u64;
        self.account(sqe.opcode, bytes);
        if sqe.opcode == opcode::READ {
            Completion::data(bytes as usize)
        } else {
            Completion::ok()
        }
    }

    /// Dataset Management (NVM Command Set 1.0 §3.3.3): with the Deallocate attribute every
    /// range is deallocated (reads zero afterwards); without it the ranges are hints only.
    fn dataset_management(&mut self, sqe: &Sqe, data: &[u8]) -> Completion {
        let ns = match self.namespace(sqe.nsid) {
            Ok(ns) => ns,
            Err(c) => return c,
        };
        if sqe.cdw11 & DSM_AD == 0 {
            return Completion::ok();
        }
        let ranges = (sqe.cdw10 & 0xff) as usize + 1;
        let Some(list) = data.get(..ranges * DSM_RANGE_SIZE) else {
            return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
        };
        // Validate every range before deallocating any.
        let mut extents = Vec::with_capacity(ranges);
        for r in list.chunks_exact(DSM_RANGE_SIZE) {
            let len = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as u64;
            let mut s = [0u8; 8];
            s.copy_from_slice(&r[8..16]);
            let slba = u64::from_le_bytes(s);
            if len == 0 {
                continue;
            }
            match extent(&ns, slba, len) {
                Ok(e) => extents.push(e),
                Err(c) => return c,
            }
        }
        for e in &extents {
            if let Err(err) = ns.backend.deallocate(e.offset, e.bytes) {
                return self.io_error(sqe, err.raw_os_error().unwrap_or(libc::EIO), e.slba);
            }
        }
        Completion::ok()
    }

    /// Compare (NVM Command Set 1.0 §3.2.1): reads the range synchronously into a per-queue
    /// scratch buffer (allocated once, MDTS-sized) and compares with the host's data.
    fn compare(&mut self, sqe: &Sqe, data: &[u8], ext: &Extent) -> Completion {
        let mdts = self.limits.max_data_transfer as usize;
        let Some(state) = self.io.as_mut() else {
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        let scratch = state.scratch.get_or_insert_with(|| AlignedBuf::new(mdts));
        let buf = &mut scratch.as_mut_slice()[..ext.bytes as usize];
        let mut sync = SyncRead { result: None };
        let r = match ext.ns.backend.start(
            BackendRequest::Read { offset: ext.offset },
            buf,
            0,
            &mut sync,
        ) {
            Started::Done(r) => r.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)),
            Started::Submitted => match sync.result {
                Some(n) if n as u64 == ext.bytes => Ok(()),
                Some(n) if n < 0 => Err(-n),
                _ => Err(libc::EIO),
            },
        };
        if let Err(errno) = r {
            return self.io_error(sqe, errno, ext.slba);
        }
        if buf[..] != data[..ext.bytes as usize] {
            return Completion::err(Status::COMPARE_FAILURE.with_dnr()).with_lba(ext.slba);
        }
        Completion::ok()
    }
}

/// An `IoSubmit` that performs a read at once with pread(2) (Compare only: rare, and it keeps
/// Compare free of per-command buffers).
struct SyncRead {
    result: Option<i32>,
}

impl IoSubmit for SyncRead {
    fn submit(&mut self, op: BlockOp, _tag: u64) {
        if op.kind != BlockOpKind::Read {
            self.result = Some(-libc::EINVAL);
            return;
        }
        let mut done = 0usize;
        let len = op.len as usize;
        while done < len {
            // SAFETY: `op.buf`/`op.len` describe the scratch slice handed to `Backend::start`
            // just above, which is exclusively borrowed for the duration of this call.
            let n = unsafe {
                libc::pread(
                    op.fd,
                    op.buf.add(done).cast(),
                    len - done,
                    (op.offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let errno = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                if errno == libc::EINTR {
                    continue;
                }
                self.result = Some(-errno);
                return;
            }
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        self.result = Some(done as i32);
    }
}

/// A zeroed, 4096-byte aligned heap buffer (O_DIRECT-compatible).
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub const ALIGN: usize = 4096;

    pub fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), Self::ALIGN)
            .unwrap_or_else(|_| Layout::new::<u8>());
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self { ptr, layout }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() initialised (zeroed) bytes,
        // uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
