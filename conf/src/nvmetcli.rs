//! Import of a Linux kernel target configuration saved by `nvmetcli save` (`saveconfig.json`,
//! default `/etc/nvmet/config.json`).
//!
//! The file mirrors configfs under `/sys/kernel/config/nvmet`: `hosts`, `ports` (with `addr`,
//! `param`, linked `subsystems`, `referrals`, `ana_groups`) and `subsystems` (with `attr`,
//! `allowed_hosts`, `namespaces` → `device`). Attribute values are strings because they are
//! configfs file contents. The reader is lenient about types (hand-written files use numbers
//! where nvmetcli writes strings) and reports everything it cannot carry over as a warning
//! instead of dropping it silently.
//!
//! What nvmet derives from the backing store at enable time (the namespace block size) is
//! derived here the same way, on the machine the import runs on (see [`Backing`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::file::Config;
use crate::global::{Global, IO_QUEUES_RANGE, QUEUE_SIZE_RANGE};
use crate::hosts::Host;
use crate::load::ConfError;
use crate::multipath::{AnaGroup, AnaState, PortAnaState, DEFAULT_ANA_GROUP};
use crate::names::{parse_nguid, parse_uuid};
use crate::ports::{Port, Referral, Transport};
use crate::size::ByteSize;
use crate::subsystems::{Namespace, Subsystem, BLOCK_SIZES};
use crate::tls::TlsPolicy;

type Attrs = BTreeMap<String, Value>;

#[derive(Debug, Deserialize)]
struct SaveConfig {
    #[serde(default)]
    hosts: Vec<HostEntry>,
    #[serde(default)]
    ports: Vec<PortEntry>,
    #[serde(default)]
    subsystems: Vec<SubsystemEntry>,
}

#[derive(Debug, Deserialize)]
struct HostEntry {
    nqn: String,
    #[serde(default)]
    dhchap: Attrs,
}

#[derive(Debug, Deserialize)]
struct PortEntry {
    portid: Value,
    #[serde(default)]
    addr: Attrs,
    #[serde(default)]
    param: Attrs,
    #[serde(default)]
    subsystems: Vec<String>,
    #[serde(default)]
    referrals: Vec<ReferralEntry>,
    #[serde(default)]
    ana_groups: Vec<AnaGroupEntry>,
}

#[derive(Debug, Deserialize)]
struct ReferralEntry {
    #[serde(default)]
    name: String,
    #[serde(default)]
    addr: Attrs,
    #[serde(default)]
    enable: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct AnaGroupEntry {
    #[serde(default)]
    grpid: Value,
    #[serde(default)]
    ana: Attrs,
}

#[derive(Debug, Deserialize)]
struct SubsystemEntry {
    nqn: String,
    #[serde(default)]
    attr: Attrs,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    #[serde(default)]
    namespaces: Vec<NamespaceEntry>,
    #[serde(default)]
    passthru: Vec<Value>,
}

#[derive(Debug, Deserialize)]
struct NamespaceEntry {
    nsid: Value,
    #[serde(default)]
    device: Attrs,
    #[serde(default)]
    enable: Option<Value>,
    /// nvmetcli writes the group here; older versions only in `ana.grpid`.
    #[serde(default)]
    ana_grpid: Option<Value>,
    #[serde(default)]
    ana: Attrs,
    #[serde(default)]
    resv: Attrs,
}

/// What a namespace's `device_path` is, as far as the block size nvmet serves depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// A regular file on a file system with this block size (`st_blksize`, which Linux
    /// `generic_fillattr` fills from the inode's `i_blkbits`).
    File { fs_block_size: u64 },
    /// A block device with this logical block size.
    BlockDevice { logical_block_size: u64 },
}

impl Backing {
    /// The LBA data size nvmet serves from this backing store (Linux
    /// drivers/nvme/target/io-cmd-file.c `nvmet_file_ns_enable`: `blksize_shift` is the
    /// inode's `i_blkbits` capped at 12, i.e. the file system block size up to 4096;
    /// io-cmd-bdev.c: the device's logical block size).
    pub fn nvmet_block_size(self) -> u64 {
        match self {
            Backing::File { fs_block_size } => fs_block_size.min(4096),
            Backing::BlockDevice { logical_block_size } => logical_block_size,
        }
    }

    /// Looks at `path` on this machine.
    pub fn probe(path: &Path) -> Result<Backing, String> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
        if meta.file_type().is_block_device() {
            let rdev = meta.rdev();
            // glibc's gnu_dev_major / gnu_dev_minor encoding of dev_t.
            let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
            let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
            let sys = format!("/sys/dev/block/{major}:{minor}");
            // A partition has no queue/ of its own: its disk's is one level up.
            ["queue/logical_block_size", "../queue/logical_block_size"]
                .iter()
                .find_map(|leaf| std::fs::read_to_string(format!("{sys}/{leaf}")).ok())
                .and_then(|text| text.trim().parse().ok())
                .map(|logical_block_size| Backing::BlockDevice { logical_block_size })
                .ok_or_else(|| format!("no logical_block_size under {sys}"))
        } else if meta.is_file() {
            Ok(Backing::File {
                fs_block_size: meta.blksize(),
            })
        } else {
            Err("not a regular file or block device".to_owned())
        }
    }
}

/// The imported configuration plus everything that could not be represented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// A configfs attribute as text: nvmetcli writes strings, people write numbers and booleans.
fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(u8::from(*b).to_string()),
        _ => None,
    }
}

fn number(value: Option<&Value>) -> Option<u64> {
    text(value)?.parse().ok()
}

fn enabled(value: Option<&Value>) -> bool {
    // configfs "enable" is absent on kernels without it: absent means enabled.
    value.is_none() || number(value).is_some_and(|n| n != 0)
}

/// A configfs attribute that is set to something other than its default (`defaults`).
fn set_to_other_than(attrs: &Attrs, key: &str, defaults: &[&str]) -> Option<String> {
    text(attrs.get(key)).filter(|v| !v.is_empty() && !defaults.contains(&v.as_str()))
}

fn ana_state_named(name: &str) -> Option<AnaState> {
    serde_json::from_value(Value::String(name.to_owned())).ok()
}

/// The state nvmet gives a group on a port that has no directory for it: group 1 is
/// optimized, every other group inaccessible (Linux configfs.c `nvmet_ports_make`).
fn nvmet_default_state(group: u32) -> AnaState {
    if group == DEFAULT_ANA_GROUP {
        AnaState::Optimized
    } else {
        AnaState::Inaccessible
    }
}

fn transport_named(name: &str) -> Option<Transport> {
    match name {
        "tcp" => Some(Transport::Tcp),
        "rdma" => Some(Transport::Rdma),
        _ => None,
    }
}

impl Config {
    /// Converts an `nvmetcli save` JSON document, looking at the namespaces' backing stores on
    /// this machine for their block size. The result is not validated: run
    /// [`Config::validate`] (paths, NQN formats) on the machine that will serve it.
    pub fn from_nvmetcli_json(json: &str) -> Result<Import, ConfError> {
        Self::from_nvmetcli_json_with(json, &Backing::probe)
    }

    /// [`Config::from_nvmetcli_json`] with the backing stores described by `probe`.
    pub fn from_nvmetcli_json_with(
        json: &str,
        probe: &dyn Fn(&Path) -> Result<Backing, String>,
    ) -> Result<Import, ConfError> {
        let saved: SaveConfig = serde_json::from_str(json)?;
        let mut warnings = Vec::new();
        let mut global = Global::default();
        let mut ports = Vec::new();
        let mut referrals: Vec<Referral> = Vec::new();
        // NQN → ids of the imported ports that export it.
        let mut links: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
        let mut inline_sizes = Vec::new();
        let mut queue_sizes = Vec::new();
        // ANA group → (port, state) for each imported port that has a directory for it.
        let mut ana_listed: BTreeMap<u32, Vec<(u16, AnaState)>> = BTreeMap::new();

        for (i, entry) in saved.ports.iter().enumerate() {
            let Some(id) = number(Some(&entry.portid)).and_then(|n| u16::try_from(n).ok()) else {
                warnings.push(format!(
                    "ports[{i}]: portid {} is not a 16-bit number: skipped",
                    entry.portid
                ));
                continue;
            };
            let what = format!("port {id}");
            let trtype = text(entry.addr.get("trtype")).unwrap_or_default();
            let Some(transport) = transport_named(&trtype) else {
                warnings.push(format!(
                    "{what}: transport {trtype:?} is not supported: skipped"
                ));
                continue;
            };
            let address = text(entry.addr.get("traddr")).unwrap_or_default();
            let Some(service) =
                number(entry.addr.get("trsvcid")).and_then(|n| u32::try_from(n).ok())
            else {
                warnings.push(format!(
                    "{what}: trsvcid {:?} is not a port number: skipped",
                    text(entry.addr.get("trsvcid")).unwrap_or_default()
                ));
                continue;
            };
            // inline_data_size is per port in nvmet, global here; -1 means "transport default".
            if let Some(size) =
                text(entry.param.get("inline_data_size")).and_then(|s| s.parse::<u64>().ok())
            {
                inline_sizes.push((id, size));
            }
            // nvmet's addr_tsas "tls1.3" with addr_treq "required" or "not required"; its PSKs
            // are in the kernel's .nvme keyring, which the JSON does not carry.
            let tls = match set_to_other_than(&entry.addr, "tsas", &["none", "not required"]) {
                None => TlsPolicy::None,
                Some(tsas) if tsas == "tls1.3" && transport == Transport::Tcp => {
                    warnings.push(format!(
                        "{what}: TLS 1.3: the PSKs are in the kernel keyring, not in this file: add [[tls_keys]] with each host's key file"
                    ));
                    if text(entry.addr.get("treq")).as_deref() == Some("required") {
                        TlsPolicy::Required
                    } else {
                        TlsPolicy::Optional
                    }
                }
                Some(tsas) => {
                    warnings.push(format!(
                        "{what}: tsas {tsas:?} is not supported: exported without TLS"
                    ));
                    TlsPolicy::None
                }
            };
            // max_queue_size is per port in nvmet (newer kernels), global here; -1 = default.
            if let Some(size) =
                text(entry.param.get("max_queue_size")).and_then(|s| s.parse::<u32>().ok())
            {
                queue_sizes.push((id, size));
            }
            if text(entry.param.get("pi_enable")).as_deref() == Some("1") {
                warnings.push(format!(
                    "{what}: protection information (pi_enable) is not supported"
                ));
            }
            for group in &entry.ana_groups {
                let grpid = number(Some(&group.grpid)).and_then(|n| u32::try_from(n).ok());
                let state_name = text(group.ana.get("state")).unwrap_or_default();
                match (grpid, ana_state_named(&state_name)) {
                    (Some(grpid), Some(state)) => {
                        ana_listed.entry(grpid).or_default().push((id, state))
                    }
                    _ => warnings.push(format!(
                        "{what}: ANA group {} state {state_name:?} not understood: skipped",
                        group.grpid
                    )),
                }
            }
            for (r, referral) in entry.referrals.iter().enumerate() {
                if !enabled(referral.enable.as_ref()) {
                    continue;
                }
                let name = if referral.name.is_empty() {
                    format!("referrals[{r}]")
                } else {
                    format!("referral {:?}", referral.name)
                };
                let trtype = text(referral.addr.get("trtype")).unwrap_or_default();
                let service =
                    number(referral.addr.get("trsvcid")).and_then(|n| u32::try_from(n).ok());
                match (transport_named(&trtype), service) {
                    (Some(transport), Some(service)) => {
                        let referral = Referral {
                            transport,
                            address: text(referral.addr.get("traddr")).unwrap_or_default(),
                            service,
                        };
                        if !referrals.contains(&referral) {
                            referrals.push(referral);
                        }
                    }
                    _ => warnings.push(format!(
                        "{what}: {name}: transport {trtype:?} / trsvcid not supported: skipped"
                    )),
                }
            }
            for nqn in &entry.subsystems {
                links.entry(nqn.as_str()).or_default().push(id);
            }
            ports.push(Port {
                id,
                transport,
                address,
                service,
                tls,
            });
        }

        if let Some(&(_, smallest)) = inline_sizes.iter().min_by_key(|(_, size)| *size) {
            if inline_sizes.iter().any(|&(_, size)| size != smallest) {
                warnings.push(format!(
                    "param.inline_data_size differs between ports ({}); using the smallest, {smallest}, for all",
                    inline_sizes
                        .iter()
                        .map(|(id, size)| format!("port {id}: {size}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            global.in_capsule_data_size = ByteSize(smallest);
        }
        if let Some(&(_, smallest)) = queue_sizes.iter().min_by_key(|(_, size)| *size) {
            if queue_sizes.iter().any(|&(_, size)| size != smallest) {
                warnings.push(format!(
                    "param.max_queue_size differs between ports; using the smallest, {smallest}, for all"
                ));
            }
            if QUEUE_SIZE_RANGE.contains(&smallest) {
                global.max_queue_size = smallest;
            } else {
                warnings.push(format!(
                    "param.max_queue_size {smallest} is outside {QUEUE_SIZE_RANGE:?}: using {}",
                    global.max_queue_size
                ));
            }
        }

        // nvmet keeps DH-HMAC-CHAP settings per host (configfs hosts/<nqn>/dhchap_*); here they
        // belong to the host's entry in each subsystem that allows it.
        let auth: BTreeMap<&str, Host> = saved
            .hosts
            .iter()
            .filter_map(|h| host_auth(h, &mut warnings).map(|a| (h.nqn.as_str(), a)))
            .collect();

        let mut subsystems = Vec::new();
        let mut qid_maxes = Vec::new();
        let mut cntlids = Vec::new();
        let mut ana_used = Vec::new();
        for entry in &saved.subsystems {
            let what = format!("subsystem {}", entry.nqn);
            let Some(port_ids) = links.get(entry.nqn.as_str()) else {
                warnings.push(format!(
                    "{what}: not linked to any imported port (unreachable in nvmet too): skipped"
                ));
                continue;
            };
            if !entry.passthru.is_empty() {
                warnings.push(format!(
                    "{what}: passthru controllers are not supported: skipped"
                ));
                continue;
            }
            if text(entry.attr.get("pi_enable")).as_deref() == Some("1") {
                warnings.push(format!(
                    "{what}: protection information (pi_enable) is not supported"
                ));
            }
            if let Some(qid_max) =
                number(entry.attr.get("qid_max")).and_then(|n| u32::try_from(n).ok())
            {
                qid_maxes.push((entry.nqn.as_str(), qid_max));
            }
            for key in ["cntlid_min", "cntlid_max"] {
                if let Some(value) = number(entry.attr.get(key)).and_then(|n| u32::try_from(n).ok())
                {
                    cntlids.push((entry.nqn.as_str(), key, value));
                }
            }
            if let Some(oui) = set_to_other_than(&entry.attr, "ieee_oui", &["0x000000", "0"]) {
                warnings.push(format!(
                    "{what}: ieee_oui {oui} is not carried over (nvmfd reports none)"
                ));
            }
            // Absent means nvmet's default, closed (attr_allow_any_host 0).
            let mut allow_any_host =
                Some(text(entry.attr.get("allow_any_host")).is_some_and(|v| v == "1"));
            if allow_any_host == Some(true) && !entry.allowed_hosts.is_empty() {
                // nvmet refuses allow_any_host=1 while hosts are linked; restore keeps the hosts.
                warnings.push(format!(
                    "{what}: allow_any_host=1 together with allowed_hosts: keeping the host list"
                ));
                allow_any_host = None;
            }
            let (hosts, allowed_hosts): (Vec<&String>, Vec<&String>) = entry
                .allowed_hosts
                .iter()
                .partition(|nqn| auth.contains_key(nqn.as_str()));
            let mut namespaces = Vec::new();
            for (n, ns) in entry.namespaces.iter().enumerate() {
                let Some(nsid) = number(Some(&ns.nsid)).and_then(|n| u32::try_from(n).ok()) else {
                    warnings.push(format!(
                        "{what}: namespaces[{n}]: nsid {} is not a number: skipped",
                        ns.nsid
                    ));
                    continue;
                };
                if !enabled(ns.enable.as_ref()) {
                    warnings.push(format!("{what}: namespace {nsid} is disabled: skipped"));
                    continue;
                }
                let path = text(ns.device.get("path")).unwrap_or_default();
                if path.is_empty() {
                    warnings.push(format!(
                        "{what}: namespace {nsid} has no device path: skipped"
                    ));
                    continue;
                }
                // Zero identifiers are what configfs reports when none was set.
                let uuid = text(ns.device.get("uuid"))
                    .filter(|u| parse_uuid(u).is_some_and(|b| b != [0; 16]));
                let nguid = text(ns.device.get("nguid"))
                    .filter(|g| parse_nguid(g).is_some_and(|b| b != [0; 16]));
                let nswhat = format!("{what}: namespace {nsid}");
                let block_size = import_block_size(&nswhat, &path, probe, &mut warnings);
                // buffered_io=1 opens the file without O_DIRECT (Linux io-cmd-file.c).
                let direct_io = text(ns.device.get("buffered_io")).as_deref() != Some("1");
                if text(ns.device.get("p2pmem")).is_some_and(|v| v != "0" && !v.is_empty()) {
                    warnings.push(format!(
                        "{nswhat}: p2pmem (peer-to-peer memory) is not supported: host memory is used"
                    ));
                }
                if text(ns.resv.get("enable")).as_deref() == Some("1") {
                    warnings.push(format!(
                        "{nswhat}: persistent reservations (resv.enable) are not supported"
                    ));
                }
                let ana_group = number(ns.ana_grpid.as_ref().or(ns.ana.get("grpid")))
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(DEFAULT_ANA_GROUP);
                ana_used.push(ana_group);
                namespaces.push(Namespace {
                    path: Some(path.into()),
                    ram_size: None,
                    block_size,
                    direct_io,
                    uuid,
                    nguid,
                    ana_group,
                    ..Namespace::new_ram(nsid, ByteSize(0))
                });
            }
            subsystems.push(Subsystem {
                nqn: entry.nqn.clone(),
                serial: text(entry.attr.get("serial")).unwrap_or_default(),
                model: text(entry.attr.get("model"))
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| "nvmfd".to_owned()),
                allow_any_host,
                allowed_hosts: allowed_hosts.into_iter().cloned().collect(),
                hosts: hosts
                    .into_iter()
                    .filter_map(|nqn| auth.get(nqn.as_str()).cloned())
                    .collect(),
                ports: port_ids.clone(),
                namespaces,
            });
        }

        for (nqn, _) in links
            .iter()
            .filter(|(nqn, _)| !saved.subsystems.iter().any(|s| s.nqn == **nqn))
        {
            warnings.push(format!("a port links unknown subsystem {nqn}: ignored"));
        }

        // qid_max (I/O queues a host may create) is per subsystem in nvmet, global here.
        if let Some(&(_, smallest)) = qid_maxes.iter().min_by_key(|(_, n)| *n) {
            if qid_maxes.iter().any(|&(_, n)| n != smallest) {
                warnings.push(format!(
                    "attr.qid_max differs between subsystems; using the smallest, {smallest}, for all"
                ));
            }
            if IO_QUEUES_RANGE.contains(&smallest) {
                global.max_io_queues = smallest;
            } else {
                warnings.push(format!(
                    "attr.qid_max {smallest} is outside {IO_QUEUES_RANGE:?}: using {}",
                    global.max_io_queues
                ));
            }
        }
        // Controller ID ranges are per subsystem in nvmet, one range for the target here.
        for key in ["cntlid_min", "cntlid_max"] {
            let values: Vec<(&str, u32)> = cntlids
                .iter()
                .filter(|(_, k, _)| *k == key)
                .map(|&(nqn, _, v)| (nqn, v))
                .collect();
            let Some(&(_, first)) = values.first() else {
                continue;
            };
            if values.iter().any(|&(_, v)| v != first) {
                warnings.push(format!(
                    "attr.{key} differs between subsystems ({}): the default range is used",
                    values
                        .iter()
                        .map(|(nqn, v)| format!("{nqn}: {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            } else if key == "cntlid_min" {
                global.cntlid_min = first;
            } else {
                global.cntlid_max = first;
            }
        }
        let ana_groups = import_ana_groups(&ports, ana_listed, &ana_used);

        Ok(Import {
            config: Config {
                global,
                rdma: Default::default(),
                metrics: Default::default(),
                ports,
                subsystems,
                referrals,
                ana_groups,
                tls_keys: Vec::new(),
                gateway_group: None,
            },
            warnings,
        })
    }
}

/// The block size nvmet serves for `path` (see [`Backing::nvmet_block_size`]); a warning and
/// the default when nvmfd cannot serve the same.
fn import_block_size(
    what: &str,
    path: &str,
    probe: &dyn Fn(&Path) -> Result<Backing, String>,
    warnings: &mut Vec<String>,
) -> u32 {
    let fallback = Namespace::new_ram(1, ByteSize(0)).block_size;
    let nvmet = match probe(Path::new(path)) {
        Ok(backing) => backing.nvmet_block_size(),
        Err(e) => {
            warnings.push(format!(
                "{what}: block size unknown ({path}: {e}): using {fallback}; nvmet serves the \
                 file system block size (at most 4096) for files and the logical block size \
                 for block devices: set block_size to match, or data moves on the host"
            ));
            return fallback;
        }
    };
    match u32::try_from(nvmet) {
        Ok(size) if BLOCK_SIZES.contains(&size) => size,
        _ => {
            warnings.push(format!(
                "{what}: nvmet serves {nvmet}-byte blocks, nvmfd only {BLOCK_SIZES:?}: using \
                 {fallback}; data moves on the host"
            ));
            fallback
        }
    }
}

/// `[[ana_groups]]` from nvmet's per-port groups: every group a port lists or a namespace
/// uses, with its state on every imported port (nvmet's default where a port has no directory
/// for it). The most common state becomes the group's state, the others `port_states`;
/// group 1 optimized everywhere is nvmfd's default and needs no entry.
fn import_ana_groups(
    ports: &[Port],
    listed: BTreeMap<u32, Vec<(u16, AnaState)>>,
    used: &[u32],
) -> Vec<AnaGroup> {
    let mut ids: Vec<u32> = listed.keys().copied().chain(used.iter().copied()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut groups = Vec::new();
    for id in ids {
        let states: Vec<(u16, AnaState)> = ports
            .iter()
            .map(|port| {
                let state = listed
                    .get(&id)
                    .and_then(|l| l.iter().find(|(p, _)| *p == port.id))
                    .map_or(nvmet_default_state(id), |&(_, s)| s);
                (port.id, state)
            })
            .collect();
        let count = |state: AnaState| states.iter().filter(|(_, s)| *s == state).count();
        // Ties go to the first port's state, so the result does not depend on hashing.
        let state = states
            .iter()
            .map(|&(_, s)| s)
            .max_by_key(|&s| {
                (
                    count(s),
                    std::cmp::Reverse(states.iter().position(|&(_, t)| t == s)),
                )
            })
            .unwrap_or(nvmet_default_state(id));
        let port_states: Vec<PortAnaState> = states
            .iter()
            .filter(|&&(_, s)| s != state)
            .map(|&(port, state)| PortAnaState { port, state })
            .collect();
        if id == DEFAULT_ANA_GROUP && state == AnaState::Optimized && port_states.is_empty() {
            continue;
        }
        groups.push(AnaGroup {
            id,
            state,
            port_states,
        });
    }
    groups
}

/// A host's nvmet DH-HMAC-CHAP attributes (`dhchap_key`, `dhchap_ctrl_key`, `dhchap_hash`,
/// `dhchap_dhgroup`) as a host entry; `None` when it has no key (nvmet then does not
/// authenticate it).
fn host_auth(host: &HostEntry, warnings: &mut Vec<String>) -> Option<Host> {
    let attr = |name: &str| text(host.dhchap.get(name)).filter(|v| !v.is_empty());
    let key = attr("key")?;
    let mut entry = Host::new(host.nqn.clone());
    entry.dhchap_key = Some(key);
    entry.dhchap_ctrl_key = attr("ctrl_key");
    // nvmet negotiates exactly the configured hash and group.
    entry.dhchap_hashes = attr("hash").into_iter().collect();
    entry.dhchap_dhgroups = attr("dhgroup").into_iter().collect();
    if let Err(e) = entry.keys() {
        warnings.push(format!("host {}: {e}", host.nqn));
    }
    Some(entry)
}
