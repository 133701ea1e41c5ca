//! Regular-file namespaces (disk images), O_DIRECT by default.
//!
//! Data moves through the reactor's io_uring: one [`BlockOp`] per Read / Write / Flush. O_DIRECT
//! keeps the page cache out of the data path (no double caching with the host's own cache, and
//! no dirty pages the kernel would write back behind our back); if the filesystem refuses it
//! (open fails with EINVAL, or statx reports no direct-I/O support or alignment needs larger than
//! the namespace block) the file is used buffered and a warning says so.
//!
//! Durability: Write{fua} → `RWF_DSYNC` and Flush → `fdatasync` (see `uring.rs`), so the
//! namespace's volatile write cache (the page cache in buffered mode, the device cache with
//! O_DIRECT) is handled exactly as the host expects from VWC = 1.
//!
//! Deallocate and Write Zeroes go through the same ring as `IORING_OP_FALLOCATE` (punch hole,
//! zero range; io_uring runs fallocate on its worker threads, never in the submitting reactor),
//! and where the filesystem supports neither mode the engine writes zeroes from a shared buffer
//! (`ZeroMethod`): slow but always correct, and still off the reactor.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::fileid::BackendFile;
use super::{
    check_range, Backend, BackendError, BackendRequest, BlockOp, BlockOpKind, Capabilities,
    IoSubmit, Started, ZeroMethod, Zeroing,
};

#[derive(Debug)]
pub struct FileBackend {
    file: BackendFile,
    path: PathBuf,
    capacity: u64,
    block_size: u32,
    direct: bool,
    /// Buffer address alignment O_DIRECT needs (statx `dio_mem_align`, else the block size).
    mem_align: usize,
}

impl FileBackend {
    /// Opens (creating and extending to `size` if given) a regular file as a namespace with
    /// `block_size`-byte blocks. The capacity is the file size rounded down to whole blocks; a
    /// file larger than `size` is not truncated (its data stays reachable).
    pub fn open(
        path: &Path,
        size: Option<u64>,
        direct_io: bool,
        block_size: u32,
    ) -> Result<Self, BackendError> {
        Self::open_with(path, size, direct_io, block_size, &open_file)
    }

    /// `open` with the open(2) step injectable, so the buffered fallback can be tested on a
    /// filesystem that does support O_DIRECT.
    fn open_with(
        path: &Path,
        size: Option<u64>,
        direct_io: bool,
        block_size: u32,
        opener: &dyn Fn(&Path, bool, bool) -> io::Result<File>,
    ) -> Result<Self, BackendError> {
        let create = size.is_some();
        let open_err = |source| BackendError::Open {
            path: path.to_path_buf(),
            source,
        };
        let (file, mut direct) = if direct_io {
            match opener(path, create, true) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(path = %path.display(),
                        "filesystem refuses O_DIRECT; using buffered I/O (page cache)");
                    (opener(path, create, false).map_err(open_err)?, false)
                }
                Err(e) => return Err(open_err(e)),
            }
        } else {
            (opener(path, create, false).map_err(open_err)?, false)
        };

        let stat_err = |source| BackendError::Stat {
            path: path.to_path_buf(),
            source,
        };
        let meta = file.metadata().map_err(stat_err)?;
        if !meta.file_type().is_file() {
            return Err(BackendError::UnsupportedFileType {
                path: path.to_path_buf(),
            });
        }
        let mut len = meta.len();
        if let Some(size) = size {
            if len < size {
                // Sparse extension: no blocks are allocated until written.
                file.set_len(size).map_err(|source| BackendError::Resize {
                    path: path.to_path_buf(),
                    size,
                    source,
                })?;
                len = size;
            } else if len > size {
                tracing::info!(path = %path.display(), file_size = len, size,
                    "file is larger than the configured size; exporting the whole file");
            }
        }
        let capacity = len - len % u64::from(block_size);
        if capacity == 0 {
            return Err(BackendError::TooSmall {
                path: path.to_path_buf(),
                size: len,
                block_size,
            });
        }
        if capacity != len {
            tracing::warn!(path = %path.display(), file_size = len, capacity,
                "file size is not a multiple of the block size; the tail is not exported");
        }

        let mut mem_align = block_size as usize;
        if direct {
            match dio_alignment(&file) {
                Some((0, _)) => {
                    tracing::warn!(path = %path.display(),
                        "filesystem does not support direct I/O on this file; using buffered I/O");
                    direct = false;
                }
                Some((mem, offset)) if offset > block_size || mem > 4096 => {
                    tracing::warn!(path = %path.display(), dio_offset_align = offset,
                        dio_mem_align = mem, block_size,
                        "O_DIRECT alignment exceeds the namespace block size; using buffered I/O");
                    direct = false;
                }
                Some((mem, _)) => mem_align = mem as usize,
                // Kernel or filesystem does not report it: the successful open is our evidence.
                None => {}
            }
            if !direct {
                clear_o_direct(&file).map_err(open_err)?;
            }
        }

        tracing::debug!(path = %path.display(), capacity, block_size, direct_io = direct,
            "opened file namespace backend");
        Ok(FileBackend {
            file: BackendFile::new(file),
            path: path.to_path_buf(),
            capacity,
            block_size,
            direct,
            mem_align: mem_align.max(1),
        })
    }

    /// Whether data I/O bypasses the page cache (for logs and the control CLI).
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_data_op(&self, offset: u64, buf: &[u8]) -> io::Result<u32> {
        check_range(offset, buf.len() as u64, self.capacity)?;
        let len =
            u32::try_from(buf.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let misaligned = !offset.is_multiple_of(u64::from(self.block_size))
            || !len.is_multiple_of(self.block_size)
            || (self.direct && !(buf.as_ptr() as usize).is_multiple_of(self.mem_align));
        if misaligned {
            // The core converts whole LBAs and the transport aligns buffers; this guards the
            // O_DIRECT rules rather than letting the kernel answer EINVAL later.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(len)
    }
}

impl Backend for FileBackend {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    /// Holes read as zeroes and the zeroing plan ends in plain zero writes, so the promise
    /// holds on every filesystem. The filesystem's limits are not known (0). A volatile
    /// cache always: buffered writes sit in the page cache, and even with O_DIRECT the data
    /// may sit in the disk's cache and a new block's allocation in the file system's
    /// journal until `fdatasync` (Flush) or `RWF_DSYNC` (FUA).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            volatile_cache: true,
            ..Capabilities::ZEROING
        }
    }

    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        start_fd_op(&self.file, request, buf, tag, io, |offset, buf| {
            self.check_data_op(offset, buf)
        })
    }

    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        what: Zeroing,
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        // Deallocated blocks read back as zeroes (DLFEAT): a hole does, and if the filesystem
        // cannot punch holes the range is zeroed instead.
        let plan = match what {
            Zeroing::Deallocate | Zeroing::WriteZeroes { deallocate: true } => {
                ZeroMethod::FILE_DEALLOCATE
            }
            Zeroing::WriteZeroes { deallocate: false } => ZeroMethod::FILE_WRITE_ZEROES,
        };
        let bs = u64::from(self.block_size);
        start_zeroes_op(&self.file, ranges, plan, tag, io, |o, l| {
            check_range(o, l, self.capacity)?;
            if !o.is_multiple_of(bs) || !l.is_multiple_of(bs) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            Ok(())
        })
    }
}

/// Deallocate / Write Zeroes of `ranges` on a backend's file through the ring, one op per range
/// and one completion for all; shared with the block-device backend. `check` validates a range.
pub(crate) fn start_zeroes_op(
    file: &BackendFile,
    ranges: &[(u64, u64)],
    plan: &'static [ZeroMethod],
    tag: u64,
    io: &mut dyn IoSubmit,
    check: impl Fn(u64, u64) -> io::Result<()>,
) -> Started {
    let mut ops = Vec::with_capacity(ranges.len());
    for &(offset, len) in ranges {
        if let Err(e) = check(offset, len) {
            return Started::Done(Err(e));
        }
        if len > 0 {
            let zeroes = BlockOpKind::Zeroes { len, plan };
            ops.push(op_on(file, zeroes, offset, std::ptr::null_mut(), 0));
        }
    }
    if ops.is_empty() {
        return Started::Done(Ok(()));
    }
    io.submit_group(&ops, tag);
    Started::Submitted
}

/// Read / Write / Flush on a backend's file through the ring; shared with the block-device
/// backend.
/// `check` validates a data op and returns its length.
pub(crate) fn start_fd_op(
    file: &BackendFile,
    request: BackendRequest,
    buf: &mut [u8],
    tag: u64,
    io: &mut dyn IoSubmit,
    check: impl Fn(u64, &[u8]) -> io::Result<u32>,
) -> Started {
    let (kind, offset, len) = match request {
        BackendRequest::Read { offset } => (BlockOpKind::Read, offset, check(offset, buf)),
        BackendRequest::Write { offset, fua } => {
            (BlockOpKind::Write { fua }, offset, check(offset, buf))
        }
        BackendRequest::Flush => (BlockOpKind::Flush, 0, Ok(0)),
    };
    let len = match len {
        Ok(len) => len,
        Err(e) => return Started::Done(Err(e)),
    };
    io.submit(op_on(file, kind, offset, buf.as_mut_ptr(), len), tag);
    Started::Submitted
}

/// An op on `file`, under its descriptor and its identity (the rings' registered-file key).
pub(crate) fn op_on(
    file: &BackendFile,
    kind: BlockOpKind,
    offset: u64,
    buf: *mut u8,
    len: u32,
) -> BlockOp {
    BlockOp {
        fd: file.as_raw_fd(),
        file: Some(file.id()),
        kind,
        offset,
        buf,
        len,
    }
}

fn open_file(path: &Path, create: bool, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(create).mode(0o600);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

/// statx(STATX_DIOALIGN) → `(dio_mem_align, dio_offset_align)`, `None` when not reported
/// (kernels before 6.1, or filesystems that do not fill it in). `(0, 0)` means the file does not
/// support direct I/O (statx(2)).
fn dio_alignment(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated empty path with AT_EMPTY_PATH, and `stx` is a
    // properly sized out-parameter.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// Turns O_DIRECT off on an open descriptor (Linux allows toggling it with F_SETFL).
fn clear_o_direct(file: &File) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, no pointers involved.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
