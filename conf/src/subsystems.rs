//! `[[subsystems]]` with their allowed hosts and `[[subsystems.namespaces]]`, and their checks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hosts::{self, Host};
use crate::multipath::{default_ana_group, is_default_ana_group, AnaGroup, DEFAULT_ANA_GROUP};
use crate::names::{check_nqn, check_subsystem_name, parse_nguid, parse_uuid};
use crate::ports::Port;
use crate::qos::{self, HostQos, Qos};
use crate::report::{Errors, ValidationError};
use crate::size::ByteSize;

/// Supported LBA data sizes (Identify Namespace LBAF); both are what Linux hosts expect.
pub const BLOCK_SIZES: [u32; 2] = [512, 4096];
/// Identify Controller SN and MN field widths (NVMe Base 2.0 §5.17.2.1).
pub const SERIAL_MAX: usize = 20;
pub const MODEL_MAX: usize = 40;

/// `[[subsystems]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subsystem {
    pub nqn: String,
    /// Identify Controller SN (≤ 20 ASCII); empty = derived from the NQN.
    #[serde(default)]
    pub serial: String,
    /// Identify Controller MN (≤ 40 ASCII).
    #[serde(default = "default_model")]
    pub model: String,
    /// `true` opens the subsystem to every host. A subsystem that lists no hosts must say
    /// `true` (or `false`, closed) explicitly: an open subsystem is never a default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    /// Hosts allowed without authentication settings.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Hosts allowed with their authentication settings (`[[subsystems.hosts]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Host>,
    /// Port ids this subsystem is exported on; empty = every port.
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
    /// IOPS and bandwidth limits of hosts on this subsystem (`[[subsystems.host_qos]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_qos: Vec<HostQos>,
}

fn default_model() -> String {
    "nvmfd".to_owned()
}

impl Subsystem {
    /// Whether any host NQN may connect: only when the file says so.
    pub fn allows_any_host(&self) -> bool {
        self.allow_any_host == Some(true)
    }

    /// Every allowed host NQN: `allowed_hosts` and the `hosts` entries.
    pub fn host_nqns(&self) -> impl Iterator<Item = &str> {
        self.allowed_hosts
            .iter()
            .map(String::as_str)
            .chain(self.hosts.iter().map(|h| h.nqn.as_str()))
    }

    /// Whether this subsystem is reachable through port `port_id`.
    pub fn exported_on(&self, port_id: u16) -> bool {
        self.ports.is_empty() || self.ports.contains(&port_id)
    }
}

/// `[[subsystems.namespaces]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Namespace {
    pub nsid: u32,
    /// RAM-backed namespace of this size (exclusive with `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_size: Option<ByteSize>,
    /// A null namespace of this size: reads return zeroes, writes are dropped (benchmarks;
    /// exclusive with every other storage key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub null_size: Option<ByteSize>,
    /// Regular file or block device (exclusive with `ram_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Ceph RBD image, "pool/image" or "pool/namespace/image" (exclusive with `ram_size` and
    /// `path`; needs nvmfd built with the `rbd` feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbd: Option<String>,
    /// ceph.conf for `rbd` (default: librados' search: $CEPH_CONF, /etc/ceph/ceph.conf, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceph_conf: Option<PathBuf>,
    /// Ceph client id for `rbd`, "admin" or "client.admin" (default: admin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceph_client_id: Option<String>,
    /// Create or extend the regular file at `path` to this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<ByteSize>,
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default = "default_true")]
    pub direct_io: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
    /// ANA group (an `[[ana_groups]]` id, or 1).
    #[serde(
        default = "default_ana_group",
        skip_serializing_if = "is_default_ana_group"
    )]
    pub ana_group: u32,
    /// Fault injection, for tests: commands touching these LBA ranges fail.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
    /// Host NQNs that see this namespace; absent = every host the subsystem admits. The
    /// others find the NSID inactive (not in their active namespace list, Invalid Namespace
    /// for I/O).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// IOPS and bandwidth limits of this namespace, all hosts together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<Qos>,
}

/// `[[subsystems.namespaces.faults]]`: commands of kind `on` that touch LBAs
/// `slba .. slba + blocks` wait `latency_ms` (if set) and then fail with `error` (if set),
/// before the storage sees them; with `every = n` only every n-th such command does (tests
/// of how hosts and the target handle failing or slow media; see storage::fault).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub slba: u64,
    pub blocks: u64,
    pub on: FaultOn,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<FaultError>,
    /// Delay before the command starts, ms (the reactor keeps serving other commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u32>,
    /// Apply to every n-th command touching the range (default 1: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u32>,
}

/// Longest `latency_ms`: far beyond any host's I/O timeout (Linux: 30 s), which is the
/// longest delay a test has a use for.
pub const MAX_FAULT_LATENCY_MS: u32 = 600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultOn {
    Read,
    Write,
    Any,
}

/// The errno the storage reports: `eio` (a media error) or `enospc` (out of space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultError {
    Eio,
    Enospc,
}

fn default_block_size() -> u32 {
    512
}

fn default_true() -> bool {
    true
}

/// Where a namespace's data lives, once validation has established that exactly one of
/// `ram_size` / `path` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage<'a> {
    Ram {
        size: u64,
    },
    Null {
        size: u64,
    },
    Path {
        path: &'a std::path::Path,
        size: Option<u64>,
    },
    Rbd {
        /// "pool/image" or "pool/namespace/image" (validated).
        image: &'a str,
        ceph_conf: Option<&'a std::path::Path>,
        client_id: Option<&'a str>,
    },
}

impl Namespace {
    /// A namespace with every optional key at its default.
    pub fn new_ram(nsid: u32, size: ByteSize) -> Namespace {
        Namespace {
            nsid,
            ram_size: Some(size),
            null_size: None,
            path: None,
            rbd: None,
            ceph_conf: None,
            ceph_client_id: None,
            size: None,
            block_size: default_block_size(),
            read_only: false,
            direct_io: true,
            uuid: None,
            nguid: None,
            ana_group: default_ana_group(),
            faults: Vec::new(),
            hosts: None,
            qos: None,
        }
    }

    /// `None` when the namespace is invalid (not exactly one of `ram_size` / `path` / `rbd`).
    pub fn storage(&self) -> Option<Storage<'_>> {
        if let Some(size) = self.null_size {
            let alone = self.ram_size.is_none() && self.path.is_none() && self.rbd.is_none();
            return alone.then_some(Storage::Null { size: size.bytes() });
        }
        match (&self.ram_size, &self.path, &self.rbd) {
            (Some(size), None, None) => Some(Storage::Ram { size: size.bytes() }),
            (None, Some(path), None) => Some(Storage::Path {
                path,
                size: self.size.map(ByteSize::bytes),
            }),
            (None, None, Some(image)) => Some(Storage::Rbd {
                image,
                ceph_conf: self.ceph_conf.as_deref(),
                client_id: self.ceph_client_id.as_deref(),
            }),
            _ => None,
        }
    }

    /// The configured UUID, parsed (None if unset or malformed: validation reports the latter).
    pub fn uuid_bytes(&self) -> Option<[u8; 16]> {
        self.uuid.as_deref().and_then(parse_uuid)
    }

    pub fn nguid_bytes(&self) -> Option<[u8; 16]> {
        self.nguid.as_deref().and_then(parse_nguid)
    }
}

/// Every problem with `[[subsystems]]`: identity, hosts, port references, namespaces, and the
/// namespace identifiers and files that must be unique target-wide.
pub(crate) fn check(subsystems: &[Subsystem], ports: &[Port], errors: &mut Errors) {
    let mut nqns = HashMap::new();
    // Namespace identifiers and backing files must be unique target-wide: a host folding
    // paths by UUID/NGUID would otherwise merge two different namespaces.
    let mut uuids: HashMap<[u8; 16], String> = HashMap::new();
    let mut nguids: HashMap<[u8; 16], String> = HashMap::new();
    let mut paths: HashMap<PathBuf, String> = HashMap::new();
    for (s, subsystem) in subsystems.iter().enumerate() {
        let key = format!("subsystems[{s}]");
        check_subsystem_identity(&key, subsystem, errors);
        if let Some(first) = nqns.insert(subsystem.nqn.as_str(), s) {
            errors.push(
                format!("{key}.nqn"),
                &subsystem.nqn,
                format!("duplicate NQN (also subsystems[{first}])"),
            );
        }
        let mut port_ids = HashMap::new();
        for (p, &port_id) in subsystem.ports.iter().enumerate() {
            let pkey = format!("{key}.ports[{p}]");
            if !ports.iter().any(|port| port.id == port_id) {
                errors.push(&pkey, port_id, "no port with this id in [[ports]]");
            }
            if let Some(first) = port_ids.insert(port_id, p) {
                errors.push(
                    &pkey,
                    port_id,
                    format!("listed twice (also {key}.ports[{first}])"),
                );
            }
        }
        qos::check_hosts(&key, &subsystem.host_qos, errors);
        let mut nsids = HashMap::new();
        for (n, namespace) in subsystem.namespaces.iter().enumerate() {
            let nkey = format!("{key}.namespaces[{n}]");
            if let Some(first) = nsids.insert(namespace.nsid, n) {
                errors.push(
                    format!("{nkey}.nsid"),
                    namespace.nsid,
                    format!("duplicate nsid (also {key}.namespaces[{first}])"),
                );
            }
            check_namespace(&nkey, namespace, errors);
            check_namespace_hosts(&nkey, namespace, errors);
            if let Some(limits) = &namespace.qos {
                qos::check(&format!("{nkey}.qos"), limits, errors);
            }
            let mut unique = |map: &mut HashMap<[u8; 16], String>, field: &str, id| {
                if let Some(first) = map.get(&id) {
                    let value = match field {
                        "uuid" => namespace.uuid.as_deref().unwrap_or_default(),
                        _ => namespace.nguid.as_deref().unwrap_or_default(),
                    };
                    errors.push(
                        format!("{nkey}.{field}"),
                        value,
                        format!("duplicate {field} (also {first})"),
                    );
                } else {
                    map.insert(id, nkey.clone());
                }
            };
            if let Some(id) = namespace.uuid_bytes() {
                unique(&mut uuids, "uuid", id);
            }
            if let Some(id) = namespace.nguid_bytes() {
                unique(&mut nguids, "nguid", id);
            }
            if let Some(path) = &namespace.path {
                let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                if let Some(first) = paths.get(&canonical) {
                    errors.push(
                        format!("{nkey}.path"),
                        path.display(),
                        format!("already exported by {first}"),
                    );
                } else {
                    paths.insert(canonical, nkey.clone());
                }
            }
        }
    }
}

/// Subsystem names that nvmet accepts but that are not NVMe Base 2.0 §4.5 NQNs: served, but a
/// strict host or tool may refuse them, so the administrator hears about it.
pub(crate) fn warnings(subsystems: &[Subsystem], warnings: &mut Vec<ValidationError>) {
    for (s, subsystem) in subsystems.iter().enumerate() {
        if check_subsystem_name(&subsystem.nqn).is_err() {
            continue; // an error, reported by `check`
        }
        if let Err(e) = check_nqn(&subsystem.nqn) {
            warnings.push(ValidationError {
                key: format!("subsystems[{s}].nqn"),
                value: subsystem.nqn.clone(),
                reason: format!("not a well-formed NQN ({e}); served as nvmet would"),
            });
        }
        namespace_host_warnings(s, subsystem, warnings);
    }
}

/// A namespace's `hosts` are host NQNs, each listed once.
fn check_namespace_hosts(key: &str, namespace: &Namespace, errors: &mut Errors) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (h, host) in namespace.hosts.iter().flatten().enumerate() {
        let hkey = format!("{key}.hosts[{h}]");
        if let Err(e) = check_nqn(host) {
            errors.push(&hkey, host, e.to_string());
        }
        if let Some(first) = seen.insert(host, h) {
            errors.push(
                &hkey,
                host,
                format!("listed twice (also {key}.hosts[{first}])"),
            );
        }
    }
}

/// Namespace `hosts` that can never see the namespace (the subsystem admits no such host),
/// and namespaces hidden from every host: legal (the list may be edited before the host is
/// added), but probably not what was meant.
fn namespace_host_warnings(s: usize, subsystem: &Subsystem, warnings: &mut Vec<ValidationError>) {
    for (n, namespace) in subsystem.namespaces.iter().enumerate() {
        let Some(hosts) = &namespace.hosts else {
            continue;
        };
        let key = format!("subsystems[{s}].namespaces[{n}].hosts");
        if hosts.is_empty() {
            warnings.push(ValidationError {
                key: key.clone(),
                value: String::new(),
                reason: format!("namespace {} is hidden from every host", namespace.nsid),
            });
        }
        if subsystem.allows_any_host() {
            continue;
        }
        for (h, host) in hosts.iter().enumerate() {
            if !subsystem.host_nqns().any(|allowed| allowed == host) {
                warnings.push(ValidationError {
                    key: format!("{key}[{h}]"),
                    value: host.clone(),
                    reason: "not an allowed host of this subsystem: it cannot connect to see \
                             the namespace"
                        .to_owned(),
                });
            }
        }
    }
}

/// No subsystem takes the name of the discovery subsystem (`global.discovery_nqn`).
pub(crate) fn check_discovery_nqn(
    subsystems: &[Subsystem],
    discovery_nqn: Option<&str>,
    errors: &mut Errors,
) {
    let Some(discovery_nqn) = discovery_nqn else {
        return; // the well-known NQN: `check_subsystem_name`
    };
    for (s, subsystem) in subsystems.iter().enumerate() {
        if subsystem.nqn == discovery_nqn {
            errors.push(
                format!("subsystems[{s}].nqn"),
                &subsystem.nqn,
                "is global.discovery_nqn, the discovery subsystem's name",
            );
        }
    }
}

/// A namespace's `ana_group` must name an `[[ana_groups]]` entry (group 1 exists implicitly).
pub(crate) fn check_ana_groups(subsystems: &[Subsystem], groups: &[AnaGroup], errors: &mut Errors) {
    for (s, subsystem) in subsystems.iter().enumerate() {
        for (n, namespace) in subsystem.namespaces.iter().enumerate() {
            let group = namespace.ana_group;
            if group != DEFAULT_ANA_GROUP && !groups.iter().any(|g| g.id == group) {
                errors.push(
                    format!("subsystems[{s}].namespaces[{n}].ana_group"),
                    group,
                    "no [[ana_groups]] entry with this id (only group 1 exists implicitly)",
                );
            }
        }
    }
}

fn check_subsystem_identity(key: &str, subsystem: &Subsystem, errors: &mut Errors) {
    // Any name nvmet accepts is served (migrated configurations and test tools use names
    // like `testnqn`); malformed NQNs are only warned about, see `warnings`.
    if let Err(e) = check_subsystem_name(&subsystem.nqn) {
        errors.push(format!("{key}.nqn"), &subsystem.nqn, e.to_string());
    }
    check_ascii_field(
        &format!("{key}.serial"),
        &subsystem.serial,
        SERIAL_MAX,
        errors,
    );
    check_ascii_field(&format!("{key}.model"), &subsystem.model, MODEL_MAX, errors);
    let lists_hosts = !subsystem.allowed_hosts.is_empty() || !subsystem.hosts.is_empty();
    if subsystem.allow_any_host == Some(true) && lists_hosts {
        errors.push(
            format!("{key}.allow_any_host"),
            "true",
            "contradicts the non-empty allowed_hosts / hosts lists",
        );
    }
    if subsystem.allow_any_host.is_none() && !lists_hosts {
        // Secure default: a subsystem is never open to every host by omission.
        errors.push(
            format!("{key}.allow_any_host"),
            "",
            format!(
                "subsystem {} lists no hosts: say allow_any_host = true to let any host connect, \
                 or list allowed_hosts / [[subsystems.hosts]]",
                subsystem.nqn
            ),
        );
    }
    let mut seen: HashMap<&str, String> = HashMap::new();
    let entries = subsystem
        .allowed_hosts
        .iter()
        .enumerate()
        .map(|(h, host)| (format!("{key}.allowed_hosts[{h}]"), host.as_str()))
        .chain(
            subsystem
                .hosts
                .iter()
                .enumerate()
                .map(|(h, host)| (format!("{key}.hosts[{h}].nqn"), host.nqn.as_str())),
        );
    for (h, host) in subsystem.allowed_hosts.iter().enumerate() {
        if let Err(e) = check_nqn(host) {
            errors.push(format!("{key}.allowed_hosts[{h}]"), host, e.to_string());
        }
    }
    for (hkey, host) in entries {
        if let Some(first) = seen.get(host) {
            errors.push(&hkey, host, format!("listed twice (also {first})"));
        } else {
            seen.insert(host, hkey);
        }
    }
    hosts::check(key, &subsystem.hosts, errors);
}

/// Identify Controller SN/MN are space-padded printable ASCII (NVMe Base 2.0 §5.17.2.1).
fn check_ascii_field(key: &str, value: &str, max: usize, errors: &mut Errors) {
    if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        errors.push(key, value, "must be printable ASCII");
    } else if value.len() > max {
        errors.push(key, value, format!("longer than {max} characters"));
    }
}

fn check_namespace(key: &str, namespace: &Namespace, errors: &mut Errors) {
    // NSID 0 is invalid and 0xFFFFFFFF is the broadcast value (NVMe Base 2.0 §3.2.1.2).
    if namespace.nsid == 0 || namespace.nsid == u32::MAX {
        errors.push(
            format!("{key}.nsid"),
            namespace.nsid,
            "must be 1..=4294967294",
        );
    }
    let block_size = namespace.block_size;
    let block_size_ok = BLOCK_SIZES.contains(&block_size);
    if !block_size_ok {
        errors.push(
            format!("{key}.block_size"),
            block_size,
            "must be 512 or 4096",
        );
    }
    let check_multiple = |errors: &mut Errors, field: &str, size: ByteSize| {
        if size.bytes() == 0 {
            errors.push(format!("{key}.{field}"), size, "must be greater than 0");
        } else if block_size_ok && size.bytes() % u64::from(block_size) != 0 {
            errors.push(
                format!("{key}.{field}"),
                size,
                format!("must be a multiple of block_size ({block_size})"),
            );
        }
    };
    match (
        &namespace.null_size,
        &namespace.ram_size,
        &namespace.path,
        &namespace.rbd,
    ) {
        (Some(null_size), None, None, None) => check_multiple(errors, "null_size", *null_size),
        (Some(_), ..) => errors.push(key, "", "null_size excludes ram_size / path / rbd"),
        (None, Some(ram_size), None, None) => check_multiple(errors, "ram_size", *ram_size),
        (None, None, Some(path), None) => check_backing_path(key, path, namespace, errors),
        (None, None, None, Some(image)) => check_rbd(key, image, namespace, errors),
        (None, _, _, None) => errors.push(key, "", "needs exactly one of ram_size / path"),
        _ => errors.push(key, "", "needs exactly one of ram_size / path / rbd"),
    }
    if namespace.rbd.is_none() {
        if let Some(conf) = &namespace.ceph_conf {
            errors.push(
                format!("{key}.ceph_conf"),
                conf.display(),
                "only valid with rbd",
            );
        }
        if let Some(id) = &namespace.ceph_client_id {
            errors.push(format!("{key}.ceph_client_id"), id, "only valid with rbd");
        }
    }
    for (i, fault) in namespace.faults.iter().enumerate() {
        let end_byte = fault
            .slba
            .checked_add(fault.blocks)
            .and_then(|end| end.checked_mul(u64::from(block_size)));
        if fault.blocks == 0 || end_byte.is_none() {
            errors.push(
                format!("{key}.faults[{i}].blocks"),
                fault.blocks,
                "must be greater than 0, with slba + blocks inside a 64-bit byte offset",
            );
        }
        if fault.error.is_none() && fault.latency_ms.is_none() {
            errors.push(
                format!("{key}.faults[{i}]"),
                "",
                "needs error, latency_ms or both",
            );
        }
        if let Some(ms) = fault
            .latency_ms
            .filter(|&ms| ms == 0 || ms > MAX_FAULT_LATENCY_MS)
        {
            errors.push(
                format!("{key}.faults[{i}].latency_ms"),
                ms,
                format!("must be between 1 and {MAX_FAULT_LATENCY_MS}"),
            );
        }
        if fault.every == Some(0) {
            errors.push(format!("{key}.faults[{i}].every"), 0, "must be at least 1");
        }
    }
    if let Some(size) = namespace.size {
        if namespace.path.is_none() {
            errors.push(
                format!("{key}.size"),
                size,
                "only valid with path (RAM namespaces use ram_size)",
            );
        } else {
            check_multiple(errors, "size", size);
            if namespace.read_only {
                errors.push(
                    format!("{key}.size"),
                    size,
                    "cannot create or extend a read_only namespace's file",
                );
            }
        }
    }
    if let Some(uuid) = &namespace.uuid {
        match parse_uuid(uuid) {
            None => errors.push(format!("{key}.uuid"), uuid, "not a UUID (8-4-4-4-12 hex)"),
            Some(bytes) if bytes == [0; 16] => {
                errors.push(format!("{key}.uuid"), uuid, "the nil UUID means \"none\"")
            }
            Some(_) => {}
        }
    }
    if let Some(nguid) = &namespace.nguid {
        match parse_nguid(nguid) {
            None => errors.push(format!("{key}.nguid"), nguid, "not 32 hex digits"),
            // An all-zero NGUID means "not reported" (NVMe Base 2.0 §5.17.2.2).
            Some(bytes) if bytes == [0; 16] => {
                errors.push(format!("{key}.nguid"), nguid, "all zeros means \"none\"")
            }
            Some(_) => {}
        }
    }
}

/// `rbd = "pool/image"` or `"pool/namespace/image"` (as the `rbd` tool names images); no
/// snapshots (`@snap`): a namespace is writable storage.
fn check_rbd(key: &str, image: &str, namespace: &Namespace, errors: &mut Errors) {
    let rkey = format!("{key}.rbd");
    let parts: Vec<&str> = image.split('/').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
        errors.push(
            &rkey,
            image,
            "must be \"pool/image\" or \"pool/namespace/image\"",
        );
    } else if image.contains('@') {
        errors.push(&rkey, image, "snapshots (@) cannot be exported");
    } else if image.contains('\0') || image.chars().any(char::is_whitespace) {
        errors.push(&rkey, image, "contains NUL or whitespace");
    }
    if let Some(conf) = &namespace.ceph_conf {
        let ckey = format!("{key}.ceph_conf");
        if !conf.is_absolute() {
            errors.push(&ckey, conf.display(), "must be an absolute path");
        } else if !conf.is_file() {
            errors.push(&ckey, conf.display(), "no such file");
        }
    }
    if let Some(id) = &namespace.ceph_client_id {
        let bare = id.strip_prefix("client.").unwrap_or(id);
        if bare.is_empty() || id.contains('\0') || id.chars().any(char::is_whitespace) {
            errors.push(
                format!("{key}.ceph_client_id"),
                id,
                "must be a client id such as \"admin\" or \"client.admin\"",
            );
        }
    }
}

fn check_backing_path(key: &str, path: &Path, namespace: &Namespace, errors: &mut Errors) {
    use std::os::unix::fs::FileTypeExt;
    let pkey = format!("{key}.path");
    if !path.is_absolute() {
        errors.push(&pkey, path.display(), "must be an absolute path");
        return;
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_block_device() => {
            if let Some(size) = namespace.size {
                errors.push(
                    format!("{key}.size"),
                    size,
                    "only applies to regular files, not block devices",
                );
            }
        }
        Ok(meta) if meta.is_file() => {
            if meta.len() == 0 && namespace.size.is_none() {
                errors.push(&pkey, path.display(), "empty file (set size to extend it)");
            }
        }
        Ok(_) => errors.push(&pkey, path.display(), "not a regular file or block device"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if namespace.size.is_none() {
                errors.push(&pkey, path.display(), "no such file");
            } else if let Some(parent) = path.parent().filter(|p| !p.is_dir()) {
                errors.push(
                    &pkey,
                    path.display(),
                    format!("cannot be created: no such directory {}", parent.display()),
                );
            }
        }
        Err(e) => errors.push(&pkey, path.display(), format!("cannot access: {e}")),
    }
}
