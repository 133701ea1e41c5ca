//! The gateway group in the daemon: one RADOS client instance for the whole process (leases
//! and RBD images alike, so that fencing it fences every write), a rounds thread (renewals,
//! survey, takeovers, handbacks) and a clock thread (the local lease deadline, independent of
//! RADOS calls that may hang). ANA changes go to the main loop, which applies them to the
//! target (hosts get the ANA change AEN) through [`Host::overlay`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvme::ana::{AnaGroupConfig, AnaState};

use super::ceph::CephStore;
use super::lease::{Machine, Ms, Reason, Settings, Step, View};
use super::round::{round, Clock, Sink};
use super::stats::Stats;
use super::Poll;
/// Wakes the main loop (the daemon passes its self-pipe writer).
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// What the gateway threads tell the main loop.
enum Event {
    Ana { group: u32, state: AnaState },
    Fenced,
}

/// Monotonic milliseconds since the gateway started.
#[derive(Clone, Copy)]
struct MonoClock(Instant);

impl Clock for MonoClock {
    fn now(&self) -> Ms {
        self.0.elapsed().as_millis() as Ms
    }
}

/// Journal line, metrics and main-loop event for each step.
#[derive(Clone)]
struct EventSink {
    tx: Sender<Event>,
    wake: Arc<Waker>,
    stats: Arc<Stats>,
}

impl Sink for EventSink {
    fn step(&mut self, step: Step) {
        match step {
            Step::Ana {
                group,
                state,
                reason,
            } => {
                match &reason {
                    Reason::Takeover { .. }
                    | Reason::Handback { .. }
                    | Reason::HandbackCancelled => {
                        tracing::warn!(
                            group,
                            state = state.name(),
                            reason = reason.label(),
                            "gateway group: {reason}"
                        )
                    }
                    _ => tracing::error!(
                        group,
                        state = state.name(),
                        reason = reason.label(),
                        "gateway group: {reason}"
                    ),
                }
                self.stats.change(group, reason.label(), state.name());
                let _ = self.tx.send(Event::Ana { group, state });
            }
            Step::Fenced => {
                self.stats.fenced.store(1, Ordering::Relaxed);
                tracing::error!("gateway group: this gateway's RADOS client is blocklisted (fenced by another gateway); stopping so that a restart rejoins as a new client instance");
                let _ = self.tx.send(Event::Fenced);
            }
            Step::Takeover { .. } | Step::Release { .. } => {}
        }
        (self.wake)();
    }

    fn renew_latency(&mut self, ms: Ms) {
        self.stats.renewal(ms.saturating_mul(1000));
    }
}

/// The ANA groups a gateway group manages: those declared plus those namespaces use.
fn managed_groups(config: &conf::Config) -> Vec<u32> {
    let mut groups: Vec<u32> = config.ana_groups.iter().map(|g| g.id).collect();
    for s in &config.subsystems {
        for n in &s.namespaces {
            groups.push(n.ana_group);
        }
    }
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// A running gateway of a gateway group.
pub struct Host {
    group: conf::GatewayGroup,
    store: Option<CephStore>,
    machine: Arc<Mutex<Machine>>,
    clock: MonoClock,
    /// What this gateway reports for each managed group.
    states: BTreeMap<u32, AnaState>,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Host {
    /// Connects to the cluster (blocking, at most `client_mount_timeout`), makes that client
    /// the one RBD images open on, and sets every managed group to standby. `None` without a
    /// `[gateway_group]`.
    pub fn connect(config: &conf::Config) -> Result<Option<Host>, String> {
        let Some(group) = &config.gateway_group else {
            return Ok(None);
        };
        // No RADOS operation of a gateway may outlast its lease: an image write stuck behind a
        // network cut then fails back to the host (which retries it, and finds this path
        // inaccessible by then) instead of hanging until the cut heals; a lease renewal or a
        // blocklist request fails and the round goes on. An op that reaches an OSD after the
        // gateway was fenced is refused there, so giving up on it is safe.
        // (librados takes whole seconds here.)
        let timeout = group.lease_ms.div_ceil(1000).to_string();
        let opts = rados::ConnectOptions {
            ceph_conf: group.ceph_conf.clone(),
            client_id: group.client_id.clone(),
            options: vec![
                ("rados_osd_op_timeout".to_owned(), timeout.clone()),
                ("rados_mon_op_timeout".to_owned(), timeout),
            ],
        };
        let cluster = rados::Cluster::connect(&opts)
            .map_err(|e| format!("gateway_group: connecting to Ceph: {e}"))?;
        storage::rbd::share_cluster(Arc::clone(&cluster))
            .map_err(|_| "gateway_group: a RADOS client is already shared".to_owned())?;
        let lease = Duration::from_millis(group.lease_ms);
        let store = CephStore::new(
            cluster,
            &group.pool,
            group.namespace.as_deref(),
            &group.name,
            &group.gateway,
            lease,
        )
        .map_err(|e| format!("gateway_group: opening pool {}: {e}", group.pool))?;
        let groups = managed_groups(config);
        let standby = match group.standby_state {
            conf::StandbyState::Inaccessible => AnaState::Inaccessible,
            conf::StandbyState::NonOptimized => AnaState::NonOptimized,
        };
        let settings = Settings {
            members: group.members.iter().map(|m| m.id.clone()).collect(),
            groups: groups.clone(),
            preferred: groups
                .iter()
                .filter_map(|&g| group.preferred(g).map(|p| (g, p.to_owned())))
                .collect(),
            lease: group.lease_ms,
            renew: group.renew_ms,
            failback_hold: group.failback_hold_ms,
            handover_drain: group.handover_drain_ms,
            standby,
        };
        let clock = MonoClock(Instant::now());
        let me = store.me().clone();
        tracing::info!(
            group = %group.name,
            gateway = %me.gateway,
            client = %me.client,
            addr = %me.addr,
            ana_groups = ?groups,
            lease_ms = group.lease_ms,
            "gateway group: connected; RBD images open on this RADOS client, every ANA group in standby until its lease is taken"
        );
        let machine = Machine::new(settings, me, clock.now());
        let (tx, rx) = std::sync::mpsc::channel();
        Ok(Some(Host {
            group: group.clone(),
            store: Some(store),
            machine: Arc::new(Mutex::new(machine)),
            clock,
            states: groups.iter().map(|&g| (g, standby)).collect(),
            tx,
            rx,
            stats: Arc::new(Stats::default()),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        }))
    }

    /// Whether the gateway group decides `group`'s state (`ctl set-ana-state` is refused).
    pub fn manages(&self, group: u32) -> bool {
        self.states.contains_key(&group)
    }

    /// Replaces the configured states of the managed groups by the ones this gateway reports
    /// (on every port).
    pub fn overlay(&self, mapped: &mut nvme::target::TargetConfig) {
        let groups = &mut mapped.multipath.ana_groups;
        for (&id, &state) in &self.states {
            groups.retain(|g| g.id != id);
            groups.push(AnaGroupConfig {
                id,
                state,
                port_states: BTreeMap::new(),
            });
        }
        groups.sort_by_key(|g| g.id);
    }

    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Starts the rounds and clock threads; `wake` wakes the main loop for [`Host::poll`].
    pub fn start(&mut self, wake: Waker) -> Result<(), String> {
        let Some(store) = self.store.take() else {
            return Err("gateway group started twice".to_owned());
        };
        let sink = EventSink {
            tx: self.tx.clone(),
            wake: Arc::new(wake),
            stats: Arc::clone(&self.stats),
        };
        let renew = Duration::from_millis(self.group.renew_ms);
        let (machine, clock, stop) = (
            Arc::clone(&self.machine),
            self.clock,
            Arc::clone(&self.stop),
        );
        let mut rounds_sink = sink.clone();
        let rounds = std::thread::Builder::new()
            .name("gateway-lease".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let started = Instant::now();
                    if !round(&machine, &store, &clock, &mut rounds_sink) {
                        return;
                    }
                    while started.elapsed() < renew && !stop.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(20).min(renew));
                    }
                }
                release_all(&machine, &store);
            })
            .map_err(|e| format!("cannot start the gateway-lease thread: {e}"))?;
        self.threads.push(rounds);
        let (machine, stop) = (Arc::clone(&self.machine), Arc::clone(&self.stop));
        let mut clock_sink = sink;
        let ticker = std::thread::Builder::new()
            .name("gateway-clock".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let steps = lock(&machine).tick(clock.now());
                    for step in steps {
                        clock_sink.step(step);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
            .map_err(|e| format!("cannot start the gateway-clock thread: {e}"))?;
        self.threads.push(ticker);
        Ok(())
    }

    /// Takes the threads' events (main thread).
    pub fn poll(&mut self) -> Poll {
        let mut poll = Poll::default();
        while let Ok(event) = self.rx.try_recv() {
            match event {
                Event::Ana { group, state } => {
                    if self.states.insert(group, state) != Some(state) {
                        poll.changed = true;
                    }
                }
                Event::Fenced => poll.fenced = true,
            }
        }
        let owned = self
            .states
            .values()
            .filter(|s| **s == AnaState::Optimized)
            .count();
        self.stats.owned.store(owned as u64, Ordering::Relaxed);
        poll
    }

    /// `nvmfd ctl gateways`.
    pub fn view(&self) -> View {
        lock(&self.machine).view(self.clock.now())
    }

    /// Stops the threads; groups still held are handed back (Released record, unlocked) so
    /// that the others take them at once, without waiting for the lease or fencing. Call
    /// after the reactors stopped (no I/O in flight any more).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if self.stats.fenced.load(Ordering::Relaxed) == 1 {
            tracing::error!(
                refused = storage::rbd::fenced_ops(),
                "gateway group: fenced; image operations the OSDs refused since (none reached the images)"
            );
        }
    }
}

fn lock(machine: &Mutex<Machine>) -> std::sync::MutexGuard<'_, Machine> {
    machine.lock().unwrap_or_else(|e| e.into_inner())
}

/// Graceful stop: hand every held group back.
fn release_all(machine: &Mutex<Machine>, store: &CephStore) {
    use super::lease::Record;
    use super::round::Store;
    for group in lock(machine).held() {
        let r = store
            .write_record(group, &Record::Released)
            .and_then(|()| store.unlock(group));
        match r {
            Ok(()) => tracing::info!(group, "gateway group: stopping; ANA group handed back"),
            Err(e) => {
                tracing::warn!(group, error = %e, "gateway group: stopping; hand-back failed, the lease expires instead")
            }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
    }
}
