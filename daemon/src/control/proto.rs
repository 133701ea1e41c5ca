//! The control socket protocol: one JSON object per line each way.
//!
//! A request names its command in `"command"` (kebab-case) with the command's fields beside
//! it, e.g. `{"command":"remove-namespace","nqn":"nqn.…","nsid":2}`. Every request gets one
//! response line: `{"ok":true,"result":…}` or `{"ok":false,"error":"…"}`. The views below are
//! what `result` holds; `nvmfd ctl` prints them as tables (or as this JSON with `--json`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Longest request line accepted (a namespace with a long path is far below this); longer
/// lines are refused before they are buffered whole.
pub const MAX_REQUEST_LINE: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Request {
    /// Version, uptime, counts.
    Status,
    Subsystems,
    Subsystem {
        nqn: String,
    },
    /// Namespaces of one subsystem, or of all of them, with their I/O counters.
    Namespaces {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nqn: Option<String>,
    },
    Ports,
    /// The gateway group as this gateway sees it.
    Gateways,
    /// Live controllers (discovery controllers included) of one subsystem or of all.
    Controllers {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nqn: Option<String>,
    },
    AddNamespace {
        nqn: String,
        namespace: Box<conf::Namespace>,
    },
    RemoveNamespace {
        nqn: String,
        nsid: u32,
    },
    /// Show a namespace to the listed host NQNs only, or (`None`) to every host the
    /// subsystem admits. Hosts whose view changes get a Namespace Attribute Changed AEN.
    SetNamespaceHosts {
        nqn: String,
        nsid: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hosts: Option<Vec<String>>,
    },
    AddHost {
        nqn: String,
        host: String,
    },
    RemoveHost {
        nqn: String,
        host: String,
    },
    /// Set or rotate a host's DH-HMAC-CHAP keys, allowing the host if it was not; a host
    /// without keys is allowed without authentication. Live queues stay authenticated; their
    /// next authentication transaction uses the new keys.
    SetHostKey {
        nqn: String,
        host: conf::Host,
    },
    /// Add or replace the TLS PSK of a host (or host and subsystem), `[[tls_keys]]`: new TLS
    /// handshakes use it, established sessions continue.
    SetTlsKey {
        key: conf::TlsKey,
    },
    /// Remove a host's (or host and subsystem's) TLS PSK; its established sessions continue.
    RemoveTlsKey {
        host: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subsystem: Option<String>,
    },
    AddPort {
        port: conf::Port,
    },
    RemovePort {
        id: u16,
    },
    /// Set an ANA group's state (NVMe Base 2.0 §8.1.3): on one port (a per-port state of the
    /// group), or, without `port`, on every port (the group's state; per-port states go).
    /// Controllers whose ANA log page changes get an ANA change notice.
    SetAnaState {
        group: u32,
        state: conf::multipath::AnaState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
    },
    /// Cumulative I/O counters per namespace and controller (`[metrics]` must count);
    /// `nvmfd ctl top` turns two of them into rates.
    Top,
    /// Re-read the configuration file, as SIGHUP does, and report the outcome.
    Reload,
    /// Write the running configuration as TOML (default: the file it was loaded from).
    WriteConfig {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<PathBuf>,
    },
}

/// One request line: the request, and for configuration edits whether to keep the change
/// out of the configuration file (`"transient":true`; by default an applied edit is written
/// through to the file so that it survives the next reload or restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(flatten)]
    pub request: Request,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
}

impl Request {
    /// Whether the request changes the running configuration (logged at info level).
    pub fn is_change(&self) -> bool {
        !matches!(
            self,
            Request::Status
                | Request::Subsystems
                | Request::Subsystem { .. }
                | Request::Namespaces { .. }
                | Request::Ports
                | Request::Gateways
                | Request::Controllers { .. }
                | Request::Top
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub result: serde_json::Value,
}

impl Response {
    pub fn success(result: impl Serialize) -> Response {
        match serde_json::to_value(result) {
            Ok(result) => Response {
                ok: true,
                error: None,
                result,
            },
            Err(e) => Response::failure(format!("cannot encode the result: {e}")),
        }
    }

    pub fn failure(error: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(error.into()),
            result: serde_json::Value::Null,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    pub version: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub config_path: Option<PathBuf>,
    pub subsystems: usize,
    pub namespaces: usize,
    pub ports: usize,
    pub controllers: usize,
    pub connections: usize,
    pub discovery_genctr: u64,
    /// Failed in-band authentications since start.
    #[serde(default)]
    pub auth_failures: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubsystemView {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub allowed_hosts: Vec<String>,
    /// Port ids it is exported on; empty = every port.
    pub ports: Vec<u16>,
    pub namespaces: usize,
    pub controllers: usize,
}

/// `subsystem NQN`: the subsystem with its namespaces and controllers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubsystemDetail {
    #[serde(flatten)]
    pub subsystem: SubsystemView,
    pub namespace_list: Vec<NamespaceView>,
    pub controller_list: Vec<ControllerView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamespaceView {
    pub nqn: String,
    pub nsid: u32,
    /// Backend kind ("ram", "file", "block", …).
    pub backend: String,
    /// Backing file or device; absent for RAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    pub size_bytes: u64,
    pub block_size: u32,
    pub read_only: bool,
    pub uuid: String,
    pub read_commands: u64,
    pub write_commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortView {
    pub id: u16,
    pub transport: String,
    pub address: String,
    pub service: u16,
    /// Subsystems reachable through it (discovery excluded).
    pub subsystems: Vec<String>,
    /// Live controllers connected through it.
    pub controllers: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControllerView {
    pub nqn: String,
    pub cntlid: u16,
    pub host_nqn: String,
    pub host_address: String,
    pub transport: String,
    pub port_id: u16,
    /// Admin queue plus connected I/O queues.
    pub queues: usize,
    pub kato_ms: u32,
    /// Each connected queue (admin queue 0 first) and the reactor thread serving it.
    #[serde(default)]
    pub queue_reactors: Vec<QueueReactor>,
}

/// Which reactor serves queue `qid` (`None`: not known, e.g. an older daemon).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueReactor {
    pub qid: u16,
    pub reactor: Option<u16>,
}

/// What a change (`add-*`, `remove-*`, `reload`) did.
/// Cumulative counters of one command class (`nvme::metrics::ClassCounters`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassView {
    pub commands: u64,
    pub bytes: u64,
    pub latency_count: u64,
    pub latency_sum_ns: u64,
    /// Non-cumulative counts; bucket i holds latencies below 2^i µs, the last one the rest.
    pub latency_buckets: Vec<u64>,
}

/// One namespace (`nsid`) or controller (`cntlid`, `host_nqn`) with its I/O classes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopRow {
    pub nqn: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cntlid: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_nqn: Option<String>,
    pub read: ClassView,
    pub write: ClassView,
    pub flush: ClassView,
    pub other: ClassView,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopView {
    pub namespaces: Vec<TopRow>,
    pub controllers: Vec<TopRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyView {
    pub summary: String,
    /// For edits: whether the change was written to the configuration file (absent for
    /// `reload`, which reads the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<Saved>,
}

/// Whether an applied edit reached the configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Saved {
    /// Written through (atomically) to this file.
    Written { path: PathBuf },
    /// `--transient`: live only, the next reload or restart undoes it.
    Transient,
    /// Live, but the file could not be updated: the next reload or restart undoes it.
    Failed { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteConfigView {
    pub path: PathBuf,
    pub bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_use_a_kebab_case_command_tag() {
        let r: Request =
            serde_json::from_str(r#"{"command":"remove-namespace","nqn":"n","nsid":2}"#).unwrap();
        assert_eq!(
            r,
            Request::RemoveNamespace {
                nqn: "n".into(),
                nsid: 2
            }
        );
        let r: Request = serde_json::from_str(r#"{"command":"namespaces"}"#).unwrap();
        assert_eq!(r, Request::Namespaces { nqn: None });
        let text = serde_json::to_string(&Request::AddNamespace {
            nqn: "n".into(),
            namespace: Box::new(conf::Namespace::new_ram(3, conf::ByteSize(1 << 20))),
        })
        .unwrap();
        let back: Request = serde_json::from_str(&text).unwrap();
        assert!(matches!(back, Request::AddNamespace { namespace, .. } if namespace.nsid == 3));
        let r: Request = serde_json::from_str(
            r#"{"command":"set-ana-state","group":1,"state":"non-optimized"}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Request::SetAnaState {
                group: 1,
                state: conf::multipath::AnaState::NonOptimized,
                port: None
            }
        );
        assert!(serde_json::from_str::<Request>(
            r#"{"command":"set-ana-state","group":1,"state":"optimised"}"#
        )
        .is_err());
        assert!(serde_json::from_str::<Request>(r#"{"command":"format-disk"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"command":"remove-port"}"#).is_err());
    }

    #[test]
    fn edits_carry_an_optional_transient_flag_beside_the_command() {
        let e: Envelope =
            serde_json::from_str(r#"{"command":"remove-port","id":2,"transient":true}"#).unwrap();
        assert_eq!(e.request, Request::RemovePort { id: 2 });
        assert!(e.transient);
        let e: Envelope = serde_json::from_str(r#"{"command":"remove-port","id":2}"#).unwrap();
        assert!(!e.transient);
        let text = serde_json::to_string(&Envelope {
            request: Request::Status,
            transient: false,
        })
        .unwrap();
        assert_eq!(text, r#"{"command":"status"}"#);
        let text = serde_json::to_string(&Envelope {
            request: Request::RemovePort { id: 3 },
            transient: true,
        })
        .unwrap();
        assert_eq!(text, r#"{"command":"remove-port","id":3,"transient":true}"#);
    }

    #[test]
    fn responses_carry_either_a_result_or_an_error() {
        let ok = serde_json::to_string(&Response::success(ApplyView {
            summary: "x".into(),
            saved: None,
        }))
        .unwrap();
        assert_eq!(ok, r#"{"ok":true,"result":{"summary":"x"}}"#);
        let ok = serde_json::to_string(&Response::success(ApplyView {
            summary: "x".into(),
            saved: Some(Saved::Written {
                path: "/etc/nvmfd/nvmfd.toml".into(),
            }),
        }))
        .unwrap();
        assert_eq!(
            ok,
            r#"{"ok":true,"result":{"saved":{"path":"/etc/nvmfd/nvmfd.toml","state":"written"},"summary":"x"}}"#
        );
        let err = serde_json::to_string(&Response::failure("no such subsystem")).unwrap();
        assert_eq!(err, r#"{"ok":false,"error":"no such subsystem"}"#);
    }
}
