//! Multipath settings: `[[ana_groups]]` (Asymmetric Namespace Access groups and their state per
//! port), the namespaces' `ana_group`, and `global.cntlid_min` / `global.cntlid_max`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn parse(text: &str) -> Config {
        Config::parse_toml(text).unwrap()
    }

    /// The key of every problem the whole validation reports.
    fn error_keys(config: &Config) -> Vec<String> {
        let errors = config.validate().err().unwrap_or_default();
        errors.into_iter().map(|e| e.key).collect()
    }

    const PORTS: &str = r#"
[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420
"#;

    #[test]
    fn parses_groups_states_and_namespace_groups() {
        let c = parse(&format!(
            r#"
[global]
cntlid_min = 101
cntlid_max = 200
{PORTS}
[[ana_groups]]
id = 2
state = "inaccessible"
port_states = [{{ port = 1, state = "non-optimized" }}]

[[ana_groups]]
id = 3

[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:mp"
[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
ana_group = 2
[[subsystems.namespaces]]
nsid = 2
ram_size = "1M"
"#
        ));
        assert_eq!((c.global.cntlid_min, c.global.cntlid_max), (101, 200));
        assert_eq!(c.ana_groups[0].state, AnaState::Inaccessible);
        assert_eq!(
            c.ana_groups[0].port_states,
            vec![PortAnaState {
                port: 1,
                state: AnaState::NonOptimized
            }]
        );
        assert_eq!(c.ana_groups[1].state, AnaState::Optimized, "default");
        assert_eq!(c.subsystems[0].namespaces[0].ana_group, 2);
        assert_eq!(c.subsystems[0].namespaces[1].ana_group, 1, "default");
        assert_eq!(error_keys(&c), Vec::<String>::new());
        // Every state name the file accepts.
        for name in [
            "optimized",
            "non-optimized",
            "inaccessible",
            "persistent-loss",
            "change",
        ] {
            let text = format!("{PORTS}\n[[ana_groups]]\nid = 2\nstate = \"{name}\"\n");
            assert!(Config::parse_toml(&text).is_ok(), "{name}");
        }
        assert!(Config::parse_toml(&format!(
            "{PORTS}\n[[ana_groups]]\nid = 2\nstate = \"optimised\"\n"
        ))
        .is_err());
    }

    #[test]
    fn reports_every_problem_with_its_key() {
        let c = parse(&format!(
            r#"
[global]
cntlid_min = 300
cntlid_max = 200
{PORTS}
[[ana_groups]]
id = 0
[[ana_groups]]
id = 2
port_states = [{{ port = 9, state = "change" }}, {{ port = 1, state = "change" }}, {{ port = 1, state = "optimized" }}]
[[ana_groups]]
id = 2

[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:mp"
[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
ana_group = 5
"#
        ));
        let keys = error_keys(&c);
        assert_eq!(
            keys,
            vec![
                "global.cntlid_max",
                "ana_groups[0].id",
                "ana_groups[1].port_states[0].port",
                "ana_groups[1].port_states[2].port",
                "ana_groups[2].id",
                "subsystems[0].namespaces[0].ana_group",
            ]
        );
        let mut c = c;
        c.global.cntlid_min = 0;
        c.global.cntlid_max = 0x1_0000;
        let keys = error_keys(&c);
        assert_eq!(&keys[..2], &["global.cntlid_min", "global.cntlid_max"]);
    }
}
