//! SQE building: an op parked in the engine ([`InFlight`]) as the io_uring entry that carries
//! it (or its remainder, or the next step of a zeroing plan).

use io_uring::{opcode, squeue, types};

use crate::{BlockOp, BlockOpKind, Deferred, ZeroMethod};

/// Size of the shared zero buffer `ZeroMethod::WriteZeroes` writes from, one write per chunk.
pub(super) const ZERO_CHUNK: usize = 1 << 20;

/// `BLOCK_URING_CMD_DISCARD` = `_IO(0x12, 0)` (include/uapi/linux/fs.h, Linux 6.12): discard of
/// `[sqe->addr, sqe->addr + sqe->addr3)` on a block device opened for writing.
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

/// One op the engine is responsible for until its completion has been reaped.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) op: BlockOp,
    pub(super) tag: u64,
    /// Bytes already transferred by earlier (short) completions.
    pub(super) done: u32,
    pub(super) transient_retries: u8,
    /// `Zeroes`: index into the plan of the method being tried, and bytes already written by
    /// `ZeroMethod::WriteZeroes`.
    pub(super) stage: u8,
    pub(super) zeroed: u64,
    /// Member of a group (`submit_group`): index into `groups`.
    pub(super) group: Option<u32>,
    /// The registered-file slot the op is issued on (`None`: `op.fd`). Held, so that the slot
    /// keeps this file until the op is released.
    pub(super) file_slot: Option<u32>,
    /// The registered buffer the op's buffer lies in (`None`: a plain READ/WRITE).
    pub(super) buf_slot: Option<u16>,
    /// A delay (`submit_after`) rather than an op: the slot's SQE is an `IORING_OP_TIMEOUT`
    /// and `op` carries only the command's buffer for `Timer::then`.
    pub(super) timer: Option<Box<Timer>>,
}

/// A pending `submit_after`. Boxed so that the timespec keeps its address while the slot
/// vector grows: the kernel reads it when it takes the SQE, which with SQPOLL is whenever.
pub(super) struct Timer {
    pub(super) timespec: types::Timespec,
    pub(super) then: Deferred,
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer").finish_non_exhaustive()
    }
}

/// The engine's zero buffer as the kernel sees it: `ZERO_CHUNK` bytes at a 4096-aligned
/// address (O_DIRECT), or null before any op needed it.
#[derive(Clone, Copy)]
pub(super) struct AlignedZeroes(pub(super) *const u8);

impl AlignedZeroes {
    pub(super) const ALIGN: usize = 4096;

    pub(super) fn of(buf: &Option<Vec<u8>>) -> Self {
        AlignedZeroes(buf.as_ref().map_or(std::ptr::null(), |b| {
            // The vector has ALIGN spare bytes, so the aligned start leaves ZERO_CHUNK.
            b.as_ptr()
                .wrapping_add(b.as_ptr().align_offset(Self::ALIGN))
        }))
    }
}

/// Runs `$body` with `$fd` bound to the op's file as the opcode builders take it: its
/// registered slot (`types::Fixed`, which sets IOSQE_FIXED_FILE) or its descriptor.
macro_rules! with_file {
    ($entry:expr, $fd:ident => $body:expr) => {
        match $entry.file_slot {
            Some(slot) => {
                let $fd = types::Fixed(slot);
                $body
            }
            None => {
                let $fd = types::Fd($entry.op.fd);
                $body
            }
        }
    };
}

pub(super) fn build_sqe(entry: &InFlight, user_data: u32, zeroes: AlignedZeroes) -> squeue::Entry {
    let op = &entry.op;
    let offset = op.offset + u64::from(entry.done);
    let len = op.len - entry.done;
    // `done` ≤ `len` ≤ the caller's buffer, so the pointer stays inside that buffer.
    let buf = op.buf.wrapping_add(entry.done as usize);
    if let Some(timer) = &entry.timer {
        // A pure timer (count 0): completes with -ETIME when it expires.
        return opcode::Timeout::new(&timer.timespec)
            .build()
            .user_data(u64::from(user_data));
    }
    if let Some(index) = entry.buf_slot {
        // On a registered buffer (only reads and writes get one). The remainder of a short
        // transfer starts further inside the same registration.
        let sqe = with_file!(entry, fd => match op.kind {
            BlockOpKind::Read => Some(opcode::ReadFixed::new(fd, buf, len, index)
                .offset(offset)
                .build()),
            BlockOpKind::Write { fua } => Some(opcode::WriteFixed::new(fd, buf, len, index)
                .offset(offset)
                .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                .build()),
            BlockOpKind::Flush | BlockOpKind::Zeroes { .. } => None,
        });
        if let Some(sqe) = sqe {
            return sqe.user_data(u64::from(user_data));
        }
    }
    let sqe = with_file!(entry, fd => match op.kind {
        BlockOpKind::Read => opcode::Read::new(fd, buf, len).offset(offset).build(),
        BlockOpKind::Write { fua } => opcode::Write::new(fd, buf, len)
            .offset(offset)
            .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
            .build(),
        BlockOpKind::Flush => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        BlockOpKind::Zeroes { len, plan } => match plan[usize::from(entry.stage)] {
            method @ (ZeroMethod::PunchHole | ZeroMethod::ZeroRange) => {
                opcode::Fallocate::new(fd, len)
                    .offset(op.offset)
                    .mode(method.fallocate_mode().unwrap_or(0))
                    .build()
            }
            ZeroMethod::Discard => {
                // sqe->addr = start, sqe->addr3 (the first 8 bytes of the command area) =
                // length (block/ioctl.c, blkdev_uring_cmd).
                let mut cmd = [0u8; 16];
                cmd[..8].copy_from_slice(&len.to_le_bytes());
                // IOSQE_ASYNC: issued inline, the kernel marks the discard bio REQ_NOWAIT
                // (blkdev_cmd_discard), and a bio-based device without nowait support — dm-thin,
                // the device this method exists for — fails it with EOPNOTSUPP instead of
                // EAGAIN, so io_uring never retries it from a worker. Forced to io-wq, the
                // discard may block there, never on the reactor.
                opcode::UringCmd16::new(fd, BLOCK_URING_CMD_DISCARD)
                    .addr(Some(op.offset))
                    .cmd(cmd)
                    .build()
                    .flags(squeue::Flags::ASYNC)
            }
            ZeroMethod::WriteZeroes => {
                let n = (len - entry.zeroed).min(ZERO_CHUNK as u64) as u32;
                opcode::Write::new(fd, zeroes.0, n)
                    .offset(op.offset + entry.zeroed)
                    .build()
            }
        },
    });
    sqe.user_data(u64::from(user_data))
}
