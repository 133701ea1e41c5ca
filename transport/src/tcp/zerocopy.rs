//! Zero-copy sends (Linux `MSG_ZEROCOPY`, `Documentation/networking/msg_zerocopy.rst`): the
//! kernel pins the pages of a send instead of copying them, and reports on the socket's error
//! queue when it no longer needs them — as a range of send ids (a per-socket count of the
//! zero-copy sends that returned success, from 0, wrapping). Until then the buffer must not
//! change: the core keeps the command slot busy (`send::SendQueue::advance_zerocopy`).
//!
//! Where the kernel copies anyway it says so in the notification
//! (`SO_EE_CODE_ZEROCOPY_COPIED`): on loopback, whose receiver cannot hold the sender's pages,
//! and on devices without scatter-gather (docs/performance.md, "Zero-copy sends on loopback").

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessageOwned, MsgFlags};

/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h): the origin of a zero-copy notification.
const ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data after all.
const CODE_COPIED: u8 = 1;

/// Turns zero-copy sends on for the socket (`SO_ZEROCOPY`, Linux 4.14+).
pub fn enable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on an open socket with a pointer to an int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One non-blocking zero-copy send of `iov`. A success consumes one send id, even when it
/// took only part of the bytes.
pub fn send(fd: BorrowedFd<'_>, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    let flags = MsgFlags::from_bits_retain(libc::MSG_ZEROCOPY | libc::MSG_DONTWAIT);
    sendmsg::<()>(fd.as_raw_fd(), iov, &[], flags, None).map_err(io::Error::from)
}

/// A batch of finished zero-copy sends: ids `lo..=hi`, and whether the kernel copied them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub lo: u32,
    pub hi: u32,
    pub copied: bool,
}

/// Reads the notifications waiting on the socket's error queue (non-blocking) into `done`;
/// returns when the queue is empty. Other error-queue entries are dropped.
pub fn notifications(fd: BorrowedFd<'_>, done: &mut impl FnMut(Done)) -> io::Result<()> {
    loop {
        let mut cmsg = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
        let mut none: [IoSliceMut<'_>; 0] = [];
        let msg = match recvmsg::<()>(
            fd.as_raw_fd(),
            &mut none,
            Some(&mut cmsg),
            MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for c in msg.cmsgs()? {
            let err = match c {
                ControlMessageOwned::Ipv4RecvErr(err, _)
                | ControlMessageOwned::Ipv6RecvErr(err, _) => err,
                _ => continue,
            };
            if err.ee_origin == ORIGIN_ZEROCOPY && err.ee_errno == 0 {
                done(Done {
                    lo: err.ee_info,
                    hi: err.ee_data,
                    copied: err.ee_code & CODE_COPIED != 0,
                });
            }
        }
    }
}
