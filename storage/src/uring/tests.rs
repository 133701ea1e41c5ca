use super::sqe::{build_sqe, AlignedZeroes, InFlight, ZERO_CHUNK};
use super::*;
use crate::aligned::AlignedBuf;
use crate::fileid::BackendFile;
use crate::fixedbuf::{self, BufferUnit};
use crate::test_support::{scratch_file, scratch_file_in, wait_for_completion, CloseWatch};
use crate::testing::pattern;
use crate::{BlockOp, BlockOpKind, IoSubmit, ZeroMethod};
use io_uring::squeue;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

fn op(file: &File, kind: BlockOpKind, offset: u64, buf: &mut [u8]) -> BlockOp {
    BlockOp {
        fd: file.as_raw_fd(),
        file: None,
        kind,
        offset,
        buf: buf.as_mut_ptr(),
        len: buf.len() as u32,
    }
}

/// Reaps until `count` completions have arrived.
fn collect(io: &mut UringEngine, count: usize) -> Vec<(u64, i32)> {
    let mut all = Vec::new();
    while all.len() < count {
        all.extend(wait_for_completion(io));
    }
    all.sort();
    all
}

#[test]
fn uring_overflow_queue_and_batching() {
    overflow_queue_and_batching(RingOptions::default());
}

#[test]
fn uring_sqpoll_ring_overflow_queue_and_batching() {
    // The same through an SQPOLL ring: the kernel thread takes the SQ, a full SQ is
    // waited for, the eventfd still signals completions. (Unprivileged SQPOLL needs
    // Linux 5.11; the test kernels are newer.)
    overflow_queue_and_batching(RingOptions {
        sqpoll_idle_ms: Some(10),
        ..RingOptions::default()
    });
}

fn overflow_queue_and_batching(options: RingOptions) {
    // 4 SQ entries (8 CQ), 64 ops submitted before a single flush: most wait in the overflow
    // queue and are fed to the kernel as completions are reaped.
    let name = match options.sqpoll_idle_ms {
        Some(_) => "overflow-sqpoll",
        None => "overflow",
    };
    let (path, file) = scratch_file(name, 1 << 20);
    let mut io = UringEngine::with_options(4, options).unwrap();
    assert_eq!(io.sqpoll(), options.sqpoll_idle_ms.is_some());
    let mut bufs: Vec<AlignedBuf> = (0..64)
        .map(|i| {
            let mut b = AlignedBuf::new(4096);
            b.copy_from_slice(&pattern(4096, i));
            b
        })
        .collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let fua = i % 3 == 0;
        io.submit(
            op(&file, BlockOpKind::Write { fua }, i as u64 * 4096, b),
            1000 + i as u64,
        );
    }
    assert_eq!(io.in_flight(), 64);
    let done = collect(&mut io, 64);
    assert_eq!(done, (0..64).map(|i| (1000 + i, 4096)).collect::<Vec<_>>());
    assert_eq!(io.in_flight(), 0);
    for (i, b) in bufs.iter().enumerate() {
        let mut back = vec![0u8; 4096];
        file.read_exact_at(&mut back, i as u64 * 4096).unwrap();
        assert!(back[..] == b[..], "block {i}");
    }

    // Read them back through the ring, plus one flush, again all queued at once.
    let mut rbufs: Vec<AlignedBuf> = (0..64).map(|_| AlignedBuf::new(4096)).collect();
    for (i, b) in rbufs.iter_mut().enumerate() {
        io.submit(op(&file, BlockOpKind::Read, i as u64 * 4096, b), i as u64);
    }
    io.submit(op(&file, BlockOpKind::Flush, 0, &mut []), 999);
    let done = collect(&mut io, 65);
    assert_eq!(done.last(), Some(&(999, 0)));
    assert!(done[..64]
        .iter()
        .enumerate()
        .all(|(i, &(t, r))| t == i as u64 && r == 4096));
    assert!(rbufs.iter().zip(&bufs).all(|(r, w)| r[..] == w[..]));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_cancel_stops_a_waiting_op_and_leaves_finished_ones_alone() {
    // A read from an empty pipe waits in the kernel until cancelled.
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are owned here only.
    let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut io = UringEngine::new(8).unwrap();
    let mut buf = AlignedBuf::new(4096);
    let read = BlockOp {
        fd: rx.as_raw_fd(),
        file: None,
        kind: BlockOpKind::Read,
        offset: 0,
        buf: buf.as_mut_ptr(),
        len: 4096,
    };
    io.submit(read, 7);
    io.flush();
    assert!(io.cancel(7), "in the kernel: cancel requested");
    io.flush();
    assert_eq!(collect(&mut io, 1), vec![(7, -libc::ECANCELED)]);
    assert!(!io.cancel(7), "gone");
    // Cancelled before it reached the kernel: taken back, no SQE.
    io.submit(read, 8);
    assert!(io.cancel(8));
    assert_eq!(collect(&mut io, 1), vec![(8, -libc::ECANCELED)]);
    // A read that already has its data completes normally.
    drop(tx);
    io.submit(read, 9);
    io.flush();
    assert_eq!(
        collect(&mut io, 1),
        vec![(9, -libc::EIO)],
        "EOF: a short read"
    );
    assert_eq!(io.in_flight(), 0);
    drop(rx);
}

#[test]
fn uring_errors_are_delivered_as_negative_results() {
    let (path, file) = scratch_file("errors", 8192);
    let mut io = UringEngine::new(8).unwrap();
    let mut buf = AlignedBuf::new(4096);
    // Bad descriptor: the kernel answers -EBADF in the CQE.
    let mut bad = op(&file, BlockOpKind::Read, 0, &mut buf);
    bad.fd = -1;
    io.submit(bad, 1);
    // Writing through a read-only descriptor: -EBADF too.
    let ro = File::open(&path).unwrap();
    io.submit(op(&ro, BlockOpKind::Write { fua: false }, 0, &mut buf), 2);
    // Read wholly past EOF: 0 bytes → -EIO (cannot serve the range).
    io.submit(op(&file, BlockOpKind::Read, 1 << 20, &mut buf), 3);
    // Invalid op rejected before the kernel, still delivered through reap + eventfd.
    let mut null = op(&file, BlockOpKind::Read, 0, &mut buf);
    null.buf = std::ptr::null_mut();
    io.submit(null, 4);
    let done = collect(&mut io, 4);
    assert_eq!(
        done,
        vec![
            (1, -libc::EBADF),
            (2, -libc::EBADF),
            (3, -libc::EIO),
            (4, -libc::EINVAL)
        ]
    );
    assert_eq!(io.in_flight(), 0);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_one_flush_submits_a_batch_with_a_failing_op_in_it() {
    // The reactor calls flush once and then sleeps in epoll: every op of the batch must have
    // reached the kernel by then, even when one of them fails at submission.
    // Two SQ entries for four ops: half the batch starts in the overflow queue.
    let (path, file) = scratch_file("batch", 16384);
    let mut io = UringEngine::new(2).unwrap();
    let mut bufs: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::new(4096)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let mut o = op(&file, BlockOpKind::Read, i as u64 * 4096, b);
        if i == 1 {
            o.fd = -1;
        }
        io.submit(o, i as u64);
    }
    io.flush();
    // SAFETY: the engine outlives this borrow.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(io.fd()) };
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got.len() < 4 && std::time::Instant::now() < deadline {
        let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16)).unwrap();
        io.reap(|t, r| got.push((t, r)));
    }
    got.sort();
    assert_eq!(
        got,
        vec![(0, 4096), (1, -libc::EBADF), (2, 4096), (3, 4096)]
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_short_read_at_eof_is_resubmitted_then_fails() {
    // 6 KiB file, 8 KiB read: the kernel returns 6 KiB, the remainder returns 0 → -EIO.
    let (path, file) = scratch_file("short", 6144);
    let mut io = UringEngine::new(8).unwrap();
    let mut buf = AlignedBuf::new(8192);
    io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 7);
    assert_eq!(collect(&mut io, 1), vec![(7, -libc::EIO)]);
    // Extending the file makes the same read whole.
    file.set_len(8192).unwrap();
    io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 8);
    assert_eq!(collect(&mut io, 1), vec![(8, 8192)]);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_short_read_remainder_is_resubmitted_and_completes() {
    // A pipe delivers what is there: 3000 of 8192 bytes first (a short read), the engine
    // resubmits the remaining 5192 into the rest of the buffer, which completes once the
    // writer sends them. The caller sees one completion with the full length.
    let (rx, tx) = nix::unistd::pipe().unwrap();
    let data = pattern(8192, 42);
    let mut io = UringEngine::new(4).unwrap();
    let mut buf = AlignedBuf::new(8192);
    nix::unistd::write(&tx, &data[..3000]).unwrap();
    io.submit(
        BlockOp {
            fd: rx.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Read,
            offset: 0,
            buf: buf.as_mut_ptr(),
            len: 8192,
        },
        11,
    );
    io.flush();
    // Let the first, short completion come back and be resubmitted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = Vec::new();
    while io.slots.iter().flatten().all(|e| e.done == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "short read never completed"
        );
        io.wait().unwrap();
        io.reap(|t, r| got.push((t, r)));
        io.flush();
    }
    assert!(
        got.is_empty(),
        "a short transfer must not be reported: {got:?}"
    );
    assert_eq!(io.in_flight(), 1);
    nix::unistd::write(&tx, &data[3000..]).unwrap();
    assert_eq!(collect(&mut io, 1), vec![(11, 8192)]);
    assert!(buf[..] == data[..]);
}

#[test]
fn uring_random_mixed_io_matches_a_model() {
    // Batches of random non-overlapping reads and writes (some FUA) on an O_DIRECT file,
    // checked against an in-memory copy of what the file must contain.
    const SIZE: usize = 4 << 20;
    let (path, _) = scratch_file("model", SIZE as u64);
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap()
    };
    let mut model = vec![0u8; SIZE];
    let mut io = UringEngine::new(8).unwrap();
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = move |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound
    };
    for round in 0..20u64 {
        // 32 ops per batch over 32 disjoint 128 KiB regions, random offset and length
        // (multiples of 512) inside each region.
        let mut ops = Vec::new();
        for region in 0..32u64 {
            let blocks = 1 + next(256) as usize;
            let start = region * 128 * 1024 + next(256 - blocks as u64 + 1) * 512;
            let len = blocks * 512;
            let kind = match next(3) {
                0 => BlockOpKind::Read,
                1 => BlockOpKind::Write { fua: false },
                _ => BlockOpKind::Write { fua: true },
            };
            let mut buf = AlignedBuf::new(len);
            if kind != BlockOpKind::Read {
                buf.copy_from_slice(&pattern(len, round * 100 + region));
            }
            ops.push((kind, start, buf));
        }
        for (tag, (kind, start, buf)) in ops.iter_mut().enumerate() {
            let op = op(&file, *kind, *start, buf);
            io.submit(op, tag as u64);
        }
        let done = collect(&mut io, ops.len());
        for (tag, res) in done {
            let (kind, start, buf) = &ops[tag as usize];
            assert_eq!(res, buf.len() as i32, "op {tag}");
            let range = *start as usize..*start as usize + buf.len();
            match kind {
                BlockOpKind::Read => assert!(buf[..] == model[range], "round {round} op {tag}"),
                _ => model[range].copy_from_slice(buf),
            }
        }
    }
    let mut whole = vec![0u8; SIZE];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut whole, 0)
        .unwrap();
    assert!(whole == model);
    std::fs::remove_file(path).unwrap();
}

/// The raw 64-byte SQE (`struct io_uring_sqe`, include/uapi/linux/io_uring.h): opcode @0,
/// fd @4, off @8, addr @16, len @24, rw_flags / fsync_flags @28, user_data @32.
fn sqe_bytes(sqe: &squeue::Entry) -> [u8; 64] {
    const _: () = assert!(std::mem::size_of::<squeue::Entry>() == 64);
    // SAFETY: `squeue::Entry` is `#[repr(C)]` around the 64-byte kernel SQE (size asserted
    // above), and every byte of it is initialised by the builders.
    unsafe { std::mem::transmute_copy(sqe) }
}

const NO_ZEROES: AlignedZeroes = AlignedZeroes(std::ptr::null());

fn field_u32(b: &[u8; 64], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn field_u64(b: &[u8; 64], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn uring_sqe_encodes_fua_flush_and_remainders() {
    let mut buf = [0u8; 8192];
    let base = buf.as_mut_ptr();
    let entry = |kind, done| InFlight {
        op: BlockOp {
            fd: 9,
            file: None,
            kind,
            offset: 1 << 20,
            buf: base,
            len: 8192,
        },
        tag: 1,
        done,
        transient_retries: 0,
        stage: 0,
        zeroed: 0,
        group: None,
        timer: None,
        file_slot: None,
        buf_slot: None,
    };
    // Crash safety: FUA → RWF_DSYNC on that write only; plain writes carry no flag.
    let fua = sqe_bytes(&build_sqe(
        &entry(BlockOpKind::Write { fua: true }, 0),
        5,
        NO_ZEROES,
    ));
    assert_eq!(fua[0], io_uring::opcode::Write::CODE);
    assert_eq!(field_u32(&fua, 28), libc::RWF_DSYNC as u32);
    assert_eq!(field_u64(&fua, 32), 5);
    let plain = sqe_bytes(&build_sqe(
        &entry(BlockOpKind::Write { fua: false }, 0),
        5,
        NO_ZEROES,
    ));
    assert_eq!(field_u32(&plain, 28), 0);
    // Flush → fsync with IORING_FSYNC_DATASYNC (= fdatasync).
    let flush = sqe_bytes(&build_sqe(&entry(BlockOpKind::Flush, 0), 6, NO_ZEROES));
    assert_eq!(flush[0], io_uring::opcode::Fsync::CODE);
    assert_eq!(field_u32(&flush, 28), 1);
    // A resubmitted remainder starts where the short transfer stopped, keeps FUA.
    let rest = sqe_bytes(&build_sqe(
        &entry(BlockOpKind::Write { fua: true }, 4096),
        7,
        NO_ZEROES,
    ));
    assert_eq!(field_u32(&rest, 4), 9);
    assert_eq!(field_u64(&rest, 8), (1 << 20) + 4096);
    assert_eq!(field_u64(&rest, 16), base as u64 + 4096);
    assert_eq!(field_u32(&rest, 24), 4096);
    assert_eq!(field_u32(&rest, 28), libc::RWF_DSYNC as u32);
    let zeroes = |plan, stage| InFlight {
        stage,
        ..entry(BlockOpKind::Zeroes { len: 3 << 30, plan }, 0)
    };
    // Deallocate on a block device: fallocate(PUNCH_HOLE | KEEP_SIZE) — no BLKDISCARD
    // followed by a NOUNMAP zero-out — or, on discard-only devices, the discard command:
    // off @8 = cmd_op, addr @16 = start, addr3 @48 = length.
    let punch = sqe_bytes(&build_sqe(
        &zeroes(ZeroMethod::BDEV_WRITE_ZEROES_DEAC, 0),
        9,
        NO_ZEROES,
    ));
    assert_eq!(punch[0], io_uring::opcode::Fallocate::CODE);
    assert_eq!(field_u64(&punch, 8), 1 << 20);
    assert_eq!(field_u64(&punch, 16), 3 << 30);
    assert_eq!(field_u32(&punch, 24), 0x03);
    let discard = sqe_bytes(&build_sqe(
        &zeroes(ZeroMethod::BDEV_DISCARD, 0),
        9,
        NO_ZEROES,
    ));
    assert_eq!(discard[0], io_uring::opcode::UringCmd16::CODE);
    assert_eq!(field_u32(&discard, 8), 0x1200);
    assert_eq!(field_u64(&discard, 16), 1 << 20);
    assert_eq!(field_u64(&discard, 48), 3 << 30);
    // flags @1: IOSQE_ASYNC on the discard only (a REQ_NOWAIT discard fails on dm-thin).
    assert_eq!(discard[1], squeue::Flags::ASYNC.bits());
    assert_eq!(punch[1], 0);
    // Write Zeroes keeps the blocks: ZERO_RANGE | KEEP_SIZE.
    let zr = sqe_bytes(&build_sqe(
        &zeroes(ZeroMethod::BDEV_WRITE_ZEROES, 0),
        9,
        NO_ZEROES,
    ));
    assert_eq!(
        (zr[0], field_u32(&zr, 24)),
        (io_uring::opcode::Fallocate::CODE, 0x11)
    );
    let read = sqe_bytes(&build_sqe(&entry(BlockOpKind::Read, 512), 8, NO_ZEROES));
    assert_eq!(read[0], io_uring::opcode::Read::CODE);
    assert_eq!(
        (field_u64(&read, 8), field_u32(&read, 24)),
        ((1 << 20) + 512, 7680)
    );
    assert_eq!((read[1], field_u32(&read, 4)), (0, 9), "the descriptor");
    // On a registered file: fd @4 is the slot, flags @1 carry IOSQE_FIXED_FILE, on every
    // kind of op (the discard keeps its IOSQE_ASYNC).
    let fixed = |e: InFlight| InFlight {
        file_slot: Some(3),
        ..e
    };
    for e in [
        entry(BlockOpKind::Read, 512),
        entry(BlockOpKind::Write { fua: true }, 0),
        entry(BlockOpKind::Flush, 0),
        zeroes(ZeroMethod::BDEV_WRITE_ZEROES_DEAC, 0),
        zeroes(ZeroMethod::BDEV_DISCARD, 0),
        zeroes(&[ZeroMethod::WriteZeroes][..], 0),
    ] {
        let kind = e.op.kind;
        let plain = sqe_bytes(&build_sqe(&e, 8, NO_ZEROES));
        let b = sqe_bytes(&build_sqe(&fixed(e), 8, NO_ZEROES));
        assert_eq!(field_u32(&b, 4), 3, "{kind:?}");
        assert_eq!(b[1], plain[1] | squeue::Flags::FIXED_FILE.bits());
        assert_eq!(
            (b[0], &b[8..]),
            (plain[0], &plain[8..]),
            "only fd and flags differ"
        );
    }
    // On a registered buffer: READ_FIXED / WRITE_FIXED with buf_index @40 (u16), the rest
    // as the plain op (a remainder's address and length, FUA); other ops ignore it.
    let in_buffer = |e: InFlight| InFlight {
        buf_slot: Some(0x1234),
        ..e
    };
    for (e, code) in [
        (entry(BlockOpKind::Read, 512), opcode::ReadFixed::CODE),
        (
            entry(BlockOpKind::Write { fua: true }, 0),
            opcode::WriteFixed::CODE,
        ),
    ] {
        let plain = sqe_bytes(&build_sqe(&e, 8, NO_ZEROES));
        let b = sqe_bytes(&build_sqe(&in_buffer(e), 8, NO_ZEROES));
        assert_eq!(b[0], code);
        assert_eq!(u16::from_le_bytes([b[40], b[41]]), 0x1234);
        assert_eq!((&b[1..40], &b[42..]), (&plain[1..40], &plain[42..]));
    }
    let flush = entry(BlockOpKind::Flush, 0);
    assert_eq!(
        sqe_bytes(&build_sqe(&flush, 8, NO_ZEROES)),
        sqe_bytes(&build_sqe(
            &in_buffer(entry(BlockOpKind::Flush, 0)),
            8,
            NO_ZEROES
        ))
    );
}

fn zeroes_op(file: &File, offset: u64, len: u64, plan: &'static [ZeroMethod]) -> BlockOp {
    BlockOp {
        fd: file.as_raw_fd(),
        file: None,
        kind: BlockOpKind::Zeroes { len, plan },
        offset,
        buf: std::ptr::null_mut(),
        len: 0,
    }
}

#[test]
fn uring_zeroes_fall_back_and_write_zeroes_in_chunks() {
    // A range over two zero chunks with an odd block count, on an O_DIRECT file: written by
    // hand (plan with only WriteZeroes), and on tmpfs, where ZERO_RANGE is unsupported and
    // the engine moves on to the next method of the plan.
    let len = (ZERO_CHUNK as u64) * 2 + 3 * 512;
    for (base, plan) in [
        ("/var/tmp", &[ZeroMethod::WriteZeroes][..]),
        (
            "/dev/shm",
            &[ZeroMethod::ZeroRange, ZeroMethod::WriteZeroes][..],
        ),
    ] {
        let path = std::path::PathBuf::from(format!(
            "{base}/nvmfd-uring-zeroes-{}.img",
            std::process::id()
        ));
        let data = pattern(len as usize + 1024, 5);
        std::fs::write(&path, &data).unwrap();
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            let direct = if base == "/var/tmp" {
                libc::O_DIRECT
            } else {
                0
            };
            File::options()
                .read(true)
                .write(true)
                .custom_flags(direct)
                .open(&path)
                .unwrap()
        };
        let mut io = UringEngine::new(4).unwrap();
        io.submit(zeroes_op(&file, 512, len, plan), 3);
        assert_eq!(collect(&mut io, 1), vec![(3, 0)], "{base}");
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back[..512], data[..512]);
        assert!(back[512..512 + len as usize].iter().all(|&b| b == 0));
        assert_eq!(back[512 + len as usize..], data[512 + len as usize..]);
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn uring_zeroes_report_the_last_methods_error() {
    // Every method unsupported (ZERO_RANGE on tmpfs is the only one in the plan): the
    // error reaches the caller instead of a silent success.
    let (path, file) = scratch_file_in("/dev/shm", "nozero", 8192);
    let mut io = UringEngine::new(4).unwrap();
    io.submit(zeroes_op(&file, 0, 4096, ZeroMethod::BDEV_WRITE_ZEROES), 1);
    assert_eq!(collect(&mut io, 1), vec![(1, -libc::EOPNOTSUPP)]);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_group_completes_once_with_the_first_error() {
    let (path, file) = scratch_file("group", 1 << 20);
    file.write_all_at(&pattern(1 << 20, 1), 0).unwrap();
    let mut io = UringEngine::new(2).unwrap();
    let plan = ZeroMethod::FILE_DEALLOCATE;
    // Three ranges, more than the SQ holds at once: one completion, result 0.
    let ops = [
        zeroes_op(&file, 0, 4096, plan),
        zeroes_op(&file, 64 * 1024, 8192, plan),
        zeroes_op(&file, 512 * 1024, 4096, plan),
    ];
    io.submit_group(&ops, 10);
    assert_eq!(collect(&mut io, 1), vec![(10, 0)]);
    let mut back = vec![0u8; 1 << 20];
    file.read_exact_at(&mut back, 0).unwrap();
    for (o, l) in [(0, 4096), (64 * 1024, 8192), (512 * 1024, 4096)] {
        assert!(back[o..o + l].iter().all(|&b| b == 0));
    }
    assert!(back[4096..64 * 1024].iter().any(|&b| b != 0));
    // One member fails in the kernel, one before it: the group reports an error once.
    let mut bad = zeroes_op(&file, 0, 4096, plan);
    bad.fd = -1;
    let empty_plan = BlockOp {
        kind: BlockOpKind::Zeroes {
            len: 4096,
            plan: &[],
        },
        ..ops[0]
    };
    io.submit_group(&[ops[1], bad, empty_plan, ops[2]], 11);
    let done = collect(&mut io, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, 11);
    assert!(
        done[0].1 == -libc::EBADF || done[0].1 == -libc::EINVAL,
        "{done:?}"
    );
    // Nothing to do at all.
    io.submit_group(&[], 12);
    assert_eq!(collect(&mut io, 1), vec![(12, 0)]);
    assert_eq!(io.in_flight(), 0);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn no_blocking_storage_call_on_the_reactor_thread() {
    // How "the reactor never blocks on storage" is checked: a thread that cannot make any
    // storage system call (seccomp, above) plays the reactor and runs every backend
    // operation the core issues — read, write, FUA write, flush, deallocate (several
    // ranges), write zeroes with and without DEAC — on a file namespace (O_DIRECT and
    // buffered, on disk and on tmpfs where the zeroing falls back) through its ring. Any
    // synchronous pread / fallocate / ioctl / fdatasync on this thread fails the command.
    use crate::file::FileBackend;
    use crate::test_support::{run, zero, zero_ranges};
    use crate::{Backend, BackendRequest, Zeroing};
    let dir = format!("nvmfd-uring-noblock-{}", std::process::id());
    let cases = [("/var/tmp", true), ("/var/tmp", false), ("/dev/shm", true)];
    let paths: Vec<_> = cases
        .iter()
        .map(|(base, _)| std::path::PathBuf::from(base).join(&dir))
        .collect();
    let backends: Vec<FileBackend> = cases
        .iter()
        .zip(&paths)
        .map(|(&(_, direct), dir)| {
            std::fs::create_dir_all(dir).unwrap();
            let p = dir.join(format!("disk-{direct}.img"));
            FileBackend::open(&p, Some(4 << 20), direct, 4096).unwrap()
        })
        .collect();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // With registered files: their slots are filled from this thread too.
                let mut io = registered(8);
                forbid_blocking_storage_calls_on_this_thread();
                // The filter is in force (else this test could not fail).
                let (rx, _tx) = nix::unistd::pipe().unwrap();
                // SAFETY: fdatasync on a pipe descriptor we own; no memory involved.
                assert_eq!(unsafe { libc::fdatasync(rx.as_raw_fd()) }, -1);
                assert_eq!(
                    io::Error::last_os_error().raw_os_error(),
                    Some(libc::ENOTRECOVERABLE)
                );
                for b in &backends {
                    let b: &dyn Backend = b;
                    let mut w = AlignedBuf::new(64 * 1024);
                    w.copy_from_slice(&pattern(64 * 1024, 3));
                    for fua in [false, true] {
                        run(b, BackendRequest::Write { offset: 0, fua }, &mut w, &mut io).unwrap();
                    }
                    run(b, BackendRequest::Flush, &mut AlignedBuf::new(0), &mut io).unwrap();
                    let mut r = AlignedBuf::new(64 * 1024);
                    run(b, BackendRequest::Read { offset: 0 }, &mut r, &mut io).unwrap();
                    assert!(r[..] == w[..]);
                    let ranges = [(0, 4096), (16384, 8192), (1 << 20, 1 << 20)];
                    zero_ranges(b, &ranges, Zeroing::Deallocate, &mut io).unwrap();
                    for deallocate in [false, true] {
                        let what = Zeroing::WriteZeroes { deallocate };
                        zero(b, 32768, 8192, what, &mut io).unwrap();
                    }
                    run(b, BackendRequest::Read { offset: 0 }, &mut r, &mut io).unwrap();
                    for (o, l) in [(0, 4096), (16384, 8192), (32768, 8192)] {
                        assert!(r[o..o + l].iter().all(|&x| x == 0));
                    }
                    assert!(r[4096..16384] == w[4096..16384]);
                }
                assert_eq!(
                    io.files.slots().len(),
                    backends.len(),
                    "on registered slots"
                );
            })
            .join()
            .unwrap();
    });
    drop(backends);
    for p in paths {
        let _ = std::fs::remove_dir_all(p);
    }
}

/// A ring with a registered-file table of `slots` slots.
fn registered(slots: u32) -> UringEngine {
    let options = RingOptions {
        registered_files: slots,
        ..RingOptions::default()
    };
    UringEngine::with_options(8, options).unwrap()
}

fn file_op(file: &BackendFile, kind: BlockOpKind, offset: u64, buf: &mut [u8]) -> BlockOp {
    crate::file::op_on(file, kind, offset, buf.as_mut_ptr(), buf.len() as u32)
}

/// The registered-file slot of the op submitted with `tag`, while it is in the engine.
fn slot_of(io: &UringEngine, tag: u64) -> Option<u32> {
    io.slots
        .iter()
        .flatten()
        .find(|e| e.tag == tag)
        .expect("op in the engine")
        .file_slot
}

fn read_back(io: &mut UringEngine, file: &BackendFile, tag: u64) -> (Option<u32>, Vec<u8>) {
    let mut buf = AlignedBuf::new(4096);
    io.submit(file_op(file, BlockOpKind::Read, 0, &mut buf), tag);
    let slot = slot_of(io, tag);
    assert_eq!(collect(io, 1), vec![(tag, 4096)]);
    (slot, buf.to_vec())
}

#[test]
fn uring_registered_file_closes_on_the_turn_after_its_backend_goes() {
    // The ring's slot holds a reference to the file: until the ring lets go, a removed
    // namespace's file (a block device: its loop device, its LV) stays open. The next
    // turn (`flush`) must let go.
    let (path, file) = scratch_file("regclose", 8192);
    let file = BackendFile::new(file);
    let id = file.id();
    let mut io = registered(4);
    let mut w = AlignedBuf::new(4096);
    w.copy_from_slice(&pattern(4096, 1));
    io.submit(
        file_op(&file, BlockOpKind::Write { fua: true }, 0, &mut w),
        1,
    );
    let slot = slot_of(&io, 1).expect("issued on a registered slot");
    assert_eq!(collect(&mut io, 1), vec![(1, 4096)]);
    let (again, back) = read_back(&mut io, &file, 2);
    assert_eq!(again, Some(slot), "one slot per file");
    assert!(back[..] == w[..]);
    assert_eq!(io.files.slots(), vec![(id, vec![slot])]);

    let watch = CloseWatch::new(&path);
    drop(file);
    assert!(
        !watch.closed_within(100),
        "the descriptor is closed, the ring's slot still holds the file"
    );
    io.flush();
    assert!(
        watch.closed_within(5000),
        "the turn after removal closed it"
    );
    assert!(io.files.slots().is_empty());
    assert_eq!(io.files.free.len(), 4);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_reused_descriptor_number_never_reaches_the_removed_file() {
    // Namespace A is removed (its backend and descriptor gone, the ring's slot not yet
    // swept) and namespace B opens under A's descriptor number: B's ops must reach B's
    // file, which a table keyed by descriptor number would get wrong.
    let (path_a, fa) = scratch_file("reuse-a", 4096);
    let (path_b, fb) = scratch_file("reuse-b", 4096);
    fa.write_all_at(&pattern(4096, 1), 0).unwrap();
    fb.write_all_at(&pattern(4096, 2), 0).unwrap();
    let mut io = registered(4);
    let mut reused = false;
    // Another test thread may take the freed number first: then try again.
    for attempt in 0..20 {
        let a = BackendFile::new(fa.try_clone().unwrap());
        let n = a.as_raw_fd();
        let (slot_a, back) = read_back(&mut io, &a, 1);
        assert!(slot_a.is_some());
        assert!(back == pattern(4096, 1));
        drop(a);
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own: the lowest free number ≥ n.
        let dup = unsafe { libc::fcntl(fb.as_raw_fd(), libc::F_DUPFD_CLOEXEC, n) };
        assert!(dup >= 0);
        // SAFETY: `dup` was just created and nothing else owns it.
        let b = BackendFile::new(unsafe { File::from_raw_fd(dup) });
        if dup != n {
            drop(b);
            io.flush();
            continue;
        }
        assert_eq!(io.files.slots().len(), 1, "A's slot is still registered");
        let (slot_b, back) = read_back(&mut io, &b, 2);
        assert!(slot_b.is_some() && slot_b != slot_a, "attempt {attempt}");
        assert!(back == pattern(4096, 2), "B's read reached B's file");
        drop(b);
        io.flush();
        reused = true;
        break;
    }
    assert!(reused, "the descriptor number was never free for reuse");
    assert!(io.files.slots().is_empty());
    std::fs::remove_file(path_a).unwrap();
    std::fs::remove_file(path_b).unwrap();
}

#[test]
fn uring_full_file_table_falls_back_to_descriptors() {
    let (path_a, fa) = scratch_file("full-a", 4096);
    let (path_b, fb) = scratch_file("full-b", 4096);
    fa.write_all_at(&pattern(4096, 1), 0).unwrap();
    fb.write_all_at(&pattern(4096, 2), 0).unwrap();
    let (a, b) = (BackendFile::new(fa), BackendFile::new(fb));
    let mut io = registered(1);
    let (mut ra, mut rb) = (AlignedBuf::new(4096), AlignedBuf::new(4096));
    io.submit(file_op(&a, BlockOpKind::Read, 0, &mut ra), 1);
    io.submit(file_op(&b, BlockOpKind::Read, 0, &mut rb), 2);
    assert_eq!(slot_of(&io, 1), Some(0));
    assert_eq!(slot_of(&io, 2), None, "no slot left: the descriptor");
    assert!(io.files.warned_full);
    assert_eq!(collect(&mut io, 2), vec![(1, 4096), (2, 4096)]);
    assert!(ra.to_vec() == pattern(4096, 1));
    assert!(rb.to_vec() == pattern(4096, 2));
    // A removed file's slot goes to the next file that needs one.
    drop(a);
    let (slot, back) = read_back(&mut io, &b, 3);
    assert_eq!(slot, Some(0));
    assert!(back == pattern(4096, 2));
    std::fs::remove_file(path_a).unwrap();
    std::fs::remove_file(path_b).unwrap();
}

#[test]
fn uring_refused_file_table_falls_back_to_descriptors() {
    // More slots than RLIMIT_NOFILE (and than the kernel's IORING_MAX_FIXED_FILES): the
    // kernel refuses the table, as a kernel before 5.19 refuses a sparse one.
    let mut io = registered(u32::MAX);
    assert!(!io.files.enabled);
    let (path, f) = scratch_file("refused", 4096);
    f.write_all_at(&pattern(4096, 3), 0).unwrap();
    let f = BackendFile::new(f);
    let (slot, back) = read_back(&mut io, &f, 1);
    assert_eq!(slot, None);
    assert!(back == pattern(4096, 3));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_slot_held_by_a_parked_op_is_not_emptied() {
    // Should a backend go while one of its ops is still in the engine (the contract says
    // it cannot), the slot keeps naming its file until that op is released: never empty
    // or another file under the op's feet.
    let (rx, tx) = nix::unistd::pipe().unwrap();
    let rx = BackendFile::new(File::from(rx));
    let mut io = registered(2);
    let mut buf = AlignedBuf::new(4096);
    io.submit(file_op(&rx, BlockOpKind::Read, 0, &mut buf), 7);
    io.flush();
    drop(rx);
    io.flush();
    assert_eq!(io.files.slots().len(), 1, "held by the parked read");
    assert!(io.cancel(7));
    io.flush();
    assert_eq!(collect(&mut io, 1), vec![(7, -libc::ECANCELED)]);
    io.flush();
    assert!(
        io.files.slots().is_empty(),
        "released with the op, swept on the next turn"
    );
    drop(tx);
}

/// A ring with a registered-buffer budget of `bytes`.
fn fixed(bytes: u64) -> UringEngine {
    let options = RingOptions {
        fixed_buffer_bytes: bytes,
        ..RingOptions::default()
    };
    UringEngine::with_options(8, options).unwrap()
}

/// The ring's registered buffers as the kernel lists them (`/proc/self/fdinfo`: after
/// `UserBufs:`, one line per table entry, `index: 0xADDR/LEN` or `index: <none>`).
fn kernel_buffers(io: &UringEngine) -> Vec<(usize, u32)> {
    let info =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", io.ring.as_raw_fd())).unwrap();
    let mut lines = info.lines().skip_while(|l| !l.starts_with("UserBufs:"));
    assert!(lines.next().is_some(), "fdinfo lists UserBufs:\n{info}");
    let entry = |l: &str| {
        let (_, value) = l.trim().split_once(": ")?;
        Some(value.split_once('/').map(|(addr, len)| {
            let addr = usize::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap();
            (addr, len.parse().unwrap())
        }))
    };
    // Before Linux 6.13 an empty entry is listed as the kernel's dummy buffer.
    let dummy = |&(addr, _): &(usize, u32)| addr != usize::MAX;
    lines.map_while(entry).flatten().filter(dummy).collect()
}

/// Anonymous memory, as a transport maps its buffers; unmapped on drop.
struct Mapping(*mut u8, usize);

impl Mapping {
    fn new(len: usize) -> Self {
        Self::map(std::ptr::null_mut(), len, 0)
    }

    fn map(at: *mut u8, len: usize, fixed: i32) -> Self {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed;
        // SAFETY: an anonymous mapping, anywhere, or (`replaced`) over a mapping this
        // test owns and no longer uses.
        let p = unsafe {
            libc::mmap(
                at.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        Mapping(p.cast(), len)
    }

    /// New memory at this mapping's address, as when a closed connection's buffers are
    /// unmapped and the next connection's mapping gets their address; done in one step
    /// (MAP_FIXED over the old one) so that no other thread's mapping can take the
    /// address in between.
    fn replaced(self) -> Self {
        let (at, len) = (self.0, self.1);
        std::mem::forget(self);
        Self::map(at, len, libc::MAP_FIXED)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the live mapping, read by the test thread while no op is in flight.
        unsafe { std::slice::from_raw_parts(self.0, self.1) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with `&mut self` the only access.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }

    fn unit(&self, owner: &fixedbuf::BufferOwner, index: u32) -> BufferUnit {
        BufferUnit {
            owner: owner.id(),
            index,
            base: self.0,
            len: self.1 as u32,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping created in `map`, which nothing uses any more.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

fn buf_slot_of(io: &UringEngine, tag: u64) -> Option<u16> {
    io.slots
        .iter()
        .flatten()
        .find(|e| e.tag == tag)
        .expect("op in the engine")
        .buf_slot
}

/// A scratch file holding `contents` at offset 0, opened O_DIRECT.
fn direct_file(name: &str, size: u64, contents: &[u8]) -> (std::path::PathBuf, File) {
    let (path, plain) = scratch_file(name, size);
    plain.write_all_at(contents, 0).unwrap();
    plain.sync_all().unwrap();
    use std::os::unix::fs::OpenOptionsExt;
    let f = File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    (path, f)
}

#[test]
fn uring_fixed_buffers_carry_the_data_and_grow_with_the_transfer() {
    let (path, f) = direct_file("fixed", 1 << 20, &[]);
    let mut io = fixed(1 << 20);
    assert!(io.buffers.enabled);
    let owner = fixedbuf::BufferOwner::new();
    let (mut a, b) = (Mapping::new(256 << 10), Mapping::new(256 << 10));
    let (ua, ub) = (a.unit(&owner, 0), b.unit(&owner, 1));
    a.bytes_mut()[..65536].copy_from_slice(&pattern(65536, 5));
    let op = |kind, m: &Mapping, offset, len| BlockOp {
        fd: f.as_raw_fd(),
        file: None,
        kind,
        offset,
        buf: m.0,
        len,
    };
    // 4 KiB written from A: A registered for one page, the op a WRITE_FIXED on it.
    io.submit_in(op(BlockOpKind::Write { fua: false }, &a, 0, 4096), 1, &ua);
    let slot_a = buf_slot_of(&io, 1).expect("issued on a registered buffer");
    assert_eq!(collect(&mut io, 1), vec![(1, 4096)]);
    assert_eq!(io.registered_buffers(), (1, 4096));
    assert_eq!(kernel_buffers(&io), vec![(a.0 as usize, 4096)]);
    // 64 KiB from the same unit: the same entry, registered again at 64 KiB.
    io.submit_in(op(BlockOpKind::Write { fua: true }, &a, 0, 65536), 2, &ua);
    assert_eq!(buf_slot_of(&io, 2), Some(slot_a));
    assert_eq!(collect(&mut io, 1), vec![(2, 65536)]);
    assert_eq!(io.registered_buffers(), (1, 65536));
    // Read back into B through its own registration: the bytes A wrote.
    io.submit_in(op(BlockOpKind::Read, &b, 0, 65536), 3, &ub);
    assert!(buf_slot_of(&io, 3).is_some_and(|s| s != slot_a));
    assert_eq!(collect(&mut io, 1), vec![(3, 65536)]);
    assert!(b.bytes()[..65536] == pattern(65536, 5)[..]);
    let mut listed = kernel_buffers(&io);
    listed.sort();
    let mut want = vec![(a.0 as usize, 65536), (b.0 as usize, 65536)];
    want.sort();
    assert_eq!(listed, want, "what the kernel has registered");
    // An op outside the unit it names is issued on its buffer as it is.
    io.submit_in(op(BlockOpKind::Read, &b, 0, 4096), 5, &ua);
    assert_eq!(buf_slot_of(&io, 5), None);
    assert_eq!(collect(&mut io, 1), vec![(5, 4096)]);
    // A smaller op inside a registration is issued on it as it is.
    io.submit_in(op(BlockOpKind::Read, &a, 4096, 4096), 4, &ua);
    assert_eq!(buf_slot_of(&io, 4), Some(slot_a));
    assert_eq!(collect(&mut io, 1), vec![(4, 4096)]);
    assert_eq!(io.registered_buffers(), (2, 131072));
    drop(owner);
    io.flush();
    assert_eq!(io.registered_buffers(), (0, 0));
    assert_eq!(
        kernel_buffers(&io),
        vec![],
        "emptied on the turn after the owner went"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_fixed_buffers_of_a_gone_owner_never_serve_a_new_mapping_at_its_address() {
    // A connection's slot mapping is unmapped when it closes and the next connection's may
    // get the same address, while the ring still holds the old registration (until its
    // next sweep), whose pages the kernel keeps pinned. Keyed by address, the new
    // connection's read would land in the old pages and never reach its buffer.
    let (path, f) = direct_file("fixedreuse", 65536, &pattern(8192, 9));
    let mut io = fixed(1 << 20);
    let op = |buf, len| BlockOp {
        fd: f.as_raw_fd(),
        file: None,
        kind: BlockOpKind::Read,
        offset: 0,
        buf,
        len,
    };
    let old_owner = fixedbuf::BufferOwner::new();
    let old = Mapping::new(8192);
    let addr = old.0;
    io.submit_in(op(addr, 4096), 1, &old.unit(&old_owner, 0));
    assert!(buf_slot_of(&io, 1).is_some());
    assert_eq!(collect(&mut io, 1), vec![(1, 4096)]);
    drop(old_owner);
    let new_owner = fixedbuf::BufferOwner::new();
    let new = old.replaced();
    assert_eq!(new.0, addr, "the same address");
    assert!(new.bytes().iter().all(|&b| b == 0));
    // No sweep in between: the old entry is still registered.
    assert_eq!(io.registered_buffers().0, 1);
    io.submit_in(op(addr, 4096), 2, &new.unit(&new_owner, 0));
    assert_eq!(collect(&mut io, 1), vec![(2, 4096)]);
    assert!(
        new.bytes()[..4096] == pattern(4096, 9)[..],
        "the read reached the new mapping"
    );
    io.flush();
    assert_eq!(io.registered_buffers(), (1, 4096), "the old one swept");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_fixed_buffers_beyond_the_budget_pin_per_op() {
    let (path, f) = direct_file("fixedbudget", 65536, &pattern(16384, 4));
    let mut io = fixed(8192);
    let owner = fixedbuf::BufferOwner::new();
    let maps: Vec<Mapping> = (0..3).map(|_| Mapping::new(16384)).collect();
    for (i, m) in maps.iter().enumerate() {
        let op = BlockOp {
            fd: f.as_raw_fd(),
            file: None,
            kind: BlockOpKind::Read,
            offset: 0,
            buf: m.0,
            len: 4096,
        };
        io.submit_in(op, i as u64, &m.unit(&owner, i as u32));
    }
    assert!(buf_slot_of(&io, 0).is_some() && buf_slot_of(&io, 1).is_some());
    assert_eq!(buf_slot_of(&io, 2), None, "8 KiB of budget: two pages");
    assert!(io.buffers.warned_full);
    assert_eq!(collect(&mut io, 3), vec![(0, 4096), (1, 4096), (2, 4096)]);
    for m in &maps {
        assert!(m.bytes()[..4096] == pattern(4096, 4)[..]);
    }
    // Growing a registered unit past the budget: that op pins per op, the entry stays.
    let op = BlockOp {
        fd: f.as_raw_fd(),
        file: None,
        kind: BlockOpKind::Read,
        offset: 0,
        buf: maps[0].0,
        len: 16384,
    };
    io.submit_in(op, 3, &maps[0].unit(&owner, 0));
    assert_eq!(buf_slot_of(&io, 3), None);
    assert_eq!(collect(&mut io, 1), vec![(3, 16384)]);
    assert!(maps[0].bytes()[..16384] == pattern(16384, 4)[..]);
    assert_eq!(io.registered_buffers(), (2, 8192));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_fixed_buffers_off_or_refused_pin_per_op() {
    let (path, f) = direct_file("fixedoff", 65536, &[]);
    let owner = fixedbuf::BufferOwner::new();
    let m = Mapping::new(8192);
    let op = BlockOp {
        fd: f.as_raw_fd(),
        file: None,
        kind: BlockOpKind::Read,
        offset: 0,
        buf: m.0,
        len: 4096,
    };
    let mut off = fixed(0);
    assert!(!off.buffers.enabled);
    off.submit_in(op, 1, &m.unit(&owner, 0));
    assert_eq!(buf_slot_of(&off, 1), None);
    assert_eq!(collect(&mut off, 1), vec![(1, 4096)]);
    // Memory the kernel will not register (a read-only file mapping: registration pins
    // for writing, which it refuses): the registration fails, the op goes per op, and no
    // later one tries.
    let ro = File::open(&path).unwrap();
    // SAFETY: a new shared read-only mapping of a scratch file, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ,
            libc::MAP_SHARED,
            ro.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let unit = BufferUnit {
        owner: owner.id(),
        index: 1,
        base: p.cast(),
        len: 8192,
    };
    let mut io = fixed(1 << 20);
    let mut rejected = BlockOp {
        buf: p.cast(),
        kind: BlockOpKind::Write { fua: false },
        ..op
    };
    rejected.len = 4096;
    io.submit_in(rejected, 2, &unit);
    assert_eq!(buf_slot_of(&io, 2), None);
    assert!(io.buffers.refused);
    assert_eq!(collect(&mut io, 1), vec![(2, 4096)]);
    io.submit_in(op, 3, &m.unit(&owner, 0));
    assert_eq!(buf_slot_of(&io, 3), None, "no registration after a refusal");
    assert_eq!(collect(&mut io, 1), vec![(3, 4096)]);
    // SAFETY: the mapping made above; no op uses it any more.
    unsafe { libc::munmap(p, 8192) };
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_setup_errors_are_classified() {
    for errno in [libc::EPERM, libc::ENOSYS, libc::EACCES] {
        let err = classify_setup_error(256, io::Error::from_raw_os_error(errno));
        assert!(matches!(&err, UringError::Unavailable(e) if e.raw_os_error() == Some(errno)));
        assert!(err.to_string().contains("io_uring_disabled"));
    }
    let err = classify_setup_error(256, io::Error::from_raw_os_error(libc::ENOMEM));
    assert!(matches!(err, UringError::Setup { entries: 256, .. }));
}

#[test]
fn uring_engine_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<UringEngine>();
    let engine = UringEngine::new(4).unwrap();
    std::thread::spawn(move || assert_eq!(engine.in_flight(), 0))
        .join()
        .unwrap();
}

#[test]
fn uring_eventfd_signals_readiness() {
    let (path, file) = scratch_file("eventfd", 4096);
    let mut io = UringEngine::new(2).unwrap();
    let mut fds = [nix::poll::PollFd::new(
        // SAFETY: the engine outlives this borrow.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(io.fd()) },
        nix::poll::PollFlags::POLLIN,
    )];
    assert_eq!(
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
        0
    );
    let mut buf = AlignedBuf::new(4096);
    io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 5);
    io.flush();
    io.wait().unwrap();
    assert_eq!(
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).unwrap(),
        1
    );
    let mut got = Vec::new();
    io.reap(|t, r| got.push((t, r)));
    assert_eq!(got, vec![(5, 4096)]);
    // reap drained the eventfd: not readable any more.
    assert_eq!(
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
        0
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_external_completions_arrive_through_reap_with_ring_completions() {
    // A backend library's thread completes ops while the ring completes its own: both wake
    // the same eventfd, `in_flight` counts both until reaped, and every result reaches
    // `reap` with its tag exactly once.
    let (path, file) = scratch_file("external", 8192);
    let mut io = UringEngine::new(4).unwrap();
    let ext = Arc::clone(io.external().unwrap());
    for _ in 0..3 {
        ext.begin();
    }
    ext.begin();
    ext.abandon(); // refused synchronously: no completion follows
    assert_eq!(io.in_flight(), 3);
    let mut buf = AlignedBuf::new(4096);
    io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 100);
    io.flush();
    let worker = {
        let ext = Arc::clone(&ext);
        std::thread::spawn(move || {
            for (tag, res) in [(1u64, 4096), (2, -libc::EIO), (3, 0)] {
                std::thread::sleep(std::time::Duration::from_millis(5));
                ext.complete(tag, res);
            }
        })
    };
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < 4 {
        assert!(std::time::Instant::now() < deadline, "got only {got:?}");
        io.wait().unwrap();
        io.reap(|t, r| got.push((t, r)));
    }
    worker.join().unwrap();
    got.sort();
    assert_eq!(got, vec![(1, 4096), (2, -libc::EIO), (3, 0), (100, 4096)]);
    assert_eq!(io.in_flight(), 0);
    assert!(!ext.ready());
    std::fs::remove_file(path).unwrap();
}

#[test]
fn uring_drop_waits_for_external_ops() {
    // The engine must not go (and let the transport free buffers) while a library holds an
    // op: Drop returns only after the late completion.
    let io = UringEngine::new(2).unwrap();
    let mut io = io;
    let ext = Arc::clone(io.external().unwrap());
    ext.begin();
    let started = std::time::Instant::now();
    let worker = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        ext.complete(9, 0);
    });
    drop(io);
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    worker.join().unwrap();
}

#[test]
fn uring_drop_waits_for_in_flight_ops() {
    let (path, file) = scratch_file("drop", 1 << 20);
    let mut buf = AlignedBuf::new(1 << 20);
    {
        let mut io = UringEngine::new(4).unwrap();
        io.submit(op(&file, BlockOpKind::Read, 0, &mut buf), 1);
        io.flush();
        // Dropped with the read in the kernel: Drop must wait, so `buf` is safe to free.
    }
    drop(buf);
    std::fs::remove_file(path).unwrap();
}
