//! Helpers for backend tests: a driver that runs one request to completion through a real
//! `UringEngine`, waiting on its eventfd the way the reactor does.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::aligned::AlignedBuf;
use super::uring::UringEngine;
use super::{Backend, BackendRequest, Started, Zeroing};

/// A read-write file of `size` bytes under /var/tmp (not tmpfs: O_DIRECT and fallocate behave
/// as on a disk), named after the test and the process; the caller removes it.
pub(crate) fn scratch_file(name: &str, size: u64) -> (PathBuf, File) {
    scratch_file_in("/var/tmp", name, size)
}

/// [`scratch_file`] in directory `dir` (`/dev/shm` for tmpfs behaviour).
pub(crate) fn scratch_file_in(dir: &str, name: &str, size: u64) -> (PathBuf, File) {
    let path = PathBuf::from(format!(
        "{dir}/nvmfd-backend-{name}-{}.img",
        std::process::id()
    ));
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(size).unwrap();
    (path, file)
}

/// Waits (at most 10 s) for the engine's eventfd to become readable, then reaps.
pub(crate) fn wait_for_completion(io: &mut UringEngine) -> Vec<(u64, i32)> {
    let mut done = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done.is_empty() {
        io.flush();
        // SAFETY: the engine (and so its eventfd) outlives this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(io.fd()) };
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "no io_uring completion within 10 s");
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        poll(&mut fds, PollTimeout::from(ms)).unwrap();
        io.reap(|tag, res| done.push((tag, res)));
    }
    done
}

/// Runs `request` to completion: inline for RAM, through the ring otherwise. Checks that a
/// successful data op reports exactly the buffer length.
pub(crate) fn run(
    backend: &dyn Backend,
    request: BackendRequest,
    buf: &mut [u8],
    io: &mut UringEngine,
) -> io::Result<()> {
    const TAG: u64 = 0xABCD_0001;
    match backend.start(request, buf, TAG, io) {
        Started::Done(result) => result,
        Started::Submitted => {
            let done = wait_for_completion(io);
            assert_eq!(done.len(), 1, "one op, one completion: {done:?}");
            let (tag, res) = done[0];
            assert_eq!(tag, TAG);
            if res < 0 {
                return Err(io::Error::from_raw_os_error(-res));
            }
            let expected = match request {
                BackendRequest::Flush => 0,
                _ => buf.len() as i32,
            };
            assert_eq!(res, expected, "completion byte count");
            Ok(())
        }
    }
}

/// [`run`] of a write of `buf` at byte `offset`.
pub(crate) fn write_at(
    backend: &dyn Backend,
    offset: u64,
    fua: bool,
    buf: &mut [u8],
    io: &mut UringEngine,
) -> io::Result<()> {
    run(backend, BackendRequest::Write { offset, fua }, buf, io)
}

/// [`run`] of a read into `buf` from byte `offset`.
pub(crate) fn read_at(
    backend: &dyn Backend,
    offset: u64,
    buf: &mut [u8],
    io: &mut UringEngine,
) -> io::Result<()> {
    run(backend, BackendRequest::Read { offset }, buf, io)
}

/// [`run`] of a flush (no data buffer).
pub(crate) fn flush(backend: &dyn Backend, io: &mut UringEngine) -> io::Result<()> {
    run(backend, BackendRequest::Flush, &mut AlignedBuf::new(0), io)
}

/// Runs one Deallocate / Write Zeroes of `[offset, offset + len)` to completion.
pub(crate) fn zero(
    backend: &dyn Backend,
    offset: u64,
    len: u64,
    what: Zeroing,
    io: &mut UringEngine,
) -> io::Result<()> {
    zero_ranges(backend, &[(offset, len)], what, io)
}

/// Runs one multi-range Deallocate / Write Zeroes to completion: one completion, result 0.
pub(crate) fn zero_ranges(
    backend: &dyn Backend,
    ranges: &[(u64, u64)],
    what: Zeroing,
    io: &mut UringEngine,
) -> io::Result<()> {
    const TAG: u64 = 0xABCD_0002;
    match backend.start_zeroes(ranges, what, TAG, io) {
        Started::Done(result) => result,
        Started::Submitted => {
            let done = wait_for_completion(io);
            assert_eq!(done.len(), 1, "one command, one completion: {done:?}");
            assert_eq!(done[0].0, TAG);
            match done[0].1 {
                0 => Ok(()),
                res if res < 0 => Err(io::Error::from_raw_os_error(-res)),
                res => panic!("zeroing completed with {res}, not 0"),
            }
        }
    }
}

/// Sees when the last reference to a file that was opened for writing goes away: inotify's
/// IN_CLOSE_WRITE comes from the kernel's final `fput` of the open file, not from `close(2)`
/// of one descriptor, so it does not come while an io_uring registered-file slot still holds
/// the file.
pub(crate) struct CloseWatch(std::os::fd::OwnedFd);

impl CloseWatch {
    pub(crate) fn new(path: &std::path::Path) -> Self {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: inotify_init1 takes flags only; the result is checked before it is owned.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", io::Error::last_os_error());
        // SAFETY: `fd` was just created and nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid inotify descriptor and a NUL-terminated path that outlives the call.
        let wd = unsafe {
            libc::inotify_add_watch(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                name.as_ptr(),
                libc::IN_CLOSE_WRITE,
            )
        };
        assert!(wd >= 0, "inotify_add_watch: {}", io::Error::last_os_error());
        CloseWatch(fd)
    }

    /// Whether the file was closed for good (now, or within `ms` milliseconds).
    pub(crate) fn closed_within(&self, ms: u16) -> bool {
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(ms)).unwrap() > 0
    }
}
