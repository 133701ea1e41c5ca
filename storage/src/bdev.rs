//! Block-device namespaces (S_ISBLK: disks, partitions, LVs, loop devices), always O_DIRECT.
//!
//! Data moves through the reactor's io_uring like file namespaces (Write{fua} → `RWF_DSYNC`,
//! which the block layer turns into a FUA write or a write + cache flush; Flush → `fdatasync`,
//! which issues a device cache flush). Deallocate and Write Zeroes go through the ring too, as
//! `IORING_OP_FALLOCATE` on the device (the kernel's `blkdev_fallocate`: PUNCH_HOLE is a
//! write-zeroes that may unmap, ZERO_RANGE one that keeps the blocks provisioned) or, for
//! devices that can only discard, `BLOCK_URING_CMD_DISCARD`; never BLKDISCARD followed by a
//! NOUNMAP BLKZEROOUT, which re-provisioned thin volumes right after discarding them.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::file::{start_fd_op, start_zeroes_op};
use super::fileid::BackendFile;
use super::{
    check_range, Backend, BackendError, BackendRequest, Capabilities, IoSubmit, Started,
    ZeroMethod, Zeroing,
};

// <linux/fs.h>: the block-device ioctls (type 0x12).
nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
nix::ioctl_read_bad!(blksszget, libc::BLKSSZGET, libc::c_int);

#[derive(Debug)]
pub struct BlockBackend {
    file: BackendFile,
    path: PathBuf,
    capacity: u64,
    block_size: u32,
    /// The device's logical block size: the O_DIRECT alignment for offsets, lengths and
    /// buffer addresses.
    device_block_size: u32,
    /// From the device's queue limits at open (see [`QueueLimits`]).
    caps: Capabilities,
}

/// The block layer's limits for discard and write-zeroes (Documentation/ABI/stable/
/// sysfs-block): 0 means the device does not support the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct QueueLimits {
    discard_max_bytes: u64,
    write_zeroes_max_bytes: u64,
    physical_block_size: u64,
    optimal_io_size: u64,
    /// `queue/write_cache` is "write back": the device acknowledges writes from a volatile
    /// cache (the block layer then sends cache flushes and FUA); "write through": it does
    /// not, and the block layer drops flushes as no-ops.
    write_back_cache: bool,
}

impl QueueLimits {
    /// Reads `/sys/dev/block/MAJ:MIN/queue/…` (a partition's limits are its disk's, one
    /// directory up). Unreadable values count as "not supported": nothing is promised that
    /// was not read.
    fn of_device(rdev: u64) -> Self {
        let dev = PathBuf::from(format!(
            "/sys/dev/block/{}:{}",
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        ));
        let queue = if dev.join("queue").is_dir() {
            dev.join("queue")
        } else {
            dev.join("../queue")
        };
        Self::from_dir(&queue)
    }

    fn from_dir(queue: &Path) -> Self {
        let read = |name: &str| {
            std::fs::read_to_string(queue.join(name))
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Only "write through" rules a cache out: a cache that could not be read about is
        // assumed, which costs the host Flushes, never data.
        let write_cache = std::fs::read_to_string(queue.join("write_cache")).unwrap_or_default();
        QueueLimits {
            discard_max_bytes: read("discard_max_bytes"),
            write_zeroes_max_bytes: read("write_zeroes_max_bytes"),
            physical_block_size: read("physical_block_size"),
            optimal_io_size: read("optimal_io_size"),
            write_back_cache: write_cache.trim() != "write through",
        }
    }

    /// With write-zeroes, deallocate is an unmapping write-zeroes (`ZeroMethod::PunchHole`):
    /// zeroes guaranteed. With discard only, it is a discard: space back, no zeroes promised.
    fn capabilities(self) -> Capabilities {
        let zeroes = self.write_zeroes_max_bytes > 0;
        Capabilities {
            deallocate: zeroes || self.discard_max_bytes > 0,
            zeroes_after_deallocate: zeroes,
            write_zeroes_deallocates: zeroes,
            max_deallocate_bytes: if zeroes {
                self.write_zeroes_max_bytes
            } else {
                self.discard_max_bytes
            },
            // Without device support the kernel writes zero pages itself: no limit to report.
            max_write_zeroes_bytes: self.write_zeroes_max_bytes,
            // Reported 0 (most devices' `optimal_io_size`) or beyond u32: not known.
            physical_block_bytes: u32::try_from(self.physical_block_size).unwrap_or(0),
            optimal_io_bytes: u32::try_from(self.optimal_io_size).unwrap_or(0),
            volatile_cache: self.write_back_cache,
        }
    }
}

impl BlockBackend {
    pub fn open(path: &Path, block_size: u32) -> Result<Self, BackendError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|source| BackendError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| BackendError::Stat {
            path: path.to_path_buf(),
            source,
        })?;
        if !meta.file_type().is_block_device() {
            return Err(BackendError::NotABlockDevice {
                path: path.to_path_buf(),
            });
        }
        let ioctl_err = |request: &'static str| {
            move |errno: nix::errno::Errno| BackendError::Ioctl {
                path: path.to_path_buf(),
                request,
                source: errno.into(),
            }
        };
        let fd = file.as_raw_fd();
        let mut size = 0u64;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is a valid local.
        unsafe { blkgetsize64(fd, &mut size) }.map_err(ioctl_err("BLKGETSIZE64"))?;
        let mut lbs: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which is a valid local.
        unsafe { blksszget(fd, &mut lbs) }.map_err(ioctl_err("BLKSSZGET"))?;
        let device_block_size = u32::try_from(lbs).unwrap_or(0);
        // O_DIRECT needs every offset and length aligned to the logical block size; namespace
        // LBAs are whole multiples of it only if it is not larger (both are powers of two).
        if device_block_size == 0 || device_block_size > block_size {
            return Err(BackendError::DeviceBlockSize {
                path: path.to_path_buf(),
                device_block_size,
                block_size,
            });
        }
        let capacity = size - size % u64::from(block_size);
        if capacity == 0 {
            return Err(BackendError::TooSmall {
                path: path.to_path_buf(),
                size,
                block_size,
            });
        }
        use std::os::unix::fs::MetadataExt;
        let limits = QueueLimits::of_device(meta.rdev());
        tracing::debug!(path = %path.display(), capacity, block_size, device_block_size,
            ?limits, "opened block device namespace backend");
        Ok(BlockBackend {
            file: BackendFile::new(file),
            path: path.to_path_buf(),
            capacity,
            block_size,
            device_block_size,
            caps: limits.capabilities(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device_block_size(&self) -> u32 {
        self.device_block_size
    }

    fn check_data_op(&self, offset: u64, buf: &[u8]) -> io::Result<u32> {
        check_range(offset, buf.len() as u64, self.capacity)?;
        let len =
            u32::try_from(buf.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        if !offset.is_multiple_of(u64::from(self.block_size))
            || !len.is_multiple_of(self.block_size)
            || !(buf.as_ptr() as usize).is_multiple_of(self.device_block_size as usize)
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(len)
    }

    fn check_zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.capacity)?;
        let dbs = u64::from(self.device_block_size);
        if !offset.is_multiple_of(dbs) || !len.is_multiple_of(dbs) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
}

impl Backend for BlockBackend {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn kind(&self) -> &'static str {
        "block"
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
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
        // No NOUNMAP zero-out after a discard (that would provision a thin volume again):
        // deallocate lets the kernel unmap-or-zero, or just discards (see `ZeroMethod`).
        let write_zeroes = self.caps.zeroes_after_deallocate;
        let plan = match what {
            Zeroing::Deallocate if write_zeroes => ZeroMethod::BDEV_WRITE_ZEROES_DEAC,
            Zeroing::Deallocate if self.caps.deallocate => ZeroMethod::BDEV_DISCARD,
            // Neither discard nor write-zeroes: deallocate is a hint (NVM Command Set 1.0
            // §3.2.3.2.1), taken as one; DLFEAT promised nothing for this namespace.
            Zeroing::Deallocate => return Started::Done(Ok(())),
            Zeroing::WriteZeroes { deallocate: true } if write_zeroes => {
                ZeroMethod::BDEV_WRITE_ZEROES_DEAC
            }
            Zeroing::WriteZeroes { .. } => ZeroMethod::BDEV_WRITE_ZEROES,
        };
        start_zeroes_op(&self.file, ranges, plan, tag, io, |o, l| {
            self.check_zero_range(o, l)
        })
    }
}

#[cfg(test)]
mod tests;
