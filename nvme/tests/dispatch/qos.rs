//! QoS through the dispatch contract: a waiting Read is `Blocked` and asks its submitter for
//! a wake-up at its time; two I/O queues on two threads share a namespace's limit; admin
//! commands of a limited host are never held; a limit removed live lets what waits go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::qos::{QosConfig, QosLimits};
use nvme::queue::{Outcome, Queue};
use nvme::spec::nvm_opcode::READ;
use nvme::target::Target;
use nvme::wire::{Sqe, Status};
use storage::sync::SyncEngine;
use storage::{BlockOp, IoSubmit};

use crate::harness::*;

/// A synchronous submitter that records the wake-ups asked for.
#[derive(Default)]
struct Waking {
    io: SyncEngine,
    wakes: Vec<Instant>,
}

impl IoSubmit for Waking {
    fn submit(&mut self, op: BlockOp, tag: u64) {
        self.io.submit(op, tag)
    }
    fn submit_group(&mut self, ops: &[BlockOp], tag: u64) {
        self.io.submit_group(ops, tag)
    }
    fn wake_at(&mut self, at: Instant) {
        self.wakes.push(at);
    }
}

fn limited(iops: u64) -> (Arc<Target>, Backends) {
    let backends = Backends::new();
    let mut cfg = basic_config();
    cfg.subsystems[0].qos = QosConfig {
        namespaces: [(
            1,
            QosLimits {
                iops,
                burst: Duration::from_millis(5),
                ..QosLimits::default()
            },
        )]
        .into(),
        ..QosConfig::default()
    };
    (target_with(cfg, &backends), backends)
}

fn read(cid: u16) -> Sqe {
    Sqe {
        cid,
        ..rw(READ, 1, u64::from(cid) % 2048, 1)
    }
}

/// Runs `sqe` on `q` (prepared already): the response, or None while it waits.
fn attempt(q: &mut Queue, sqe: &Sqe, buf: &mut [u8], io: &mut Waking) -> Option<Status> {
    match q.execute(sqe, buf, u64::from(sqe.cid), io) {
        Outcome::Complete(r) => Some(r.cqe.status),
        Outcome::Blocked => None,
        other => panic!("cid {}: {other:?}", sqe.cid),
    }
}

#[test]
fn a_waiting_read_is_blocked_and_asks_for_a_wake_up_at_its_time() {
    let (target, _b) = limited(100);
    let (_admin, cntlid) = admin(&target, SUBNQN, 0);
    let mut h = io_queue(&target, cntlid, 1);
    let mut io = Waking::default();
    let mut buf = vec![0u8; 512];
    let t0 = Instant::now();
    // 100/s with the 5 ms burst: the first goes, the second waits about 5 ms, the third 15.
    let sqes: Vec<Sqe> = (1..=3).map(read).collect();
    for s in &sqes {
        h.q.prepare(s, 512).unwrap();
    }
    assert_eq!(
        attempt(&mut h.q, &sqes[0], &mut buf, &mut io),
        Some(Status::SUCCESS)
    );
    assert_eq!(attempt(&mut h.q, &sqes[1], &mut buf, &mut io), None);
    assert_eq!(attempt(&mut h.q, &sqes[2], &mut buf, &mut io), None);
    assert_eq!(io.wakes.len(), 2);
    let (w1, w2) = (io.wakes[0] - t0, io.wakes[1] - t0);
    assert!(
        w1 <= Duration::from_millis(6) && w1 >= Duration::from_millis(3),
        "{w1:?}"
    );
    assert!(w2 - w1 >= Duration::from_millis(9), "{w1:?} {w2:?}");
    // Run again at its time, the second goes; the third still waits.
    std::thread::sleep(io.wakes[0].saturating_duration_since(Instant::now()));
    assert_eq!(
        attempt(&mut h.q, &sqes[1], &mut buf, &mut io),
        Some(Status::SUCCESS)
    );
    // The limit goes: the third goes at its next run, long before its time would have come.
    target
        .subsystem(SUBNQN)
        .unwrap()
        .set_qos(&QosConfig::default());
    assert_eq!(
        attempt(&mut h.q, &sqes[2], &mut buf, &mut io),
        Some(Status::SUCCESS)
    );
}

#[test]
fn admin_commands_and_flush_of_a_limited_host_are_never_held() {
    let (target, _b) = limited(0);
    let subsystem = target.subsystem(SUBNQN).unwrap();
    subsystem.set_qos(&QosConfig {
        hosts: [(
            HOSTNQN.to_owned(),
            QosLimits {
                iops: 1,
                burst: Duration::from_millis(5),
                ..QosLimits::default()
            },
        )]
        .into(),
        ..QosConfig::default()
    });
    let (mut a, cntlid) = admin(&target, SUBNQN, 0);
    let mut h = io_queue(&target, cntlid, 1);
    let mut io = Waking::default();
    let mut buf = vec![0u8; 512];
    let sqes: Vec<Sqe> = (1..=2).map(read).collect();
    for s in &sqes {
        h.q.prepare(s, 512).unwrap();
    }
    assert_eq!(
        attempt(&mut h.q, &sqes[0], &mut buf, &mut io),
        Some(Status::SUCCESS)
    );
    assert_eq!(attempt(&mut h.q, &sqes[1], &mut buf, &mut io), None);
    let mut page = vec![0u8; 4096];
    for _ in 0..10 {
        assert_eq!(a.status(identify(1, 0, 0), &mut page), Status::SUCCESS);
    }
    let flush = sqe(nvme::spec::nvm_opcode::FLUSH, 1);
    assert_eq!(h.status(flush, &mut []), Status::SUCCESS);
    // Still waiting: a second has not passed.
    assert_eq!(attempt(&mut h.q, &sqes[1], &mut buf, &mut io), None);
}

/// Two I/O queues of one host on two threads (as on two reactors), 16 reads outstanding
/// each, for 600 ms against a namespace limited to 200/s: together they never get more than
/// the rate (plus the burst and the first), and each gets a share.
#[test]
fn two_io_queues_on_two_threads_share_a_namespace_limit() {
    let (target, _b) = limited(200);
    let (_admin, cntlid) = admin(&target, SUBNQN, 0);
    let queues: Vec<Host> = (1..=2).map(|qid| io_queue(&target, cntlid, qid)).collect();
    let run = Duration::from_millis(600);
    let t0 = Instant::now();
    let threads: Vec<_> = queues
        .into_iter()
        .map(|mut h| {
            std::thread::spawn(move || {
                let mut io = Waking::default();
                let mut buf = vec![0u8; 512];
                let mut waiting: Vec<Sqe> = Vec::new();
                let mut next = 1u16;
                let mut done = 0u64;
                while t0.elapsed() < run {
                    while waiting.len() < 16 {
                        let s = read(next);
                        next += 1;
                        h.q.prepare(&s, 512).unwrap();
                        waiting.push(s);
                    }
                    let mut still = Vec::new();
                    for s in waiting {
                        match attempt(&mut h.q, &s, &mut buf, &mut io) {
                            Some(st) => {
                                assert_eq!(st, Status::SUCCESS);
                                done += 1;
                            }
                            None => still.push(s),
                        }
                    }
                    waiting = still;
                    std::thread::sleep(Duration::from_millis(1));
                }
                done
            })
        })
        .collect();
    let done: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let secs = t0.elapsed().as_secs_f64();
    let total: u64 = done.iter().sum();
    // 200/s over the run, plus the first and the 5 ms burst (one command).
    assert!(
        total as f64 <= 200.0 * secs + 2.0,
        "{done:?} in {secs:.3} s"
    );
    assert!(total >= 60, "{done:?} in {secs:.3} s");
    assert!(done.iter().all(|&n| n >= 20), "{done:?}");
    let c = target.subsystem(SUBNQN).unwrap().qos().namespaces[0]
        .1
        .counters();
    assert_eq!(c.commands, total);
}

/// What a transport does: it runs a blocked command again only when `may_run` says so, and
/// polls the queue after. A limit removed live must make the waiting command worth running
/// again by the next poll.
#[test]
fn a_limit_removed_makes_waiting_commands_worth_running_at_the_next_poll() {
    let (target, _b) = limited(1);
    let (_admin, cntlid) = admin(&target, SUBNQN, 0);
    let mut h = io_queue(&target, cntlid, 1);
    let mut io = Waking::default();
    let mut buf = vec![0u8; 512];
    let sqes: Vec<Sqe> = (1..=4).map(read).collect();
    for s in &sqes {
        h.q.prepare(s, 512).unwrap();
    }
    assert_eq!(
        attempt(&mut h.q, &sqes[0], &mut buf, &mut io),
        Some(Status::SUCCESS)
    );
    for s in &sqes[1..] {
        assert_eq!(attempt(&mut h.q, s, &mut buf, &mut io), None);
        assert!(!h.q.may_run(s, Instant::now()));
    }
    assert!(h.q.next_wake().is_some());
    target
        .subsystem(SUBNQN)
        .unwrap()
        .set_qos(&QosConfig::default());
    h.q.poll(Instant::now());
    // Every waiting command is worth running, also after the first of them went.
    for s in &sqes[1..] {
        assert!(h.q.may_run(s, Instant::now()), "cid {}", s.cid);
        assert_eq!(
            attempt(&mut h.q, s, &mut buf, &mut io),
            Some(Status::SUCCESS)
        );
    }
    assert_eq!(h.q.next_wake(), None);
}
