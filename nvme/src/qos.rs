//! Quality of service: IOPS and bandwidth limits on a namespace (all hosts together) or on a
//! host of a subsystem (all its controllers and queues), shared by every reactor.
//!
//! Method: each limited quantity (commands, read bytes, write bytes, all bytes) is a GCRA
//! bucket (the generic cell rate algorithm, ITU-T I.371) held in one `AtomicU64`: its
//! theoretical arrival time (TAT), in nanoseconds of a monotonic clock since the limiter's
//! epoch. A command of cost `c` arriving at `now` is scheduled at
//! `start = max(now, TAT - burst)` and moves TAT to `max(TAT, start) + c / rate` (one CAS).
//! If `start` is `now` it runs at once; otherwise it keeps its place: it waits in its queue
//! until `start`. Every queue of every reactor schedules on the same atomic, so a limit
//! shared by queues on several reactors is exact over time, with no per-reactor shares to
//! rebalance, and commands go in the order they arrived across all those queues (no queue
//! can starve another by polling first). A command larger than the burst is scheduled like
//! any other and puts the bucket in debt for its size, so none is refused for its size. A
//! command limited by its host and its namespace is scheduled on both and waits for the
//! later time. An aborted waiting command's place is not given back (its share of the rate
//! is lost). A limit changed live starts its buckets afresh and the waiting commands take a
//! new place on them at their next run.
//!
//! Sans-I/O: every function takes `now`; nothing here reads a clock or sleeps. A command that
//! must wait returns `Outcome::Blocked` to its transport, and its queue asks the reactor for a
//! wake-up (`IoSubmit::wake_at`) at its time; the transport runs it again then.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes in the MB of the `*_mbps` limits (MiB, as SPDK's and Ceph's `*_mbytes_per_sec`).
pub const MB: u64 = 1 << 20;
/// The burst of a limit that gives none: a waiting command starts when its reactor wakes up,
/// and a reactor is woken late on a busy machine (another process on its CPU, a hypervisor);
/// the host's next commands then arrive after their places, and the time in between would be
/// lost to the rate. 100 ms of the rate absorbs such delays (the Linux block throttle works in
/// slices of the same length) and lets at most that much run ahead after an idle spell.
pub const DEFAULT_BURST: Duration = Duration::from_millis(100);
/// The smallest burst that may be configured: reactor wake-ups are timed to the millisecond.
pub const MIN_BURST: Duration = Duration::from_millis(5);

/// Limits of one namespace or one host; 0 = no limit on that quantity. Bytes are data bytes
/// of Read (and Compare) and Write commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// Commands per second (Read, Write, Compare, Write Zeroes, Copy, Verify together).
    pub iops: u64,
    pub read_bytes_per_sec: u64,
    pub write_bytes_per_sec: u64,
    pub total_bytes_per_sec: u64,
    /// How far ahead of the rate a burst may run (each limit may take this much of its rate
    /// at once); zero: [`DEFAULT_BURST`], else at least [`MIN_BURST`].
    pub burst: Duration,
}

impl QosLimits {
    /// No quantity is limited.
    pub fn is_unlimited(&self) -> bool {
        self.iops == 0
            && self.read_bytes_per_sec == 0
            && self.write_bytes_per_sec == 0
            && self.total_bytes_per_sec == 0
    }
}

/// What a command costs: one command, and its data bytes in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub read: u64,
    pub write: u64,
}

/// One rate: a GCRA bucket (see the module documentation).
#[derive(Debug, Default)]
struct Bucket {
    /// Theoretical arrival time, ns since the limiter's epoch.
    tat: AtomicU64,
    /// Nanoseconds per unit as 32.32 fixed point (rounded up, so the rate is never exceeded);
    /// 0 = unlimited.
    ns_per_unit: AtomicU64,
}

impl Bucket {
    fn set_rate(&self, per_sec: u64) {
        let fp = if per_sec == 0 {
            0
        } else {
            let scaled = (1_000_000_000u128 << 32).div_ceil(per_sec as u128);
            scaled.min(u64::MAX as u128) as u64
        };
        self.ns_per_unit.store(fp, Ordering::Relaxed);
        self.tat.store(0, Ordering::Relaxed);
    }

    /// Schedules `units` arriving at `now_ns`: the time (ns) they may start, `now_ns` when
    /// at once (see the module documentation).
    #[inline]
    fn schedule(&self, now_ns: u64, units: u64, burst_ns: u64) -> u64 {
        let fp = self.ns_per_unit.load(Ordering::Relaxed);
        if fp == 0 {
            return now_ns;
        }
        let cost = ((units as u128 * fp as u128).div_ceil(1 << 32)).min(u64::MAX as u128) as u64;
        let mut start = now_ns;
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                start = now_ns.max(tat.saturating_sub(burst_ns));
                Some(tat.max(start).saturating_add(cost))
            });
        start
    }
}

/// Counters of a limiter: what it admitted and how long commands waited for it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QosCounters {
    pub commands: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Commands that waited before they were admitted (or aborted while waiting).
    pub held_commands: u64,
    /// Total time those commands waited, in nanoseconds.
    pub held_ns: u64,
}

/// The limits of one namespace or host, shared by every queue they apply to.
#[derive(Debug)]
pub struct Limiter {
    epoch: Instant,
    limits: Mutex<QosLimits>,
    burst_ns: AtomicU64,
    iops: Bucket,
    read: Bucket,
    write: Bucket,
    total: Bucket,
    commands: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    held_commands: AtomicU64,
    held_ns: AtomicU64,
    generation: AtomicU64,
}

impl Limiter {
    /// A limiter whose clock starts at `epoch` (every `now` given to it is later).
    pub fn new(limits: QosLimits, epoch: Instant) -> Self {
        let l = Self {
            epoch,
            limits: Mutex::new(QosLimits::default()),
            burst_ns: AtomicU64::new(0),
            iops: Bucket::default(),
            read: Bucket::default(),
            write: Bucket::default(),
            total: Bucket::default(),
            commands: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            held_commands: AtomicU64::new(0),
            held_ns: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        };
        l.set(limits);
        l
    }

    /// Changes the limits live: the buckets start afresh (no debt, the whole burst), and
    /// commands waiting for the old limits take a new place at their next run. The same
    /// limits again change nothing.
    pub fn set(&self, limits: QosLimits) {
        let mut current = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        if *current == limits && self.generation() > 0 {
            return;
        }
        let burst = if limits.burst.is_zero() {
            DEFAULT_BURST
        } else {
            limits.burst.max(MIN_BURST)
        };
        let burst_ns = burst.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.burst_ns.store(burst_ns, Ordering::Relaxed);
        self.iops.set_rate(limits.iops);
        self.read.set_rate(limits.read_bytes_per_sec);
        self.write.set_rate(limits.write_bytes_per_sec);
        self.total.set_rate(limits.total_bytes_per_sec);
        *current = limits;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn limits(&self) -> QosLimits {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn counters(&self) -> QosCounters {
        QosCounters {
            commands: self.commands.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            held_commands: self.held_commands.load(Ordering::Relaxed),
            held_ns: self.held_ns.load(Ordering::Relaxed),
        }
    }

    fn ns(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn instant(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }

    /// Schedules a command of `cost` arriving at `now`: when it may start (`now`: at once).
    pub fn schedule(&self, now: Instant, cost: Cost) -> Instant {
        let now_ns = self.ns(now);
        let burst = self.burst_ns.load(Ordering::Relaxed);
        let mut start = self.iops.schedule(now_ns, 1, burst);
        if cost.read > 0 {
            start = start.max(self.read.schedule(now_ns, cost.read, burst));
        }
        if cost.write > 0 {
            start = start.max(self.write.schedule(now_ns, cost.write, burst));
        }
        if cost.read + cost.write > 0 {
            start = start.max(self.total.schedule(now_ns, cost.read + cost.write, burst));
        }
        if start == now_ns {
            now
        } else {
            self.instant(start)
        }
    }

    /// Counts a command that starts now.
    fn count(&self, cost: Cost) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        if cost.read > 0 {
            self.read_bytes.fetch_add(cost.read, Ordering::Relaxed);
        }
        if cost.write > 0 {
            self.write_bytes.fetch_add(cost.write, Ordering::Relaxed);
        }
    }

    /// Bumped by every change of the limits: commands scheduled before it take a new place.
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A command that waited `held` for this limiter went on (or was aborted).
    fn note_held(&self, held: Duration) {
        self.held_commands.fetch_add(1, Ordering::Relaxed);
        self.held_ns
            .fetch_add(held.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The QoS limits of one subsystem as configured: per namespace (NSID) and per host NQN.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct QosConfig {
    pub namespaces: BTreeMap<u32, QosLimits>,
    pub hosts: BTreeMap<String, QosLimits>,
}

impl QosConfig {
    /// The same limits without the entries that limit nothing.
    pub fn limited(&self) -> QosConfig {
        QosConfig {
            namespaces: self
                .namespaces
                .iter()
                .filter(|(_, l)| !l.is_unlimited())
                .map(|(n, l)| (*n, *l))
                .collect(),
            hosts: self
                .hosts
                .iter()
                .filter(|(_, l)| !l.is_unlimited())
                .map(|(h, l)| (h.clone(), *l))
                .collect(),
        }
    }
}

/// The limiters of one subsystem: per namespace (NSID) and per host NQN (limited ones only).
#[derive(Debug, Default, Clone)]
pub struct QosTable {
    pub namespaces: Vec<(u32, Arc<Limiter>)>,
    pub hosts: Vec<(String, Arc<Limiter>)>,
}

impl QosTable {
    /// The limits this table was built from.
    pub fn config(&self) -> QosConfig {
        QosConfig {
            namespaces: self
                .namespaces
                .iter()
                .map(|(n, l)| (*n, l.limits()))
                .collect(),
            hosts: self
                .hosts
                .iter()
                .map(|(h, l)| (h.clone(), l.limits()))
                .collect(),
        }
    }

    pub fn namespace(&self, nsid: u32) -> Option<&Arc<Limiter>> {
        self.namespaces
            .iter()
            .find(|(n, _)| *n == nsid)
            .map(|(_, l)| l)
    }

    pub fn host(&self, hostnqn: &str) -> Option<&Arc<Limiter>> {
        self.hosts
            .iter()
            .find(|(h, _)| h == hostnqn)
            .map(|(_, l)| l)
    }

    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.hosts.is_empty()
    }

    /// The limiters a queue of `hostnqn` applies: its host's and every namespace's.
    pub fn for_host(&self, hostnqn: &str) -> Applied {
        Applied {
            host: self
                .hosts
                .iter()
                .find(|(h, _)| h == hostnqn)
                .map(|(_, l)| Arc::clone(l)),
            namespaces: self.namespaces.clone(),
        }
    }
}

/// The limiters that apply to one queue.
#[derive(Debug, Default, Clone)]
pub struct Applied {
    pub host: Option<Arc<Limiter>>,
    pub namespaces: Vec<(u32, Arc<Limiter>)>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.host.is_none() && self.namespaces.is_empty()
    }

    fn namespace(&self, nsid: u32) -> Option<&Arc<Limiter>> {
        self.namespaces
            .iter()
            .find(|(n, _)| *n == nsid)
            .map(|(_, l)| l)
    }
}

/// A command waiting in its queue.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    cid: u16,
    nsid: u32,
    /// When it first waited (the held time).
    since: Instant,
    /// When its limiters let it start.
    start: Instant,
    /// The generations of its host's and namespace's limiters when it was scheduled.
    generations: (u64, u64),
    /// Looked at since the queue's limiters last changed (`start` holds for them).
    fresh: bool,
}

/// What a queue's QoS gate decided for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// It may start now.
    Pass,
    /// It waits; the transport runs it again after a wake-up at (or after) this time.
    Hold(Instant),
}

/// QoS state of one I/O queue: the limiters that apply to it and the commands they hold, in
/// arrival order. Only present on queues some limit applies to (or that still hold commands
/// of a limit just removed): an unlimited queue pays nothing.
#[derive(Debug, Default)]
pub struct QueueQos {
    applied: Applied,
    waiting: Vec<Waiting>,
    /// Commands that passed the gate but were stopped after it (a fused pair's write lock):
    /// their next run passes without being scheduled again.
    passed: Vec<u16>,
    /// The CIDs of `waiting`, in the same order (scanned by `may_run` on every transport
    /// poll: kept small and contiguous).
    cids: Vec<u16>,
    /// No waiting command may start before this (`None`: unknown, e.g. after a change).
    earliest: Option<Instant>,
}

fn generation(l: Option<&Arc<Limiter>>) -> u64 {
    l.map_or(0, |l| l.generation())
}

impl QueueQos {
    pub fn new(applied: Applied) -> Self {
        Self {
            applied,
            ..Self::default()
        }
    }

    /// New limiters (a change published since): waiting commands are looked at again at
    /// their next run.
    pub fn update(&mut self, applied: Applied) {
        self.applied = applied;
        // Each waiting command must run again to learn its new place.
        for w in &mut self.waiting {
            w.fresh = false;
        }
        self.earliest = None;
    }

    /// Whether running command `cid` again at `now` can change anything: `false` for a
    /// command waiting for its limits whose time has not come, so that transports do not run
    /// every waiting command on every poll.
    #[inline]
    pub fn may_run(&self, cid: u16, now: Instant) -> bool {
        match self.earliest {
            Some(at) if now < at => !self.cids.contains(&cid),
            _ => true,
        }
    }

    /// When the first waiting command may start (`None`: none waits, or not known).
    pub fn earliest(&self) -> Option<Instant> {
        self.earliest
    }

    /// Recomputes `cids` and `earliest` after the waiting commands changed.
    fn settle(&mut self) {
        settle(&self.waiting, &mut self.cids, &mut self.earliest);
    }

    /// Whether this queue neither has limits nor holds anything (the state can go).
    pub fn is_idle(&self) -> bool {
        self.applied.is_empty() && self.waiting.is_empty() && self.passed.is_empty()
    }

    /// Whether this queue holds commands.
    pub fn holds(&self) -> bool {
        !self.waiting.is_empty() || !self.passed.is_empty()
    }

    /// Commands waiting for their limiters.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn limiters(&self, nsid: u32) -> (Option<&Arc<Limiter>>, Option<&Arc<Limiter>>) {
        (self.applied.host.as_ref(), self.applied.namespace(nsid))
    }

    /// The gate for command `cid` of namespace `nsid` costing `cost`, run (again) at `now`.
    pub fn gate(&mut self, cid: u16, nsid: u32, cost: Cost, now: Instant) -> Gate {
        if !self.passed.is_empty() {
            if let Some(i) = self.passed.iter().position(|&c| c == cid) {
                self.passed.swap_remove(i);
                return Gate::Pass;
            }
        }
        let (host, ns) = (self.applied.host.as_ref(), self.applied.namespace(nsid));
        let generations = (generation(host), generation(ns));
        match self.waiting.iter().position(|w| w.cid == cid) {
            None => {
                if host.is_none() && ns.is_none() {
                    return Gate::Pass;
                }
                let start = schedule(host, ns, now, cost);
                if start <= now {
                    count(host, ns, cost);
                    return Gate::Pass;
                }
                self.waiting.push(Waiting {
                    cid,
                    nsid,
                    since: now,
                    start,
                    generations,
                    fresh: true,
                });
                self.cids.push(cid);
                self.earliest = self.earliest.map(|e| e.min(start));
                if self.waiting.len() == 1 {
                    self.earliest = Some(start);
                }
                Gate::Hold(start)
            }
            Some(i) => {
                let w = &mut self.waiting[i];
                let mut moved = !w.fresh;
                w.fresh = true;
                if host.is_none() && ns.is_none() {
                    // Its limits were removed.
                    w.start = now;
                } else if w.generations != generations {
                    // Its limits changed: a new place on the new buckets.
                    w.start = schedule(host, ns, now, cost);
                    w.generations = generations;
                    moved = true;
                }
                if w.start > now {
                    let start = w.start;
                    if moved {
                        self.settle();
                    }
                    return Gate::Hold(start);
                }
                let w = self.waiting.remove(i);
                settle(&self.waiting, &mut self.cids, &mut self.earliest);
                let held = now.saturating_duration_since(w.since);
                for l in [host, ns].into_iter().flatten() {
                    l.note_held(held);
                }
                count(host, ns, cost);
                Gate::Pass
            }
        }
    }

    /// Whether command `cid` waits for its limits.
    pub fn is_waiting(&self, cid: u16) -> bool {
        self.cids.contains(&cid)
    }

    /// Command `cid` passed the gate but could not start (e.g. behind a fused pair's write
    /// lock): its next run passes without being scheduled again.
    pub fn passed_but_blocked(&mut self, cid: u16) {
        if !self.passed.contains(&cid) {
            self.passed.push(cid);
        }
    }

    /// Command `cid` ended without running (aborted, failed a check, its namespace went):
    /// it stops waiting; the time it waited counts as held.
    pub fn forget(&mut self, cid: u16, now: Instant) {
        self.passed.retain(|&c| c != cid);
        if let Some(i) = self.waiting.iter().position(|w| w.cid == cid) {
            let w = self.waiting.remove(i);
            self.settle();
            let (host, ns) = self.limiters(w.nsid);
            let held = now.saturating_duration_since(w.since);
            for l in [host, ns].into_iter().flatten() {
                l.note_held(held);
            }
        }
    }
}

/// `earliest` is known only when every waiting command was looked at since the last change.
fn settle(waiting: &[Waiting], cids: &mut Vec<u16>, earliest: &mut Option<Instant>) {
    cids.clear();
    cids.extend(waiting.iter().map(|w| w.cid));
    *earliest = if waiting.iter().all(|w| w.fresh) {
        waiting.iter().map(|w| w.start).min()
    } else {
        None
    };
}

/// Schedules `cost` on the host's and the namespace's limiters: the later start.
fn schedule(
    host: Option<&Arc<Limiter>>,
    ns: Option<&Arc<Limiter>>,
    now: Instant,
    cost: Cost,
) -> Instant {
    let h = host.map_or(now, |l| l.schedule(now, cost));
    let n = ns.map_or(now, |l| l.schedule(now, cost));
    h.max(n)
}

fn count(host: Option<&Arc<Limiter>>, ns: Option<&Arc<Limiter>>, cost: Cost) {
    for l in [host, ns].into_iter().flatten() {
        l.count(cost);
    }
}

#[cfg(test)]
mod tests;
