use super::*;
use crate::aligned::AlignedBuf;
use crate::test_support::{flush, read_at, write_at, zero};
use crate::testing::pattern;
use crate::uring::UringEngine;
use nix::fcntl::{fallocate, FallocateFlags};
use std::os::unix::fs::FileExt;

/// A scratch directory on a disk filesystem (not tmpfs), removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(base: &str, name: &str) -> Self {
        let dir = PathBuf::from(base).join(format!(
            "nvmfd-file-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn o_direct_set(backend: &FileBackend) -> bool {
    // SAFETY: fcntl on a descriptor the backend owns.
    let flags = unsafe { libc::fcntl(backend.file.as_raw_fd(), libc::F_GETFL) };
    flags & libc::O_DIRECT != 0
}

/// The full data-path exercise: pattern write/read, FUA write, flush, deallocate and write
/// zeroes read back as zeroes with neighbours intact — through the real ring.
fn exercise(backend: &FileBackend, block_size: u32) {
    let bs = u64::from(block_size);
    let mut io = UringEngine::new(16).unwrap();
    let n = 64 * 1024;
    let mut wbuf = AlignedBuf::new(n);
    wbuf.copy_from_slice(&pattern(n, u64::from(block_size)));
    write_at(backend, 3 * bs, false, &mut wbuf, &mut io).unwrap();
    let mut rbuf = AlignedBuf::new(n);
    read_at(backend, 3 * bs, &mut rbuf, &mut io).unwrap();
    assert!(rbuf[..] == wbuf[..], "read-back mismatch");

    // The data reached the file itself (not just some cache of ours).
    let mut via_std = vec![0u8; n];
    File::open(&backend.path)
        .unwrap()
        .read_exact_at(&mut via_std, 3 * bs)
        .unwrap();
    assert!(via_std[..] == wbuf[..]);

    let mut fua = AlignedBuf::new(block_size as usize);
    fua.copy_from_slice(&pattern(block_size as usize, 99));
    write_at(backend, 0, true, &mut fua, &mut io).unwrap();
    flush(backend, &mut io).unwrap();
    let mut one = AlignedBuf::new(block_size as usize);
    read_at(backend, 0, &mut one, &mut io).unwrap();
    assert!(one[..] == fua[..]);

    // Deallocate two blocks in the middle of the pattern.
    zero(backend, 5 * bs, 2 * bs, Zeroing::Deallocate, &mut io).unwrap();
    read_at(backend, 3 * bs, &mut rbuf, &mut io).unwrap();
    let (a, b) = (2 * bs as usize, 4 * bs as usize);
    assert!(rbuf[..a] == wbuf[..a]);
    assert!(
        rbuf[a..b].iter().all(|&x| x == 0),
        "deallocated range not zero"
    );
    assert!(rbuf[b..] == wbuf[b..]);

    // Write Zeroes on one block after rewriting the pattern.
    write_at(backend, 3 * bs, false, &mut wbuf, &mut io).unwrap();
    zero(
        backend,
        4 * bs,
        bs,
        Zeroing::WriteZeroes { deallocate: false },
        &mut io,
    )
    .unwrap();
    read_at(backend, 3 * bs, &mut rbuf, &mut io).unwrap();
    let (a, b) = (bs as usize, 2 * bs as usize);
    assert!(rbuf[..a] == wbuf[..a]);
    assert!(
        rbuf[a..b].iter().all(|&x| x == 0),
        "write-zeroes range not zero"
    );
    assert!(rbuf[b..] == wbuf[b..]);

    // The last block is addressable, one past it is not.
    let last = backend.capacity() - bs;
    write_at(backend, last, false, &mut one, &mut io).unwrap();
    let err = read_at(backend, last + bs, &mut one, &mut io);
    assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    assert_eq!(io.in_flight(), 0);
}

fn direct_roundtrip(block_size: u32) {
    let dir = ScratchDir::new("/var/tmp", &format!("direct{block_size}"));
    let path = dir.0.join("disk.img");
    let backend = FileBackend::open(&path, Some(4 << 20), true, block_size).unwrap();
    assert!(
        backend.direct_io(),
        "O_DIRECT expected on a disk filesystem"
    );
    assert!(o_direct_set(&backend));
    assert_eq!(backend.capacity(), 4 << 20);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
    exercise(&backend, block_size);
}

#[test]
fn file_direct_512() {
    direct_roundtrip(512);
}

#[test]
fn file_direct_4096() {
    direct_roundtrip(4096);
}

#[test]
fn file_buffered_when_direct_not_requested() {
    let dir = ScratchDir::new("/var/tmp", "buffered");
    let path = dir.0.join("disk.img");
    let backend = FileBackend::open(&path, Some(1 << 20), false, 4096).unwrap();
    assert!(!backend.direct_io());
    assert!(!o_direct_set(&backend));
    exercise(&backend, 4096);
}

#[test]
fn file_falls_back_to_buffered_when_o_direct_refused() {
    // What tmpfs did before Linux 6.6 and what ramfs still does: open(O_DIRECT) → EINVAL.
    let dir = ScratchDir::new("/var/tmp", "fallback");
    let path = dir.0.join("disk.img");
    let refusing = |p: &Path, create: bool, direct: bool| {
        if direct {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        } else {
            open_file(p, create, false)
        }
    };
    let backend = FileBackend::open_with(&path, Some(1 << 20), true, 512, &refusing).unwrap();
    assert!(!backend.direct_io());
    assert!(!o_direct_set(&backend));
    exercise(&backend, 512);

    // Any other open failure is reported, naming the path.
    let failing = |_: &Path, _: bool, _: bool| Err(io::Error::from_raw_os_error(libc::EACCES));
    let err = FileBackend::open_with(&path, None, true, 512, &failing).unwrap_err();
    assert!(
        matches!(&err, BackendError::Open { path: p, source } if p == &path
        && source.raw_os_error() == Some(libc::EACCES))
    );
    assert!(err.to_string().contains("disk.img"));
}

#[test]
#[ignore = "needs root (mounts a ramfs): cargo test -p nvme -- --ignored file_on_ramfs"]
fn file_on_ramfs_falls_back_to_buffered() {
    // ramfs refuses open(O_DIRECT) with EINVAL and supports no fallocate mode at all: the
    // whole fallback chain on a real filesystem.
    let dir = ScratchDir::new("/var/tmp", "ramfs");
    let status = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(&dir.0)
        .status()
        .expect("mount not found");
    assert!(status.success(), "mounting ramfs needs root");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&dir.0);
    let path = dir.0.join("disk.img");
    let backend = FileBackend::open(&path, Some(1 << 20), true, 512).unwrap();
    assert!(!backend.direct_io());
    assert!(!o_direct_set(&backend));
    // Neither PUNCH_HOLE nor ZERO_RANGE: the engine writes the zeroes.
    exercise(&backend, 512);
}

#[test]
fn file_on_tmpfs_uses_fallocate_fallbacks() {
    // tmpfs supports PUNCH_HOLE but not ZERO_RANGE: Write Zeroes falls back to a hole.
    let dir = ScratchDir::new("/dev/shm", "tmpfs");
    let path = dir.0.join("disk.img");
    let backend = FileBackend::open(&path, Some(1 << 20), true, 4096).unwrap();
    let zero_range = FallocateFlags::FALLOC_FL_ZERO_RANGE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    assert_eq!(
        fallocate(backend.file.as_raw_fd(), zero_range, 0, 4096),
        Err(nix::errno::Errno::EOPNOTSUPP),
        "tmpfs gained ZERO_RANGE? then this test no longer covers the fallback"
    );
    exercise(&backend, 4096);
}

#[test]
fn file_shared_by_several_reactor_threads() {
    // As in the daemon: one namespace, one ring per reactor thread.
    let dir = ScratchDir::new("/var/tmp", "threads");
    let path = dir.0.join("disk.img");
    let backend = std::sync::Arc::new(FileBackend::open(&path, Some(8 << 20), true, 4096).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let backend = backend.clone();
            std::thread::spawn(move || {
                let mut io = UringEngine::new(8).unwrap();
                let region = t * (2 << 20);
                for i in 0..32u64 {
                    let offset = region + (i % 16) * 128 * 1024;
                    let mut w = AlignedBuf::new(128 * 1024);
                    w.copy_from_slice(&pattern(128 * 1024, t * 1000 + i));
                    let fua = i % 4 == 0;
                    write_at(&*backend, offset, fua, &mut w, &mut io).unwrap();
                    let mut r = AlignedBuf::new(128 * 1024);
                    read_at(&*backend, offset, &mut r, &mut io).unwrap();
                    assert!(r[..] == w[..], "thread {t} op {i}");
                }
                flush(&*backend, &mut io).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn file_read_past_eof_after_truncation_is_eio() {
    let dir = ScratchDir::new("/var/tmp", "truncated");
    let path = dir.0.join("disk.img");
    let backend = FileBackend::open(&path, Some(1 << 20), true, 4096).unwrap();
    let mut io = UringEngine::new(8).unwrap();
    // Someone shrinks the image under a live namespace.
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(64 * 1024)
        .unwrap();
    let mut buf = AlignedBuf::new(8192);
    // Entirely past the new end of file: the read returns 0 bytes.
    let err = read_at(&backend, 512 * 1024, &mut buf, &mut io);
    assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EIO));
    // Straddling it: the first 4 KiB arrive, the resubmitted remainder hits EOF.
    let err = read_at(&backend, 60 * 1024, &mut buf, &mut io);
    assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EIO));
    // Reads inside the file still work.
    read_at(&backend, 0, &mut buf, &mut io).unwrap();
}

#[test]
fn file_open_errors() {
    let dir = ScratchDir::new("/var/tmp", "errors");
    // Missing file without a size: not created.
    let missing = dir.0.join("missing.img");
    let err = FileBackend::open(&missing, None, true, 512).unwrap_err();
    assert!(
        matches!(&err, BackendError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    );
    assert!(!missing.exists());
    // Smaller than one block.
    let tiny = dir.0.join("tiny.img");
    std::fs::write(&tiny, [1u8; 100]).unwrap();
    let err = FileBackend::open(&tiny, None, true, 512).unwrap_err();
    assert!(matches!(
        err,
        BackendError::TooSmall {
            size: 100,
            block_size: 512,
            ..
        }
    ));
    // Not a multiple of the block size: the tail is not exported.
    let odd = dir.0.join("odd.img");
    std::fs::write(&odd, vec![0u8; 4096 + 1000]).unwrap();
    let backend = FileBackend::open(&odd, None, false, 512).unwrap();
    assert_eq!(backend.capacity(), 4096 + 512);
    // An existing file larger than `size` is kept whole.
    let big = FileBackend::open(&odd, Some(1024), false, 512).unwrap();
    assert_eq!(big.capacity(), 4096 + 512);
    // A directory.
    let err = FileBackend::open(&dir.0, None, false, 512).unwrap_err();
    assert!(matches!(
        err,
        BackendError::Open { .. } | BackendError::UnsupportedFileType { .. }
    ));
}

#[test]
fn file_rejects_misaligned_requests_inline() {
    let dir = ScratchDir::new("/var/tmp", "misaligned");
    let path = dir.0.join("disk.img");
    let backend = FileBackend::open(&path, Some(1 << 20), true, 4096).unwrap();
    let mut io = UringEngine::new(4).unwrap();
    let mut buf = AlignedBuf::new(8192);
    for request in [
        BackendRequest::Read { offset: 512 },
        BackendRequest::Write {
            offset: 4096 * 3 + 1,
            fua: true,
        },
    ] {
        let started = backend.start(request, &mut buf, 1, &mut io);
        assert!(
            matches!(started, Started::Done(Err(ref e)) if e.raw_os_error() == Some(libc::EINVAL))
        );
    }
    let started = backend.start(
        BackendRequest::Read { offset: 0 },
        &mut buf[1..4097],
        1,
        &mut io,
    );
    assert!(matches!(started, Started::Done(Err(_))));
    assert_eq!(io.in_flight(), 0);
}
