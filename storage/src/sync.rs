//! The one synchronous `IoSubmit`: performs each `BlockOp` at submit time with
//! pread(2) / pwrite(2) / fdatasync(2) / fallocate(2) and keeps `(tag, result)` for the
//! caller to deliver later, as the reactor's io_uring would on a later loop turn. Used by
//! tests and fuzz targets that drive the dispatch core or a transport without a reactor.

use super::{BlockOp, BlockOpKind, IoSubmit, ZeroMethod};

/// Runs ops synchronously; results are bytes transferred or -errno, like a CQE's `res`.
#[derive(Debug, Default)]
pub struct SyncEngine {
    /// Completed ops in submission order, not yet delivered.
    pub done: Vec<(u64, i32)>,
}

impl SyncEngine {
    /// Runs `op` now and returns its result (bytes transferred or -errno).
    pub fn run(op: &BlockOp) -> i32 {
        if let BlockOpKind::Zeroes { len, plan } = op.kind {
            return Self::zero(op, len, plan);
        }
        let len = op.len as usize;
        let mut done = 0usize;
        while done < len || op.kind == BlockOpKind::Flush {
            // SAFETY: `IoSubmit` contract (ARCHITECTURE.md, data buffers): `op.buf[..op.len]`
            // stays alive and untouched by anyone else until this op's completion is
            // delivered, which is after this call; `op.fd` is the namespace's open file.
            let n = unsafe {
                match op.kind {
                    BlockOpKind::Read => libc::pread(
                        op.fd,
                        op.buf.add(done).cast(),
                        len - done,
                        (op.offset + done as u64) as libc::off_t,
                    ),
                    BlockOpKind::Write { .. } => libc::pwrite(
                        op.fd,
                        op.buf.add(done).cast(),
                        len - done,
                        (op.offset + done as u64) as libc::off_t,
                    ),
                    BlockOpKind::Flush => libc::fdatasync(op.fd) as isize,
                    BlockOpKind::Zeroes { .. } => unreachable!("handled above"),
                }
            };
            if n < 0 {
                let errno = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                if errno == libc::EINTR {
                    continue;
                }
                return -errno;
            }
            if op.kind == BlockOpKind::Flush {
                return 0;
            }
            if n == 0 {
                // End of file: a short transfer, which the caller reports.
                break;
            }
            done += n as usize;
        }
        done as i32
    }

    /// `[op.offset, op.offset + len)` made to read as zeroes with the methods of `plan` in
    /// order, moving on when one is unsupported (EOPNOTSUPP / ENOSYS / EINVAL, as the ring
    /// engine does); 0 or the error that ended the plan. `Discard` is a block-device ring
    /// command this engine does not issue: it counts as unsupported.
    fn zero(op: &BlockOp, len: u64, plan: &[ZeroMethod]) -> i32 {
        let mut res = -libc::EOPNOTSUPP;
        for &method in plan {
            res = match method {
                ZeroMethod::PunchHole | ZeroMethod::ZeroRange => {
                    let mode = method.fallocate_mode().unwrap_or(0);
                    // SAFETY: fallocate(2) on the namespace's open file touches no memory.
                    let r = unsafe {
                        libc::fallocate(op.fd, mode, op.offset as libc::off_t, len as libc::off_t)
                    };
                    if r < 0 {
                        -std::io::Error::last_os_error()
                            .raw_os_error()
                            .unwrap_or(libc::EIO)
                    } else {
                        0
                    }
                }
                ZeroMethod::Discard => -libc::EOPNOTSUPP,
                ZeroMethod::WriteZeroes => Self::write_zeroes(op.fd, op.offset, len),
            };
            if !matches!(-res, libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) {
                break;
            }
        }
        res.min(0)
    }

    /// Plain writes from a zero buffer, a chunk at a time.
    fn write_zeroes(fd: std::os::fd::RawFd, offset: u64, len: u64) -> i32 {
        const CHUNK: usize = 64 * 1024;
        let zeroes = vec![0u8; CHUNK];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as u32;
            let res = Self::run(&BlockOp {
                fd,
                file: None,
                kind: BlockOpKind::Write { fua: false },
                offset: offset + done,
                // pwrite(2) only reads through this pointer.
                buf: zeroes.as_ptr().cast_mut(),
                len: n,
            });
            if res < 0 {
                return res;
            }
            if res == 0 {
                return -libc::EIO;
            }
            done += res as u64;
        }
        0
    }
}

impl IoSubmit for SyncEngine {
    fn submit(&mut self, op: BlockOp, tag: u64) {
        let res = Self::run(&op);
        self.done.push((tag, res));
    }

    fn submit_group(&mut self, ops: &[BlockOp], tag: u64) {
        let res = ops.iter().map(Self::run).find(|&r| r < 0).unwrap_or(0);
        self.done.push((tag, res));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;
    use crate::test_support::scratch_file;
    use std::fs::File;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// An unlinked scratch file holding `len` bytes of 7.
    fn filled(name: &str, len: usize) -> File {
        let (path, mut f) = scratch_file(name, 0);
        std::fs::remove_file(&path).unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        f
    }

    #[test]
    fn reads_writes_flushes_and_reports_errors() {
        let f = filled("sync", 8192);
        let mut buf = AlignedBuf::new(4096);
        let mut io = SyncEngine::default();
        let op = |kind, buf: &mut AlignedBuf, offset| BlockOp {
            kind,
            fd: f.as_raw_fd(),
            file: None,
            buf: buf.as_mut_ptr(),
            len: 4096,
            offset,
        };
        io.submit(op(BlockOpKind::Read, &mut buf, 4096), 1);
        assert!(buf.iter().all(|&b| b == 7));
        buf.fill(9);
        io.submit(op(BlockOpKind::Write { fua: false }, &mut buf, 0), 2);
        io.submit(op(BlockOpKind::Flush, &mut buf, 0), 3);
        // Past the end: a short (empty) read, not an error.
        io.submit(op(BlockOpKind::Read, &mut buf, 8192), 4);
        assert_eq!(io.done, vec![(1, 4096), (2, 4096), (3, 0), (4, 0)]);
        let mut bad = op(BlockOpKind::Read, &mut buf, 0);
        bad.fd = -1;
        assert_eq!(SyncEngine::run(&bad), -libc::EBADF);
    }

    #[test]
    fn zeroes_groups_with_the_plan_in_order() {
        let f = filled("sync-z", 16384);
        let zeroes = |offset, len, plan| BlockOp {
            kind: BlockOpKind::Zeroes { len, plan },
            fd: f.as_raw_fd(),
            file: None,
            buf: std::ptr::null_mut(),
            len: 0,
            offset,
        };
        let mut io = SyncEngine::default();
        io.submit_group(
            &[
                zeroes(0, 4096, ZeroMethod::FILE_DEALLOCATE),
                zeroes(8192, 4096, ZeroMethod::FILE_WRITE_ZEROES),
            ],
            1,
        );
        // Plain writes of zeroes: the last resort, and what a plan without it cannot reach.
        io.submit(zeroes(12288, 2048, &[ZeroMethod::WriteZeroes]), 2);
        io.submit(zeroes(0, 4096, &[ZeroMethod::Discard]), 3);
        assert_eq!(io.done, vec![(1, 0), (2, 0), (3, -libc::EOPNOTSUPP)]);
        let mut back = AlignedBuf::new(16384);
        let read = BlockOp {
            kind: BlockOpKind::Read,
            fd: f.as_raw_fd(),
            file: None,
            buf: back.as_mut_ptr(),
            len: 16384,
            offset: 0,
        };
        assert_eq!(SyncEngine::run(&read), 16384);
        let zero = |r: std::ops::Range<usize>| back[r].iter().all(|&b| b == 0);
        assert!(zero(0..4096) && zero(8192..14336));
        assert!(back[4096..8192]
            .iter()
            .chain(&back[14336..])
            .all(|&b| b == 7));
    }
}
