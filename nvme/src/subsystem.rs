//! NVM subsystems: settings, the published namespace table, and the controllers connected to
//! each subsystem (with dynamic controller ID allocation, NVMe-oF 1.1 §4.2).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::ana::AnaTable;
use crate::command::TerminateReason;
use crate::controller::Controller;
use crate::namespace::NamespaceTable;
use crate::qos::{Applied, Limiter, QosConfig, QosTable};
use crate::reservation::Notice;
use crate::spec::MAX_CNTLID;
use crate::visibility::Visibility;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    Nvm,
    Discovery,
}

/// The parts of a subsystem's configuration that may change while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemSettings {
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub allowed_hosts: BTreeSet<String>,
    /// Hosts that must authenticate, with their keys (each is allowed, listed here or not).
    pub host_auth: BTreeMap<String, crate::auth::HostAuth>,
    /// Empty = exported on every port.
    pub ports: BTreeSet<u16>,
}

#[derive(Debug)]
struct Registry {
    by_cntlid: BTreeMap<u16, Weak<Controller>>,
    /// Where the next allocation starts looking, so IDs are not reused immediately (a host
    /// that still holds a stale cntlid then gets a clean "unknown controller").
    next: u16,
    /// Controller IDs this target may hand out (disjoint ranges per gateway let several
    /// targets serve one subsystem NQN without cntlid collisions on the host).
    min: u16,
    max: u16,
    /// The namespaces' reservation states are shared with the other gateways (a gateway
    /// group's store): reservations are served with a restricted range too.
    shared_reservations: bool,
}

#[derive(Debug)]
pub struct Subsystem {
    pub nqn: String,
    pub kind: SubsystemKind,
    settings: RwLock<Arc<SubsystemSettings>>,
    namespaces: RwLock<Arc<NamespaceTable>>,
    /// The target's ANA state (target-wide, published to every subsystem); written under the
    /// `namespaces` write lock so the pair always matches `ns_generation`.
    ana: RwLock<Arc<AnaTable>>,
    /// Which hosts see which namespaces; written under the `namespaces` write lock like `ana`.
    visibility: RwLock<Arc<Visibility>>,
    /// Bumped after every namespace table or ANA table change; I/O queues compare it with the
    /// generation of their cached tables instead of taking a lock per command.
    ns_generation: AtomicU64,
    /// QoS limiters of its namespaces and hosts (`qos`); replaced under the `namespaces`
    /// write lock with a generation bump, so I/O queues pick them up like a new table.
    qos: RwLock<Arc<QosTable>>,
    controllers: Mutex<Registry>,
    removed: AtomicBool,
}

/// What `Subsystem::update_from` changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SubsystemChange {
    pub added: Vec<u32>,
    pub removed: Vec<u32>,
    pub replaced: Vec<u32>,
    /// NSIDs whose list of hosts that see them changed.
    pub visibility_changed: Vec<u32>,
    pub settings_changed: bool,
    pub qos_changed: bool,
}

/// Why a controller could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// Every controller ID is in use.
    Exhausted,
    /// The subsystem was removed by a reload.
    Removed,
}

impl Subsystem {
    pub fn new(
        nqn: String,
        kind: SubsystemKind,
        settings: SubsystemSettings,
        namespaces: NamespaceTable,
    ) -> Self {
        Self {
            nqn,
            kind,
            settings: RwLock::new(Arc::new(settings)),
            namespaces: RwLock::new(Arc::new(namespaces)),
            ana: RwLock::new(Arc::new(AnaTable::default())),
            visibility: RwLock::new(Arc::default()),
            ns_generation: AtomicU64::new(0),
            qos: RwLock::new(Arc::default()),
            controllers: Mutex::new(Registry {
                by_cntlid: BTreeMap::new(),
                next: 1,
                min: 1,
                max: MAX_CNTLID,
                shared_reservations: false,
            }),
            removed: AtomicBool::new(false),
        }
    }

    /// Shows the namespaces to the hosts `visibility` says (before the subsystem is served).
    pub(crate) fn with_visibility(self, visibility: Visibility) -> Self {
        *self.visibility.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(visibility);
        self
    }

    pub fn visibility(&self) -> Arc<Visibility> {
        Arc::clone(&self.visibility.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The namespaces `hostnqn` sees (every namespace, unless some are shown to chosen hosts).
    pub fn namespaces_for(&self, hostnqn: &str) -> Arc<NamespaceTable> {
        let guard = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let vis = self.visibility.read().unwrap_or_else(|e| e.into_inner());
        vis.view(&guard, hostnqn)
    }

    /// [`Subsystem::published`] as `hostnqn` sees it: what its I/O queues cache.
    pub fn published_for(&self, hostnqn: &str) -> (Arc<NamespaceTable>, Arc<AnaTable>, u64) {
        // Read under the table lock, so the view, the ANA table and the generation match.
        let guard = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let vis = self.visibility.read().unwrap_or_else(|e| e.into_inner());
        let ana = Arc::clone(&self.ana.read().unwrap_or_else(|e| e.into_inner()));
        (
            vis.view(&guard, hostnqn),
            ana,
            self.ns_generation.load(Ordering::Acquire),
        )
    }

    /// The QoS limiters of this subsystem.
    pub fn qos(&self) -> Arc<QosTable> {
        Arc::clone(&self.qos.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The limiters an I/O queue of `hostnqn` applies (read after the generation it caches,
    /// so a change published in between is picked up at its next command).
    pub(crate) fn qos_for(&self, hostnqn: &str) -> Applied {
        self.qos
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .for_host(hostnqn)
    }

    /// Sets the QoS limits live. A limiter that stays (same NSID or host) is changed in place,
    /// keeping its buckets and counters; I/O queues pick up added and removed ones at their
    /// next command or poll (a generation bump). Returns whether anything changed.
    pub fn set_qos(&self, config: &QosConfig) -> bool {
        let _ns = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        let mut qos = self.qos.write().unwrap_or_else(|e| e.into_inner());
        let config = config.limited();
        if qos.config() == config {
            return false;
        }
        let keep = |old: Option<&Arc<Limiter>>, limits| match old {
            Some(l) => {
                l.set(limits);
                Arc::clone(l)
            }
            None => Arc::new(Limiter::new(limits, std::time::Instant::now())),
        };
        let table = QosTable {
            namespaces: config
                .namespaces
                .iter()
                .map(|(&nsid, &l)| (nsid, keep(qos.namespace(nsid), l)))
                .collect(),
            hosts: config
                .hosts
                .iter()
                .map(|(h, &l)| (h.clone(), keep(qos.host(h), l)))
                .collect(),
        };
        *qos = Arc::new(table);
        self.ns_generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    pub fn is_discovery(&self) -> bool {
        self.kind == SubsystemKind::Discovery
    }

    pub fn settings(&self) -> Arc<SubsystemSettings> {
        Arc::clone(&self.settings.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn namespaces(&self) -> Arc<NamespaceTable> {
        Arc::clone(&self.namespaces.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The generation of the current namespace table, paired with it (read under the lock so
    /// the two always match).
    pub fn namespaces_with_generation(&self) -> (Arc<NamespaceTable>, u64) {
        let guard = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        (
            Arc::clone(&guard),
            self.ns_generation.load(Ordering::Acquire),
        )
    }

    /// The namespace table, the ANA table and their generation, read together.
    pub fn published(&self) -> (Arc<NamespaceTable>, Arc<AnaTable>, u64) {
        let guard = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let ana = Arc::clone(&self.ana.read().unwrap_or_else(|e| e.into_inner()));
        (
            Arc::clone(&guard),
            ana,
            self.ns_generation.load(Ordering::Acquire),
        )
    }

    pub fn ana(&self) -> Arc<AnaTable> {
        Arc::clone(&self.ana.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Publishes a new ANA table; I/O queues see it at their next command or poll.
    pub(crate) fn publish_ana(&self, table: Arc<AnaTable>) {
        let _ns = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        *self.ana.write().unwrap_or_else(|e| e.into_inner()) = table;
        self.ns_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Restricts the controller IDs handed out from now on to `min..=max` (live controllers
    /// keep theirs).
    pub(crate) fn set_cntlid_range(&self, min: u16, max: u16) {
        let mut reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let (min, max) = (min.clamp(1, MAX_CNTLID), max.clamp(1, MAX_CNTLID));
        reg.min = min.min(max);
        reg.max = max;
        if !(reg.min..=reg.max).contains(&reg.next) {
            reg.next = reg.min;
        }
    }

    /// Whether the namespaces' reservation states are shared by the gateways of a group.
    pub(crate) fn set_shared_reservations(&self, shared: bool) {
        let mut reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        reg.shared_reservations = shared;
    }

    /// Reservations are served when this process is the only gateway of the subsystem, or
    /// when the gateways share the reservation state (a gateway group): otherwise several
    /// gateways (multipath, each with a restricted controller ID range) would each keep
    /// their own registrants.
    pub fn reservations_supported(&self) -> bool {
        if self.is_discovery() {
            return false;
        }
        let reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        reg.shared_reservations || (reg.min == 1 && reg.max == MAX_CNTLID)
    }

    /// Cheap check for the I/O path.
    pub fn ns_generation(&self) -> u64 {
        self.ns_generation.load(Ordering::Acquire)
    }

    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        let s = self.settings();
        s.allow_any_host || s.allowed_hosts.contains(hostnqn) || s.host_auth.contains_key(hostnqn)
    }

    pub fn exported_on(&self, port_id: u16) -> bool {
        let s = self.settings();
        s.ports.is_empty() || s.ports.contains(&port_id)
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Allocates a controller ID unique within this subsystem (across all ports) and registers
    /// the controller `build` makes for it.
    pub fn add_controller(
        &self,
        build: impl FnOnce(u16) -> Controller,
    ) -> Result<Arc<Controller>, AllocError> {
        let mut reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_removed() {
            return Err(AllocError::Removed);
        }
        reg.by_cntlid.retain(|_, w| w.strong_count() > 0);
        let (min, max) = (reg.min, reg.max);
        if reg.by_cntlid.range(min..=max).count() > (max - min) as usize {
            return Err(AllocError::Exhausted);
        }
        let after = |id: u16| if id >= max { min } else { id + 1 };
        let mut id = reg.next.clamp(min, max);
        while reg.by_cntlid.contains_key(&id) {
            id = after(id);
        }
        reg.next = after(id);
        let ctrl = Arc::new(build(id));
        reg.by_cntlid.insert(id, Arc::downgrade(&ctrl));
        Ok(ctrl)
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        let reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        reg.by_cntlid.get(&cntlid).and_then(Weak::upgrade)
    }

    pub fn remove_controller(&self, cntlid: u16) {
        let mut reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        reg.by_cntlid.remove(&cntlid);
    }

    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        let reg = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        reg.by_cntlid.values().filter_map(Weak::upgrade).collect()
    }

    /// Takes over settings and namespaces from `new` (a freshly built copy of this subsystem's
    /// new configuration). Controllers get a Namespace Attribute Changed event for every
    /// added, removed or replaced NSID.
    pub(crate) fn update_from(&self, new: &Subsystem) -> SubsystemChange {
        let new_settings = new.settings();
        let settings_changed = {
            let mut s = self.settings.write().unwrap_or_else(|e| e.into_inner());
            let changed = **s != *new_settings;
            if changed {
                *s = new_settings;
            }
            changed
        };
        if settings_changed {
            // A host no longer allowed loses its controllers at once, not at its next Connect.
            for ctrl in self.controllers() {
                if !self.host_allowed(&ctrl.hostnqn) {
                    tracing::info!(subsystem = %self.nqn, hostnqn = %ctrl.hostnqn,
                        cntlid = ctrl.cntlid, "host removed: disconnecting its controller");
                    ctrl.terminate(TerminateReason::HostRemoved);
                }
            }
        }
        let qos_changed = self.set_qos(&new.qos().config());
        if qos_changed {
            tracing::info!(subsystem = %self.nqn, "QoS limits changed");
        }
        let new_table = new.namespaces();
        let new_vis = new.visibility();
        let (added, removed, replaced, changed, before) = {
            let mut t = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
            let mut vis = self.visibility.write().unwrap_or_else(|e| e.into_inner());
            let before = (Arc::clone(&t), Arc::clone(&vis));
            let added: Vec<u32> = new_table
                .iter()
                .filter(|ns| t.get(ns.nsid).is_none())
                .map(|ns| ns.nsid)
                .collect();
            let removed: Vec<u32> = t
                .iter()
                .filter(|ns| new_table.get(ns.nsid).is_none())
                .map(|ns| ns.nsid)
                .collect();
            let replaced: Vec<u32> = new_table
                .iter()
                .filter(|ns| t.get(ns.nsid).is_some_and(|old| !Arc::ptr_eq(old, ns)))
                .map(|ns| ns.nsid)
                .collect();
            let mut changed: BTreeSet<u32> = replaced.iter().copied().collect();
            changed.extend(&added);
            changed.extend(&removed);
            if !changed.is_empty() || **vis != *new_vis {
                *t = Arc::clone(&new_table);
                *vis = Arc::clone(&new_vis);
                self.ns_generation.fetch_add(1, Ordering::AcqRel);
            }
            (added, removed, replaced, changed, before)
        };
        let visibility_changed = before.1.restrictions_changed(&new_vis);
        if !changed.is_empty() || !visibility_changed.is_empty() {
            // Each host hears of the namespaces attached to or detached from its view, and
            // of reopened ones it sees: no other (NVMe Base 2.0 §5.16.1.5 lists the
            // namespaces "attached to the controller").
            for ctrl in self.controllers() {
                let nsids = Visibility::changed_for(
                    &ctrl.hostnqn,
                    (&before.0, &before.1),
                    (&new_table, &new_vis),
                    &replaced,
                );
                if !nsids.is_empty() {
                    ctrl.namespaces_changed(nsids.into_iter());
                }
            }
        }
        SubsystemChange {
            added,
            removed,
            replaced,
            visibility_changed,
            settings_changed,
            qos_changed,
        }
    }

    /// The subsystem was removed from the configuration: refuse new controllers and end the
    /// existing ones (their queues' `poll` reports termination).
    pub(crate) fn shut_down(&self) {
        self.removed.store(true, Ordering::Release);
        for ctrl in self.controllers() {
            ctrl.terminate(TerminateReason::SubsystemRemoved);
        }
    }

    /// Delivers reservation notifications on namespace `nsid` to every controller of each
    /// notified host (NVMe Base 2.0 §8.19: a registrant is a host, so all its controllers
    /// hear of it, over any transport).
    pub fn notify_reservation(&self, nsid: u32, notices: &[Notice]) {
        if notices.is_empty() {
            return;
        }
        for ctrl in self.controllers() {
            for n in notices.iter().filter(|n| n.host == ctrl.hostid) {
                tracing::debug!(subsystem = %self.nqn, nsid, cntlid = ctrl.cntlid,
                    hostnqn = %ctrl.hostnqn, kind = ?n.kind, "reservation notification");
                ctrl.reservation_notice(n.kind, nsid);
            }
        }
    }

    /// Picks up size changes of resizable backends (an RBD image after `rbd resize`): each
    /// namespace whose backend reports a new capacity is republished with the new block count
    /// (same backend, configuration and identifiers), and every controller gets a Namespace
    /// Attribute Changed event listing it (NVMe Base 2.0 §5.2.1, log 04h), upon which Linux
    /// re-reads Identify Namespace and updates the disk size. Returns the resized NSIDs.
    pub(crate) fn refresh_capacities(&self) -> Vec<u32> {
        // Ask the backends outside the table lock: a backend may block briefly.
        let resized: Vec<Arc<crate::namespace::Namespace>> = self
            .namespaces()
            .iter()
            .filter(|ns| ns.backend.refresh_capacity().is_some())
            .cloned()
            .collect();
        if resized.is_empty() {
            return Vec::new();
        }
        let mut changed = Vec::new();
        {
            let mut t = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
            let mut all: Vec<Arc<crate::namespace::Namespace>> = t.iter().cloned().collect();
            for slot in all.iter_mut() {
                // A reload that replaced the namespace meanwhile opened it at the new size.
                if !resized.iter().any(|r| Arc::ptr_eq(r, slot)) {
                    continue;
                }
                let config = slot.config.clone();
                match crate::namespace::Namespace::new(config, Arc::clone(&slot.backend), &self.nqn)
                {
                    Ok(mut ns) if ns.blocks != slot.blocks => {
                        changed.push(ns.nsid);
                        ns.writes = Arc::clone(&slot.writes);
                        ns.stats = Arc::clone(&slot.stats);
                        *slot = Arc::new(ns);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(subsystem = %self.nqn, nsid = slot.nsid, error = %e,
                        "namespace shrank below one block; keeping its old size"),
                }
            }
            if !changed.is_empty() {
                *t = Arc::new(NamespaceTable::new(all));
                self.ns_generation.fetch_add(1, Ordering::AcqRel);
            }
        }
        if !changed.is_empty() {
            let vis = self.visibility();
            for ctrl in self.controllers() {
                let seen: Vec<u32> = changed
                    .iter()
                    .copied()
                    .filter(|&n| vis.sees(&ctrl.hostnqn, n))
                    .collect();
                if !seen.is_empty() {
                    ctrl.namespaces_changed(seen.into_iter());
                }
            }
        }
        changed
    }
}
