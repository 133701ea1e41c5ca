//! Fused Compare and Write (NVMe Base 2.0 §3.4.2, NVM Command Set 1.0 §3.2.1) through the
//! queue contract: pairing, miscompare, broken pairs, and exclusion of other writes to the
//! same LBAs from other queues and controllers while the pair runs.

use std::time::Instant;

use nvme::queue::{Outcome, Queue, Response};
use nvme::spec::nvm_opcode::{COMPARE, READ, WRITE};
use nvme::spec::{admin_opcode, sqe_flags};
use nvme::wire::{Sqe, Status};

use crate::harness::*;

fn fused(mut s: Sqe, fuse: u8, cid: u16) -> Sqe {
    s.flags |= fuse;
    s.cid = cid;
    s
}

fn with_cid(mut s: Sqe, cid: u16) -> Sqe {
    s.cid = cid;
    s
}

/// Runs `execute` and, for a submitted op, its completion right away.
fn exec(h: &mut Host, s: &Sqe, data: &mut [u8]) -> Option<Response> {
    h.execute_now(s, data, s.cid as u64)
}

fn poll(q: &mut Queue) -> Vec<(u16, Status)> {
    q.poll(Instant::now())
        .completions
        .iter()
        .map(|r| (r.cqe.cid, r.cqe.status))
        .collect()
}

fn block(b: u8) -> Vec<u8> {
    vec![b; 4096]
}

/// Runs a whole pair in submission order: Compare `cmp` then Write `new` on LBAs 8..16.
/// Returns (Compare status, Write status).
fn pair(q: &mut Host, cmp: u8, new: u8) -> (Status, Status) {
    let c = fused(rw(COMPARE, 1, 8, 8), sqe_flags::FUSE_FIRST, 100);
    let w = fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_SECOND, 101);
    q.q.prepare(&c, 4096).unwrap();
    q.q.prepare(&w, 4096).unwrap();
    assert!(exec(q, &c, &mut block(cmp)).is_none(), "Compare held");
    let wr = exec(q, &w, &mut block(new)).expect("Write ran");
    let done = poll(&mut q.q);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, 100);
    (done[0].1, wr.cqe.status)
}

fn read_back(q: &mut Host) -> Vec<u8> {
    let mut back = vec![0u8; 4096];
    assert_eq!(
        q.run(rw(READ, 1, 8, 8), &mut back).cqe.status,
        Status::SUCCESS
    );
    back
}

#[test]
fn compare_and_write_then_miscompare() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (_a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    assert_eq!(q.status(rw(WRITE, 1, 8, 8), &mut block(1)), Status::SUCCESS);
    assert_eq!(pair(&mut q, 1, 2), (Status::SUCCESS, Status::SUCCESS));
    assert_eq!(read_back(&mut q), block(2));
    // The stored data is 2 now: comparing with 1 fails and the Write is not executed.
    assert_eq!(
        pair(&mut q, 1, 3),
        (
            Status::COMPARE_FAILURE.with_dnr(),
            Status::ABORTED_FAILED_FUSED
        )
    );
    assert_eq!(read_back(&mut q), block(2));
}

#[test]
fn write_half_waits_for_the_compare_data() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (_a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let c = fused(rw(COMPARE, 1, 8, 8), sqe_flags::FUSE_FIRST, 7);
    let w = fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_SECOND, 8);
    q.q.prepare(&c, 4096).unwrap();
    q.q.prepare(&w, 4096).unwrap();
    // The Write's data came first (e.g. in-capsule while the Compare waits for R2T data).
    assert_eq!(
        q.q.execute(&w, &mut block(5), 8, &mut q.io),
        Outcome::Blocked
    );
    assert!(exec(&mut q, &c, &mut block(0)).is_none());
    let wr = exec(&mut q, &w, &mut block(5)).unwrap();
    assert_eq!((wr.cqe.cid, wr.cqe.status), (8, Status::SUCCESS));
    assert_eq!(poll(&mut q.q), vec![(7, Status::SUCCESS)]);
    assert_eq!(read_back(&mut q), block(5));
}

#[test]
fn broken_pairs() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    assert_eq!(q.status(rw(WRITE, 1, 8, 8), &mut block(9)), Status::SUCCESS);
    let first = |cid| fused(rw(COMPARE, 1, 8, 8), sqe_flags::FUSE_FIRST, cid);
    let second = |cid| fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_SECOND, cid);

    // A second half alone.
    assert_eq!(
        q.q.prepare(&second(1), 4096),
        Err(Status::ABORTED_MISSING_FUSED)
    );
    // A first half followed by an ordinary command: the first is aborted when it executes,
    // the ordinary command runs.
    q.q.prepare(&first(2), 4096).unwrap();
    let r = with_cid(rw(READ, 1, 8, 8), 3);
    q.q.prepare(&r, 4096).unwrap();
    let c = exec(&mut q, &first(2), &mut block(9)).unwrap();
    assert_eq!(c.cqe.status, Status::ABORTED_MISSING_FUSED);
    assert_eq!(
        exec(&mut q, &r, &mut block(0)).unwrap().cqe.status,
        Status::SUCCESS
    );
    // The same when the first half already executed (held): completed from `poll`.
    q.q.prepare(&first(4), 4096).unwrap();
    assert!(exec(&mut q, &first(4), &mut block(9)).is_none());
    q.q.prepare(&first(5), 4096).unwrap();
    assert_eq!(poll(&mut q.q), vec![(4, Status::ABORTED_MISSING_FUSED)]);
    // ... and 5 is broken by a mismatched range: both Invalid Field, nothing written.
    let other = fused(rw(WRITE, 1, 9, 8), sqe_flags::FUSE_SECOND, 6);
    assert_eq!(
        q.q.prepare(&other, 4096),
        Err(Status::INVALID_FIELD.with_dnr())
    );
    let c = exec(&mut q, &first(5), &mut block(9)).unwrap();
    assert_eq!(c.cqe.status, Status::INVALID_FIELD.with_dnr());
    // Different block count, different namespace, wrong opcodes.
    for bad in [
        fused(rw(WRITE, 1, 8, 4), sqe_flags::FUSE_SECOND, 11),
        fused(rw(WRITE, 2, 8, 8), sqe_flags::FUSE_SECOND, 11),
        fused(rw(READ, 1, 8, 8), sqe_flags::FUSE_SECOND, 11),
    ] {
        q.q.prepare(&first(10), 4096).unwrap();
        assert!(q.q.prepare(&bad, bad.cdw12 * 512 + 512).is_err());
        assert_eq!(
            exec(&mut q, &first(10), &mut block(9)).unwrap().cqe.status,
            Status::INVALID_FIELD.with_dnr()
        );
    }
    let write_first = fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_FIRST, 12);
    assert_eq!(
        q.q.prepare(&write_first, 4096),
        Err(Status::INVALID_FIELD.with_dnr())
    );
    // FUSE 11b is reserved.
    let reserved = fused(rw(WRITE, 1, 8, 8), 3, 13);
    assert_eq!(
        q.q.prepare(&reserved, 4096),
        Err(Status::INVALID_FIELD.with_dnr())
    );
    // A first half that failed admission: its second half is aborted as failed.
    let out_of_range = fused(rw(COMPARE, 1, u64::MAX - 1, 8), sqe_flags::FUSE_FIRST, 14);
    assert!(q.q.prepare(&out_of_range, 4096).is_err());
    let w = fused(rw(WRITE, 1, u64::MAX - 1, 8), sqe_flags::FUSE_SECOND, 15);
    assert_eq!(q.q.prepare(&w, 4096), Err(Status::ABORTED_FAILED_FUSED));
    // Fused admin commands do not exist.
    let mut id = identify(1, 0, 0);
    id.flags |= sqe_flags::FUSE_FIRST;
    assert_eq!(
        a.status(id, &mut [0u8; 4096]),
        Status::INVALID_FIELD.with_dnr()
    );
    // Nothing of the above wrote.
    assert_eq!(read_back(&mut q), block(9));
    let _ = admin_opcode::IDENTIFY;
}

fn file_config(tag: &str) -> (nvme::target::TargetConfig, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("nvmfd-fused-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces = vec![nvme::namespace::NamespaceConfig {
        nsid: 1,
        backend: nvme::namespace::BackendConfig::File {
            path: dir.join("ns.img"),
            size: Some(1 << 20),
            direct_io: false,
        },
        block_size: 512,
        read_only: false,
        uuid: None,
        nguid: None,
        ana_group: 1,
    }];
    (cfg, dir)
}

/// Writes from another queue and another controller are held off while a pair runs, and the
/// pair waits for writes already in flight.
#[test]
fn pair_excludes_overlapping_writes_from_other_queues() {
    let b = Backends::new();
    let (cfg, dir) = file_config("excl");
    let t = target_with(cfg, &b);
    let (_a1, c1) = admin(&t, SUBNQN, 0);
    let (_a2, c2) = admin(&t, SUBNQN, 0);
    let mut fq = io_queue(&t, c1, 1);
    let mut other_q = io_queue(&t, c1, 2);
    let mut other_ctrl = io_queue(&t, c2, 1);

    // An ordinary write from another queue is in flight (submitted, not finished).
    let w0 = with_cid(rw(WRITE, 1, 12, 8), 1);
    other_q.q.prepare(&w0, 4096).unwrap();
    assert_eq!(
        other_q.q.execute(&w0, &mut block(0), 1, &mut other_q.io),
        Outcome::Submitted
    );
    let c = fused(rw(COMPARE, 1, 8, 8), sqe_flags::FUSE_FIRST, 20);
    let w = fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_SECOND, 21);
    fq.q.prepare(&c, 4096).unwrap();
    fq.q.prepare(&w, 4096).unwrap();
    assert!(exec(&mut fq, &c, &mut block(0)).is_none());
    assert_eq!(
        fq.q.execute(&w, &mut block(7), 21, &mut fq.io),
        Outcome::Blocked,
        "an overlapping write is in flight"
    );
    // Its intent now keeps new overlapping writes out (from any controller), not others.
    let w1 = with_cid(rw(WRITE, 1, 15, 1), 2);
    other_ctrl.q.prepare(&w1, 512).unwrap();
    assert_eq!(
        other_ctrl
            .q
            .execute(&w1, &mut [3u8; 512], 2, &mut other_ctrl.io),
        Outcome::Blocked
    );
    let disjoint = with_cid(rw(WRITE, 1, 100, 1), 3);
    other_ctrl.q.prepare(&disjoint, 512).unwrap();
    assert!(exec(&mut other_ctrl, &disjoint, &mut [4u8; 512]).is_some());
    // The write in flight completes; the pair runs and holds the range until its Write
    // completes.
    let (_, res) = other_q.io.done.pop().unwrap();
    assert_eq!(
        other_q.q.finish(&w0, res).unwrap().cqe.status,
        Status::SUCCESS
    );
    // The pair's Compare reads (under the Write's tag), still holding the range.
    assert_eq!(
        fq.q.execute(&w, &mut block(7), 21, &mut fq.io),
        Outcome::Submitted
    );
    assert_eq!(poll(&mut fq.q), vec![]);
    assert_eq!(
        other_ctrl
            .q
            .execute(&w1, &mut [3u8; 512], 2, &mut other_ctrl.io),
        Outcome::Blocked,
        "the pair's Compare is in flight"
    );
    let (_, res) = fq.io.done.pop().unwrap();
    assert!(fq.q.finish(&w, res).is_none(), "the Write is not done yet");
    assert_eq!(poll(&mut fq.q), vec![(20, Status::SUCCESS)]);
    assert_eq!(
        fq.q.execute(&w, &mut block(7), 21, &mut fq.io),
        Outcome::Submitted
    );
    assert_eq!(
        other_ctrl
            .q
            .execute(&w1, &mut [3u8; 512], 2, &mut other_ctrl.io),
        Outcome::Blocked,
        "the pair's Write is in flight"
    );
    let (_, res) = fq.io.done.pop().unwrap();
    assert_eq!(fq.q.finish(&w, res).unwrap().cqe.status, Status::SUCCESS);
    let r = exec(&mut other_ctrl, &w1, &mut [3u8; 512]).unwrap();
    assert_eq!(r.cqe.status, Status::SUCCESS);
    let mut expect = block(7);
    expect[7 * 512..].fill(3);
    assert_eq!(read_back(&mut fq), expect);
    drop((fq, other_q, other_ctrl));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A queue that goes away while its pair waits releases the range.
#[test]
fn dropped_queue_releases_its_intent() {
    let b = Backends::new();
    let (cfg, dir) = file_config("drop");
    let t = target_with(cfg, &b);
    let (_a, c1) = admin(&t, SUBNQN, 0);
    let mut fq = io_queue(&t, c1, 1);
    let mut other = io_queue(&t, c1, 2);
    let w0 = with_cid(rw(WRITE, 1, 8, 1), 1);
    other.q.prepare(&w0, 512).unwrap();
    assert_eq!(
        other.q.execute(&w0, &mut [0u8; 512], 1, &mut other.io),
        Outcome::Submitted
    );
    let c = fused(rw(COMPARE, 1, 8, 8), sqe_flags::FUSE_FIRST, 20);
    let w = fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_SECOND, 21);
    fq.q.prepare(&c, 4096).unwrap();
    fq.q.prepare(&w, 4096).unwrap();
    assert!(exec(&mut fq, &c, &mut block(0)).is_none());
    assert_eq!(
        fq.q.execute(&w, &mut block(7), 21, &mut fq.io),
        Outcome::Blocked
    );
    let (_, res) = other.io.done.pop().unwrap();
    other.q.finish(&w0, res).unwrap();
    let w1 = with_cid(rw(WRITE, 1, 8, 1), 2);
    other.q.prepare(&w1, 512).unwrap();
    assert_eq!(
        other.q.execute(&w1, &mut [1u8; 512], 2, &mut other.io),
        Outcome::Blocked
    );
    drop(fq);
    assert!(exec(&mut other, &w1, &mut [1u8; 512]).is_some());
    drop(other);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A write in flight when its namespace is replaced (another backend, so another write lock)
/// is released on the lock it started on: the new namespace's pairs are not held off by it.
#[test]
fn write_in_flight_across_a_replacement_leaves_the_new_lock_alone() {
    let b = Backends::new();
    let (cfg, dir) = file_config("replace");
    let t = target_with(cfg.clone(), &b);
    let (_a, c1) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, c1, 1);
    let w0 = with_cid(rw(WRITE, 1, 8, 1), 1);
    q.q.prepare(&w0, 512).unwrap();
    assert_eq!(
        q.q.execute(&w0, &mut [5u8; 512], 1, &mut q.io),
        Outcome::Submitted
    );
    let mut ram = cfg.clone();
    ram.subsystems[0].namespaces = vec![ram_ns(1, 1 << 20, 512)];
    let s = t.apply_with_opener(ram, &b.opener()).unwrap();
    assert_eq!(s.namespaces_replaced, vec![(SUBNQN.to_string(), 1)]);
    let (_, res) = q.io.done.pop().unwrap();
    assert_eq!(q.q.finish(&w0, res).unwrap().cqe.status, Status::SUCCESS);
    // Twice: a wrongly released count would hold off every pair from now on.
    assert_eq!(pair(&mut q, 0, 7), (Status::SUCCESS, Status::SUCCESS));
    assert_eq!(pair(&mut q, 7, 9), (Status::SUCCESS, Status::SUCCESS));
    drop(q);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The metrics count a fused pair's Write once — admission, data and completion — although the
/// queue runs it more than once: blocked behind a write in flight, then its Compare read
/// (submitted to the file namespace), then the write itself. No command stays "in flight".
#[test]
fn a_fused_pair_is_counted_once() {
    let b = Backends::new();
    let (cfg, dir) = file_config("metrics");
    let t = target_with(cfg, &b);
    let reg = t.enable_metrics();
    let (admin_q, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let mut other = io_queue(&t, cntlid, 2);
    assert_eq!(q.status(rw(WRITE, 1, 8, 8), &mut block(1)), Status::SUCCESS);
    // A write in flight on another queue: the pair's Write waits for it (Blocked).
    let w0 = with_cid(rw(WRITE, 1, 12, 8), 1);
    other.q.prepare(&w0, 4096).unwrap();
    assert_eq!(
        other.q.execute(&w0, &mut block(1), 1, &mut other.io),
        Outcome::Submitted
    );
    let c = fused(rw(COMPARE, 1, 8, 8), sqe_flags::FUSE_FIRST, 100);
    let w = fused(rw(WRITE, 1, 8, 8), sqe_flags::FUSE_SECOND, 101);
    q.q.prepare(&c, 4096).unwrap();
    q.q.prepare(&w, 4096).unwrap();
    assert!(exec(&mut q, &c, &mut block(1)).is_none(), "Compare held");
    assert_eq!(
        q.q.execute(&w, &mut block(2), 101, &mut q.io),
        Outcome::Blocked
    );
    let (tag, res) = other.io.done.pop().unwrap();
    assert!(other.q.finish(&w0, res).is_some() && tag == 1);
    let wr = exec(&mut q, &w, &mut block(2)).expect("Write ran");
    assert_eq!(wr.cqe.status, Status::SUCCESS);
    assert_eq!(poll(&mut q.q), vec![(100, Status::SUCCESS)]);
    assert!(
        q.submitted >= 2,
        "the Compare read and the write went to the backend"
    );
    drop((q, other, admin_q));
    let s = reg.snapshot();
    let mut writes = (0, 0);
    let mut in_flight = 0;
    for e in &s.entries {
        let w = e.counters.class_total(nvme::metrics::Class::Write);
        writes.0 += w.commands;
        writes.1 += w.bytes;
        in_flight += e.counters.in_flight();
    }
    assert_eq!(
        writes,
        (3, 3 * 4096),
        "three writes of 4 KiB, each counted once"
    );
    assert_eq!(in_flight, 0);
    std::fs::remove_dir_all(dir).unwrap();
}
