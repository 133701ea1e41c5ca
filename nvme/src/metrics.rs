//! Command counters for the metrics endpoint and `nvmfd ctl top` (off unless enabled).
//!
//! Counting stays on the thread that owns the queue: each `Queue` (module `queue`) keeps
//! plain integers in a [`QueueMetrics`] (no atomics, no lock per command) and copies them into
//! its [`Slot`] of the [`Registry`] at most every [`PUBLISH_INTERVAL`] from `Queue::poll`
//! (which transports call after every batch and on every tick), and once more when the queue
//! is dropped. A scrape takes a [`Snapshot`] of every slot; the views (per namespace, per
//! controller, per port) are sums over it, so they only grow: a closed queue's counters stay in
//! the registry, folded into its controller's entry while that controller lives and into its
//! subsystem's afterwards.
//!
//! Latencies are measured by the transports, which own the clock reads (the core is sans-I/O):
//! a command's latency runs from its capsule's arrival (the socket read or receive completion
//! that made it whole) to its response handed to the socket or queue pair, and its backend
//! latency from the submission of its block operation to that operation's completion. The
//! transports read the clock once per batch of input, output or completions, not per command,
//! and hand the durations to `Queue::observe_latency` / `Queue::observe_backend`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::wire::Status;

/// How stale a published snapshot may be while its queue is busy (idle queues publish on the
/// transport's tick, ≤ 100 ms).
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);

/// Upper bounds (µs, inclusive, as Prometheus' `le`) of the latency buckets: fine from 1 to
/// 100 µs, where NVMe-oF commands on RAM, NVMe and loopback live, then coarser up to 10 s;
/// a last bucket (+Inf) takes the rest.
pub const LATENCY_BOUNDS_US: [u64; 28] = [
    1, 2, 5, 10, 15, 20, 25, 30, 40, 50, 75, 100, 150, 250, 500, 1_000, 2_500, 5_000, 10_000,
    25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
/// Buckets per histogram: one per bound, and +Inf.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;
const LATENCY_BOUNDS_NS: [u64; LATENCY_BOUNDS_US.len()] = {
    let mut ns = [0; LATENCY_BOUNDS_US.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = LATENCY_BOUNDS_US[i] * 1000;
        i += 1;
    }
    ns
};
/// Distinct namespace IDs counted per queue; further ones (a host probing) go to entry 0.
const MAX_NSIDS_PER_QUEUE: usize = 64;

/// Upper bound of bucket `i` in µs (`None` for the last, +Inf).
pub fn bucket_bound_us(i: usize) -> Option<u64> {
    LATENCY_BOUNDS_US.get(i).copied()
}

/// What a command was, for counting (NVM Command Set 1.0 Figure 18 for the I/O opcodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Read,
    Write,
    Flush,
    /// Other I/O commands (Write Zeroes, Dataset Management, Compare, …).
    Other,
    /// Admin and Fabrics commands.
    Admin,
}

impl Class {
    pub const ALL: [Class; 5] = [
        Class::Read,
        Class::Write,
        Class::Flush,
        Class::Other,
        Class::Admin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Write => "write",
            Class::Flush => "flush",
            Class::Other => "other",
            Class::Admin => "admin",
        }
    }
}

/// A latency histogram: non-cumulative counts per bucket (see [`bucket_bound_us`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Histogram {
    pub count: u64,
    pub sum_ns: u64,
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            count: 0,
            sum_ns: 0,
            buckets: [0; LATENCY_BUCKETS],
        }
    }
}

impl Histogram {
    #[inline]
    pub fn observe(&mut self, ns: u64) {
        // The first bound at or above the value: `le` is inclusive.
        let i = LATENCY_BOUNDS_NS.partition_point(|&b| b < ns);
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.wrapping_add(ns);
    }

    pub fn add(&mut self, o: &Histogram) {
        self.count += o.count;
        self.sum_ns = self.sum_ns.wrapping_add(o.sum_ns);
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    /// Mean in µs (`None` without observations).
    pub fn mean_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64 / 1000.0)
    }

    /// Latency below which `q` (0..=1) of the observations fall, interpolated linearly inside
    /// the bucket as Prometheus' `histogram_quantile` does; `None` without observations or when
    /// it falls in the +Inf bucket.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q * self.count as f64;
        let mut below = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 && (below + n) as f64 >= rank {
                let upper = bucket_bound_us(i)? as f64;
                let lower = match i {
                    0 => 0.0,
                    _ => LATENCY_BOUNDS_US[i - 1] as f64,
                };
                let into = (rank - below as f64).max(0.0) / n as f64;
                return Some(lower + (upper - lower) * into);
            }
            below += n;
        }
        None
    }
}

/// One class of commands: completions, data moved, latency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassCounters {
    /// Completions sent (success or not).
    pub commands: u64,
    /// Data bytes moved over the fabric: host-to-controller at admission, controller-to-host
    /// with a successful completion.
    pub bytes: u64,
    /// Capsule arrival to response handed to the socket / queue pair (held Asynchronous Event
    /// Requests never: they wait for an event, not for the target).
    pub latency: Histogram,
    /// Block operation submitted to its completion (commands that went to an asynchronous
    /// backend: RAM and null namespaces complete in line and have none).
    pub backend: Histogram,
}

impl ClassCounters {
    pub fn add(&mut self, o: &ClassCounters) {
        self.commands += o.commands;
        self.bytes += o.bytes;
        self.latency.add(&o.latency);
        self.backend.add(&o.backend);
    }
}

/// Counters of one namespace ID as seen by one queue (nsid 0: admin, Fabrics and commands
/// without a valid namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsCounters {
    pub nsid: u32,
    pub classes: [ClassCounters; 5],
    /// Commands whose block operation the backend failed (an error it returned, or a short
    /// transfer); cancelled operations (Abort) are not failures.
    pub backend_errors: u64,
}

impl NsCounters {
    pub fn class(&self, c: Class) -> &ClassCounters {
        &self.classes[c as usize]
    }
}

/// Everything one queue counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub namespaces: Vec<NsCounters>,
    /// Commands taken in (executed or refused by the transport).
    pub admitted: u64,
    /// Failed completions by status field (SCT << 8 | SC, without DNR/More).
    pub errors: Vec<(u16, u64)>,
    /// Connect commands completed with an error on this queue.
    pub connect_failures: u64,
    /// Keep-alive expiries of the controller (counted on its admin queue).
    pub keep_alive_expiries: u64,
    /// Commands that had to wait for a free data buffer of the RDMA device's pool (their
    /// data could not move until another command returned one).
    pub pool_waits: u64,
}

impl QueueCounters {
    #[inline(never)]
    fn ns_index(&mut self, nsid: u32) -> usize {
        match self.namespaces.iter().position(|n| n.nsid == nsid) {
            Some(pos) => pos,
            None if self.namespaces.len() >= MAX_NSIDS_PER_QUEUE => self.ns_index(0),
            None => {
                self.namespaces.push(NsCounters {
                    nsid,
                    ..Default::default()
                });
                self.namespaces.len() - 1
            }
        }
    }

    pub fn add(&mut self, o: &QueueCounters) {
        self.add_counts(o, true);
    }

    /// [`add`](Self::add), with the latency histograms only when `latency` (sums that do
    /// not show latencies skip their copying).
    pub fn add_counts(&mut self, o: &QueueCounters, latency: bool) {
        for n in &o.namespaces {
            let mine = self.ns_unbounded(n.nsid);
            for (a, b) in mine.classes.iter_mut().zip(n.classes.iter()) {
                if latency {
                    a.add(b);
                } else {
                    a.commands += b.commands;
                    a.bytes += b.bytes;
                }
            }
            mine.backend_errors += n.backend_errors;
        }
        self.admitted += o.admitted;
        for &(code, n) in &o.errors {
            add_error(&mut self.errors, code, n);
        }
        self.connect_failures += o.connect_failures;
        self.keep_alive_expiries += o.keep_alive_expiries;
        self.pool_waits += o.pool_waits;
    }

    /// Aggregates keep every namespace ID (already bounded per queue).
    fn ns_unbounded(&mut self, nsid: u32) -> &mut NsCounters {
        match self.namespaces.iter().position(|n| n.nsid == nsid) {
            Some(pos) => &mut self.namespaces[pos],
            None => {
                self.namespaces.push(NsCounters {
                    nsid,
                    ..Default::default()
                });
                self.namespaces.last_mut().expect("just pushed")
            }
        }
    }

    /// Completions sent: every completion is counted in its namespace and class (summed here
    /// rather than kept in a counter of its own, one increment less per command).
    pub fn completed(&self) -> u64 {
        self.namespaces
            .iter()
            .flat_map(|n| n.classes.iter())
            .map(|c| c.commands)
            .sum()
    }

    /// Commands admitted and not yet completed.
    pub fn in_flight(&self) -> u64 {
        self.admitted.saturating_sub(self.completed())
    }

    /// Backend failures over every namespace.
    pub fn backend_errors(&self) -> u64 {
        self.namespaces.iter().map(|n| n.backend_errors).sum()
    }

    /// Sum over namespaces of one class.
    pub fn class_total(&self, c: Class) -> ClassCounters {
        let mut t = ClassCounters::default();
        for n in &self.namespaces {
            t.add(n.class(c));
        }
        t
    }
}

fn add_error(errors: &mut Vec<(u16, u64)>, code: u16, n: u64) {
    match errors.iter_mut().find(|(c, _)| *c == code) {
        Some((_, count)) => *count += n,
        None => errors.push((code, n)),
    }
}

/// Who a queue's counters belong to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    pub port_id: u16,
    pub transport: Transport,
    /// Set at Connect; a queue that never connected counts for its port only.
    pub subsystem: Option<String>,
    /// `None` once the controller is gone (its counters then stay with the subsystem).
    pub cntlid: Option<u16>,
    pub hostnqn: Option<String>,
}

/// The queue's transport (`queue::TransportKind`, with an order for keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    Tcp,
    Rdma,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// What a queue last published.
#[derive(Debug, Clone)]
struct Published {
    key: QueueKey,
    /// The admin queue of its controller (the controller lives as long as it does).
    admin: bool,
    counters: QueueCounters,
    closed: bool,
}

/// One queue's place in the registry.
#[derive(Debug)]
pub struct Slot(Mutex<Published>);

/// The queues' published counters, and what closed queues left behind.
#[derive(Debug, Default)]
pub struct Registry {
    inner: Mutex<RegistryInner>,
}

#[derive(Debug, Default)]
struct RegistryInner {
    live: Vec<Arc<Slot>>,
    retired: HashMap<QueueKey, QueueCounters>,
}

/// Counters of every key at one moment: closed queues merged by key, live queues one entry
/// each (with `live` set).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub entries: Vec<SnapshotEntry>,
}

#[derive(Debug, Clone)]
pub struct SnapshotEntry {
    pub key: QueueKey,
    /// A live queue (not what closed ones left behind).
    pub live: bool,
    pub counters: QueueCounters,
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    fn register(&self, key: QueueKey) -> Arc<Slot> {
        let slot = Arc::new(Slot(Mutex::new(Published {
            key,
            admin: false,
            counters: QueueCounters::default(),
            closed: false,
        })));
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.live.push(Arc::clone(&slot));
        slot
    }

    /// Folds closed queues into the retired totals and returns every key's counters.
    pub fn snapshot(&self) -> Snapshot {
        let mut entries = Vec::new();
        self.for_each(|key, live, counters| {
            entries.push(SnapshotEntry {
                key: key.clone(),
                live,
                counters: counters.clone(),
            })
        });
        Snapshot { entries }
    }

    /// Folds closed queues into the retired totals, then shows `visit` every key's counters
    /// (key, live, counters) in place: what [`Registry::snapshot`] returns, without copying
    /// it (a scrape with a thousand controllers sums them up as they are visited). Each live
    /// queue's slot is locked only while it is visited.
    pub fn for_each(&self, mut visit: impl FnMut(&QueueKey, bool, &QueueCounters)) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        let mut live_admins = Vec::new();
        inner.live.retain(|slot| {
            let p = slot.0.lock().unwrap_or_else(|e| e.into_inner());
            if p.closed {
                inner
                    .retired
                    .entry(p.key.clone())
                    .or_default()
                    .add(&p.counters);
                false
            } else {
                if p.admin {
                    live_admins.push((p.key.subsystem.clone(), p.key.cntlid));
                }
                visit(&p.key, true, &p.counters);
                true
            }
        });
        // A controller is gone when its admin queue is: what its queues counted stays with
        // the subsystem (per-namespace and per-port totals never go back).
        if inner.retired.keys().any(|k| k.cntlid.is_some()) {
            let live: HashSet<(Option<String>, Option<u16>)> = live_admins.into_iter().collect();
            let gone: Vec<QueueKey> = inner
                .retired
                .keys()
                .filter(|k| k.cntlid.is_some() && !live.contains(&(k.subsystem.clone(), k.cntlid)))
                .cloned()
                .collect();
            for key in gone {
                if let Some(c) = inner.retired.remove(&key) {
                    let orphan = QueueKey {
                        cntlid: None,
                        hostnqn: None,
                        ..key
                    };
                    inner.retired.entry(orphan).or_default().add(&c);
                }
            }
        }
        for (key, counters) in &inner.retired {
            visit(key, false, counters);
        }
    }
}

/// Per-queue counting, owned by the queue's thread.
#[derive(Debug)]
pub struct QueueMetrics {
    slot: Arc<Slot>,
    counters: QueueCounters,
    last_publish: Instant,
    /// Index in `counters.namespaces` of the namespace counted last (queues mostly serve one:
    /// it is checked before the search).
    hot: usize,
    /// Commands the queue will execute again (blocked behind a fused pair, or a fused Write
    /// whose Compare matched), by CID: admitted and their data counted once, the first time.
    again: Vec<u16>,
    /// Something was counted since the last publication (an idle queue does not copy its
    /// counters into the registry every tick).
    dirty: bool,
}

impl QueueMetrics {
    pub fn new(registry: &Registry, port_id: u16, transport: Transport) -> QueueMetrics {
        let slot = registry.register(QueueKey {
            port_id,
            transport,
            subsystem: None,
            cntlid: None,
            hostnqn: None,
        });
        QueueMetrics {
            slot,
            counters: QueueCounters::default(),
            last_publish: Instant::now(),
            hot: 0,
            again: Vec::new(),
            dirty: false,
        }
    }

    #[inline]
    fn ns_mut(&mut self, nsid: u32) -> &mut NsCounters {
        let i = match self.counters.namespaces.get(self.hot) {
            Some(n) if n.nsid == nsid => self.hot,
            _ => {
                self.hot = self.counters.ns_index(nsid);
                self.hot
            }
        };
        &mut self.counters.namespaces[i]
    }

    #[inline]
    fn class_mut(&mut self, class: Class, nsid: u32) -> &mut ClassCounters {
        &mut self.ns_mut(nsid).classes[class as usize]
    }

    /// The counters of a namespace this queue already counted a completion of, else those
    /// without a namespace: a latency of a command for a namespace that does not exist goes
    /// where its completion was counted.
    #[inline]
    fn counted_class_mut(&mut self, class: Class, nsid: u32) -> &mut ClassCounters {
        let nsid = match class {
            Class::Admin => 0,
            _ => nsid,
        };
        let hot = self.hot;
        match self.counters.namespaces.get(hot) {
            Some(n) if n.nsid == nsid => &mut self.counters.namespaces[hot].classes[class as usize],
            _ => self.counted_class_cold(class, nsid),
        }
    }

    #[cold]
    fn counted_class_cold(&mut self, class: Class, nsid: u32) -> &mut ClassCounters {
        let known = self.counters.namespaces.iter().any(|n| n.nsid == nsid);
        self.class_mut(class, if known { nsid } else { 0 })
    }

    /// The queue connected to a controller.
    pub(crate) fn connected(&mut self, subsystem: &str, cntlid: u16, hostnqn: &str, admin: bool) {
        let mut p = self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
        p.key.subsystem = Some(subsystem.to_owned());
        p.key.cntlid = Some(cntlid);
        p.key.hostnqn = Some(hostnqn.to_owned());
        p.admin = admin;
    }

    /// A command is taken in.
    #[inline]
    pub(crate) fn admit(&mut self) {
        self.dirty = true;
        self.counters.admitted += 1;
    }

    /// Commands are waiting to be executed again ([`run_again`](Self::run_again)).
    #[inline(always)]
    pub(crate) fn any_again(&self) -> bool {
        !self.again.is_empty()
    }

    /// [`admit`](Self::admit) for command `cid`, unless it was admitted before and is being
    /// executed again: then `true` (its data was counted then too).
    #[cold]
    pub(crate) fn admit_again(&mut self, cid: u16) -> bool {
        if self.take_again(cid) {
            return true;
        }
        self.admit();
        false
    }

    /// Command `cid` will be executed again.
    #[cold]
    pub(crate) fn run_again(&mut self, cid: u16) {
        self.again.push(cid);
    }

    /// Takes `cid` out of the commands to be executed again (it completes otherwise, e.g.
    /// aborted while blocked): whether it was one.
    #[cold]
    pub(crate) fn take_again(&mut self, cid: u16) -> bool {
        match self.again.iter().position(|c| *c == cid) {
            Some(i) => {
                self.again.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Data the host sent with a command that completes later (`complete` counts the data
    /// of the others).
    #[inline]
    pub(crate) fn host_bytes(&mut self, class: Class, nsid: u32, bytes: u32) {
        self.dirty = true;
        if bytes > 0 {
            let nsid = if class == Class::Admin { 0 } else { nsid };
            self.class_mut(class, nsid).bytes += u64::from(bytes);
        }
    }

    /// A successful completion goes out: `bytes` the data moved with it (either way) that was
    /// not counted at submission.
    #[inline]
    pub(crate) fn complete(&mut self, class: Class, nsid: u32, bytes: u32) {
        self.dirty = true;
        let nsid = if class == Class::Admin { 0 } else { nsid };
        let c = self.class_mut(class, nsid);
        c.commands += 1;
        c.bytes += u64::from(bytes);
    }

    /// A failed completion goes out (`connect`: of a Fabrics Connect; `backend`: the backend
    /// failed its block operation).
    #[inline(never)]
    pub(crate) fn complete_failed(
        &mut self,
        class: Class,
        nsid: u32,
        status: Status,
        connect: bool,
        sent: u32,
        backend: bool,
    ) {
        // Commands for a namespace that does not exist count under 0 (a host cannot make the
        // list grow with made-up IDs).
        let invalid = Status::INVALID_NAMESPACE;
        let nsid = if (status.sct, status.sc) == (invalid.sct, invalid.sc) {
            0
        } else {
            nsid
        };
        self.complete(class, nsid, sent);
        if backend {
            let nsid = if class == Class::Admin { 0 } else { nsid };
            self.ns_mut(nsid).backend_errors += 1;
        }
        let code = (u16::from(status.sct) << 8) | u16::from(status.sc);
        add_error(&mut self.counters.errors, code, 1);
        if connect {
            self.counters.connect_failures += 1;
        }
    }

    /// A command's latency, capsule arrival to response handed over (nanoseconds).
    #[inline]
    pub(crate) fn observe_latency(&mut self, class: Class, nsid: u32, ns: u64) {
        self.dirty = true;
        self.counted_class_mut(class, nsid).latency.observe(ns);
    }

    /// A command's block operation took `ns` nanoseconds in the backend.
    #[inline]
    pub(crate) fn observe_backend(&mut self, class: Class, nsid: u32, ns: u64) {
        self.dirty = true;
        self.counted_class_mut(class, nsid).backend.observe(ns);
    }

    pub(crate) fn keep_alive_expired(&mut self) {
        self.dirty = true;
        self.counters.keep_alive_expiries += 1;
    }

    pub(crate) fn pool_wait(&mut self) {
        self.dirty = true;
        self.counters.pool_waits += 1;
    }

    /// Publishes at most every [`PUBLISH_INTERVAL`].
    #[inline]
    pub(crate) fn maybe_publish(&mut self, now: Instant) {
        if self.dirty && now.saturating_duration_since(self.last_publish) >= PUBLISH_INTERVAL {
            self.last_publish = now;
            self.dirty = false;
            self.publish(false);
        }
    }

    fn publish(&mut self, closed: bool) {
        let mut p = self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
        p.counters.clone_from(&self.counters);
        p.closed = closed;
    }
}

impl Drop for QueueMetrics {
    fn drop(&mut self) {
        self.publish(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum_reads(s: &Snapshot) -> u64 {
        s.entries
            .iter()
            .map(|e| e.counters.class_total(Class::Read).commands)
            .sum()
    }

    #[test]
    fn buckets_bound_their_values() {
        let mut h = Histogram::default();
        h.observe(500); // 0.5 µs → le 1 µs
        h.observe(1_000); // 1 µs → le 1 µs (inclusive)
        h.observe(1_001); // → le 2 µs
        h.observe(24_000); // → le 25 µs
        h.observe(100_000_000_000); // 100 s → +Inf
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[1], 1);
        assert_eq!(bucket_bound_us(6), Some(25));
        assert_eq!(h.buckets[6], 1);
        assert_eq!(h.buckets[LATENCY_BUCKETS - 1], 1);
        assert_eq!(h.count, 5);
        assert_eq!(bucket_bound_us(LATENCY_BUCKETS - 1), None);
        assert!(LATENCY_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn quantile_interpolates_inside_the_bucket() {
        let mut h = Histogram::default();
        for _ in 0..100 {
            h.observe(24_000); // all in (20, 25] µs
        }
        let p50 = h.quantile_us(0.5).unwrap();
        assert!((p50 - 22.5).abs() < 1e-9, "{p50}");
        assert_eq!(h.quantile_us(1.0), Some(25.0));
        assert_eq!(h.mean_us(), Some(24.0));
        assert_eq!(Histogram::default().quantile_us(0.99), None);
    }

    #[test]
    fn closed_queues_stay_counted_and_move_to_the_subsystem_with_their_controller() {
        let reg = Registry::new();
        let mut admin = QueueMetrics::new(&reg, 1, Transport::Tcp);
        admin.connected("nqn.a", 1, "host", true);
        let mut io = QueueMetrics::new(&reg, 1, Transport::Tcp);
        io.connected("nqn.a", 1, "host", false);
        io.admit();
        io.complete(Class::Read, 1, 4096);
        io.observe_backend(Class::Read, 1, 9_000);
        io.observe_latency(Class::Read, 1, 12_000);
        drop(io);
        let s = reg.snapshot();
        assert_eq!(sum_reads(&s), 1);
        // Still under the controller while its admin queue lives.
        assert!(s
            .entries
            .iter()
            .any(|e| !e.live && e.key.cntlid == Some(1) && e.counters.completed() == 1));
        drop(admin);
        let s = reg.snapshot();
        assert_eq!(sum_reads(&s), 1);
        assert!(s.entries.iter().all(|e| !e.live && e.key.cntlid.is_none()));
        let read = s.entries[0].counters.class_total(Class::Read);
        assert_eq!(
            (
                read.commands,
                read.bytes,
                read.latency.count,
                read.backend.count
            ),
            (1, 4096, 1, 1)
        );
        assert_eq!(read.latency.sum_ns, 12_000);
    }

    #[test]
    fn made_up_namespace_ids_do_not_grow_the_list() {
        let reg = Registry::new();
        let mut q = QueueMetrics::new(&reg, 1, Transport::Tcp);
        for nsid in 1..1000 {
            q.admit();
            q.complete_failed(
                Class::Read,
                nsid,
                Status::INVALID_NAMESPACE.with_dnr(),
                false,
                0,
                false,
            );
            q.observe_latency(Class::Read, nsid, 3_000);
        }
        assert_eq!(q.counters.namespaces.len(), 1);
        assert_eq!(q.counters.in_flight(), 0);
        assert_eq!(q.counters.errors.len(), 1);
        assert_eq!(q.counters.errors[0].1, 999);
        assert_eq!(q.counters.namespaces[0].nsid, 0);
        let read = q.counters.namespaces[0].class(Class::Read);
        assert_eq!(read.latency.count, 999);
    }

    #[test]
    fn in_flight_is_admitted_minus_completed_and_backend_errors_count_per_namespace() {
        let reg = Registry::new();
        let mut q = QueueMetrics::new(&reg, 1, Transport::Tcp);
        q.admit();
        q.host_bytes(Class::Write, 1, 512);
        q.publish(false);
        let s = reg.snapshot();
        assert_eq!(s.entries[0].counters.in_flight(), 1);
        q.complete_failed(Class::Write, 1, Status::WRITE_FAULT, false, 0, true);
        q.publish(false);
        let s = reg.snapshot();
        let c = &s.entries[0].counters;
        assert_eq!(c.in_flight(), 0);
        assert_eq!(c.backend_errors(), 1);
        assert_eq!(c.namespaces[0].nsid, 1);
        assert_eq!(c.namespaces[0].backend_errors, 1);
        assert_eq!(c.class_total(Class::Write).bytes, 512);
    }
}
