use super::*;
use crate::aligned::AlignedBuf;
use crate::test_support::{flush, read_at, write_at, zero};
use crate::testing::pattern;
use crate::uring::UringEngine;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::Command;

#[test]
fn bdev_capabilities_follow_the_queue_limits() {
    let dir = std::env::temp_dir().join(format!("nvmfd-bdev-q-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let limits = |discard: &str, zeroes: &str| {
        std::fs::write(dir.join("discard_max_bytes"), discard).unwrap();
        std::fs::write(dir.join("write_zeroes_max_bytes"), zeroes).unwrap();
        QueueLimits::from_dir(&dir).capabilities()
    };
    // Physical block and optimal I/O size (a RAID stripe, say) pass through.
    std::fs::write(dir.join("physical_block_size"), "4096\n").unwrap();
    std::fs::write(dir.join("optimal_io_size"), "65536\n").unwrap();
    let raid = limits("0", "0");
    assert_eq!(
        (raid.physical_block_bytes, raid.optimal_io_bytes),
        (4096, 65536)
    );
    std::fs::remove_file(dir.join("physical_block_size")).unwrap();
    std::fs::remove_file(dir.join("optimal_io_size")).unwrap();
    // An SSD with both: deallocate is an unmapping write-zeroes, zeroes guaranteed.
    let ssd = limits("2199023255040\n", "1048576\n");
    assert!(ssd.deallocate && ssd.zeroes_after_deallocate && ssd.write_zeroes_deallocates);
    assert_eq!(
        (ssd.max_deallocate_bytes, ssd.max_write_zeroes_bytes),
        (1 << 20, 1 << 20)
    );
    // dm-thin: discard only — space back, no zeroes promised.
    let thin = limits("65536\n", "0\n");
    assert!(thin.deallocate && !thin.zeroes_after_deallocate && !thin.write_zeroes_deallocates);
    assert_eq!(
        (thin.max_deallocate_bytes, thin.max_write_zeroes_bytes),
        (65536, 0)
    );
    // Neither (or unreadable): nothing promised, no limits invented; a write cache
    // that cannot be read about is assumed (it costs Flushes, never data).
    let cached = Capabilities {
        volatile_cache: true,
        ..Capabilities::default()
    };
    assert_eq!(limits("0", "0"), cached);
    // queue/write_cache decides the cache (Documentation/ABI/stable/sysfs-block).
    for (value, cache) in [("write back\n", true), ("write through\n", false)] {
        std::fs::write(dir.join("write_cache"), value).unwrap();
        assert_eq!(limits("0", "0").volatile_cache, cache, "{value}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(QueueLimits::from_dir(&dir).capabilities(), cached);
}

#[test]
fn bdev_refuses_non_block_paths() {
    let dir = std::env::temp_dir().join(format!("nvmfd-bdev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("regular.img");
    std::fs::write(&file, vec![0u8; 8192]).unwrap();
    let err = BlockBackend::open(&file, 512).unwrap_err();
    assert!(matches!(&err, BackendError::NotABlockDevice { path } if path == &file));
    let err = BlockBackend::open(&dir.join("missing"), 512).unwrap_err();
    assert!(
        matches!(&err, BackendError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // A character device: open(O_DIRECT) may fail or succeed depending on the driver; either
    // way it is refused.
    let err = BlockBackend::open(Path::new("/dev/null"), 512).unwrap_err();
    assert!(matches!(
        err,
        BackendError::NotABlockDevice { .. } | BackendError::Open { .. }
    ));
}

/// A loop device over a sparse file in /var/tmp, detached and deleted on drop.
struct LoopDevice {
    device: PathBuf,
    backing: PathBuf,
}

impl LoopDevice {
    fn new(name: &str, size: u64, logical_block_size: u32) -> Self {
        let backing = PathBuf::from(format!(
            "/var/tmp/nvmfd-bdev-{name}-{}.img",
            std::process::id()
        ));
        File::create(&backing).unwrap().set_len(size).unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on", "--sector-size"])
            .arg(logical_block_size.to_string())
            .arg(&backing)
            .output()
            .expect("losetup not found");
        assert!(
            out.status.success(),
            "losetup failed (needs root and loop support): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let device = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        LoopDevice { device, backing }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        let _ = std::fs::remove_file(&self.backing);
    }
}

fn loop_roundtrip(device_block_size: u32, block_size: u32) {
    let bs = u64::from(block_size);
    let lo = LoopDevice::new(
        &format!("rt{device_block_size}-{block_size}"),
        8 << 20,
        device_block_size,
    );
    let backend = BlockBackend::open(&lo.device, block_size).unwrap();
    assert_eq!(backend.capacity(), 8 << 20);
    assert_eq!(backend.device_block_size(), device_block_size);
    assert_eq!(backend.kind(), "block");
    // A loop device over a file on ext4 has write-zeroes (fallocate of the backing file):
    // deallocate is an unmapping write-zeroes and reads back as zeroes.
    let caps = backend.capabilities();
    assert!(caps.deallocate && caps.zeroes_after_deallocate, "{caps:?}");
    assert!(caps.max_write_zeroes_bytes >= 1 << 20, "{caps:?}");
    let mut io = UringEngine::new(16).unwrap();

    let n = 128 * 1024;
    let mut wbuf = AlignedBuf::new(n);
    wbuf.copy_from_slice(&pattern(n, u64::from(block_size) + 1));
    write_at(&backend, 2 * bs, false, &mut wbuf, &mut io).unwrap();
    let mut rbuf = AlignedBuf::new(n);
    read_at(&backend, 2 * bs, &mut rbuf, &mut io).unwrap();
    assert!(rbuf[..] == wbuf[..]);

    let mut one = AlignedBuf::new(block_size as usize);
    one.copy_from_slice(&pattern(block_size as usize, 3));
    write_at(&backend, 0, true, &mut one, &mut io).unwrap();
    flush(&backend, &mut io).unwrap();
    // After the flush the data is in the backing file (the loop device writes through).
    let mut backing = vec![0u8; block_size as usize];
    File::open(&lo.backing)
        .unwrap()
        .read_exact_at(&mut backing, 0)
        .unwrap();
    assert!(backing[..] == one[..]);

    zero(&backend, 4 * bs, 3 * bs, Zeroing::Deallocate, &mut io).unwrap();
    read_at(&backend, 2 * bs, &mut rbuf, &mut io).unwrap();
    let (a, b) = (2 * bs as usize, 5 * bs as usize);
    assert!(rbuf[..a] == wbuf[..a]);
    assert!(
        rbuf[a..b].iter().all(|&x| x == 0),
        "deallocated range not zero"
    );
    assert!(rbuf[b..] == wbuf[b..]);

    write_at(&backend, 2 * bs, false, &mut wbuf, &mut io).unwrap();
    zero(
        &backend,
        3 * bs,
        bs,
        Zeroing::WriteZeroes { deallocate: false },
        &mut io,
    )
    .unwrap();
    read_at(&backend, 2 * bs, &mut rbuf, &mut io).unwrap();
    let (a, b) = (bs as usize, 2 * bs as usize);
    assert!(rbuf[..a] == wbuf[..a]);
    assert!(
        rbuf[a..b].iter().all(|&x| x == 0),
        "write-zeroes range not zero"
    );
    assert!(rbuf[b..] == wbuf[b..]);

    let err = read_at(&backend, 8 << 20, &mut one, &mut io);
    assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    assert!(zero(&backend, 8 << 20, bs, Zeroing::Deallocate, &mut io).is_err());
}

#[test]
#[ignore = "needs root, loop devices and Linux 6.12+: cargo test -p nvme -- --ignored bdev_loop"]
fn bdev_loop_discard_command_through_the_ring() {
    // The discard-only plan (dm-thin's) on a loop device: BLOCK_URING_CMD_DISCARD completes
    // through the ring, and the loop driver punches the backing file's blocks out.
    use crate::{BlockOpKind, IoSubmit, ZeroMethod};
    let lo = LoopDevice::new("discard", 4 << 20, 512);
    let backend = BlockBackend::open(&lo.device, 4096).unwrap();
    let mut io = UringEngine::new(4).unwrap();
    let mut w = AlignedBuf::new(1 << 20);
    w.copy_from_slice(&pattern(1 << 20, 9));
    write_at(&backend, 0, true, &mut w, &mut io).unwrap();
    let allocated = |lo: &LoopDevice| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&lo.backing).unwrap().blocks()
    };
    let before = allocated(&lo);
    let discard = BlockOpKind::Zeroes {
        len: 1 << 20,
        plan: ZeroMethod::BDEV_DISCARD,
    };
    let op = crate::file::op_on(&backend.file, discard, 0, std::ptr::null_mut(), 0);
    io.submit(op, 5);
    let done = crate::test_support::wait_for_completion(&mut io);
    assert_eq!(done, vec![(5, 0)]);
    assert!(
        allocated(&lo) < before,
        "the discard reached the backing file"
    );
}

#[test]
#[ignore = "needs root and loop devices: cargo test -p nvme -- --ignored bdev_loop"]
fn bdev_loop_removed_device_is_not_held_open_by_a_ring() {
    // A ring's registered-file slot holds the device open: a removed namespace's loop
    // device could not be released, its LV not deactivated. The ring's turn after the
    // backend goes must let go (the last close of the device then happens).
    use crate::test_support::CloseWatch;
    use crate::uring::RingOptions;
    let lo = LoopDevice::new("regfile", 1 << 20, 512);
    let backend = BlockBackend::open(&lo.device, 4096).unwrap();
    let options = RingOptions {
        registered_files: 4,
        ..RingOptions::default()
    };
    let mut io = UringEngine::with_options(4, options).unwrap();
    let mut w = AlignedBuf::new(4096);
    w.copy_from_slice(&pattern(4096, 4));
    write_at(&backend, 0, true, &mut w, &mut io).unwrap();
    flush(&backend, &mut io).unwrap();
    let watch = CloseWatch::new(&lo.device);
    drop(backend);
    assert!(!watch.closed_within(100), "held by the ring's slot");
    io.flush();
    assert!(
        watch.closed_within(5000),
        "released on the turn after removal"
    );
    let mut back = vec![0u8; 4096];
    File::open(&lo.backing)
        .unwrap()
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert!(
        back[..] == w[..],
        "the write went through the registered slot"
    );
}

#[test]
#[ignore = "needs root and loop devices: cargo test -p nvme -- --ignored bdev_loop"]
fn bdev_loop_512_on_512() {
    loop_roundtrip(512, 512);
}

#[test]
#[ignore = "needs root and loop devices: cargo test -p nvme -- --ignored bdev_loop"]
fn bdev_loop_4096_on_512() {
    loop_roundtrip(512, 4096);
}

#[test]
#[ignore = "needs root and loop devices: cargo test -p nvme -- --ignored bdev_loop"]
fn bdev_loop_4096_on_4096() {
    loop_roundtrip(4096, 4096);
}

#[test]
#[ignore = "needs root and loop devices: cargo test -p nvme -- --ignored bdev_loop"]
fn bdev_loop_refuses_namespace_blocks_smaller_than_device_blocks() {
    let lo = LoopDevice::new("lbs", 1 << 20, 4096);
    let err = BlockBackend::open(&lo.device, 512).unwrap_err();
    assert!(matches!(
        err,
        BackendError::DeviceBlockSize {
            device_block_size: 4096,
            block_size: 512,
            ..
        }
    ));
    // Through the generic entry point, a `File` config naming a block device works too,
    // but not with a size.
    let cfg = crate::BackendConfig::File {
        path: lo.device.clone(),
        size: None,
        direct_io: true,
    };
    let backend = crate::open(&cfg, 4096).unwrap();
    assert_eq!(backend.kind(), "block");
    let cfg = crate::BackendConfig::File {
        path: lo.device.clone(),
        size: Some(1 << 20),
        direct_io: true,
    };
    assert!(matches!(
        crate::open(&cfg, 4096),
        Err(BackendError::SizeOnBlockDevice { .. })
    ));
}
