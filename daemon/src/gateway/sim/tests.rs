use super::*;

fn owners(w: &World) -> Vec<Option<String>> {
    [1, 2, 3].iter().map(|&g| w.owner(g)).collect()
}

fn some(v: &[&str]) -> Vec<Option<String>> {
    v.iter().map(|s| Some((*s).to_owned())).collect()
}

#[test]
fn cold_start_gives_each_group_to_its_preferred_gateway() {
    let mut w = World::new(&["a", "b", "c"]);
    w.run(3000);
    assert_eq!(owners(&w), some(&["a", "b", "c"]));
    assert_eq!(w.cluster.blocklisted(), 0);
    // Renewals keep them.
    w.run(60_000);
    assert_eq!(owners(&w), some(&["a", "b", "c"]));
    for id in ["a", "b", "c"] {
        assert!(w.gw(id).reported.renewals > 50);
        assert_eq!(w.gw(id).machine.lock().unwrap().counts().losses, 0);
    }
}

#[test]
fn a_killed_owner_is_fenced_and_its_group_moves_within_lease_and_two_rounds() {
    let mut w = World::new(&["a", "b", "c"]);
    w.run(3000);
    w.gw("a").dead = true;
    let killed = w.cluster.now.get();
    let mut moved = None;
    for _ in 0..20 {
        w.run(1000);
        if w.owner(1).is_some() {
            moved = Some(w.cluster.now.get() - killed);
            break;
        }
    }
    let moved = moved.expect("group 1 taken over");
    assert!(moved <= 5000 + 2000, "took {moved} ms");
    assert!(w.cluster.is_blocklisted(&w.gateways["a"].me.addr.clone()));
    // Spread: the survivor with fewer groups (ties in member order) took it.
    assert_eq!(w.owner(1).as_deref(), Some("b"));
    assert_eq!(w.owner(2).as_deref(), Some("b"));
    assert_eq!(w.owner(3).as_deref(), Some("c"));
}

#[test]
fn a_frozen_owner_is_fenced_writes_nothing_after_waking_and_fails_back_after_restart() {
    let mut w = World::new(&["a", "b", "c"]);
    w.run(3000);
    w.gw("a").frozen = true;
    w.run(60_000);
    // While a sleeps it still "reports" Optimized, but it is blocklisted: no writer.
    assert_eq!(w.gateways["a"].reported.ana[&1], AnaState::Optimized);
    assert!(w.cluster.is_blocklisted(&w.gateways["a"].me.addr.clone()));
    assert_eq!(w.owner(1).as_deref(), Some("b"));
    // Woken: its clock thread sees the lease long gone; its first RADOS call says fenced.
    w.gw("a").frozen = false;
    w.tick("a");
    assert_eq!(w.gateways["a"].reported.ana[&1], AnaState::Inaccessible);
    w.round("a");
    assert!(w.gw("a").reported.fenced);
    // Restarted as a new instance: back after the hold-down, handed over without fencing.
    let fences = w.cluster.blocklisted();
    w.start("a");
    w.run(10_000);
    assert_eq!(w.owner(1).as_deref(), Some("b"), "hold-down not yet over");
    w.run(15_000);
    assert_eq!(owners(&w), some(&["a", "b", "c"]));
    assert_eq!(w.cluster.blocklisted(), fences, "a handback fences nobody");
    let b = w.gw("b").machine.lock().unwrap().counts();
    assert_eq!((b.takeovers, b.fences, b.handbacks), (2, 1, 1));
}

#[test]
fn a_gateway_cut_off_from_ceph_stops_serving_before_anyone_takes_over() {
    let mut w = World::new(&["a", "b", "c"]);
    w.run(3000);
    let client = w.gateways["a"].me.client.clone();
    w.cluster.cut(&client, true);
    let cut_at = w.cluster.now.get();
    // a's renewals time out: its own deadline (lease − renew after the last renewal sent)
    // puts it in standby before the OSD's lease ends and b fences it.
    w.run(20_000);
    let a_standby = w.gateways["a"]
        .reported
        .changes
        .iter()
        .find(|c| c.1 == 1 && c.2 != AnaState::Optimized)
        .unwrap()
        .0;
    let b_owner = w.gateways["b"]
        .reported
        .changes
        .iter()
        .find(|c| c.1 == 1 && c.2 == AnaState::Optimized)
        .unwrap()
        .0;
    assert!(
        a_standby < b_owner,
        "a in standby at {a_standby}, b owner at {b_owner}"
    );
    assert!(
        b_owner - cut_at <= 5000 + 2000,
        "b owner {} ms after the cut",
        b_owner - cut_at
    );
    assert_eq!(w.owner(1).as_deref(), Some("b"));
    assert!(w.cluster.is_blocklisted(&w.gateways["a"].me.addr.clone()));
    // Healed: a learns it is fenced.
    w.cluster.cut(&client, false);
    w.run(2000);
    assert!(w.gw("a").reported.fenced);
    assert_eq!(w.gateways["a"].reported.ana[&1], AnaState::Inaccessible);
}

#[test]
fn two_gateways_contending_for_one_group_never_both_own_it() {
    // Neither prefers group 3 once c is gone; a and b both compute an owner for it.
    let mut w = World::new(&["a", "b"]);
    for _ in 0..200 {
        w.run(1000);
        w.check();
    }
    assert!(w.owner(3).is_some());
    assert_eq!(w.cluster.blocklisted(), 0);
}

/// A tiny deterministic PRNG (xorshift64*), so that a failing seed replays exactly.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_freezes_kills_cuts_restarts_and_clock_jumps_never_make_two_writers() {
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut w = World::new(&["a", "b", "c"]);
        for _ in 0..400 {
            let id = ["a", "b", "c"][rng.below(3) as usize];
            match rng.below(20) {
                0 => w.gw(id).frozen = !w.gw(id).frozen,
                1 if rng.below(4) == 0 => w.gw(id).dead = true,
                2 => {
                    let c = w.gateways[id].me.client.clone();
                    let cut = rng.below(2) == 0;
                    w.cluster.cut(&c, cut);
                }
                3 => {
                    let g = &w.gateways[id];
                    if g.dead || g.reported.fenced {
                        w.start(id);
                    }
                }
                // A forward jump of the gateway's monotonic clock (a long stall seen
                // only by it).
                4 => {
                    let jump = rng.below(20_000);
                    let o = &w.gw(id).offset;
                    o.set(o.get() + jump);
                }
                _ => {}
            }
            // Uneven scheduling: rounds and ticks at random moments.
            let step = rng.below(700);
            let now = w.cluster.now.get();
            w.cluster.now.set(now + step);
            if rng.below(2) == 0 {
                w.round(id);
            } else {
                w.tick(id);
            }
            w.check();
        }
    }
}
