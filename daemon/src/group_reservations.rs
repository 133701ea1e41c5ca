//! A gateway group's shared reservation state (docs/gateway-reservations.md): one RADOS
//! object per namespace whose omap holds the registrants, holder, type, generation and PTPL
//! (`nvme::reservation::store`'s key/values), replaced by compare-and-set on the object
//! version, and watched by every gateway of the group.
//!
//! Threads: the store's reads and writes run where `nvme` calls them (the persistence thread,
//! or namespace opening), never on a reactor. Notifies arrive on librados threads and are
//! handed to one watch thread ("nvmfd-resv-watch"), which re-reads the state, delivers the
//! notifications to this gateway's controllers of the hosts concerned, and only then
//! acknowledges: the gateway that made the change waits for those acknowledgements (up to
//! the lease duration) before its command completes. The same thread re-reads every
//! namespace once per lease period and re-registers a broken watch, so a missed notify is
//! caught up within that period.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use nvme::reservation::store::{decode_change, encode_change, from_omap, to_omap};
use nvme::reservation::{Notice, OpenStore, SharedStores, State, Store, StoreError, Version};
use nvme::target::Target;
use rados::omap::Expect;
use rados::watch::{Notify, Watch};
use rados::{Cluster, IoCtx};

/// The group's reservation objects, one per namespace.
pub struct GroupStores {
    io: Arc<IoCtx>,
    /// `rados_get_last_version` is per I/O context: a read or write and the version it
    /// reports happen under this lock.
    versioned: Mutex<()>,
    /// This client instance (a notify from it is this gateway's own change).
    instance: u64,
    /// Object name prefix: the group's name.
    group: String,
    /// How long a change waits for the other gateways' acknowledgements (the lease: a
    /// gateway silent for longer has lost its lease and is fenced).
    ack_timeout: Duration,
    target: OnceLock<Weak<Target>>,
    jobs: Mutex<mpsc::Sender<Job>>,
    stores: Mutex<Vec<Weak<GroupStore>>>,
    /// Itself (every `GroupStores` lives in the `Arc` [`GroupStores::new`] makes).
    me: Weak<GroupStores>,
}

impl std::fmt::Debug for GroupStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupStores")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// What the watch thread does.
enum Job {
    Notify(Weak<GroupStore>, Notify),
    WatchBroken(Weak<GroupStore>, i32),
    /// A namespace's store went away (the last queue holding the namespace may be a
    /// reactor's): unwatching is a round trip to the OSD, so it happens here.
    Unwatch(Watch),
}

impl GroupStores {
    /// The group's stores on `cluster` (the gateway's RADOS client: fencing the gateway
    /// fences its reservation writes too), objects in `pool` / `namespace`; starts the
    /// watch thread.
    pub fn new(
        cluster: &Arc<Cluster>,
        pool: &str,
        namespace: Option<&str>,
        group: &str,
        ack_timeout: Duration,
    ) -> Result<Arc<Self>, String> {
        let io = cluster
            .ioctx(pool, namespace)
            .map_err(|e| format!("reservation objects in pool {pool}: {e}"))?;
        let (tx, rx) = mpsc::channel();
        let stores = Arc::new_cyclic(|me| GroupStores {
            me: me.clone(),
            io: Arc::new(io),
            versioned: Mutex::new(()),
            instance: cluster.instance_id(),
            group: group.to_owned(),
            ack_timeout,
            target: OnceLock::new(),
            jobs: Mutex::new(tx),
            stores: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&stores);
        std::thread::Builder::new()
            .name("nvmfd-resv-watch".into())
            .spawn(move || watch_thread(weak, rx, ack_timeout))
            .map_err(|e| format!("reservation watch thread: {e}"))?;
        Ok(stores)
    }

    /// The target whose controllers hear of other gateways' changes (set once it is built).
    pub fn set_target(&self, target: &Arc<Target>) {
        let _ = self.target.set(Arc::downgrade(target));
    }

    pub fn shared(self: &Arc<Self>) -> SharedStores {
        SharedStores(Arc::clone(self) as Arc<dyn OpenStore>)
    }

    fn send(&self, job: Job) {
        let tx = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        // The thread only ends with the process.
        let _ = tx.send(job);
    }

    fn watch(self: &Arc<Self>, store: &Arc<GroupStore>) -> Result<Watch, rados::Error> {
        let (on_notify, on_error) = (Arc::downgrade(self), Arc::downgrade(self));
        let (s1, s2) = (Arc::downgrade(store), Arc::downgrade(store));
        self.io.watch(
            &store.oid,
            move |n| {
                if let Some(stores) = on_notify.upgrade() {
                    stores.send(Job::Notify(s1.clone(), n));
                }
            },
            move |_cookie, err| {
                if let Some(stores) = on_error.upgrade() {
                    stores.send(Job::WatchBroken(s2.clone(), err));
                }
            },
        )
    }
}

impl OpenStore for GroupStores {
    fn open(
        &self,
        subsystem: &str,
        nsid: u32,
        nguid: &[u8; 16],
    ) -> Result<Arc<dyn Store>, StoreError> {
        let hex: String = nguid.iter().map(|b| format!("{b:02x}")).collect();
        let oid = format!("{}.reservations.{hex}", self.group);
        // A watch needs the object.
        self.io.create_if_absent(&oid).map_err(io_error)?;
        let stores = self
            .me
            .upgrade()
            .ok_or_else(|| StoreError::Io(std::io::Error::other("gateway group stopped")))?;
        let store = Arc::new(GroupStore {
            stores,
            oid,
            subsystem: subsystem.to_owned(),
            nsid,
            watch: Mutex::new(None),
        });
        let watch = store.stores.watch(&store).map_err(io_error)?;
        *store.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(watch);
        let mut list = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|s| s.strong_count() > 0);
        list.push(Arc::downgrade(&store));
        tracing::info!(subsystem, nsid, object = %store.oid, "reservation state shared through RADOS");
        Ok(store)
    }
}

/// One namespace's reservation object.
pub struct GroupStore {
    stores: Arc<GroupStores>,
    oid: String,
    subsystem: String,
    nsid: u32,
    watch: Mutex<Option<Watch>>,
}

impl std::fmt::Debug for GroupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupStore")
            .field("oid", &self.oid)
            .finish_non_exhaustive()
    }
}

impl Drop for GroupStore {
    fn drop(&mut self) {
        let watch = self
            .watch
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(w) = watch {
            self.stores.send(Job::Unwatch(w));
        }
    }
}

fn io_error(e: rados::Error) -> StoreError {
    match e.errno() {
        Some(errno) => StoreError::Io(std::io::Error::from_raw_os_error(errno)),
        None => StoreError::Io(std::io::Error::other(e.to_string())),
    }
}

impl Store for GroupStore {
    fn load(&self) -> Result<(State, Version), StoreError> {
        let _v = self
            .stores
            .versioned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (map, version) = self.stores.io.omap_get_all(&self.oid).map_err(io_error)?;
        Ok((from_omap(&map)?, version))
    }

    fn replace(
        &self,
        version: Version,
        _before: &State,
        next: &State,
    ) -> Result<Version, StoreError> {
        let entries: BTreeMap<String, Vec<u8>> = to_omap(next);
        let expect = match version {
            0 => Expect::Absent,
            v => Expect::Version(v),
        };
        let _v = self
            .stores
            .versioned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match self.stores.io.omap_replace(&self.oid, expect, &entries) {
            Ok(v) => Ok(v),
            Err(e) if e.is_stale() => Err(StoreError::Stale),
            Err(e) => Err(io_error(e)),
        }
    }

    fn shared(&self) -> bool {
        true
    }

    /// Asks every watcher (an empty notify): alone when no other client answers. A gateway
    /// that died still has a watch until the OSD times it out, but it does not answer.
    fn alone(&self) -> Result<bool, StoreError> {
        let reply = self
            .stores
            .io
            .notify(&self.oid, &[], self.stores.ack_timeout)
            .map_err(io_error)?;
        Ok(!reply.acks.iter().any(|a| a.client != self.stores.instance))
    }

    fn publish(&self, version: Version, notices: &[Notice], abort: bool) {
        let started = Instant::now();
        let msg = encode_change(version, abort, notices);
        match self
            .stores
            .io
            .notify(&self.oid, &msg, self.stores.ack_timeout)
        {
            Ok(reply) if reply.timeouts.is_empty() => tracing::debug!(
                object = %self.oid, version, acks = reply.acks.len(),
                ms = started.elapsed().as_millis() as u64,
                "reservation change acknowledged by every gateway"
            ),
            Ok(reply) => tracing::warn!(
                object = %self.oid, version, acks = reply.acks.len(),
                silent = ?reply.timeouts,
                "reservation change not acknowledged by every gateway within the lease \
                 (a silent gateway loses its lease and is fenced)"
            ),
            Err(e) => tracing::error!(object = %self.oid, version, error = %e,
                "reservation change not published to the other gateways"),
        }
    }
}

/// The watch thread: applies other gateways' changes (then acknowledges), re-registers
/// broken watches, and re-reads every namespace once per `period`.
fn watch_thread(stores: Weak<GroupStores>, jobs: mpsc::Receiver<Job>, period: Duration) {
    let mut next_sweep = Instant::now() + period;
    loop {
        let job = match jobs.recv_timeout(next_sweep.saturating_duration_since(Instant::now())) {
            Ok(job) => Some(job),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(all) = stores.upgrade() else {
            return;
        };
        match job {
            Some(Job::Notify(store, n)) => {
                if let Some(store) = store.upgrade() {
                    store.on_notify(&all, &n);
                }
            }
            Some(Job::WatchBroken(store, err)) => {
                if let Some(store) = store.upgrade() {
                    store.rewatch(&all, err);
                }
            }
            Some(Job::Unwatch(watch)) => drop(watch),
            None => {
                let live: Vec<Arc<GroupStore>> = all
                    .stores
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter_map(Weak::upgrade)
                    .collect();
                for store in live {
                    store.ensure_watch(&all);
                    if let Err(e) = store.refresh(&all, &[], None) {
                        tracing::warn!(object = %store.oid, error = %e,
                            "periodic reservation state read failed");
                    }
                }
                next_sweep = Instant::now() + period;
            }
        }
    }
}

impl GroupStore {
    /// Re-reads the state into the namespace this store serves and delivers `notices` to
    /// this gateway's controllers of those hosts. `drain` (another gateway's Preempt and
    /// Abort): first waits, up to that long, until the writes in flight here when the new
    /// state took effect have ended (NVM Command Set 1.0 §6.6.3 for the whole group: no
    /// write of a preempted host lands after the preempting command completes).
    /// `Ok(false)`: the namespace is not served here (any more).
    fn refresh(
        &self,
        all: &GroupStores,
        notices: &[Notice],
        drain: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let Some(target) = all.target.get().and_then(Weak::upgrade) else {
            return Ok(false);
        };
        let Some(subsys) = target.subsystem(&self.subsystem) else {
            return Ok(false);
        };
        let table = subsys.namespaces();
        let Some(ns) = table.get(self.nsid) else {
            return Ok(false);
        };
        ns.reservations.refresh()?;
        if let Some(timeout) = drain {
            if !ns.writes.drain_blocking(timeout) {
                return Err(StoreError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "writes in flight did not drain",
                )));
            }
        }
        subsys.notify_reservation(self.nsid, notices);
        Ok(true)
    }

    /// Another gateway's change (or a probe): applied here before it is acknowledged, so
    /// the notifier's command completes only once this gateway refuses what it must.
    fn on_notify(&self, all: &GroupStores, n: &Notify) {
        let ack = if n.notifier == all.instance || n.data.is_empty() {
            // This gateway's own change (its cache has it) or a power-on probe.
            true
        } else {
            match decode_change(&n.data) {
                Ok(change) => {
                    let drain = change.abort.then_some(all.ack_timeout);
                    match self.refresh(all, &change.notices, drain) {
                        Ok(_) => {
                            tracing::debug!(object = %self.oid, version = change.version,
                                notices = change.notices.len(), abort = change.abort,
                                "reservation change of another gateway applied");
                            true
                        }
                        // Not acknowledged: the notifier logs this gateway as silent.
                        Err(e) => {
                            tracing::error!(object = %self.oid, version = change.version,
                                error = %e, "reservation change of another gateway not applied");
                            false
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(object = %self.oid, error = %e, "malformed reservation notify");
                    true
                }
            }
        };
        if ack {
            if let Err(e) = all.io.notify_ack(&self.oid, n.notify_id, n.cookie, &[]) {
                tracing::warn!(object = %self.oid, error = %e, "reservation notify not acknowledged");
            }
        }
    }

    /// A watch that could not be registered again is retried at every sweep.
    fn ensure_watch(self: &Arc<Self>, all: &Arc<GroupStores>) {
        let mut slot = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            match all.watch(self) {
                Ok(w) => {
                    tracing::info!(object = %self.oid, "reservation watch registered again");
                    *slot = Some(w);
                }
                Err(e) => {
                    tracing::warn!(object = %self.oid, error = %e, "reservation watch still not registered")
                }
            }
        }
    }

    /// The watch broke (notifies may have been missed): watch again, then read the state.
    fn rewatch(self: &Arc<Self>, all: &Arc<GroupStores>, err: i32) {
        tracing::warn!(object = %self.oid, error = %std::io::Error::from_raw_os_error(-err),
            "reservation watch lost; registering it again");
        let mut slot = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        slot.take();
        match all.watch(self) {
            Ok(w) => *slot = Some(w),
            Err(e) => tracing::error!(object = %self.oid, error = %e,
                "reservation watch not registered again (retried every lease period)"),
        }
        drop(slot);
        if let Err(e) = self.refresh(all, &[], None) {
            tracing::warn!(object = %self.oid, error = %e, "reservation state not read after the watch broke");
        }
    }
}
