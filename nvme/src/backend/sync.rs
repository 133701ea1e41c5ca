//! The one synchronous `IoSubmit`: performs each `BlockOp` at submit time with
//! pread(2) / pwrite(2) / fdatasync(2) and keeps `(tag, result)` for the caller to deliver
//! later, as the reactor's io_uring would on a later loop turn. Used where an op must
//! complete in place (the Compare read of an I/O queue) and by tests and fuzz targets that
//! drive the dispatch core or a transport without a reactor.

use super::{BlockOp, BlockOpKind, IoSubmit};

/// Runs ops synchronously; results are bytes transferred or -errno, like a CQE's `res`.
#[derive(Debug, Default)]
pub struct SyncEngine {
    /// Completed ops in submission order, not yet delivered.
    pub done: Vec<(u64, i32)>,
}

impl SyncEngine {
    /// Runs `op` now and returns its result (bytes transferred or -errno).
    pub fn run(op: &BlockOp) -> i32 {
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
}

impl IoSubmit for SyncEngine {
    fn submit(&mut self, op: BlockOp, tag: u64) {
        let res = Self::run(&op);
        self.done.push((tag, res));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::aligned::AlignedBuf;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn reads_writes_flushes_and_reports_errors() {
        let path = std::env::temp_dir().join(format!("nvmfd-sync-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        let mut buf = AlignedBuf::new(4096);
        let mut io = SyncEngine::default();
        let op = |kind, buf: &mut AlignedBuf, offset| BlockOp {
            kind,
            fd: f.as_raw_fd(),
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
}
