//! The token buckets on a virtual clock (an `Instant` origin plus chosen offsets), a limiter
//! shared by two threads in lock step, and the queues' waiting commands.

use super::*;

fn limits(iops: u64, read: u64, write: u64, total: u64, burst_ms: u64) -> QosLimits {
    QosLimits {
        iops,
        read_bytes_per_sec: read,
        write_bytes_per_sec: write,
        total_bytes_per_sec: total,
        burst: Duration::from_millis(burst_ms),
    }
}

fn at(t0: Instant, us: u64) -> Instant {
    t0 + Duration::from_micros(us)
}

fn us(t0: Instant, t: Instant) -> u64 {
    (t - t0).as_micros() as u64
}

const ONE: Cost = Cost { read: 0, write: 0 };

#[test]
fn an_iops_limit_schedules_at_the_rate_after_the_burst() {
    let t0 = Instant::now();
    let l = Limiter::new(limits(1000, 0, 0, 0, 5), t0);
    // The first command and the burst (5 ms: 5 commands ahead) start at once,
    // then one every millisecond: command k at (k - 5) ms.
    for k in 0..10_006u64 {
        let start = l.schedule(t0, ONE);
        assert_eq!(us(t0, start), k.saturating_sub(5) * 1000, "command {k}");
    }
    // A command arriving after the bucket drained starts at once.
    assert_eq!(l.schedule(at(t0, 20_000_000), ONE), at(t0, 20_000_000));
}

#[test]
fn a_burst_allowance_runs_ahead_of_the_rate_once() {
    let t0 = Instant::now();
    let l = Limiter::new(limits(500, 0, 0, 0, 200), t0);
    // 200 ms at 500/s = 100 commands of burst besides the first, then one every 2 ms.
    let starts: Vec<u64> = (0..201).map(|_| us(t0, l.schedule(t0, ONE))).collect();
    assert!(starts[..101].iter().all(|&s| s == 0));
    assert_eq!(starts[101], 2000);
    assert_eq!(starts[200], 200 * 1000);
}

#[test]
fn bandwidth_limits_count_bytes_by_direction() {
    let t0 = Instant::now();
    let read = Cost {
        read: 128 << 10,
        write: 0,
    };
    let write = Cost {
        read: 0,
        write: 128 << 10,
    };
    // 20 MiB/s of reads: 128 KiB every 6.25 ms; read k starts at k × 6.25 ms − 5 ms.
    let l = Limiter::new(limits(0, 20 * MB, 0, 0, 5), t0);
    let mut last = t0;
    for _ in 0..1600 {
        last = l.schedule(t0, read);
    }
    assert_eq!(us(t0, last), 1599 * 6250 - 5000);
    // Writes are not limited by a read limit.
    assert_eq!(l.schedule(t0, write), t0);
    // A total limit takes both directions.
    let l = Limiter::new(limits(0, 0, 0, 20 * MB, 5), t0);
    for _ in 0..800 {
        l.schedule(t0, read);
        last = l.schedule(t0, write);
    }
    assert_eq!(us(t0, last), 1599 * 6250 - 5000);
}

#[test]
fn a_command_larger_than_the_burst_goes_when_nothing_is_owed_and_is_paid_back() {
    let t0 = Instant::now();
    // 1 MiB/s: a 4 MiB write is 4 s of rate, far beyond the 5 ms burst.
    let l = Limiter::new(limits(0, 0, MB, 0, 5), t0);
    let big = Cost {
        read: 0,
        write: 4 * MB,
    };
    assert_eq!(l.schedule(t0, big), t0);
    let small = Cost {
        read: 0,
        write: 4096,
    };
    assert_eq!(
        us(t0, l.schedule(at(t0, 1_000_000), small)),
        4_000_000 - 5_000
    );
}

#[test]
fn no_limit_never_waits_and_a_live_change_starts_afresh() {
    let t0 = Instant::now();
    let l = Limiter::new(QosLimits::default(), t0);
    let big = Cost {
        read: 1 << 20,
        write: 0,
    };
    for _ in 0..10_000 {
        assert_eq!(l.schedule(t0, big), t0);
    }
    let l = Limiter::new(limits(100, 0, 0, 0, 5), t0);
    let mut last = t0;
    for _ in 0..50 {
        last = l.schedule(t0, ONE);
    }
    // 10 ms apart, the 5 ms burst less than one: command k at k × 10 ms − 5 ms.
    assert_eq!(us(t0, last), 485_000);
    let g = l.generation();
    // The same limits again: nothing changes.
    l.set(limits(100, 0, 0, 0, 5));
    assert_eq!(l.generation(), g);
    assert_eq!(us(t0, l.schedule(t0, ONE)), 495_000);
    // Raised to 1000/s at 100 ms: the debt of the old limit is gone.
    l.set(limits(1000, 0, 0, 0, 5));
    assert_ne!(l.generation(), g);
    assert_eq!(l.schedule(at(t0, 100_000), ONE), at(t0, 100_000));
    // Extreme rates: one command a second; and more than the clock tells apart.
    l.set(limits(1, 0, 0, 0, 5));
    let starts: Vec<u64> = (0..3).map(|_| us(t0, l.schedule(t0, ONE))).collect();
    assert_eq!(starts, [0, 1_000_000 - 5_000, 2_000_000 - 5_000]);
    l.set(limits(u64::MAX, u64::MAX, u64::MAX, u64::MAX, 60_000));
    for _ in 0..1000 {
        assert_eq!(l.schedule(t0, big), t0);
    }
}

/// Two reactors' queues schedule on one limiter, in lock step on the same virtual clock,
/// each keeping 8 commands outstanding: together they get the rate, and each about half.
#[test]
fn a_limit_shared_by_two_threads_holds_for_their_sum() {
    use std::sync::Barrier;
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(2000, 0, 0, 0, 5), t0));
    let barrier = Arc::new(Barrier::new(2));
    let steps = 2000u64; // 2 s in 1 ms steps
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (l, barrier) = (Arc::clone(&l), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut done = 0u64;
                let mut outstanding: Vec<Instant> = Vec::new();
                for step in 0..=steps {
                    barrier.wait();
                    let now = at(t0, step * 1000);
                    // Commands whose time came run (and complete at once).
                    outstanding.retain(|&start| {
                        let go = start <= now;
                        done += u64::from(go);
                        !go
                    });
                    while outstanding.len() < 8 {
                        outstanding.push(l.schedule(now, ONE));
                    }
                }
                done
            })
        })
        .collect();
    let per: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let total: u64 = per.iter().sum();
    // 2 s × 2000/s, plus the burst's 10 and the first.
    assert!((4000..=4011).contains(&total), "{per:?}");
    assert!(per.iter().all(|&n| n.abs_diff(total / 2) <= 20), "{per:?}");
}

fn applied(host: Option<&Arc<Limiter>>, ns: &[(u32, &Arc<Limiter>)]) -> Applied {
    Applied {
        host: host.cloned(),
        namespaces: ns.iter().map(|(n, l)| (*n, Arc::clone(l))).collect(),
    }
}

#[test]
fn a_queue_lets_waiting_commands_go_in_arrival_order() {
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(1000, 0, 0, 0, 5), t0));
    let mut q = QueueQos::new(applied(None, &[(1, &l)]));
    // 6 pass at once (the first and the burst), the next 10 wait: cid k until (k - 5) ms.
    let mut held = Vec::new();
    for cid in 0..16u16 {
        match q.gate(cid, 1, ONE, t0) {
            Gate::Pass => assert!(cid < 6),
            Gate::Hold(wake) => {
                assert_eq!(us(t0, wake), (u64::from(cid) - 5) * 1000);
                held.push(cid);
            }
        }
    }
    assert_eq!(q.waiting(), 10);
    // A namespace without a limit is not held behind them.
    assert_eq!(q.gate(100, 2, ONE, t0), Gate::Pass);
    // The transport runs blocked commands in slot order, here the reverse of their arrival:
    // each still goes at its time, so in arrival order, every 0.5 ms run.
    let mut order = Vec::new();
    let mut t = 0;
    while !held.is_empty() {
        t += 500;
        for &cid in held.iter().rev() {
            if q.gate(cid, 1, ONE, at(t0, t)) == Gate::Pass {
                assert!(t >= (u64::from(cid) - 5) * 1000);
                order.push(cid);
            }
        }
        held.retain(|c| !order.contains(c));
    }
    assert_eq!(order, (6..16).collect::<Vec<_>>());
    let counters = l.counters();
    assert_eq!(counters.commands, 16);
    assert_eq!(counters.held_commands, 10);
    // Each waited exactly until its time (a run falls on every whole millisecond).
    assert_eq!(
        counters.held_ns,
        (1..=10).map(|k| k * 1_000_000).sum::<u64>()
    );
}

#[test]
fn removing_or_changing_the_limit_frees_what_it_held_and_forget_stops_waiting() {
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(1, 0, 0, 0, 5), t0));
    let mut q = QueueQos::new(applied(Some(&l), &[]));
    assert_eq!(q.gate(0, 1, ONE, t0), Gate::Pass);
    for cid in 1..8u16 {
        assert!(matches!(q.gate(cid, 1, ONE, t0), Gate::Hold(_)));
    }
    // An aborted command stops waiting.
    q.forget(5, at(t0, 10));
    assert_eq!(q.waiting(), 6);
    assert_eq!(l.counters().held_commands, 1);
    // Raised live to 1000/s: the waiting commands take new places at their next run (the
    // first 6 within the burst, at once).
    l.set(limits(1000, 0, 0, 0, 5));
    for cid in [1u16, 2, 3, 4, 6, 7] {
        assert_eq!(q.gate(cid, 1, ONE, at(t0, 20)), Gate::Pass, "cid {cid}");
    }
    // Back to 1/s, one waits; then the limit goes: it passes at its next run.
    l.set(limits(1, 0, 0, 0, 5));
    assert_eq!(q.gate(8, 1, ONE, at(t0, 30)), Gate::Pass);
    assert!(matches!(q.gate(9, 1, ONE, at(t0, 30)), Gate::Hold(_)));
    q.update(Applied::default());
    assert_eq!(q.gate(9, 1, ONE, at(t0, 40)), Gate::Pass);
    assert!(q.is_idle());
}

#[test]
fn a_command_stopped_after_the_gate_is_not_charged_twice() {
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(1000, 0, 0, 0, 5), t0));
    let mut q = QueueQos::new(applied(None, &[(1, &l)]));
    assert_eq!(q.gate(7, 1, ONE, t0), Gate::Pass);
    q.passed_but_blocked(7);
    assert_eq!(q.gate(7, 1, ONE, t0), Gate::Pass);
    assert_eq!(l.counters().commands, 1);
}

/// Two queues of one host share its limiter: each holds its own commands, the one that runs
/// first at each step cannot starve the other, and together they get the host's rate.
#[test]
fn two_queues_of_one_host_share_its_limit_fairly() {
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(1000, 0, 0, 0, 5), t0));
    let mut queues = [
        QueueQos::new(applied(Some(&l), &[])),
        QueueQos::new(applied(Some(&l), &[])),
    ];
    let mut next_cid = [0u16; 2];
    let mut outstanding: [Vec<u16>; 2] = [Vec::new(), Vec::new()];
    let mut done = [0u64; 2];
    // Each queue keeps 32 commands outstanding (QD32); a passed command completes at once.
    for ms in 0..=1000u64 {
        let now = at(t0, ms * 1000);
        for (i, q) in queues.iter_mut().enumerate() {
            while outstanding[i].len() < 32 {
                outstanding[i].push(next_cid[i]);
                next_cid[i] = next_cid[i].wrapping_add(1);
            }
            let mut still = Vec::new();
            for &cid in &outstanding[i] {
                match q.gate(cid, 1, ONE, now) {
                    Gate::Pass => done[i] += 1,
                    Gate::Hold(_) => still.push(cid),
                }
            }
            outstanding[i] = still;
        }
    }
    let total = done[0] + done[1];
    assert!((1000..=1006).contains(&total), "{done:?}");
    assert!(done[0].abs_diff(done[1]) <= 40, "{done:?}");
}

#[test]
fn only_commands_whose_time_came_are_worth_running_again() {
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(1000, 0, 0, 0, 5), t0));
    let mut q = QueueQos::new(applied(None, &[(1, &l)]));
    for cid in 0..8u16 {
        q.gate(cid, 1, ONE, t0);
    }
    // 6 passed; 6 and 7 wait until 1 and 2 ms. Other CIDs (blocked for other reasons) run.
    assert!(!q.may_run(6, at(t0, 500)));
    assert!(!q.may_run(7, at(t0, 999)));
    assert!(q.may_run(100, at(t0, 500)));
    assert!(q.may_run(6, at(t0, 1000)));
    assert_eq!(q.gate(6, 1, ONE, at(t0, 1000)), Gate::Pass);
    assert!(!q.may_run(7, at(t0, 1500)));
    q.forget(7, at(t0, 1600));
    assert!(q.may_run(7, at(t0, 1700)));
}

#[test]
fn the_queue_knows_when_its_first_waiting_command_may_start() {
    let t0 = Instant::now();
    let l = Arc::new(Limiter::new(limits(1000, 0, 0, 0, 5), t0));
    let mut q = QueueQos::new(applied(None, &[(1, &l)]));
    assert_eq!(q.earliest(), None);
    for cid in 0..9u16 {
        q.gate(cid, 1, ONE, t0);
    }
    assert_eq!(q.earliest(), Some(at(t0, 1000)));
    assert_eq!(q.gate(6, 1, ONE, at(t0, 1000)), Gate::Pass);
    assert_eq!(q.earliest(), Some(at(t0, 2000)));
    // A change: unknown until the next run, which finds it again.
    q.update(applied(None, &[(1, &l)]));
    assert_eq!(q.earliest(), None);
    assert!(q.may_run(7, at(t0, 1500)));
    assert_eq!(q.gate(7, 1, ONE, at(t0, 1500)), Gate::Hold(at(t0, 2000)));
    // Known again once every waiting command ran since the change.
    assert_eq!(q.earliest(), None);
    assert!(q.may_run(8, at(t0, 1500)));
    assert_eq!(q.gate(8, 1, ONE, at(t0, 1500)), Gate::Hold(at(t0, 3000)));
    assert_eq!(q.earliest(), Some(at(t0, 2000)));
}

#[test]
fn a_limit_without_a_burst_gets_the_default_one() {
    let t0 = Instant::now();
    let l = Limiter::new(limits(1000, 0, 0, 0, 0), t0);
    // 100 ms of 1000/s: 100 commands ahead, and the first.
    let starts: Vec<u64> = (0..102).map(|_| us(t0, l.schedule(t0, ONE))).collect();
    assert!(starts[..101].iter().all(|&s| s == 0));
    assert_eq!(starts[101], 1000);
    // Below the minimum: the minimum.
    let l = Limiter::new(limits(1000, 0, 0, 0, 1), t0);
    assert_eq!((0..7).filter(|_| l.schedule(t0, ONE) == t0).count(), 6);
}
