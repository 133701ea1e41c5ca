//! Namespaces: the configuration of one namespace and the opened, immutable view of it that
//! every queue of every controller shares.

use std::path::PathBuf;

/// Where a namespace's blocks live. Backend-neutral so that configuration code can build it
/// without knowing the backends; `crate::backend::open` turns it into an `Arc<dyn Backend>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// Anonymous memory of `size` bytes (contents lost on exit).
    Ram { size: u64 },
    /// A regular file, created or extended to `size` when given; O_DIRECT when `direct_io`.
    File {
        path: PathBuf,
        size: Option<u64>,
        direct_io: bool,
    },
    /// A block device; its size is the device size.
    Block { path: PathBuf },
}
