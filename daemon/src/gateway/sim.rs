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
mod tests;
