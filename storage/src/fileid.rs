//! A backend's open file with an identity under which io_uring rings may register it.
//!
//! Each reactor's ring may put a file or block namespace's descriptor in its registered-file
//! table (`IORING_REGISTER_FILES_UPDATE`), so that ops name a table slot and the kernel skips
//! the descriptor lookup and the file reference count round trip per op. Backends are shared
//! by every reactor, so each ring registers on first use, and two rules make that safe:
//!
//! * Tables are keyed by [`FileId`], a number handed out once per process, never by the
//!   descriptor number: once a namespace is removed its number is free, the next open gets
//!   it, and a table keyed by number would send the new namespace's ops to the old file, which
//!   the ring's slot still holds.
//! * A ring's slot holds a reference to the file: a removed block device would stay open
//!   (and its loop device attached, its LV busy) for as long as the slot does. Dropping a
//!   [`BackendFile`] retires its id; each ring compares [`retired_count`] with the count of
//!   its last sweep once per reactor turn and empties the slots of retired ids, so no ring
//!   keeps a removed namespace's file open beyond its next turn.

use std::fs::File;
use std::num::NonZeroU64;
use std::os::fd::{AsRawFd, RawFd};

use super::retire::Registry;

/// Identity of one [`BackendFile`]: unique for the life of the process. Never 0, so that
/// `BlockOp::file` (an `Option`) costs no more than the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileId(NonZeroU64);

static FILES: Registry = Registry::new();

/// The file or block device a backend does I/O on, with its [`FileId`].
#[derive(Debug)]
pub struct BackendFile {
    file: File,
    id: FileId,
}

impl BackendFile {
    pub fn new(file: File) -> Self {
        BackendFile {
            file,
            id: FileId(FILES.issue()),
        }
    }

    pub fn id(&self) -> FileId {
        self.id
    }
}

impl AsRawFd for BackendFile {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl Drop for BackendFile {
    /// Retires the id before the descriptor closes (the field drops after this): a ring that
    /// sees the new count finds the id gone.
    fn drop(&mut self) {
        FILES.retire(self.id.0);
    }
}

/// How many `BackendFile`s have been dropped in this process. A ring that read this before
/// sweeping (and found no retired id it could not release) needs no sweep while it is
/// unchanged.
#[inline]
pub fn retired_count() -> u64 {
    FILES.retired_count()
}

/// Which of `ids` belong to dropped `BackendFile`s, under one lock.
pub fn retired_among(ids: impl Iterator<Item = FileId>, mut f: impl FnMut(FileId)) {
    FILES.retired_among(ids.map(|id| id.0), |id| f(FileId(id)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused_and_retire_on_drop() {
        let path = std::env::temp_dir().join(format!("nvmfd-fileid-{}", std::process::id()));
        let open = || {
            File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap()
        };
        let a = BackendFile::new(open());
        let a_id = a.id();
        let before = retired_count();
        drop(a);
        assert!(retired_count() > before);
        let b = BackendFile::new(open());
        assert_ne!(
            b.id(),
            a_id,
            "a new file never gets an old id, whatever its descriptor"
        );
        assert_eq!(std::mem::size_of::<Option<FileId>>(), 8);
        let mut retired = Vec::new();
        retired_among([a_id, b.id()].into_iter(), |id| retired.push(id));
        assert_eq!(retired, vec![a_id]);
        drop(b);
        std::fs::remove_file(path).unwrap();
    }
}
