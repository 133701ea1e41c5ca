//! Multipath settings: `[[ana_groups]]` (Asymmetric Namespace Access groups and their state per
//! port) and the range `global.cntlid_min` / `global.cntlid_max` are checked here; a namespace's
//! `ana_group` is a namespace key, checked with the namespaces (`subsystems`).
//!
//! Several gateways (nvmfd processes) can export one volume under one subsystem NQN: each uses
//! its own controller ID range and reports its own ANA state for the volume's group, and the
//! host sees one namespace with one path per gateway.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::ports::Port;
use crate::report::Errors;

/// Highest ANA group ID (the target reports it as ANAGRPMAX; `nvme::ana::MAX_ANA_GROUP`).
pub const ANA_GROUP_MAX: u32 = 128;
/// The group of namespaces that do not name one; it exists without being declared.
pub const DEFAULT_ANA_GROUP: u32 = 1;
/// Controller IDs FFF0h..FFFFh are reserved (NVMe Base 2.0 §3.1.2).
pub const CNTLID_MAX: u32 = 0xffef;

/// An ANA state as written in the file (the names the Linux host and nvme-cli print).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnaState {
    #[default]
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

/// `[[ana_groups]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnaGroup {
    /// 1..=128.
    pub id: u32,
    /// State on every port not listed in `port_states`.
    #[serde(default)]
    pub state: AnaState,
    /// Per-port states: `port_states = [{ port = 2, state = "non-optimized" }]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_states: Vec<PortAnaState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortAnaState {
    /// A `[[ports]]` id.
    pub port: u16,
    pub state: AnaState,
}

pub(crate) fn default_ana_group() -> u32 {
    DEFAULT_ANA_GROUP
}

pub(crate) fn is_default_ana_group(group: &u32) -> bool {
    *group == DEFAULT_ANA_GROUP
}

/// Every problem with the controller ID range and `[[ana_groups]]` (the namespaces'
/// `ana_group` references are checked with the namespaces).
pub(crate) fn check(
    (min, max): (u32, u32),
    groups: &[AnaGroup],
    ports: &[Port],
    errors: &mut Errors,
) {
    if !(1..=CNTLID_MAX).contains(&min) {
        errors.push(
            "global.cntlid_min",
            min,
            format!("must be 1..={CNTLID_MAX}"),
        );
    }
    if !(1..=CNTLID_MAX).contains(&max) {
        errors.push(
            "global.cntlid_max",
            max,
            format!("must be 1..={CNTLID_MAX}"),
        );
    } else if max < min {
        errors.push(
            "global.cntlid_max",
            max,
            format!("must not be below cntlid_min ({min})"),
        );
    }
    let mut ids = HashMap::new();
    for (g, group) in groups.iter().enumerate() {
        let key = format!("ana_groups[{g}]");
        if !(1..=ANA_GROUP_MAX).contains(&group.id) {
            errors.push(
                format!("{key}.id"),
                group.id,
                format!("must be 1..={ANA_GROUP_MAX}"),
            );
        }
        if let Some(first) = ids.insert(group.id, g) {
            errors.push(
                format!("{key}.id"),
                group.id,
                format!("duplicate ANA group (also ana_groups[{first}])"),
            );
        }
        let mut listed = HashMap::new();
        for (p, ps) in group.port_states.iter().enumerate() {
            let pkey = format!("{key}.port_states[{p}].port");
            if !ports.iter().any(|port| port.id == ps.port) {
                errors.push(&pkey, ps.port, "no port with this id in [[ports]]");
            }
            if let Some(first) = listed.insert(ps.port, p) {
                errors.push(
                    &pkey,
                    ps.port,
                    format!("listed twice (also {key}.port_states[{first}])"),
                );
            }
        }
    }
}
