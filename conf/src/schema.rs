//! The TOML schema of ARCHITECTURE.md contract 3, as serde types.
//!
//! Every struct refuses unknown keys: a misspelt `read_ony = true` must fail loudly instead of
//! silently exporting a writable namespace.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::multipath::{
    default_ana_group, default_cntlid_max, default_cntlid_min, is_default_ana_group, AnaGroup,
};
use crate::names::{parse_nguid, parse_uuid};
use crate::rdma::Rdma;
use crate::size::ByteSize;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub global: Global,
    /// NVMe/RDMA pool sizes, shared receive queue and busy polling (see `rdma`).
    #[serde(default, skip_serializing_if = "Rdma::is_default")]
    pub rdma: Rdma,
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default)]
    pub subsystems: Vec<Subsystem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub referrals: Vec<Referral>,
    /// Asymmetric Namespace Access groups (see `multipath`); group 1 exists implicitly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ana_groups: Vec<AnaGroup>,
}

/// `[global]`: limits and process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Global {
    /// Reactor threads; 0 = one per online CPU (or one per entry of `cpus` when given).
    pub reactors: u32,
    /// CPUs to pin reactors to, round-robin; empty = no pinning.
    pub cpus: Vec<u32>,
    /// Entries per I/O queue the target accepts (CAP.MQES + 1).
    pub max_queue_size: u32,
    /// I/O queues per controller.
    pub max_io_queues: u32,
    /// In-capsule data bytes per command (IOCCSZ = (64 + this) / 16, NVMe-oF 1.1 §4.1).
    pub in_capsule_data_size: ByteSize,
    /// Largest data transfer per command (Identify Controller MDTS).
    pub max_data_transfer: ByteSize,
    /// Keep-alive timeout used when the host asks for none (milliseconds).
    pub kato_default_ms: u32,
    /// A transport connection that has not completed a Fabrics Connect within this many
    /// milliseconds is closed (no keep-alive runs before Connect, so an idle or half-open
    /// socket would otherwise hold its buffers forever).
    pub connect_timeout_ms: u32,
    /// `tracing` env-filter directive: a level ("info") or "target=level,…".
    pub log_level: String,
    pub log_format: LogFormat,
    pub control_socket: PathBuf,
    /// Controller IDs this target hands out (1..=65519). Gateways that export the same
    /// subsystem NQN need disjoint ranges.
    pub cntlid_min: u32,
    pub cntlid_max: u32,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            reactors: 0,
            cpus: Vec::new(),
            max_queue_size: 128,
            max_io_queues: 8,
            in_capsule_data_size: ByteSize(8192),
            max_data_transfer: ByteSize(1 << 20),
            kato_default_ms: 120_000,
            connect_timeout_ms: 30_000,
            log_level: "info".to_owned(),
            log_format: LogFormat::Text,
            control_socket: PathBuf::from("/run/nvmfd/control.sock"),
            cntlid_min: default_cntlid_min(),
            cntlid_max: default_cntlid_max(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Rdma,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// `[[ports]]`: one listening address (the NVMe-oF "port" of the discovery log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    /// PORTID of the discovery log entry; referenced by `subsystems[].ports`.
    pub id: u16,
    pub transport: Transport,
    /// An IPv4 or IPv6 literal (no host names: the discovery log must carry what we bind).
    pub address: String,
    /// TCP port / RDMA CM port. Kept wider than u16 so that 70000 is reported by validation
    /// with its key path instead of as a type error.
    pub service: u32,
}

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
    /// Unset = allow any host exactly when `allowed_hosts` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Port ids this subsystem is exported on; empty = every port.
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
}

fn default_model() -> String {
    "nvmfd".to_owned()
}

impl Subsystem {
    /// Whether any host NQN may connect.
    pub fn allows_any_host(&self) -> bool {
        self.allow_any_host.unwrap_or(self.allowed_hosts.is_empty())
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
        }
    }

    /// `None` when the namespace is invalid (not exactly one of `ram_size` / `path` / `rbd`).
    pub fn storage(&self) -> Option<Storage<'_>> {
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

/// `[[referrals]]`: other discovery controllers listed in our discovery log (subtype 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Referral {
    pub transport: Transport,
    pub address: String,
    pub service: u32,
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
