//! Import of a Linux kernel target configuration saved by `nvmetcli save` (`saveconfig.json`,
//! default `/etc/nvmet/config.json`).
//!
//! The file mirrors configfs under `/sys/kernel/config/nvmet`: `hosts`, `ports` (with `addr`,
//! `param`, linked `subsystems`, `referrals`, `ana_groups`) and `subsystems` (with `attr`,
//! `allowed_hosts`, `namespaces` → `device`). Attribute values are strings because they are
//! configfs file contents. The reader is lenient about types (hand-written files use numbers
//! where nvmetcli writes strings) and reports everything it cannot carry over as a warning
//! instead of dropping it silently.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::file::Config;
use crate::global::Global;
use crate::hosts::Host;
use crate::load::ConfError;
use crate::names::{parse_nguid, parse_uuid};
use crate::ports::{Port, Referral, Transport};
use crate::size::ByteSize;
use crate::subsystems::{Namespace, Subsystem};

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

fn transport_named(name: &str) -> Option<Transport> {
    match name {
        "tcp" => Some(Transport::Tcp),
        "rdma" => Some(Transport::Rdma),
        _ => None,
    }
}

impl Config {
    /// Converts an `nvmetcli save` JSON document. The result is not validated: run
    /// [`Config::validate`] (paths, NQN formats) on the machine that will serve it.
    pub fn from_nvmetcli_json(json: &str) -> Result<Import, ConfError> {
        let saved: SaveConfig = serde_json::from_str(json)?;
        let mut warnings = Vec::new();
        let mut global = Global::default();
        let mut ports = Vec::new();
        let mut referrals: Vec<Referral> = Vec::new();
        // NQN → ids of the imported ports that export it.
        let mut links: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
        let mut inline_sizes = Vec::new();

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
            if text(entry.addr.get("treq")).as_deref() == Some("required") {
                warnings.push(format!(
                    "{what}: treq \"required\" (secure channel) is not supported: exported without TLS"
                ));
            }
            // inline_data_size is per port in nvmet, global here; -1 means "transport default".
            if let Some(size) =
                text(entry.param.get("inline_data_size")).and_then(|s| s.parse::<u64>().ok())
            {
                inline_sizes.push((id, size));
            }
            if text(entry.param.get("pi_enable")).as_deref() == Some("1") {
                warnings.push(format!(
                    "{what}: protection information (pi_enable) is not supported"
                ));
            }
            for group in &entry.ana_groups {
                let state = text(group.ana.get("state")).unwrap_or_default();
                if !state.is_empty() && state != "optimized" {
                    warnings.push(format!(
                        "{what}: ANA group {} state {state:?} is not supported: all paths are optimized",
                        group.grpid
                    ));
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

        // nvmet keeps DH-HMAC-CHAP settings per host (configfs hosts/<nqn>/dhchap_*); here they
        // belong to the host's entry in each subsystem that allows it.
        let auth: BTreeMap<&str, Host> = saved
            .hosts
            .iter()
            .filter_map(|h| host_auth(h, &mut warnings).map(|a| (h.nqn.as_str(), a)))
            .collect();

        let mut subsystems = Vec::new();
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
                namespaces.push(Namespace {
                    path: Some(path.into()),
                    ram_size: None,
                    uuid,
                    nguid,
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

        Ok(Import {
            config: Config {
                global,
                rdma: Default::default(),
                ports,
                subsystems,
                referrals,
                ana_groups: Vec::new(),
            },
            warnings,
        })
    }
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
