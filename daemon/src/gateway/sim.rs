//! An in-memory RADOS for the gateway group: exclusive group locks and shared membership locks
//! that expire on the cluster's (virtual) clock, owner records, and a blocklist that makes
//! every later operation of a fenced instance fail. Gateways run [`round`] against it; the
//! tests freeze, kill, partition and restart them, jump their clocks, and check after every
//! step that no ANA group has two gateways that report Optimized and can still write.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Mutex;

use nvme::ana::AnaState;

use super::lease::{Fault, Instance, Machine, Ms, Record, Settings, Step, Survey};
use super::round::{round, Clock, Sink, Store};

/// The cluster: one shared virtual clock, every object.
#[derive(Debug, Default)]
pub struct Cluster {
    pub now: Cell<Ms>,
    state: RefCell<Objects>,
}

#[derive(Debug, Default)]
struct Objects {
    /// Group → holder and expiry.
    locks: BTreeMap<u32, (Instance, Ms)>,
    /// Member client → instance and expiry.
    members: BTreeMap<String, (Instance, Ms)>,
    records: BTreeMap<u32, Record>,
    blocklist: BTreeSet<String>,
    /// Clients whose requests never arrive (a network cut).
    cut: BTreeSet<String>,
}

/// Cost of one RADOS round trip and of a blocklist (a monitor commit), in virtual ms.
const OP_MS: Ms = 3;
const BLOCKLIST_MS: Ms = 40;
const TIMEOUT_MS: Ms = 500;

impl Cluster {
    fn tick(&self, ms: Ms) {
        self.now.set(self.now.get() + ms);
    }

    pub fn is_blocklisted(&self, addr: &str) -> bool {
        self.state.borrow().blocklist.contains(addr)
    }

    pub fn blocklisted(&self) -> usize {
        self.state.borrow().blocklist.len()
    }

    pub fn cut(&self, client: &str, cut: bool) {
        let mut s = self.state.borrow_mut();
        if cut {
            s.cut.insert(client.to_owned());
        } else {
            s.cut.remove(client);
        }
    }

    /// Runs one operation of `who`: a cut client times out, a blocklisted one is refused.
    fn op<T>(
        &self,
        who: &Instance,
        cost: Ms,
        f: impl FnOnce(&mut Objects, Ms) -> Result<T, Fault>,
    ) -> Result<T, Fault> {
        if self.state.borrow().cut.contains(&who.client) {
            self.tick(TIMEOUT_MS);
            return Err(Fault::Other(libc::ETIMEDOUT));
        }
        self.tick(cost);
        let now = self.now.get();
        let mut s = self.state.borrow_mut();
        if s.blocklist.contains(&who.addr) {
            return Err(Fault::Blocklisted);
        }
        s.locks.retain(|_, (_, exp)| *exp > now);
        s.members.retain(|_, (_, exp)| *exp > now);
        f(&mut s, now)
    }
}

/// One gateway instance's view of the cluster.
pub struct SimStore<'a> {
    pub cluster: &'a Cluster,
    pub me: Instance,
    pub lease: Ms,
}

impl Store for SimStore<'_> {
    fn renew_member(&self) -> Result<(), Fault> {
        let (me, lease) = (self.me.clone(), self.lease);
        self.cluster.op(&self.me, OP_MS, |s, now| {
            s.members.insert(me.client.clone(), (me, now + lease));
            Ok(())
        })
    }

    fn survey(&self, groups: &[u32]) -> Result<Survey, Fault> {
        self.cluster
            .op(&self.me, OP_MS * (1 + groups.len() as Ms), |s, _| {
                Ok(Survey {
                    members: s.members.values().map(|(i, _)| i.clone()).collect(),
                    groups: groups
                        .iter()
                        .map(|&g| {
                            let holder = s.locks.get(&g).map(|(i, _)| i.clone());
                            let record = s.records.get(&g).cloned().unwrap_or(Record::None);
                            (g, (holder, record))
                        })
                        .collect(),
                })
            })
    }

    fn renew(&self, group: u32) -> Result<(), Fault> {
        let (me, lease) = (self.me.clone(), self.lease);
        self.cluster
            .op(&self.me, OP_MS, |s, now| match s.locks.get_mut(&group) {
                Some((holder, exp)) if *holder == me => {
                    *exp = now + lease;
                    Ok(())
                }
                _ => Err(Fault::Lost),
            })
    }

    fn blocklist(&self, addr: &str) -> Result<(), Fault> {
        self.cluster.op(&self.me, BLOCKLIST_MS, |s, _| {
            s.blocklist.insert(addr.to_owned());
            Ok(())
        })
    }

    fn break_lock(&self, group: u32, holder: &Instance) -> Result<(), Fault> {
        self.cluster.op(&self.me, OP_MS, |s, _| {
            if s.locks.get(&group).is_some_and(|(h, _)| h == holder) {
                s.locks.remove(&group);
            }
            Ok(())
        })
    }

    fn lock(&self, group: u32) -> Result<(), Fault> {
        let (me, lease) = (self.me.clone(), self.lease);
        self.cluster
            .op(&self.me, OP_MS, |s, now| match s.locks.get(&group) {
                Some((holder, _)) if *holder != me => Err(Fault::Busy),
                _ => {
                    s.locks.insert(group, (me, now + lease));
                    Ok(())
                }
            })
    }

    fn write_record(&self, group: u32, record: &Record) -> Result<(), Fault> {
        let record = record.clone();
        self.cluster.op(&self.me, OP_MS, |s, _| {
            s.records.insert(group, record);
            Ok(())
        })
    }

    fn unlock(&self, group: u32) -> Result<(), Fault> {
        let me = self.me.clone();
        self.cluster.op(&self.me, OP_MS, |s, _| {
            if s.locks.get(&group).is_some_and(|(h, _)| *h == me) {
                s.locks.remove(&group);
                Ok(())
            } else {
                Err(Fault::Lost)
            }
        })
    }
}

/// A gateway's monotonic clock: the cluster's plus its own offset (a clock jump moves it).
pub struct SimClock {
    cluster: Rc<Cluster>,
    offset: Rc<Cell<Ms>>,
}

impl Clock for SimClock {
    fn now(&self) -> Ms {
        self.cluster.now.get() + self.offset.get()
    }
}

/// What a gateway reports, as the hosts see it.
#[derive(Debug)]
pub struct Reported {
    pub ana: BTreeMap<u32, AnaState>,
    pub fenced: bool,
    /// (cluster time, group, state, reason label).
    pub changes: Vec<(Ms, u32, AnaState, String)>,
    clock: Rc<Cluster>,
    pub renewals: u64,
}

impl Sink for Reported {
    fn step(&mut self, step: Step) {
        match step {
            Step::Ana {
                group,
                state,
                reason,
            } => {
                self.ana.insert(group, state);
                let at = self.clock.now.get();
                self.changes
                    .push((at, group, state, reason.label().to_owned()));
            }
            Step::Fenced => self.fenced = true,
            _ => unreachable!("RADOS steps stay in the round"),
        }
    }

    fn renew_latency(&mut self, _ms: Ms) {
        self.renewals += 1;
    }
}

/// One gateway process: its instance, machine and what it reports.
pub struct Gateway {
    pub machine: Mutex<Machine>,
    pub me: Instance,
    pub reported: Reported,
    pub offset: Rc<Cell<Ms>>,
    /// Frozen (SIGSTOP): runs nothing, reports what it last reported.
    pub frozen: bool,
    /// Dead (SIGKILL): serves nothing.
    pub dead: bool,
}

/// Settings of a test group: gateways a, b, c preferring groups 1, 2, 3.
pub fn settings() -> Settings {
    Settings {
        members: vec!["a".into(), "b".into(), "c".into()],
        groups: vec![1, 2, 3],
        preferred: [(1, "a".into()), (2, "b".into()), (3, "c".into())].into(),
        lease: 5000,
        renew: 1000,
        failback_hold: 15000,
        handover_drain: 2000,
        standby: AnaState::Inaccessible,
    }
}

/// The cluster and the gateways, with the invariant check.
pub struct World {
    pub cluster: Rc<Cluster>,
    pub gateways: BTreeMap<String, Gateway>,
    next_instance: u64,
}

impl World {
    pub fn new(ids: &[&str]) -> World {
        let mut w = World {
            cluster: Rc::new(Cluster::default()),
            gateways: BTreeMap::new(),
            next_instance: 4100,
        };
        for id in ids {
            w.start(id);
        }
        w
    }

    /// Starts (or restarts) gateway `id` as a new client instance.
    pub fn start(&mut self, id: &str) {
        self.next_instance += 1;
        let n = self.next_instance;
        let me = Instance {
            gateway: id.to_owned(),
            client: format!("client.{n}"),
            addr: format!("v1:127.0.0.1:0/{n}"),
        };
        let now = self.cluster.now.get();
        let machine = Machine::new(settings(), me.clone(), now);
        let mut reported = Reported {
            ana: BTreeMap::new(),
            fenced: false,
            changes: Vec::new(),
            clock: Rc::clone(&self.cluster),
            renewals: 0,
        };
        for g in [1, 2, 3] {
            reported.ana.insert(g, AnaState::Inaccessible);
        }
        self.gateways.insert(
            id.to_owned(),
            Gateway {
                machine: Mutex::new(machine),
                me,
                reported,
                offset: Rc::new(Cell::new(0)),
                frozen: false,
                dead: false,
            },
        );
    }

    /// One round of gateway `id` (nothing when frozen or dead).
    pub fn round(&mut self, id: &str) {
        let gw = self.gateways.get_mut(id).unwrap();
        if gw.frozen || gw.dead || gw.reported.fenced {
            return;
        }
        let store = SimStore {
            cluster: &self.cluster,
            me: gw.me.clone(),
            lease: 5000,
        };
        let clock = SimClock {
            cluster: Rc::clone(&self.cluster),
            offset: Rc::clone(&gw.offset),
        };
        round(&gw.machine, &store, &clock, &mut gw.reported);
        self.check();
    }

    /// The clock thread of gateway `id`.
    pub fn tick(&mut self, id: &str) {
        let gw = self.gateways.get_mut(id).unwrap();
        if gw.frozen || gw.dead || gw.reported.fenced {
            return;
        }
        let now = self.cluster.now.get() + gw.offset.get();
        let steps = gw.machine.lock().unwrap().tick(now);
        for s in steps {
            gw.reported.step(s);
        }
        self.check();
    }

    /// Advances the cluster clock by `ms`, every live gateway ticking and running a round
    /// every `renew` ms in a fixed order.
    pub fn run(&mut self, ms: Ms) {
        let end = self.cluster.now.get() + ms;
        while self.cluster.now.get() < end {
            let ids: Vec<String> = self.gateways.keys().cloned().collect();
            for id in &ids {
                self.tick(id);
                self.round(id);
            }
            let now = self.cluster.now.get();
            self.cluster.now.set(now + 1000 - now % 1000);
        }
    }

    /// Gateways that report Optimized for `group` and whose writes would reach the OSDs.
    pub fn writers(&self, group: u32) -> Vec<String> {
        self.gateways
            .values()
            .filter(|g| !g.dead)
            .filter(|g| g.reported.ana.get(&group) == Some(&AnaState::Optimized))
            .filter(|g| !self.cluster.is_blocklisted(&g.me.addr))
            .map(|g| g.me.gateway.clone())
            .collect()
    }

    /// The safety property: never two owners that can both write.
    pub fn check(&self) {
        for g in [1, 2, 3] {
            let w = self.writers(g);
            assert!(
                w.len() <= 1,
                "group {g} has writers {w:?} at {}",
                self.cluster.now.get()
            );
        }
    }

    pub fn owner(&self, group: u32) -> Option<String> {
        let w = self.writers(group);
        assert!(w.len() <= 1);
        w.into_iter().next()
    }

    pub fn gw(&mut self, id: &str) -> &mut Gateway {
        self.gateways.get_mut(id).unwrap()
    }
}

#[cfg(test)]
mod tests {
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
}
