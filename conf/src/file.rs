//! The whole file (configuration contract): one field per section, each section's serde
//! types in its own module, and the configuration used when no file is given.
//!
//! Every struct refuses unknown keys: a misspelt `read_ony = true` must fail loudly instead of
//! silently exporting a writable namespace.

use serde::{Deserialize, Serialize};

use crate::gateway::GatewayGroup;
use crate::global::Global;
use crate::metrics::Metrics;
use crate::multipath::AnaGroup;
use crate::ports::{Port, Referral};
use crate::rdma::Rdma;
use crate::subsystems::Subsystem;
use crate::tls::TlsKey;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub global: Global,
    /// NVMe/RDMA pool sizes, shared receive queue and busy polling (see `rdma`).
    #[serde(default, skip_serializing_if = "Rdma::is_default")]
    pub rdma: Rdma,
    /// Command counters, `nvmfd ctl top` and the OpenMetrics endpoint (see `metrics`).
    #[serde(default, skip_serializing_if = "Metrics::is_default")]
    pub metrics: Metrics,
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default)]
    pub subsystems: Vec<Subsystem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub referrals: Vec<Referral>,
    /// Asymmetric Namespace Access groups (see `multipath`); group 1 exists implicitly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ana_groups: Vec<AnaGroup>,
    /// Configured TLS PSKs of the hosts (see `tls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_keys: Vec<TlsKey>,
    /// Gateways sharing ANA group ownership through RADOS leases (see `gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_group: Option<GatewayGroup>,
}

/// The configuration used when no file is given: one 1 GiB RAM namespace in
/// `nqn.2026-12.dev.nvmfd:ram0`, NVMe/TCP on 127.0.0.1:4420, any host.
pub const EMBEDDED_DEFAULT: &str = r#"
[global]

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420

[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:ram0"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
ram_size = "1G"
"#;
