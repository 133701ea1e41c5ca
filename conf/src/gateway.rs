//! `[gateway_group]`: several nvmfd gateways serving the same subsystems from one Ceph cluster,
//! each ANA group owned by one gateway at a time through a RADOS lock with a lease, with
//! automatic failover (fencing the old owner by blocklisting its RADOS client) and failback
//! to the group's preferred gateway.
//!
//! Every gateway of a group has the same section except `gateway` (its own id). The ANA
//! groups the group manages are those of `[[ana_groups]]` (and group 1 when a namespace uses
//! it); their states in the file are ignored: the lease decides.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::multipath::AnaGroup;
use crate::report::Errors;
use crate::subsystems::Subsystem;

/// What a gateway reports for an ANA group it does not own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StandbyState {
    /// Hosts send I/O only to the owner (one writer per image; the safe default).
    #[default]
    Inaccessible,
    /// Hosts may also send I/O through non-owners (several writers per image: only with
    /// `rbd_cache = false`, since librbd's write-back cache is per client).
    NonOptimized,
}

/// One gateway of the group and the ANA groups it prefers to own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The gateway's id (its `gateway` key).
    pub id: String,
    /// ANA groups this gateway owns whenever it is up (failback target).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefers: Vec<u32>,
}

/// `[gateway_group]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayGroup {
    /// The group's name: prefix of its RADOS objects (same on every gateway).
    pub name: String,
    /// This gateway's id (one of `members`).
    pub gateway: String,
    /// RADOS pool holding the group's lock objects.
    pub pool: String,
    /// RADOS namespace inside `pool` for those objects (default: the pool's default one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// ceph.conf (default: librados' search). RBD namespaces must use the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceph_conf: Option<PathBuf>,
    /// Ceph client id (default: admin). RBD namespaces must use the same: the gateway opens
    /// its images on the RADOS client that holds its leases, so that fencing it fences them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Lease duration in milliseconds: a dead owner's groups move after at most this (plus
    /// one renew interval and the fencing round trip).
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// How often leases are renewed and the group surveyed, in milliseconds (≤ lease / 3).
    #[serde(default = "default_renew_ms")]
    pub renew_ms: u64,
    /// How long a returning preferred gateway must stay up before it gets its groups back
    /// (milliseconds): a gateway that flaps does not drag its groups with it.
    #[serde(default = "default_failback_ms")]
    pub failback_hold_ms: u64,
    /// Time an owner that hands a group back keeps it inaccessible before unlocking
    /// (milliseconds): I/O it had already sent to Ceph completes first.
    #[serde(default = "default_handover_ms")]
    pub handover_drain_ms: u64,
    /// State reported for groups this gateway does not own.
    #[serde(default)]
    pub standby_state: StandbyState,
    /// Every gateway of the group, in order (groups without a preferred gateway are spread
    /// over the live ones).
    pub members: Vec<Member>,
}

fn default_lease_ms() -> u64 {
    5000
}
fn default_renew_ms() -> u64 {
    1000
}
fn default_failback_ms() -> u64 {
    15000
}
fn default_handover_ms() -> u64 {
    2000
}

impl GatewayGroup {
    /// The gateway preferred for `group`, if any.
    pub fn preferred(&self, group: u32) -> Option<&str> {
        self.members
            .iter()
            .find(|m| m.prefers.contains(&group))
            .map(|m| m.id.as_str())
    }
}

/// A name usable in a RADOS object name and lock cookie: letters, digits, `-`, `_`, `.`.
fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Every problem with `[gateway_group]`, each naming its key. `groups` are the ANA groups
/// the gateway group manages.
pub(crate) fn check(g: &GatewayGroup, ana_groups: &[AnaGroup], errors: &mut Errors) {
    let key = "gateway_group";
    if !name_ok(&g.name) {
        errors.push(
            format!("{key}.name"),
            &g.name,
            "must be 1-64 letters, digits, '-', '_' or '.'",
        );
    }
    if g.pool.is_empty() {
        errors.push(format!("{key}.pool"), "", "must name a RADOS pool");
    }
    if g.lease_ms < 1000 || g.lease_ms > 600_000 {
        errors.push(
            format!("{key}.lease_ms"),
            g.lease_ms.to_string(),
            "must be 1000..=600000",
        );
    }
    if g.renew_ms < 100 || g.renew_ms.saturating_mul(3) > g.lease_ms {
        errors.push(
            format!("{key}.renew_ms"),
            g.renew_ms.to_string(),
            "must be at least 100 and at most a third of lease_ms (renewals well inside the lease)",
        );
    }
    if g.failback_hold_ms > 3_600_000 {
        errors.push(
            format!("{key}.failback_hold_ms"),
            g.failback_hold_ms.to_string(),
            "must be at most 3600000",
        );
    }
    if g.handover_drain_ms > 60_000 {
        errors.push(
            format!("{key}.handover_drain_ms"),
            g.handover_drain_ms.to_string(),
            "must be at most 60000",
        );
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut preferred: HashMap<u32, usize> = HashMap::new();
    for (i, m) in g.members.iter().enumerate() {
        let mkey = format!("{key}.members[{i}]");
        if !name_ok(&m.id) {
            errors.push(
                format!("{mkey}.id"),
                &m.id,
                "must be 1-64 letters, digits, '-', '_' or '.'",
            );
        }
        if let Some(first) = seen.insert(m.id.as_str(), i) {
            errors.push(
                format!("{mkey}.id"),
                &m.id,
                format!("duplicate gateway (also members[{first}])"),
            );
        }
        for &group in &m.prefers {
            if let Some(first) = preferred.insert(group, i) {
                errors.push(
                    format!("{mkey}.prefers"),
                    group.to_string(),
                    format!("ANA group preferred by two gateways (also members[{first}])"),
                );
            }
            let declared = group == crate::multipath::DEFAULT_ANA_GROUP
                || ana_groups.iter().any(|a| a.id == group);
            if !declared {
                errors.push(
                    format!("{mkey}.prefers"),
                    group.to_string(),
                    "no such ANA group (declare it in [[ana_groups]])",
                );
            }
        }
    }
    if !g.members.iter().any(|m| m.id == g.gateway) {
        errors.push(
            format!("{key}.gateway"),
            &g.gateway,
            "must be the id of one of gateway_group.members",
        );
    }
}

/// RBD namespaces of a gateway must reach Ceph as the gateway's own RADOS client (same
/// ceph.conf and client id): the gateway opens them on that client, so that blocklisting it
/// fences their writes too.
pub(crate) fn check_rbd_namespaces(
    g: &GatewayGroup,
    subsystems: &[Subsystem],
    errors: &mut Errors,
) {
    let id = |s: Option<&str>| s.map(|s| s.strip_prefix("client.").unwrap_or(s).to_owned());
    let group_id = id(g.client_id.as_deref());
    for (i, subsystem) in subsystems.iter().enumerate() {
        for (j, ns) in subsystem.namespaces.iter().enumerate() {
            if ns.rbd.is_none() {
                continue;
            }
            let key = format!("subsystems[{i}].namespaces[{j}]");
            if let Some(conf) = ns
                .ceph_conf
                .as_ref()
                .filter(|c| Some(*c) != g.ceph_conf.as_ref())
            {
                errors.push(
                    format!("{key}.ceph_conf"),
                    conf.display(),
                    "must be gateway_group.ceph_conf (or unset): a gateway opens its images \
                     on the RADOS client that holds its leases",
                );
            }
            if ns.ceph_client_id.is_some() && id(ns.ceph_client_id.as_deref()) != group_id {
                errors.push(
                    format!("{key}.ceph_client_id"),
                    ns.ceph_client_id.as_deref().unwrap_or_default(),
                    "must be gateway_group.client_id (or unset): a gateway opens its images \
                     on the RADOS client that holds its leases",
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, EMBEDDED_DEFAULT};

    fn with(section: &str) -> Config {
        toml::from_str(&format!("{EMBEDDED_DEFAULT}\n{section}")).unwrap()
    }

    const GROUP: &str = r#"
[[ana_groups]]
id = 2
[gateway_group]
name = "gw"
gateway = "a"
pool = "rbd"
members = [{ id = "a", prefers = [1] }, { id = "b", prefers = [2] }]
"#;

    #[test]
    fn defaults_and_preferences() {
        let c = with(GROUP);
        c.validate().unwrap();
        let g = c.gateway_group.as_ref().unwrap();
        assert_eq!((g.lease_ms, g.renew_ms), (5000, 1000));
        assert_eq!(g.standby_state, super::StandbyState::Inaccessible);
        assert_eq!(g.preferred(2), Some("b"));
        assert_eq!(g.preferred(3), None);
        // Round trip through the writer.
        let back: Config = toml::from_str(&c.to_toml().unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn bad_values_name_their_keys() {
        let bad = GROUP
            .replace("gateway = \"a\"", "gateway = \"c\"\nrenew_ms = 4000")
            .replace("prefers = [2]", "prefers = [1, 9]");
        let errors = with(&bad).validate().unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        for key in [
            "gateway_group.gateway",
            "gateway_group.renew_ms",
            "gateway_group.members[1].prefers",
        ] {
            assert!(text.iter().any(|e| e.contains(key)), "{key} in {text:?}");
        }
        assert!(text.iter().any(|e| e.contains("preferred by two")));
        assert!(text.iter().any(|e| e.contains("no such ANA group")));
        assert!(toml::from_str::<Config>(&GROUP.replace("pool", "pol")).is_err());
    }
}
