//! What a block device can report about a failed operation, as a typed value.
//!
//! Engines and backends report failures the way the kernel does (`-errno` in a completion, an
//! `io::Error` from a system call); [`BlockError::from_errno`] sorts them into the kinds the
//! NVMe layer tells apart when it picks a status (NVMe Base 2.0 Figures 94 and 96), so that the
//! protocol crate needs no errno numbers of its own.
//!
//! The numbers are Linux's (`include/uapi/asm-generic/errno-base.h` and `errno.h`), written out
//! here because this module is part of the trait layer, which links no libc; the engine's
//! tests check every one against libc's. Architectures whose numbers differ (alpha, mips,
//! parisc, sparc) are refused at compile time rather than mapped wrongly.

#[cfg(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
compile_error!("storage::error carries the asm-generic errno numbers; this architecture's differ");

/// Linux errno numbers (asm-generic) the trait layer names.
pub mod errno {
    pub const EIO: i32 = 5;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const EBADMSG: i32 = 74;
    pub const EILSEQ: i32 = 84;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ESHUTDOWN: i32 = 108;
    pub const EDQUOT: i32 = 122;
    pub const ECANCELED: i32 = 125;
}

/// Why a backend operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    /// The medium could not transfer the data or failed its integrity check (EIO, EILSEQ,
    /// EBADMSG), or a transfer came back short.
    Media,
    /// No space left for the write (ENOSPC, EDQUOT: a thin pool or a quota ran out).
    NoSpace,
    /// The backing medium turned read-only (EROFS: a file system remounted read-only).
    ReadOnly,
    /// The op was cancelled on request (ECANCELED: an Abort that came in time).
    Canceled,
    /// The storage has no way to do this operation (EOPNOTSUPP).
    Unsupported,
    /// This process was fenced off the storage (ESHUTDOWN, which is Ceph's EBLOCKLISTED):
    /// another gateway of its group owns the namespace now.
    Fenced,
    /// The request was not valid for the storage (EINVAL: out of range, misaligned), or a
    /// completion arrived that nothing asked for.
    Invalid,
    /// Any other errno, kept for the log.
    Other(i32),
}

impl BlockError {
    /// The kind of a positive errno (as in `-res` of a failed completion).
    pub fn from_errno(errno: i32) -> Self {
        match errno {
            errno::EIO | errno::EILSEQ | errno::EBADMSG => BlockError::Media,
            errno::ENOSPC | errno::EDQUOT => BlockError::NoSpace,
            errno::EROFS => BlockError::ReadOnly,
            errno::ECANCELED => BlockError::Canceled,
            errno::EOPNOTSUPP => BlockError::Unsupported,
            errno::ESHUTDOWN => BlockError::Fenced,
            errno::EINVAL => BlockError::Invalid,
            other => BlockError::Other(other),
        }
    }

    /// The kind of an error a backend returned inline; one that carries no errno is an I/O
    /// error (EIO), as a failed system call without a reason would be.
    pub fn from_io(e: &std::io::Error) -> Self {
        Self::from_errno(e.raw_os_error().unwrap_or(errno::EIO))
    }
}

impl std::fmt::Display for BlockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockError::Media => f.write_str("media error"),
            BlockError::NoSpace => f.write_str("no space"),
            BlockError::ReadOnly => f.write_str("read-only medium"),
            BlockError::Canceled => f.write_str("cancelled"),
            BlockError::Unsupported => f.write_str("not supported by the storage"),
            BlockError::Fenced => f.write_str("fenced off the storage"),
            BlockError::Invalid => f.write_str("invalid request"),
            BlockError::Other(errno) => write!(f, "errno {errno}"),
        }
    }
}

impl std::error::Error for BlockError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_errno_the_core_distinguishes_has_its_kind() {
        use errno::*;
        for (e, kind) in [
            (EIO, BlockError::Media),
            (EILSEQ, BlockError::Media),
            (EBADMSG, BlockError::Media),
            (ENOSPC, BlockError::NoSpace),
            (EDQUOT, BlockError::NoSpace),
            (EROFS, BlockError::ReadOnly),
            (ECANCELED, BlockError::Canceled),
            (EOPNOTSUPP, BlockError::Unsupported),
            (ESHUTDOWN, BlockError::Fenced),
            (EINVAL, BlockError::Invalid),
            (1, BlockError::Other(1)),
        ] {
            assert_eq!(BlockError::from_errno(e), kind, "errno {e}");
        }
        let no_errno = std::io::Error::other("no errno");
        assert_eq!(BlockError::from_io(&no_errno), BlockError::Media);
        let enospc = std::io::Error::from_raw_os_error(ENOSPC);
        assert_eq!(BlockError::from_io(&enospc), BlockError::NoSpace);
    }

    /// The numbers written out above are the platform's.
    #[cfg(feature = "engine")]
    #[test]
    fn errno_numbers_are_libcs() {
        assert_eq!(
            [
                errno::EIO,
                errno::EINVAL,
                errno::ENOSPC,
                errno::EROFS,
                errno::EBADMSG,
                errno::EILSEQ,
                errno::EOPNOTSUPP,
                errno::ESHUTDOWN,
                errno::EDQUOT,
                errno::ECANCELED,
            ],
            [
                libc::EIO,
                libc::EINVAL,
                libc::ENOSPC,
                libc::EROFS,
                libc::EBADMSG,
                libc::EILSEQ,
                libc::EOPNOTSUPP,
                libc::ESHUTDOWN,
                libc::EDQUOT,
                libc::ECANCELED,
            ]
        );
    }
}
