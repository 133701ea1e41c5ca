//! The io_uring engine: one ring per reactor thread, implementing [`IoSubmit`].
//!
//! Life of an op: `submit` parks it in a slot and pushes an SQE if the submission queue has room
//! (otherwise it waits in the overflow queue); the reactor calls [`UringEngine::flush`] once per
//! loop iteration, which enters the kernel once for the whole batch; the ring posts completions
//! and signals the registered eventfd ([`UringEngine::fd`]), which the reactor watches with
//! epoll; [`UringEngine::reap`] then hands `(tag, res)` pairs to the reactor, which routes them
//! to `Queue::finish` through the transport. After reaping, call `flush` again so that ops parked
//! in the overflow queue (or resubmitted remainders) reach the kernel.
//!
//! Crash safety (what a successful completion promises):
//! * `Write { fua: true }` is issued with `RWF_DSYNC`: the kernel completes it only after the
//!   data and the metadata needed to read it back (allocation, size) are on stable media — the
//!   per-I/O equivalent of `O_DSYNC`, which is exactly NVMe FUA (NVM Command Set 1.0 §3.2.6).
//! * `Flush` is `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC` (= `fdatasync`): every write that
//!   completed before the flush was submitted is durable when it completes, which is what NVMe
//!   Flush promises for the volatile write cache (NVMe Base 2.0 §7.1).
//! * Plain writes may sit in the page cache (buffered files) or the device cache; the namespace
//!   therefore reports a volatile write cache and the host sends Flush / FUA when it needs them.
//!
//! Registered files (`RingOptions::registered_files`): an op on a backend's file
//! (`BlockOp::file`) names a slot of the ring's registered-file table instead of the descriptor
//! (IOSQE_FIXED_FILE), which spares the kernel the descriptor lookup and the file reference
//! count round trip per op (`fget`/`fput`: an atomic on a cache line every reactor that uses
//! the namespace shares). The table is keyed by [`FileId`], never by descriptor number, and
//! a slot whose backend is gone is emptied on the ring's next turn (`fileid` module comment).
//! A full table, or a kernel without sparse tables (before 5.19), means plain descriptors.
//!
//! Fixed buffers (`RingOptions::fixed_buffer_bytes`): a read or write submitted with
//! [`IoSubmit::submit_in`] lies inside a transport data buffer ([`BufferUnit`]); the ring
//! registers that buffer on its first op (`IORING_REGISTER_BUFFERS_UPDATE`, which pins its
//! pages once) and issues later ops inside it as `READ_FIXED`/`WRITE_FIXED`, so the kernel no
//! longer pins and unpins the pages of every O_DIRECT transfer. A unit's registration covers
//! the largest transfer seen in it (a power of two, at least a page), so a 1 MiB command slot
//! used for 4 KiB I/O pins 4 KiB; the sum of the registrations stays within the budget, and
//! ops beyond it use their buffers as they are. Entries are keyed by owner identity and
//! emptied on the turn after their owner goes (`fixedbuf` module comment).

mod engine;
mod resources;
mod sqe;
mod table;

use std::io;

use io_uring::{opcode, IoUring};

pub use engine::UringEngine;

/// How a reactor's ring is set up (`[global] uring_sqpoll`, `uring_registered_files`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingOptions {
    /// `IORING_SETUP_SQPOLL`: a kernel thread polls the submission queue, so submitting costs
    /// no system call while it is awake; it sleeps after this many milliseconds without
    /// submissions (the next submit wakes it with one `io_uring_enter`). `None`: the reactor
    /// submits with `io_uring_enter` itself, once per turn.
    pub sqpoll_idle_ms: Option<u32>,
    /// Slots of the ring's registered-file table (`IORING_REGISTER_FILES_SPARSE`): the first
    /// op on a backend's file puts it in a free slot, and later ops name the slot. 0: no
    /// table, every op names its descriptor. The kernel refuses more slots than
    /// `RLIMIT_NOFILE`; a refused table means no table, and one log line.
    pub registered_files: u32,
    /// Bytes of transport data buffers the ring may keep registered (pinned) for
    /// `READ_FIXED`/`WRITE_FIXED`; 0: no registered buffers, every op pins its own pages.
    /// A kernel without sparse buffer tables (before 5.19), or one that refuses the pinning
    /// (RLIMIT_MEMLOCK without CAP_IPC_LOCK), means none, and one log line.
    pub fixed_buffer_bytes: u64,
}

/// Entries of a ring's registered-buffer table (the kernel takes up to 16384,
/// IORING_MAX_REG_BUFFERS): one per transport data buffer in use on the reactor, e.g. 32
/// connections with 128 commands in flight each.
pub const FIXED_BUFFER_SLOTS: u32 = 4096;

/// Errors creating a ring.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// The kernel refuses io_uring to this process: `kernel.io_uring_disabled`, a seccomp
    /// profile (containers), or a kernel built without it.
    #[error("io_uring is not available to this process (kernel.io_uring_disabled, seccomp, or CONFIG_IO_URING=n)")]
    Unavailable(#[source] io::Error),
    #[error("io_uring_setup with {entries} entries failed")]
    Setup {
        entries: u32,
        #[source]
        source: io::Error,
    },
    /// The kernel has io_uring but not the opcodes the engine uses (IORING_OP_READ / WRITE
    /// arrived in Linux 5.6).
    #[error("this kernel's io_uring lacks {opcode} (Linux 5.6 or later is required)")]
    MissingOpcode { opcode: &'static str },
    #[error("creating the completion eventfd failed")]
    Eventfd(#[source] io::Error),
    #[error("registering the completion eventfd with the ring failed")]
    RegisterEventfd(#[source] io::Error),
}

/// io_uring_setup failures that mean "not allowed here" (rather than "bad arguments" or "out of
/// memory") get their own variant, so the daemon can say what to change.
fn classify_setup_error(entries: u32, source: io::Error) -> UringError {
    match source.raw_os_error() {
        // EPERM: kernel.io_uring_disabled=2, or =1 without membership in
        // kernel.io_uring_group; also what seccomp profiles (Docker's default) return.
        // ENOSYS: CONFIG_IO_URING=n or a seccomp ENOSYS policy. EACCES: LSM denial.
        Some(libc::EPERM) | Some(libc::ENOSYS) | Some(libc::EACCES) => {
            UringError::Unavailable(source)
        }
        _ => UringError::Setup { entries, source },
    }
}

/// Fails early, with a clear message, on kernels whose ring would reject every op.
fn check_opcodes(ring: &IoUring) -> Result<(), UringError> {
    let mut probe = io_uring::Probe::new();
    if ring.submitter().register_probe(&mut probe).is_err() {
        // IORING_REGISTER_PROBE itself is 5.6+: no probe means no IORING_OP_READ either.
        return Err(UringError::MissingOpcode {
            opcode: "IORING_REGISTER_PROBE",
        });
    }
    let needed = [
        (opcode::Read::CODE, "IORING_OP_READ"),
        (opcode::Write::CODE, "IORING_OP_WRITE"),
        (opcode::Fsync::CODE, "IORING_OP_FSYNC"),
        (opcode::Fallocate::CODE, "IORING_OP_FALLOCATE"),
    ];
    for (code, name) in needed {
        if !probe.is_supported(code) {
            return Err(UringError::MissingOpcode { opcode: name });
        }
    }
    Ok(())
}

/// For tests of "no blocking call on a reactor": makes the calling thread fail, with
/// `ENOTRECOVERABLE`, every system call that waits for storage (seccomp filters are per
/// thread, and threads it creates inherit them). The reactor's own calls — io_uring_enter, the
/// eventfd read/write, poll — stay allowed. Irreversible for the thread: call it on a thread
/// of its own.
pub fn forbid_blocking_storage_calls_on_this_thread() {
    let forbidden = [
        libc::SYS_fallocate,
        libc::SYS_ioctl,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_preadv2,
        libc::SYS_pwritev2,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_sync_file_range,
    ];
    let stmt = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    // A = seccomp_data.nr; for each forbidden number: if equal, return the errno.
    let mut prog = vec![stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0)];
    for nr in forbidden {
        prog.push(stmt(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            nr as u32,
            0,
            1,
        ));
        prog.push(stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOTRECOVERABLE as u32,
            0,
            0,
        ));
    }
    prog.push(stmt(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ALLOW,
        0,
        0,
    ));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with integer arguments; then a pointer to a filter program that lives
    // on this stack frame for the duration of the call (the kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let rc = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        );
        assert_eq!(rc, 0, "seccomp: {}", io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests;
