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

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::wire::Status;

/// How stale a published snapshot may be while its queue is busy (idle queues publish on the
/// transport's tick, ≤ 100 ms).
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);
/// Latency histogram buckets: upper bounds 2^0 .. 2^22 µs (≈ 4.2 s), then +Inf.
pub const LATENCY_BUCKETS: usize = 24;
/// One command in this many (per queue, by admission order) is timed for the latency
/// histograms: two clock reads per I/O would cost ~10 % of the target's instructions per 4 KiB
/// I/O (callgrind), one in 32 costs ~0.2 %; every command is still counted. (A queue at
/// 100k IOPS still yields ~3,000 timed commands a second.)
pub const LATENCY_SAMPLE_EVERY: u64 = 32;
const _: () = assert!(LATENCY_SAMPLE_EVERY.is_power_of_two());
/// Distinct namespace IDs counted per queue; further ones (a host probing) go to entry 0.
const MAX_NSIDS_PER_QUEUE: usize = 64;

/// Upper bound of bucket `i` in µs (`None` for the last, +Inf).
pub fn bucket_bound_us(i: usize) -> Option<u64> {
    (i + 1 < LATENCY_BUCKETS).then(|| 1u64 << i)
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

/// One class of commands: completions, data moved, latency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassCounters {
    /// Completions sent (success or not).
    pub commands: u64,
    /// Data bytes moved over the fabric: host-to-controller at admission, controller-to-host
    /// with a successful completion.
    pub bytes: u64,
    /// Latency observations: the timed commands (one in [`LATENCY_SAMPLE_EVERY`], held
    /// Asynchronous Event Requests never).
    pub latency_count: u64,
    pub latency_sum_ns: u64,
    /// Non-cumulative counts per bucket (see [`bucket_bound_us`]).
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl ClassCounters {
    #[inline(never)]
    fn observe(&mut self, latency: Duration) {
        let ns = latency.as_nanos().min(u128::from(u64::MAX)) as u64;
        // Bucket i holds latencies below 2^i µs (whole µs), so the bound 2^i µs is an upper
        // bound of every value in it.
        let us = ns / 1000;
        let i = (64 - us.leading_zeros()) as usize;
        self.buckets[i.min(LATENCY_BUCKETS - 1)] += 1;
        self.latency_count += 1;
        self.latency_sum_ns += ns;
    }

    pub fn add(&mut self, o: &ClassCounters) {
        self.commands += o.commands;
        self.bytes += o.bytes;
        self.latency_count += o.latency_count;
        self.latency_sum_ns += o.latency_sum_ns;
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    /// Latency below which `q` (0..=1) of the observations fall, interpolated linearly inside
    /// the bucket as Prometheus' `histogram_quantile` does; `None` without observations or when
    /// it falls in the +Inf bucket.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        if self.latency_count == 0 {
            return None;
        }
        let rank = q * self.latency_count as f64;
        let mut below = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 && (below + n) as f64 >= rank {
                let upper = bucket_bound_us(i)? as f64;
                let lower = if i == 0 { 0.0 } else { upper / 2.0 };
                let into = (rank - below as f64).max(0.0) / n as f64;
                return Some(lower + (upper - lower) * into);
            }
            below += n;
        }
        None
    }
}

/// Counters of one namespace ID as seen by one queue (nsid 0: admin, Fabrics and commands
/// without a valid namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsCounters {
    pub nsid: u32,
    pub classes: [ClassCounters; 5],
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
    /// Block operations the backend failed (negative result).
    pub backend_errors: u64,
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
        for n in &o.namespaces {
            let mine = self.ns_unbounded(n.nsid);
            for (a, b) in mine.classes.iter_mut().zip(n.classes.iter()) {
                a.add(b);
            }
        }
        self.admitted += o.admitted;
        for &(code, n) in &o.errors {
            add_error(&mut self.errors, code, n);
        }
        self.backend_errors += o.backend_errors;
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
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        let mut entries = Vec::with_capacity(inner.live.len() + inner.retired.len());
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
                    live_admins.push(p.key.clone());
                }
                entries.push(SnapshotEntry {
                    key: p.key.clone(),
                    live: true,
                    counters: p.counters.clone(),
                });
                true
            }
        });
        // A controller is gone when its admin queue is: what its queues counted stays with
        // the subsystem (per-namespace and per-port totals never go back).
        let gone: Vec<QueueKey> = inner
            .retired
            .keys()
            .filter(|k| k.cntlid.is_some() && !live_admins.contains(k))
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
        for (key, counters) in &inner.retired {
            entries.push(SnapshotEntry {
                key: key.clone(),
                live: false,
                counters: counters.clone(),
            });
        }
        Snapshot { entries }
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
    /// Admission times of commands handed to the backend, by CID.
    started: HashMap<u16, Instant, BuildHasherDefault<CidHasher>>,
    /// Commands the queue will execute again (blocked behind a fused pair, or a fused Write
    /// whose Compare matched), by CID with their admission time: admitted and their data
    /// counted once, the first time.
    again: Vec<(u16, Option<Instant>)>,
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
            started: HashMap::default(),
            again: Vec::new(),
        }
    }

    #[inline]
    fn class_mut(&mut self, class: Class, nsid: u32) -> &mut ClassCounters {
        let i = match self.counters.namespaces.get(self.hot) {
            Some(n) if n.nsid == nsid => self.hot,
            _ => {
                self.hot = self.counters.ns_index(nsid);
                self.hot
            }
        };
        &mut self.counters.namespaces[i].classes[class as usize]
    }

    /// The queue connected to a controller.
    pub(crate) fn connected(&mut self, subsystem: &str, cntlid: u16, hostnqn: &str, admin: bool) {
        let mut p = self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
        p.key.subsystem = Some(subsystem.to_owned());
        p.key.cntlid = Some(cntlid);
        p.key.hostnqn = Some(hostnqn.to_owned());
        p.admin = admin;
    }

    /// A command is taken in; returns its admission time when it is one of the timed ones.
    #[inline]
    pub(crate) fn admit(&mut self) -> Option<Instant> {
        self.counters.admitted += 1;
        (self.counters.admitted & (LATENCY_SAMPLE_EVERY - 1) == 0).then(Instant::now)
    }

    /// Commands are waiting to be executed again ([`run_again`](Self::run_again)).
    #[inline(always)]
    pub(crate) fn any_again(&self) -> bool {
        !self.again.is_empty()
    }

    /// [`admit`](Self::admit) for command `cid`, unless it was admitted before and is being
    /// executed again: then its first admission time and `true` (its data was counted then
    /// too).
    #[cold]
    pub(crate) fn admit_again(&mut self, cid: u16) -> (Option<Instant>, bool) {
        match self.take_again(cid) {
            Some(t0) => (t0, true),
            None => (self.admit(), false),
        }
    }

    /// Command `cid`, admitted at `t0`, will be executed again.
    #[cold]
    pub(crate) fn run_again(&mut self, cid: u16, t0: Option<Instant>) {
        self.again.push((cid, t0));
    }

    /// Takes `cid` out of the commands to be executed again (it completes otherwise, e.g.
    /// aborted while blocked): its admission time.
    #[cold]
    pub(crate) fn take_again(&mut self, cid: u16) -> Option<Option<Instant>> {
        let i = self.again.iter().position(|(c, _)| *c == cid)?;
        Some(self.again.swap_remove(i).1)
    }

    /// Data the host sent with a command that completes later (`complete` counts the data
    /// of the others).
    #[inline]
    pub(crate) fn host_bytes(&mut self, class: Class, nsid: u32, bytes: u32) {
        if bytes > 0 {
            let nsid = if class == Class::Admin { 0 } else { nsid };
            self.class_mut(class, nsid).bytes += u64::from(bytes);
        }
    }

    /// The command went to the backend; `finish` will complete it.
    #[inline]
    pub(crate) fn park(&mut self, cid: u16, t0: Instant) {
        self.started.insert(cid, t0);
    }

    #[inline]
    pub(crate) fn unpark(&mut self, cid: u16, result: i32) -> Option<Instant> {
        if result < 0 {
            self.counters.backend_errors += 1;
        }
        if self.started.is_empty() {
            return None;
        }
        self.started.remove(&cid)
    }

    /// A successful completion goes out: `t0` is its admission time when timed, `bytes` the
    /// data moved with it (either way) that was not counted at submission.
    #[inline]
    pub(crate) fn complete(&mut self, class: Class, nsid: u32, bytes: u32, t0: Option<Instant>) {
        let nsid = if class == Class::Admin { 0 } else { nsid };
        let c = self.class_mut(class, nsid);
        c.commands += 1;
        c.bytes += u64::from(bytes);
        if let Some(t0) = t0 {
            c.observe(t0.elapsed());
        }
    }

    /// A failed completion goes out (`connect`: of a Fabrics Connect).
    #[inline(never)]
    pub(crate) fn complete_failed(
        &mut self,
        class: Class,
        nsid: u32,
        status: Status,
        t0: Option<Instant>,
        connect: bool,
        sent: u32,
    ) {
        // Commands for a namespace that does not exist count under 0 (a host cannot make the
        // list grow with made-up IDs).
        let invalid = Status::INVALID_NAMESPACE;
        let nsid = if (status.sct, status.sc) == (invalid.sct, invalid.sc) {
            0
        } else {
            nsid
        };
        self.complete(class, nsid, sent, t0);
        let code = (u16::from(status.sct) << 8) | u16::from(status.sc);
        add_error(&mut self.counters.errors, code, 1);
        if connect {
            self.counters.connect_failures += 1;
        }
    }

    pub(crate) fn keep_alive_expired(&mut self) {
        self.counters.keep_alive_expiries += 1;
    }

    pub(crate) fn pool_wait(&mut self) {
        self.counters.pool_waits += 1;
    }

    /// Publishes at most every [`PUBLISH_INTERVAL`].
    #[inline]
    pub(crate) fn maybe_publish(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_publish) >= PUBLISH_INTERVAL {
            self.last_publish = now;
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

/// CIDs are small integers chosen by the host: used as their own hash (the map only needs
/// them spread over its buckets, not protected from collisions — at most queue-depth entries).
#[derive(Debug, Default)]
pub struct CidHasher(u64);

impl Hasher for CidHasher {
    fn finish(&self) -> u64 {
        // Spread the low bits into the top ones hashbrown uses for its control bytes.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.0 = u64::from(n);
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
        let mut c = ClassCounters::default();
        c.observe(Duration::from_nanos(500)); // 0 µs → bucket 0 (< 1 µs)
        c.observe(Duration::from_micros(1)); // 1 µs → bucket 1 (< 2 µs)
        c.observe(Duration::from_micros(100)); // → bucket 7 (< 128 µs)
        c.observe(Duration::from_secs(100)); // → +Inf
        assert_eq!(c.buckets[0], 1);
        assert_eq!(c.buckets[1], 1);
        assert_eq!(c.buckets[7], 1);
        assert_eq!(c.buckets[LATENCY_BUCKETS - 1], 1);
        assert_eq!(c.latency_count, 4);
        assert_eq!(bucket_bound_us(7), Some(128));
        assert_eq!(bucket_bound_us(LATENCY_BUCKETS - 1), None);
    }

    #[test]
    fn quantile_interpolates_inside_the_bucket() {
        let mut c = ClassCounters::default();
        for _ in 0..100 {
            c.observe(Duration::from_micros(100)); // all in (64, 128] µs
        }
        let p50 = c.quantile_us(0.5).unwrap();
        assert!((p50 - 96.0).abs() < 1e-9, "{p50}");
        assert_eq!(c.quantile_us(1.0), Some(128.0));
        assert_eq!(ClassCounters::default().quantile_us(0.99), None);
    }

    #[test]
    fn closed_queues_stay_counted_and_move_to_the_subsystem_with_their_controller() {
        let reg = Registry::new();
        let mut admin = QueueMetrics::new(&reg, 1, Transport::Tcp);
        admin.connected("nqn.a", 1, "host", true);
        let mut io = QueueMetrics::new(&reg, 1, Transport::Tcp);
        io.connected("nqn.a", 1, "host", false);
        io.admit();
        io.park(7, Instant::now());
        let t0 = io.unpark(7, 4096);
        io.complete(Class::Read, 1, 4096, t0);
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
            (read.commands, read.bytes, read.latency_count),
            (1, 4096, 1)
        );
    }

    #[test]
    fn made_up_namespace_ids_do_not_grow_the_list() {
        let reg = Registry::new();
        let mut q = QueueMetrics::new(&reg, 1, Transport::Tcp);
        for nsid in 1..1000 {
            let t0 = q.admit();
            q.complete_failed(
                Class::Read,
                nsid,
                Status::INVALID_NAMESPACE.with_dnr(),
                t0,
                false,
                0,
            );
        }
        assert_eq!(q.counters.namespaces.len(), 1);
        assert_eq!(q.counters.in_flight(), 0);
        assert_eq!(q.counters.errors.len(), 1);
        assert_eq!(q.counters.errors[0].1, 999);
        let timed = q.counters.namespaces[0].class(Class::Read).latency_count;
        assert_eq!(timed, 999 / LATENCY_SAMPLE_EVERY);
    }

    #[test]
    fn in_flight_is_admitted_minus_completed() {
        let reg = Registry::new();
        let mut q = QueueMetrics::new(&reg, 1, Transport::Tcp);
        q.admit();
        q.host_bytes(Class::Write, 1, 512);
        q.park(1, Instant::now());
        q.publish(false);
        let s = reg.snapshot();
        assert_eq!(s.entries[0].counters.in_flight(), 1);
        let t0 = q.unpark(1, -5);
        q.complete(Class::Write, 1, 0, t0);
        q.publish(false);
        let s = reg.snapshot();
        assert_eq!(s.entries[0].counters.in_flight(), 0);
        assert_eq!(s.entries[0].counters.backend_errors, 1);
        assert_eq!(s.entries[0].counters.class_total(Class::Write).bytes, 512);
    }
}
