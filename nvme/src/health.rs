//! SMART / Health counters (NVMe Base 2.0 §5.16.1.3, Figure 207) that outlive controllers,
//! namespace reopenings and — restored from the daemon's state directory — restarts.
//!
//! The [`Health`] store belongs to the target. It hands every opened namespace the counters of
//! its (subsystem NQN, NSID), so a host that reconnects (a new controller), a reload that
//! reopens the namespace or a resize that republishes it keeps counting on the same
//! integers; and every I/O queue the error counters of its subsystem. The daemon seeds the
//! store once at start from what the previous run saved ([`Health::restore`], before any
//! queue exists) and saves [`Health::state`] periodically and at a clean shutdown. The
//! counting itself stays where it was (`NamespaceStats` on the I/O path, `IoCounters` on the
//! error path): persistence only reads them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::namespace::{NamespaceStats, NamespaceStatsSnapshot};

/// Error counters of one subsystem's I/O queues. Every queue of the subsystem shares them
/// (several reactors), so the error path uses `fetch_add`; nothing on the success path
/// touches them.
#[derive(Debug, Default)]
pub struct IoCounters {
    /// Media and Data Integrity Errors: unrecovered read errors and write faults the backend
    /// reported (EIO and the like).
    pub media_errors: AtomicU64,
    /// A backend refused a write with EROFS: its medium is read-only (Critical Warning
    /// bit 3). Kept for the daemon's lifetime; not saved (a restart reopens the backend).
    pub read_only: AtomicBool,
}

impl IoCounters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Critical Warning bit 3: the media has been placed in read only mode (Figure 207).
pub const CRITICAL_WARNING_READ_ONLY: u8 = 1 << 3;

/// What survives a restart: the plain numbers of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthState {
    /// Seconds powered on (the daemon running) over every run, this one included.
    pub power_on_secs: u64,
    /// Starts of the daemon, this one included.
    pub power_cycles: u64,
    /// Starts that found the previous run had not shut down cleanly.
    pub unsafe_shutdowns: u64,
    /// Per namespace, by (subsystem NQN, NSID): namespaces no longer configured included,
    /// so the controller-level totals never go back.
    pub namespaces: BTreeMap<(String, u32), NamespaceStatsSnapshot>,
    /// Media and Data Integrity Errors per subsystem NQN.
    pub media_errors: BTreeMap<String, u64>,
}

impl HealthState {
    /// The state of a start that follows `previous` (what the last run saved, `None` on the
    /// first start or when it could not be read), whose last save said `clean` (a clean
    /// shutdown) or not: one more power cycle and, after an unclean end, one more unsafe
    /// shutdown (Figure 207: Power Cycles, Unsafe Shutdowns).
    pub fn next_start(previous: Option<(HealthState, bool)>) -> HealthState {
        let (mut s, clean) = previous.unwrap_or_default();
        let first = s.power_cycles == 0;
        s.power_cycles += 1;
        if !clean && !first {
            s.unsafe_shutdowns += 1;
        }
        s
    }
}

/// The target's SMART / Health store.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Power-on seconds, power cycles and unsafe shutdowns before this run's uptime.
    base_power_on_secs: u64,
    power_cycles: u64,
    unsafe_shutdowns: u64,
    namespaces: BTreeMap<(String, u32), Arc<NamespaceStats>>,
    subsystems: BTreeMap<String, Arc<IoCounters>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            started: Instant::now(),
            inner: Mutex::new(Inner {
                // Without a saved state the counters cover this run: one start.
                power_cycles: 1,
                ..Inner::default()
            }),
        }
    }
}

/// Controller-wide fields (Figure 207) the store knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerHealth {
    pub power_on_hours: u64,
    pub power_cycles: u64,
    pub unsafe_shutdowns: u64,
}

impl Health {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters of namespace `nsid` of `subsystem` (created at zero the first time).
    pub fn namespace(&self, subsystem: &str, nsid: u32) -> Arc<NamespaceStats> {
        let mut inner = self.lock();
        Arc::clone(
            inner
                .namespaces
                .entry((subsystem.to_owned(), nsid))
                .or_default(),
        )
    }

    /// The error counters shared by every I/O queue of `subsystem`.
    pub fn subsystem(&self, subsystem: &str) -> Arc<IoCounters> {
        let mut inner = self.lock();
        Arc::clone(inner.subsystems.entry(subsystem.to_owned()).or_default())
    }

    /// Seeds the store with a saved state (at start, before any queue counts): the counters
    /// continue from the saved values.
    pub fn restore(&self, state: &HealthState) {
        let mut inner = self.lock();
        inner.base_power_on_secs = state.power_on_secs;
        inner.power_cycles = state.power_cycles;
        inner.unsafe_shutdowns = state.unsafe_shutdowns;
        for (key, saved) in &state.namespaces {
            inner.namespaces.entry(key.clone()).or_default().add(saved);
        }
        for (nqn, &n) in &state.media_errors {
            let c = inner.subsystems.entry(nqn.clone()).or_default();
            IoCounters::add(&c.media_errors, n);
        }
    }

    /// Everything to save, as of now.
    pub fn state(&self) -> HealthState {
        let inner = self.lock();
        HealthState {
            power_on_secs: inner.base_power_on_secs + self.started.elapsed().as_secs(),
            power_cycles: inner.power_cycles,
            unsafe_shutdowns: inner.unsafe_shutdowns,
            namespaces: inner
                .namespaces
                .iter()
                .map(|(k, s)| (k.clone(), s.snapshot()))
                .collect(),
            media_errors: inner
                .subsystems
                .iter()
                .map(|(k, c)| (k.clone(), c.media_errors.load(Ordering::Relaxed)))
                .collect(),
        }
    }

    pub fn controller(&self) -> ControllerHealth {
        let inner = self.lock();
        let secs = inner.base_power_on_secs + self.started.elapsed().as_secs();
        ControllerHealth {
            power_on_hours: secs / 3600,
            power_cycles: inner.power_cycles,
            unsafe_shutdowns: inner.unsafe_shutdowns,
        }
    }

    /// The controller-level view of `subsystem` (NSID FFFFFFFFh, NVMe Base 2.0 §5.16.1.3):
    /// the sum over every namespace it has had, so a removed namespace does not take its
    /// commands out of the controller's totals.
    pub fn subsystem_totals(&self, subsystem: &str) -> NamespaceStatsSnapshot {
        let inner = self.lock();
        let mut sum = NamespaceStatsSnapshot::default();
        for (_, s) in inner
            .namespaces
            .range((subsystem.to_owned(), 0)..=(subsystem.to_owned(), u32::MAX))
        {
            sum.add(&s.snapshot());
        }
        sum
    }

    /// Media errors and the critical warning bits of `subsystem`.
    pub fn subsystem_errors(&self, subsystem: &str) -> (u64, u8) {
        let inner = self.lock();
        match inner.subsystems.get(subsystem) {
            Some(c) => (
                c.media_errors.load(Ordering::Relaxed),
                if c.read_only.load(Ordering::Relaxed) {
                    CRITICAL_WARNING_READ_ONLY
                } else {
                    0
                },
            ),
            None => (0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(reads: u64, writes: u64) -> NamespaceStatsSnapshot {
        NamespaceStatsSnapshot {
            read_commands: reads,
            write_commands: writes,
            bytes_read: reads * 4096,
            bytes_written: writes * 4096,
        }
    }

    #[test]
    fn restored_counters_continue() {
        let h = Health::default();
        let ns = h.namespace("nqn.a", 1);
        let mut saved = HealthState {
            power_on_secs: 7200,
            power_cycles: 3,
            unsafe_shutdowns: 1,
            ..HealthState::default()
        };
        saved
            .namespaces
            .insert(("nqn.a".into(), 1), counted(10, 20));
        // A namespace no longer configured still counts for its subsystem.
        saved.namespaces.insert(("nqn.a".into(), 9), counted(1, 0));
        saved.media_errors.insert("nqn.a".into(), 2);
        h.restore(&saved);
        ns.read_started();
        ns.read_done(4096);
        assert_eq!(ns.snapshot(), counted(11, 20));
        // A namespace reopened later gets the same counters.
        assert_eq!(h.namespace("nqn.a", 1).snapshot(), counted(11, 20));
        assert_eq!(h.subsystem_totals("nqn.a"), counted(12, 20));
        assert_eq!(h.subsystem_totals("nqn.b"), counted(0, 0));
        IoCounters::add(&h.subsystem("nqn.a").media_errors, 1);
        assert_eq!(h.subsystem_errors("nqn.a"), (3, 0));
        let c = h.controller();
        assert_eq!(
            (c.power_on_hours, c.power_cycles, c.unsafe_shutdowns),
            (2, 3, 1)
        );
        let now = h.state();
        assert_eq!(now.namespaces[&("nqn.a".into(), 1)], counted(11, 20));
        assert_eq!(now.media_errors["nqn.a"], 3);
        assert!(now.power_on_secs >= 7200);
    }

    #[test]
    fn starts_count_power_cycles_and_unsafe_shutdowns() {
        let first = HealthState::next_start(None);
        assert_eq!((first.power_cycles, first.unsafe_shutdowns), (1, 0));
        let clean = HealthState::next_start(Some((first.clone(), true)));
        assert_eq!((clean.power_cycles, clean.unsafe_shutdowns), (2, 0));
        let crashed = HealthState::next_start(Some((clean, false)));
        assert_eq!((crashed.power_cycles, crashed.unsafe_shutdowns), (3, 1));
        // An empty state (nothing counted yet) is a first start, however it ended.
        let again = HealthState::next_start(Some((HealthState::default(), false)));
        assert_eq!((again.power_cycles, again.unsafe_shutdowns), (1, 0));
    }

    #[test]
    fn read_only_is_a_critical_warning() {
        let h = Health::default();
        h.subsystem("nqn.a")
            .read_only
            .store(true, Ordering::Relaxed);
        assert_eq!(h.subsystem_errors("nqn.a"), (0, CRITICAL_WARNING_READ_ONLY));
        assert_eq!(h.subsystem_errors("nqn.b"), (0, 0));
    }
}
