//! Against a real cluster: `scripts/ceph-test-cluster.sh start DIR`, then
//! `NVMFD_CEPH_CONF=DIR/ceph.conf cargo test -p nvme --features rbd -- --ignored rbd_`.
//! (daemon/tests/ceph_rbd.rs starts its own cluster and goes through nvmfd.)
use super::*;
use crate::aligned::AlignedBuf;
use crate::test_support::{run, wait_for_completion};
use crate::testing::pattern;
use crate::uring::UringEngine;
use std::path::PathBuf;
use std::process::Command as Cmd;

const MIB: u64 = 1 << 20;

fn conf() -> PathBuf {
    std::env::var_os("NVMFD_CEPH_CONF")
        .map(PathBuf::from)
        .expect("NVMFD_CEPH_CONF=…/ceph.conf of a running test cluster")
}

fn rbd(args: &[&str]) {
    let conf = conf();
    let status = Cmd::new("rbd")
        .arg("-c")
        .arg(&conf)
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "rbd {args:?}");
}

/// A fresh image named after the test, removed when the guard goes.
struct Image(String);
impl Image {
    fn create(name: &str, size_mib: u64) -> Self {
        let name = format!("{name}-{}", std::process::id());
        let _ = Cmd::new("rbd")
            .arg("-c")
            .arg(conf())
            .args(["rm", "--no-progress", &format!("rbd/{name}")])
            .output();
        rbd(&[
            "create",
            &format!("rbd/{name}"),
            "--size",
            &format!("{size_mib}M"),
        ]);
        Image(name)
    }
    fn target(&self) -> RbdTarget {
        RbdTarget {
            pool: "rbd".into(),
            namespace: None,
            image: self.0.clone(),
            ceph_conf: Some(conf()),
            client_id: Some("client.admin".into()),
        }
    }
}
impl Drop for Image {
    fn drop(&mut self) {
        let _ = Cmd::new("rbd")
            .arg("-c")
            .arg(conf())
            .args(["rm", "--no-progress", &format!("rbd/{}", self.0)])
            .output();
    }
}

#[test]
#[ignore = "needs a Ceph cluster (NVMFD_CEPH_CONF)"]
fn rbd_volatile_cache_follows_the_image_rbd_cache_setting() {
    // librbd's default: the write-back cache is on.
    let image = Image::create("nvmfd-unit-cache", 4);
    let backend = RbdBackend::open(&image.target(), 512).unwrap();
    assert!(backend.capabilities().volatile_cache);
    drop(backend);
    // Turned off for this image alone (an image-level override): no cache.
    let spec = format!("rbd/{}", image.0);
    rbd(&["config", "image", "set", &spec, "rbd_cache", "false"]);
    let backend = RbdBackend::open(&image.target(), 512).unwrap();
    assert!(!backend.capabilities().volatile_cache);
}

#[test]
#[ignore = "needs a Ceph cluster (NVMFD_CEPH_CONF)"]
fn rbd_async_io_fua_flush_zeroes_through_the_engine() {
    let image = Image::create("nvmfd-unit-io", 16);
    let backend = RbdBackend::open(&image.target(), 512).unwrap();
    assert_eq!((backend.kind(), backend.capacity()), ("rbd", 16 * MIB));
    let mut io = UringEngine::new(8).unwrap();

    // 32 writes in flight at once (some FUA: write + flush pairs), spanning RADOS object
    // boundaries (4 MiB), each completing with its own tag and byte count.
    let mut bufs: Vec<AlignedBuf> = (0..32u64)
        .map(|i| {
            let mut b = AlignedBuf::new(64 * 1024);
            b.copy_from_slice(&pattern(64 * 1024, i));
            b
        })
        .collect();
    let offset = |i: u64| i * 448 * 1024 + 512;
    for (i, b) in bufs.iter_mut().enumerate() {
        let request = BackendRequest::Write {
            offset: offset(i as u64),
            fua: i % 4 == 0,
        };
        assert!(matches!(
            backend.start(request, b, 1000 + i as u64, &mut io),
            Started::Submitted
        ));
    }
    assert_eq!(io.in_flight(), 32);
    let mut done = Vec::new();
    while done.len() < 32 {
        done.extend(wait_for_completion(&mut io));
    }
    done.sort();
    assert_eq!(
        done,
        (0..32).map(|i| (1000 + i, 64 * 1024)).collect::<Vec<_>>()
    );
    assert_eq!(io.in_flight(), 0);
    for (i, b) in bufs.iter().enumerate() {
        let mut back = AlignedBuf::new(b.len());
        let read = BackendRequest::Read {
            offset: offset(i as u64),
        };
        run(&backend, read, &mut back, &mut io).unwrap();
        assert!(back[..] == b[..], "write {i} read back");
    }
    run(&backend, BackendRequest::Flush, &mut [], &mut io).unwrap();

    // Deallocate a range that starts and ends inside objects: it must read back as zeroes
    // (rbd_discard would skip the partial objects).
    backend.zero_range(offset(1) + 4096, 600 * 1024).unwrap();
    let mut back = AlignedBuf::new(64 * 1024);
    run(
        &backend,
        BackendRequest::Read { offset: offset(1) },
        &mut back,
        &mut io,
    )
    .unwrap();
    assert!(back[..4096] == bufs[1][..4096]);
    assert!(back[4096..].iter().all(|&b| b == 0));
    backend.zero_range(offset(10), 512).unwrap();
    // The asynchronous form: two ranges (one spanning an object boundary), one completion.
    let ranges = [(offset(20) + 512, 1024), (offset(9) + 4096, 60 * 1024)];
    match backend.start_zeroes(&ranges, Zeroing::Deallocate, 77, &mut io) {
        Started::Submitted => {}
        other => panic!("expected an async start, got {other:?}"),
    }
    assert_eq!(wait_for_completion(&mut io), vec![(77, 0)]);
    let mut z = AlignedBuf::new(64 * 1024);
    run(
        &backend,
        BackendRequest::Read { offset: offset(20) },
        &mut z,
        &mut io,
    )
    .unwrap();
    assert!(z[..512] == bufs[20][..512] && z[512..1536].iter().all(|&b| b == 0));
    assert!(z[1536..] == bufs[20][1536..]);
    run(
        &backend,
        BackendRequest::Read { offset: offset(9) },
        &mut z,
        &mut io,
    )
    .unwrap();
    assert!(z[..4096] == bufs[9][..4096] && z[4096..].iter().all(|&b| b == 0));
    assert_eq!(io.in_flight(), 0);
    run(
        &backend,
        BackendRequest::Read { offset: offset(10) },
        &mut back,
        &mut io,
    )
    .unwrap();
    assert!(back[..512].iter().all(|&b| b == 0) && back[512..] == bufs[10][512..]);

    // Out of range: refused before librbd, nothing in flight.
    let mut one = AlignedBuf::new(4096);
    let past = BackendRequest::Read {
        offset: 16 * MIB - 512,
    };
    assert!(matches!(
        backend.start(past, &mut one, 1, &mut io),
        Started::Done(Err(e)) if e.raw_os_error() == Some(libc::EINVAL)
    ));
    assert_eq!(io.in_flight(), 0);

    // A submitter without a completion channel gets the synchronous path.
    struct NoChannel;
    impl IoSubmit for NoChannel {
        fn submit(&mut self, _: crate::BlockOp, _: u64) {
            panic!("the RBD backend never submits BlockOps");
        }
        fn submit_group(&mut self, _: &[crate::BlockOp], _: u64) {
            panic!("the RBD backend never submits BlockOps");
        }
    }
    let read = BackendRequest::Read { offset: offset(5) };
    match backend.start(read, &mut back, 2, &mut NoChannel) {
        Started::Done(r) => r.unwrap(),
        Started::Submitted => panic!("no channel: must complete inline"),
    }
    assert!(back[..] == bufs[5][..]);
}

#[test]
#[ignore = "needs a Ceph cluster (NVMFD_CEPH_CONF)"]
fn rbd_resize_is_seen_through_refresh_capacity() {
    let image = Image::create("nvmfd-unit-resize", 8);
    let backend = RbdBackend::open(&image.target(), 4096).unwrap();
    assert!(backend.watch.is_some(), "update watch registered");
    assert_eq!(backend.refresh_capacity(), None);
    rbd(&[
        "resize",
        &format!("rbd/{}", image.0),
        "--size",
        "24M",
        "--no-progress",
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(cap) = backend.refresh_capacity() {
            assert_eq!(cap, 24 * MIB);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "resize not seen");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(backend.capacity(), 24 * MIB);
    assert_eq!(backend.refresh_capacity(), None, "reported once");
    // The new space is usable.
    let mut io = UringEngine::new(4).unwrap();
    let mut b = AlignedBuf::new(4096);
    b.copy_from_slice(&pattern(4096, 7));
    let end = 24 * MIB - 4096;
    let write = BackendRequest::Write {
        offset: end,
        fua: false,
    };
    run(&backend, write, &mut b, &mut io).unwrap();
}

#[test]
#[ignore = "needs a Ceph cluster (NVMFD_CEPH_CONF)"]
fn rbd_open_errors_name_the_image_and_step() {
    let mut target = Image::create("nvmfd-unit-err", 1).target();
    target.image = "no-such-image".into();
    let err = RbdBackend::open(&target, 512).unwrap_err();
    assert!(
        matches!(&err, BackendError::Rbd { step: "opening the image", source, .. }
            if source.raw_os_error() == Some(libc::ENOENT)),
        "{err}"
    );
    assert!(err.to_string().contains("rbd/no-such-image"), "{err}");
    target.pool = "no-such-pool".into();
    let err = RbdBackend::open(&target, 512).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Rbd {
                step: "opening the pool",
                ..
            }
        ),
        "{err}"
    );
}
