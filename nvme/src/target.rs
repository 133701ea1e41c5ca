//! The target: configuration (configuration contract), the set of subsystems and ports
//! it serves, the discovery subsystem, and live reconfiguration.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::ana::{AnaError, AnaTable, DEFAULT_ANA_GROUP};
pub use crate::ana::{AnaGroupConfig, AnaState, MultipathConfig};
use crate::controller::AsyncEvent;
use crate::health::Health;
pub use crate::limits::Limits;
use crate::namespace::{BackendConfig, Namespace, NamespaceConfig, NamespaceError, NamespaceTable};
pub use crate::peer::TransportKind;
use crate::qos::QosConfig;
use crate::reservation::{self, Reservations};
use crate::spec::{DISCOVERY_NQN, MAX_CNTLID};
use crate::subsystem::{Subsystem, SubsystemKind, SubsystemSettings};
pub use crate::visibility::Visibility;
use storage::{Backend, BackendError};

/// A listening port (NVMe-oF "port": transport + address + service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    pub id: u16,
    pub transport: TransportKind,
    pub address: IpAddr,
    pub service: u16,
    /// TLS on an NVMe/TCP port, as its discovery log entries report it (TREQ, TSAS).
    pub secure_channel: SecureChannel,
}

/// A TCP port's secure channel requirement (the transport does the TLS; the core reports it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SecureChannel {
    #[default]
    None,
    TlsOptional,
    TlsRequired,
}

/// One NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Serial number reported in Identify Controller; empty = derived from the NQN.
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub allowed_hosts: Vec<String>,
    /// Hosts that must authenticate (DH-HMAC-CHAP), with their keys; each is allowed.
    pub host_auth: BTreeMap<String, crate::auth::HostAuth>,
    /// Port ids exporting this subsystem; empty = every port.
    pub ports: Vec<u16>,
    pub namespaces: Vec<NamespaceConfig>,
    /// Namespaces shown to chosen hosts only (the others to every allowed host).
    pub visibility: Visibility,
    /// IOPS and bandwidth limits per namespace and per host (`qos`).
    pub qos: QosConfig,
}

impl SubsystemConfig {
    /// Open to any host on every port, without authentication, serial derived from the NQN:
    /// the subsystem of tests, benchmarks and self-tests.
    pub fn open_to_any_host(nqn: &str, model: &str, namespaces: Vec<NamespaceConfig>) -> Self {
        SubsystemConfig {
            nqn: nqn.into(),
            serial: String::new(),
            model: model.into(),
            allow_any_host: true,
            allowed_hosts: vec![],
            host_auth: Default::default(),
            ports: vec![],
            namespaces,
            visibility: Visibility::default(),
            qos: QosConfig::default(),
        }
    }
}

// Here rather than in `namespace`, which `ana` depends on: the default group is `ana`'s.
impl NamespaceConfig {
    /// A writable namespace in the default ANA group, its UUID and NGUID derived.
    pub fn new(nsid: u32, backend: BackendConfig, block_size: u32) -> Self {
        NamespaceConfig {
            nsid,
            backend,
            block_size,
            read_only: false,
            uuid: None,
            nguid: None,
            ana_group: DEFAULT_ANA_GROUP,
        }
    }
}

/// A discovery referral: another discovery controller hosts should also ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferralConfig {
    pub transport: TransportKind,
    pub address: IpAddr,
    pub service: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetConfig {
    pub ports: Vec<PortConfig>,
    pub subsystems: Vec<SubsystemConfig>,
    pub limits: Limits,
    pub referrals: Vec<ReferralConfig>,
    /// Controller ID range and ANA groups (several targets serving one subsystem).
    pub multipath: MultipathConfig,
    /// Where reservation states with Persist Through Power Loss are kept (one file per
    /// namespace); `None`: PTPL is not offered.
    pub state_dir: Option<std::path::PathBuf>,
    /// Where a gateway group keeps the reservation state of each namespace, shared with the
    /// other gateways (it replaces `state_dir`'s files for reservations, and reservations
    /// are then served although the controller ID range is restricted); `None`: one
    /// gateway's own state.
    pub reservation_stores: Option<reservation::SharedStores>,
    /// The discovery subsystem's own NQN (TP 8013 unique discovery NQN), reported in Identify
    /// Controller and its discovery log entries; Connect takes it and the well-known NQN.
    /// `None`: the well-known NQN.
    pub discovery_nqn: Option<String>,
}

/// Why a configuration could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("subsystem {nqn} namespace {nsid}: {source}")]
    ReservationState {
        nqn: String,
        nsid: u32,
        source: crate::reservation::StoreError,
    },
    #[error("duplicate port id {0}")]
    DuplicatePort(u16),
    #[error("duplicate subsystem {0}")]
    DuplicateSubsystem(String),
    #[error("subsystem {0}: the discovery NQN is reserved")]
    ReservedNqn(String),
    #[error("discovery NQN {nqn}: must be 1..=223 bytes")]
    InvalidDiscoveryNqn { nqn: String },
    #[error("the discovery NQN cannot change on reload (restart to change it)")]
    DiscoveryNqnChanged,
    #[error("discovery generation counter: {0}")]
    Genctr(#[from] crate::genctr::GenctrError),
    #[error("subsystem {nqn}: NQN must be 1..=223 bytes")]
    InvalidNqn { nqn: String },
    #[error("subsystem {nqn}: unknown port id {port}")]
    UnknownPort { nqn: String, port: u16 },
    #[error("subsystem {nqn}: duplicate namespace {nsid}")]
    DuplicateNamespace { nqn: String, nsid: u32 },
    #[error("subsystem {nqn}, namespace {nsid}")]
    Namespace {
        nqn: String,
        nsid: u32,
        #[source]
        source: NamespaceError,
    },
    #[error("subsystem {nqn}, namespace {nsid}: cannot open backend")]
    Backend {
        nqn: String,
        nsid: u32,
        #[source]
        source: BackendError,
    },
    #[error("subsystem {nqn}, namespace {nsid}: ANA group {group} is not configured")]
    UnknownAnaGroup { nqn: String, nsid: u32, group: u32 },
    #[error(transparent)]
    Ana(#[from] AnaError),
    #[error("invalid limit: {0}")]
    InvalidLimit(&'static str),
    #[error("limits cannot change on reload (restart to change them)")]
    LimitsChanged,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    pub subsystems_added: Vec<String>,
    pub subsystems_removed: Vec<String>,
    pub subsystems_changed: Vec<String>,
    /// (subsystem NQN, NSID)
    pub namespaces_added: Vec<(String, u32)>,
    pub namespaces_removed: Vec<(String, u32)>,
    /// Namespaces whose configuration changed (reopened; hosts get a change notice).
    pub namespaces_replaced: Vec<(String, u32)>,
    /// Namespaces shown to other hosts than before (the hosts whose view changed get a
    /// change notice).
    pub namespaces_visibility_changed: Vec<(String, u32)>,
    /// Subsystems whose QoS limits changed (applied live, no host sees a change).
    pub qos_changed: Vec<String>,
    pub ports_changed: bool,
    pub referrals_changed: bool,
    /// ANA log page change count after the reload (bumped when any state or group changed).
    pub ana_chgcnt: u64,
    /// Discovery log generation counter after the reload.
    pub discovery_genctr: u64,
}

/// Snapshot of the target's exported topology, replaced as a whole on reload.
#[derive(Debug)]
pub(crate) struct Topology {
    pub ports: Vec<PortConfig>,
    pub subsystems: BTreeMap<String, Arc<Subsystem>>,
    pub referrals: Vec<ReferralConfig>,
    /// Discovery log page generation counter (NVMe Base 2.0 Figure 262: GENCTR), part of the
    /// snapshot so a log page and its GENCTR always describe the same topology.
    pub genctr: u64,
    /// The ANA table published to every subsystem.
    pub ana: Arc<AnaTable>,
}

/// What the Discovery log page shows one host, short of the addresses its own connection
/// fills in: every port (the current discovery subsystem's entries), each subsystem the host
/// may use with the ports exporting it, and the referrals. `discovery` builds the page from
/// it; a reload compares it per discovery controller to send the change notice only where the
/// page changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiscoveryView {
    pub ports: Vec<PortConfig>,
    pub subsystems: Vec<(String, Vec<PortConfig>)>,
    pub referrals: Vec<ReferralConfig>,
}

impl Topology {
    pub(crate) fn discovery_view(&self, hostnqn: &str) -> DiscoveryView {
        let subsystems = self
            .subsystems
            .values()
            .filter(|sub| !sub.is_removed() && sub.host_allowed(hostnqn))
            .map(|sub| {
                let ports = self.ports.iter().filter(|p| sub.exported_on(p.id));
                (sub.nqn.clone(), ports.cloned().collect())
            })
            .collect();
        DiscoveryView {
            ports: self.ports.clone(),
            subsystems,
            referrals: self.referrals.clone(),
        }
    }
}

/// Maximum NQN length in bytes (NVMe Base 2.0 §4.5).
pub const MAX_NQN_LEN: usize = 223;

/// The target: everything a queue needs to find subsystems, namespaces and controllers.
#[derive(Debug)]
pub struct Target {
    limits: Limits,
    topology: RwLock<Arc<Topology>>,
    discovery: Arc<Subsystem>,
    /// Start time (the control socket's uptime).
    started: Instant,
    /// SMART / Health counters that outlive controllers and namespace reopenings.
    health: Health,
    /// Command counters, once enabled (before the first queue exists).
    metrics: std::sync::OnceLock<Arc<crate::metrics::Registry>>,
    /// Failed in-band authentications, target-wide and per source address.
    auth_failures: Arc<crate::auth::FailureLimiter>,
    /// Where authentication exponentiations run, once given (`set_auth_offload`).
    auth_offload: std::sync::OnceLock<crate::auth::AuthOffload>,
}

impl Target {
    /// Validates `config`, opens every namespace backend with `opener` (the daemon's:
    /// `storage::open`; tests use in-memory backends) and builds the target.
    pub fn with_opener(
        config: TargetConfig,
        opener: &BackendOpener,
    ) -> Result<Arc<Target>, TargetError> {
        validate_limits(&config.limits)?;
        let discovery_nqn = config.discovery_nqn.as_deref().unwrap_or(DISCOVERY_NQN);
        if discovery_nqn.is_empty()
            || discovery_nqn.len() > MAX_NQN_LEN
            || discovery_nqn.contains('\0')
        {
            return Err(TargetError::InvalidDiscoveryNqn {
                nqn: discovery_nqn.to_owned(),
            });
        }
        let ana = Arc::new(build_ana(&config, None, &BTreeMap::new())?);
        let health = Health::default();
        let subsystems = build_subsystems(
            &config,
            discovery_nqn,
            &ana,
            &BTreeMap::new(),
            opener,
            &health,
        )?;
        let genctr =
            crate::genctr::initial(config.state_dir.as_deref(), std::time::SystemTime::now())?;
        for sub in subsystems.values() {
            sub.publish_ana(Arc::clone(&ana));
            let mp = &config.multipath;
            sub.set_cntlid_range(mp.cntlid_min, mp.cntlid_max);
            sub.set_shared_reservations(config.reservation_stores.is_some());
        }
        let discovery = Arc::new(Subsystem::new(
            discovery_nqn.to_string(),
            SubsystemKind::Discovery,
            SubsystemSettings {
                serial: derived_serial(discovery_nqn),
                model: "nvmfd discovery".to_string(),
                allow_any_host: true,
                allowed_hosts: BTreeSet::new(),
                host_auth: BTreeMap::new(),
                ports: BTreeSet::new(),
            },
            NamespaceTable::default(),
        ));
        Ok(Arc::new(Target {
            limits: config.limits,
            topology: RwLock::new(Arc::new(Topology {
                ports: config.ports,
                subsystems,
                referrals: config.referrals,
                genctr,
                ana,
            })),
            discovery,
            started: Instant::now(),
            health,
            metrics: std::sync::OnceLock::new(),
            auth_failures: Arc::default(),
            auth_offload: std::sync::OnceLock::new(),
        }))
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Starts counting commands (queues created from now on count); returns the registry the
    /// metrics endpoint and `ctl top` read.
    pub fn enable_metrics(&self) -> Arc<crate::metrics::Registry> {
        Arc::clone(self.metrics.get_or_init(crate::metrics::Registry::new))
    }

    /// The command counters, when enabled.
    pub fn metrics(&self) -> Option<&Arc<crate::metrics::Registry>> {
        self.metrics.get()
    }

    pub(crate) fn topology(&self) -> Arc<Topology> {
        Arc::clone(&self.topology.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn discovery_subsystem(&self) -> &Arc<Subsystem> {
        &self.discovery
    }

    /// Finds the subsystem `nqn` (the discovery subsystem included, under its own NQN and the
    /// well-known one: TP 8013 keeps the well-known NQN valid in Connect).
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN || nqn == self.discovery.nqn {
            return Some(Arc::clone(&self.discovery));
        }
        self.topology().subsystems.get(nqn).cloned()
    }

    /// NQNs of the NVM subsystems currently served.
    pub fn subsystem_nqns(&self) -> Vec<String> {
        self.topology().subsystems.keys().cloned().collect()
    }

    pub fn ports(&self) -> Vec<PortConfig> {
        self.topology().ports.clone()
    }

    pub fn discovery_genctr(&self) -> u64 {
        self.topology().genctr
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// SMART / Health counters (restored from and saved to the state directory by the daemon).
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Failed in-band authentications (counted, and rate-limited per source address).
    pub fn auth_failures(&self) -> &Arc<crate::auth::FailureLimiter> {
        &self.auth_failures
    }

    /// Runs authentication exponentiations on `offload`'s workers from now on, within its
    /// bounds (before the first queue exists; a second call changes nothing: `false`).
    pub fn set_auth_offload(&self, offload: crate::auth::AuthOffload) -> bool {
        self.auth_offload.set(offload).is_ok()
    }

    /// The authentication offload, when one was given.
    pub fn auth_offload(&self) -> Option<&crate::auth::AuthOffload> {
        self.auth_offload.get()
    }

    /// Applies a new configuration to the running target (SIGHUP / control socket).
    ///
    /// Namespaces whose configuration is unchanged keep their open backend; added or removed
    /// namespaces raise a Namespace Attribute Changed event on every controller of the
    /// subsystem; any change to what discovery reports bumps GENCTR and raises a Discovery Log
    /// Page Change event. Subsystems that disappear lose their controllers. Nothing changes
    /// if any part of the new configuration fails to validate or open.
    pub fn apply_with_opener(
        &self,
        config: TargetConfig,
        opener: &BackendOpener,
    ) -> Result<ReloadSummary, TargetError> {
        validate_limits(&config.limits)?;
        if config.limits != self.limits {
            return Err(TargetError::LimitsChanged);
        }
        if config.discovery_nqn.as_deref().unwrap_or(DISCOVERY_NQN) != self.discovery.nqn {
            return Err(TargetError::DiscoveryNqnChanged);
        }
        let mut guard = self.topology.write().unwrap_or_else(|e| e.into_inner());
        let old = Arc::clone(&guard);
        let ana = build_ana(&config, Some(&old.ana), &old.subsystems)?;
        let ana = if ana == *old.ana {
            Arc::clone(&old.ana)
        } else {
            Arc::new(ana)
        };
        // What each discovery controller's host sees now, before anything live changes.
        let watchers: Vec<_> = self
            .discovery
            .controllers()
            .into_iter()
            .map(|ctrl| {
                let before = old.discovery_view(&ctrl.hostnqn);
                (ctrl, before)
            })
            .collect();
        // Open everything new before touching anything live.
        let fresh = build_subsystems(
            &config,
            &self.discovery.nqn,
            &ana,
            &old.subsystems,
            opener,
            &self.health,
        )?;
        let mut summary = ReloadSummary::default();
        let mut merged = BTreeMap::new();
        let mut discovery_changed = false;
        for (nqn, new_sub) in fresh {
            match old.subsystems.get(&nqn) {
                Some(live) => {
                    let change = live.update_from(&new_sub);
                    let settings_changed = change.settings_changed;
                    if settings_changed {
                        summary.subsystems_changed.push(nqn.clone());
                        discovery_changed = true;
                    }
                    let tag = |nsids: Vec<u32>| nsids.into_iter().map(|n| (nqn.clone(), n));
                    summary.namespaces_added.extend(tag(change.added));
                    summary.namespaces_removed.extend(tag(change.removed));
                    summary.namespaces_replaced.extend(tag(change.replaced));
                    summary
                        .namespaces_visibility_changed
                        .extend(tag(change.visibility_changed));
                    if change.qos_changed {
                        summary.qos_changed.push(nqn.clone());
                    }
                    merged.insert(nqn, Arc::clone(live));
                }
                None => {
                    summary.subsystems_added.push(nqn.clone());
                    discovery_changed = true;
                    merged.insert(nqn, new_sub);
                }
            }
        }
        for (nqn, sub) in &old.subsystems {
            if !merged.contains_key(nqn) {
                summary.subsystems_removed.push(nqn.clone());
                discovery_changed = true;
                sub.shut_down();
            }
        }
        // ANA: publish the new table everywhere (new subsystems have it already), then tell
        // each controller whose log page changed (NVMe Base 2.0 §8.1.3.8: ANA change notice).
        let mp = &config.multipath;
        for sub in merged.values() {
            sub.set_cntlid_range(mp.cntlid_min, mp.cntlid_max);
            sub.set_shared_reservations(config.reservation_stores.is_some());
            if !Arc::ptr_eq(&sub.ana(), &ana) {
                sub.publish_ana(Arc::clone(&ana));
            }
        }
        if !Arc::ptr_eq(&ana, &old.ana) {
            for sub in merged.values() {
                for ctrl in sub.controllers() {
                    if ana.changed_on(&old.ana, ctrl.peer.port_id) {
                        ctrl.raise_event(AsyncEvent::AnaChange);
                    }
                }
            }
        }
        summary.ana_chgcnt = ana.chgcnt();
        summary.ports_changed = config.ports != old.ports;
        summary.referrals_changed = config.referrals != old.referrals;
        discovery_changed |= summary.ports_changed || summary.referrals_changed;
        let genctr = old.genctr + discovery_changed as u64;
        if let Some(dir) = config.state_dir.as_deref().filter(|_| discovery_changed) {
            // The reload itself has taken effect by now; a counter that could not be stored
            // is still right in memory and only risks a repeat after a restart.
            if let Err(e) = crate::genctr::store(dir, genctr) {
                tracing::error!(error = %e, genctr, "discovery generation counter not saved");
            }
        }
        *guard = Arc::new(Topology {
            ports: config.ports,
            subsystems: merged,
            referrals: config.referrals,
            genctr,
            ana,
        });
        summary.discovery_genctr = guard.genctr;
        let new = Arc::clone(&guard);
        drop(guard);
        // Discovery Log Page Change notice (NVMe Base 2.0 §5.27.1.1, Figure 152) to each
        // discovery controller whose host now sees other entries; a host the change does not
        // concern is not sent to re-read.
        for (ctrl, before) in watchers {
            if new.discovery_view(&ctrl.hostnqn) != before {
                ctrl.raise_event(AsyncEvent::DiscoveryLogChanged);
            }
        }
        Ok(summary)
    }
}

impl Target {
    /// Follows backends whose size can change underneath the target (RBD images): call
    /// periodically (the daemon does, about once a second). Resized namespaces are republished
    /// and their hosts notified; returns (subsystem NQN, NSID) of each.
    pub fn refresh_capacities(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (nqn, sub) in &self.topology().subsystems {
            out.extend(
                sub.refresh_capacities()
                    .into_iter()
                    .map(|n| (nqn.clone(), n)),
            );
        }
        out
    }
}

/// Opens a namespace backend (the daemon's: `storage::open`).
pub type BackendOpener =
    dyn Fn(&BackendConfig, u32) -> Result<Arc<dyn Backend>, BackendError> + Send + Sync;

fn validate_limits(l: &Limits) -> Result<(), TargetError> {
    if !(2..=4096).contains(&l.max_queue_size) {
        return Err(TargetError::InvalidLimit("max_queue_size must be 2..=4096"));
    }
    if l.max_io_queues == 0 || l.max_io_queues > 0xfffe {
        return Err(TargetError::InvalidLimit("max_io_queues must be 1..=65534"));
    }
    if !l.max_data_transfer.is_power_of_two() || l.max_data_transfer < 4096 {
        return Err(TargetError::InvalidLimit(
            "max_data_transfer must be a power of two >= 4096",
        ));
    }
    // IOCCSZ is in 16-byte units and the in-capsule data follows a 64-byte SQE.
    if l.in_capsule_data_size & 15 != 0 || l.in_capsule_data_size > l.max_data_transfer {
        return Err(TargetError::InvalidLimit(
            "in_capsule_data_size must be a multiple of 16 and <= max_data_transfer",
        ));
    }
    Ok(())
}

/// Serial number derived from the NQN when none is configured: 20 hex digits of a stable hash
/// (hosts compare serials across paths, so it must not change between restarts).
pub fn derived_serial(nqn: &str) -> String {
    let id = crate::namespace::derived_nguid(nqn, 0);
    id[..10].iter().map(|b| format!("{b:02x}")).collect()
}

/// The ANA table for `config`. With a previous table, the groups a namespace moved out of or
/// into get a new change count. Added and removed namespaces do not: hosts learn of them from
/// the Namespace Attribute Changed notice and look their group up then (as with nvmet).
fn build_ana(
    config: &TargetConfig,
    previous: Option<&AnaTable>,
    existing: &BTreeMap<String, Arc<Subsystem>>,
) -> Result<AnaTable, TargetError> {
    let mp = &config.multipath;
    if mp.cntlid_min == 0 || mp.cntlid_min > mp.cntlid_max || mp.cntlid_max > MAX_CNTLID {
        return Err(AnaError::CntlidRange {
            min: mp.cntlid_min,
            max: mp.cntlid_max,
        }
        .into());
    }
    let mut membership_changed = BTreeSet::new();
    for sc in &config.subsystems {
        let Some(old) = existing.get(&sc.nqn).map(|s| s.namespaces()) else {
            continue;
        };
        for nc in &sc.namespaces {
            if let Some(ns) = old.get(nc.nsid).filter(|ns| ns.anagrpid != nc.ana_group) {
                membership_changed.insert(ns.anagrpid);
                membership_changed.insert(nc.ana_group);
            }
        }
    }
    let port_ids: Vec<u16> = config.ports.iter().map(|p| p.id).collect();
    Ok(AnaTable::build(
        &mp.ana_groups,
        &port_ids,
        previous,
        &membership_changed,
    )?)
}

/// Validates the subsystems of `config` and opens their namespaces; namespaces whose
/// configuration matches one in `existing` reuse its opened backend.
fn build_subsystems(
    config: &TargetConfig,
    discovery_nqn: &str,
    ana: &AnaTable,
    existing: &BTreeMap<String, Arc<Subsystem>>,
    opener: &BackendOpener,
    health: &Health,
) -> Result<BTreeMap<String, Arc<Subsystem>>, TargetError> {
    let mut port_ids = BTreeSet::new();
    for p in &config.ports {
        if !port_ids.insert(p.id) {
            return Err(TargetError::DuplicatePort(p.id));
        }
    }
    let mut out = BTreeMap::new();
    for sc in &config.subsystems {
        if sc.nqn == DISCOVERY_NQN || sc.nqn == discovery_nqn {
            return Err(TargetError::ReservedNqn(sc.nqn.clone()));
        }
        if sc.nqn.is_empty() || sc.nqn.len() > MAX_NQN_LEN || sc.nqn.contains('\0') {
            return Err(TargetError::InvalidNqn {
                nqn: sc.nqn.clone(),
            });
        }
        if out.contains_key(&sc.nqn) {
            return Err(TargetError::DuplicateSubsystem(sc.nqn.clone()));
        }
        for &port in &sc.ports {
            if !port_ids.contains(&port) {
                return Err(TargetError::UnknownPort {
                    nqn: sc.nqn.clone(),
                    port,
                });
            }
        }
        let old_table = existing.get(&sc.nqn).map(|s| s.namespaces());
        let mut namespaces = Vec::new();
        let mut nsids = BTreeSet::new();
        for nc in &sc.namespaces {
            if !nsids.insert(nc.nsid) {
                return Err(TargetError::DuplicateNamespace {
                    nqn: sc.nqn.clone(),
                    nsid: nc.nsid,
                });
            }
            if !ana.has_group(nc.ana_group) {
                return Err(TargetError::UnknownAnaGroup {
                    nqn: sc.nqn.clone(),
                    nsid: nc.nsid,
                    group: nc.ana_group,
                });
            }
            let old_ns = old_table.as_ref().and_then(|t| t.get(nc.nsid));
            let reuse = old_ns.filter(|ns| ns.config == *nc).cloned();
            // Moving a namespace to another ANA group keeps its open backend.
            let regroup = old_ns.filter(|ns| {
                ns.config.ana_group != nc.ana_group
                    && NamespaceConfig {
                        ana_group: nc.ana_group,
                        ..ns.config.clone()
                    } == *nc
            });
            // A namespace opened anew reads its persistent reservation state (if any).
            let with_state = |mut ns: Namespace| -> Result<Arc<Namespace>, TargetError> {
                ns.stats = health.namespace(&sc.nqn, nc.nsid);
                let state_err = |source| TargetError::ReservationState {
                    nqn: sc.nqn.clone(),
                    nsid: nc.nsid,
                    source,
                };
                if let Some(stores) = &config.reservation_stores {
                    let store = stores
                        .0
                        .open(&sc.nqn, nc.nsid, &ns.nguid)
                        .map_err(state_err)?;
                    ns.reservations = Reservations::open(store).map_err(state_err)?;
                } else if let Some(dir) = &config.state_dir {
                    let file = reservation::state_file(dir, &ns.nguid);
                    ns.reservations = Reservations::persistent(file).map_err(state_err)?;
                }
                Ok(Arc::new(ns))
            };
            let ns = match (reuse, regroup) {
                (Some(ns), _) => ns,
                (None, Some(old)) => {
                    let mut ns = Namespace::new(nc.clone(), Arc::clone(&old.backend), &sc.nqn)
                        .map_err(|source| TargetError::Namespace {
                            nqn: sc.nqn.clone(),
                            nsid: nc.nsid,
                            source,
                        })?;
                    // Same backend: writes in flight on the old view stay visible to fused pairs.
                    ns.writes = Arc::clone(&old.writes);
                    with_state(ns)?
                }
                (None, None) => {
                    let ns_err = |source| TargetError::Namespace {
                        nqn: sc.nqn.clone(),
                        nsid: nc.nsid,
                        source,
                    };
                    // Check what we can before opening (a backend may create files).
                    if nc.nsid == 0 || nc.nsid == u32::MAX {
                        return Err(ns_err(NamespaceError::InvalidNsid(nc.nsid)));
                    }
                    if nc.block_size != 512 && nc.block_size != 4096 {
                        return Err(ns_err(NamespaceError::InvalidBlockSize(nc.block_size)));
                    }
                    let backend = opener(&nc.backend, nc.block_size).map_err(|source| {
                        TargetError::Backend {
                            nqn: sc.nqn.clone(),
                            nsid: nc.nsid,
                            source,
                        }
                    })?;
                    with_state(Namespace::new(nc.clone(), backend, &sc.nqn).map_err(ns_err)?)?
                }
            };
            namespaces.push(ns);
        }
        let settings = SubsystemSettings {
            serial: if sc.serial.is_empty() {
                derived_serial(&sc.nqn)
            } else {
                sc.serial.clone()
            },
            model: sc.model.clone(),
            allow_any_host: sc.allow_any_host,
            allowed_hosts: sc.allowed_hosts.iter().cloned().collect(),
            host_auth: sc.host_auth.clone(),
            ports: sc.ports.iter().copied().collect(),
        };
        let subsystem = Subsystem::new(
            sc.nqn.clone(),
            SubsystemKind::Nvm,
            settings,
            NamespaceTable::new(namespaces),
        )
        .with_visibility(sc.visibility.clone());
        subsystem.set_qos(&sc.qos);
        out.insert(sc.nqn.clone(), Arc::new(subsystem));
    }
    Ok(out)
}
