//! Quality of service limits: `qos = { … }` on a `[[subsystems.namespaces]]` entry (all hosts
//! together) and `[[subsystems.host_qos]]` (one host, all its queues), and their checks.

use serde::{Deserialize, Serialize};

use crate::names::check_nqn;
use crate::report::Errors;

/// Largest IOPS limit accepted (beyond any target's reach; larger values are typos).
pub const MAX_IOPS: u64 = 1_000_000_000;
/// Largest bandwidth limit accepted, in MiB/s (1 PiB/s).
pub const MAX_MBPS: u64 = 1 << 30;
/// Largest burst allowance, in milliseconds (one minute).
pub const MAX_BURST_MS: u32 = 60_000;

/// IOPS and bandwidth limits; 0 (or absent) = no limit on that quantity. MiB/s as SPDK's and
/// Ceph's `*_mbytes_per_sec`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Qos {
    /// Commands per second (Read, Write, Compare, Write Zeroes, Copy, Verify together).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub iops: u64,
    /// Read data, MiB/s.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub read_mbps: u64,
    /// Write data, MiB/s.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_mbps: u64,
    /// Read and write data together, MiB/s.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_mbps: u64,
    /// How far ahead of its rate each limit may run in a burst, in milliseconds of that rate
    /// (absent: 100; at least 5).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub burst_ms: u32,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl Qos {
    /// Whether nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        self.iops == 0 && self.read_mbps == 0 && self.write_mbps == 0 && self.total_mbps == 0
    }
}

/// `[[subsystems.host_qos]]`: the limits of one host on this subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostQos {
    pub host: String,
    pub qos: Qos,
}

pub(crate) fn check(key: &str, qos: &Qos, errors: &mut Errors) {
    if qos.iops > MAX_IOPS {
        errors.push(
            format!("{key}.iops"),
            qos.iops,
            format!("at most {MAX_IOPS}"),
        );
    }
    for (name, v) in [
        ("read_mbps", qos.read_mbps),
        ("write_mbps", qos.write_mbps),
        ("total_mbps", qos.total_mbps),
    ] {
        if v > MAX_MBPS {
            errors.push(
                format!("{key}.{name}"),
                v,
                format!("at most {MAX_MBPS} MiB/s"),
            );
        }
    }
    if qos.burst_ms > MAX_BURST_MS {
        errors.push(
            format!("{key}.burst_ms"),
            qos.burst_ms,
            format!("at most {MAX_BURST_MS} ms"),
        );
    }
}

/// The `host_qos` entries of subsystem `key`: valid host NQNs, each once.
pub(crate) fn check_hosts(key: &str, hosts: &[HostQos], errors: &mut Errors) {
    for (i, h) in hosts.iter().enumerate() {
        let hkey = format!("{key}.host_qos[{i}]");
        if let Err(e) = check_nqn(&h.host) {
            errors.push(format!("{hkey}.host"), &h.host, e.to_string());
        }
        if let Some(first) = hosts[..i].iter().position(|o| o.host == h.host) {
            errors.push(
                format!("{hkey}.host"),
                &h.host,
                format!("listed twice (also {key}.host_qos[{first}])"),
            );
        }
        check(&format!("{hkey}.qos"), &h.qos, errors);
    }
}
