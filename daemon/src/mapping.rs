//! `conf::Config` (the file) → `nvme::target::TargetConfig` (what the core serves).
//!
//! The configuration has been validated already; the conversions below still return errors
//! instead of assuming it, because a reload can race with the filesystem (a block device that
//! vanished between validation and mapping).

use std::net::IpAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use nvme::auth::HostAuth;
use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::qos::{QosConfig, QosLimits, MB};
use nvme::target::{
    AnaGroupConfig, AnaState, Limits, MultipathConfig, PortConfig, ReferralConfig, SecureChannel,
    SubsystemConfig, TargetConfig, TransportKind, Visibility,
};

#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    #[error("{key}: {value}: {reason}")]
    Value {
        key: String,
        value: String,
        reason: &'static str,
    },
    /// A host's key (file) that no longer reads or parses.
    #[error("{key}: {message}")]
    Key { key: String, message: String },
}

fn bad(key: String, value: impl ToString, reason: &'static str) -> MappingError {
    MappingError::Value {
        key,
        value: value.to_string(),
        reason,
    }
}

fn transport(t: conf::Transport) -> TransportKind {
    match t {
        conf::Transport::Tcp => TransportKind::Tcp,
        conf::Transport::Rdma => TransportKind::Rdma,
    }
}

fn address(key: String, text: &str) -> Result<IpAddr, MappingError> {
    text.parse()
        .map_err(|_| bad(key, text, "not an IPv4 or IPv6 address"))
}

fn service(key: String, value: u32) -> Result<u16, MappingError> {
    u16::try_from(value)
        .ok()
        .filter(|&s| s != 0)
        .ok_or_else(|| bad(key, value, "must be 1..=65535"))
}

fn narrow<T: TryFrom<u64>>(key: &str, value: u64) -> Result<T, MappingError> {
    T::try_from(value).map_err(|_| bad(key.to_owned(), value, "out of range"))
}

/// A path is a block device or a regular file (created on open when `size` is given).
fn backend(
    key: String,
    path: &Path,
    namespace: &conf::Namespace,
) -> Result<BackendConfig, MappingError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_block_device() => Ok(BackendConfig::Block {
            path: path.to_owned(),
        }),
        Ok(meta) if meta.is_file() => Ok(BackendConfig::File {
            path: path.to_owned(),
            size: namespace.size.map(conf::ByteSize::bytes),
            direct_io: namespace.direct_io,
        }),
        Ok(_) => Err(bad(
            key,
            path.display(),
            "not a regular file or block device",
        )),
        Err(_) if namespace.size.is_some() => Ok(BackendConfig::File {
            path: path.to_owned(),
            size: namespace.size.map(conf::ByteSize::bytes),
            direct_io: namespace.direct_io,
        }),
        Err(_) => Err(bad(key, path.display(), "no such file")),
    }
}

/// `rbd = "pool/image"` or `"pool/namespace/image"` → the RBD backend's target.
fn rbd(
    key: String,
    image: &str,
    ceph_conf: Option<&Path>,
    client_id: Option<&str>,
) -> Result<BackendConfig, MappingError> {
    let parts: Vec<&str> = image.split('/').collect();
    let (pool, namespace, name) = match parts[..] {
        [pool, name] => (pool, None, name),
        [pool, ns, name] => (pool, Some(ns.to_owned()), name),
        _ => {
            return Err(bad(
                key,
                image,
                "must be \"pool/image\" or \"pool/namespace/image\"",
            ))
        }
    };
    Ok(BackendConfig::Rbd(storage::RbdTarget {
        pool: pool.to_owned(),
        namespace,
        image: name.to_owned(),
        ceph_conf: ceph_conf.map(Path::to_path_buf),
        client_id: client_id.map(str::to_owned),
    }))
}

pub fn target_config(config: &conf::Config) -> Result<TargetConfig, MappingError> {
    let global = &config.global;
    let limits = Limits {
        max_queue_size: narrow("global.max_queue_size", global.max_queue_size.into())?,
        max_io_queues: narrow("global.max_io_queues", global.max_io_queues.into())?,
        max_data_transfer: narrow("global.max_data_transfer", global.max_data_transfer.bytes())?,
        in_capsule_data_size: narrow(
            "global.in_capsule_data_size",
            global.in_capsule_data_size.bytes(),
        )?,
        kato_default_ms: global.kato_default_ms,
    };
    let mut ports = Vec::with_capacity(config.ports.len());
    for (i, port) in config.ports.iter().enumerate() {
        ports.push(PortConfig {
            id: port.id,
            transport: transport(port.transport),
            address: address(format!("ports[{i}].address"), &port.address)?,
            service: service(format!("ports[{i}].service"), port.service)?,
            secure_channel: match port.tls {
                conf::TlsPolicy::None => SecureChannel::None,
                conf::TlsPolicy::Optional => SecureChannel::TlsOptional,
                conf::TlsPolicy::Required => SecureChannel::TlsRequired,
            },
        });
    }
    let mut referrals = Vec::with_capacity(config.referrals.len());
    for (i, referral) in config.referrals.iter().enumerate() {
        referrals.push(ReferralConfig {
            transport: transport(referral.transport),
            address: address(format!("referrals[{i}].address"), &referral.address)?,
            service: service(format!("referrals[{i}].service"), referral.service)?,
        });
    }
    let mut subsystems = Vec::with_capacity(config.subsystems.len());
    for (s, subsystem) in config.subsystems.iter().enumerate() {
        let mut namespaces = Vec::with_capacity(subsystem.namespaces.len());
        let mut visibility = Visibility::default();
        for (n, namespace) in subsystem.namespaces.iter().enumerate() {
            if let Some(hosts) = &namespace.hosts {
                visibility.restrict(namespace.nsid, hosts.iter().cloned());
            }
            let key = format!("subsystems[{s}].namespaces[{n}]");
            let backend = match namespace.storage() {
                Some(conf::Storage::Ram { size }) => BackendConfig::Ram { size },
                Some(conf::Storage::Null { size }) => BackendConfig::Null { size },
                Some(conf::Storage::Path { path, .. }) => {
                    backend(format!("{key}.path"), path, namespace)?
                }
                Some(conf::Storage::Rbd {
                    image,
                    ceph_conf,
                    client_id,
                }) => rbd(format!("{key}.rbd"), image, ceph_conf, client_id)?,
                None => return Err(bad(key, "", "needs exactly one of ram_size / path")),
            };
            let backend = if namespace.faults.is_empty() {
                backend
            } else {
                BackendConfig::Faulty {
                    inner: Box::new(backend),
                    rules: fault_rules(namespace),
                }
            };
            namespaces.push(NamespaceConfig {
                nsid: namespace.nsid,
                backend,
                block_size: namespace.block_size,
                read_only: namespace.read_only,
                uuid: namespace.uuid_bytes(),
                nguid: namespace.nguid_bytes(),
                ana_group: namespace.ana_group,
            });
        }
        let mut host_auth = std::collections::BTreeMap::new();
        for (h, host) in subsystem.hosts.iter().enumerate() {
            // Key files are read here, at start and at every reload: a rotated file applies.
            let keys = host.keys().map_err(|e| MappingError::Key {
                key: format!("subsystems[{s}].hosts[{h}]"),
                message: e.to_string(),
            })?;
            if let Some(k) = keys {
                host_auth.insert(
                    host.nqn.clone(),
                    HostAuth {
                        host_key: k.host_key,
                        ctrl_key: k.ctrl_key,
                        hashes: k.hashes,
                        dh_groups: k.dh_groups,
                    },
                );
            }
        }
        subsystems.push(SubsystemConfig {
            nqn: subsystem.nqn.clone(),
            serial: subsystem.serial.clone(),
            model: subsystem.model.clone(),
            allow_any_host: subsystem.allows_any_host(),
            allowed_hosts: subsystem.host_nqns().map(str::to_owned).collect(),
            host_auth,
            ports: subsystem.ports.clone(),
            namespaces,
            visibility,
            qos: qos_config(subsystem),
        });
    }
    Ok(TargetConfig {
        ports,
        subsystems,
        limits,
        referrals,
        multipath: multipath(config)?,
        state_dir: config.global.state_dir.clone(),
        discovery_nqn: config.global.discovery_nqn.clone(),
        reservation_stores: None,
    })
}

/// A subsystem's `qos` keys (MiB/s, ms) as the core's limits (bytes per second, a duration).
fn qos_config(subsystem: &conf::Subsystem) -> QosConfig {
    QosConfig {
        namespaces: subsystem
            .namespaces
            .iter()
            .filter_map(|ns| ns.qos.map(|q| (ns.nsid, qos_limits(&q))))
            .collect(),
        hosts: subsystem
            .host_qos
            .iter()
            .map(|h| (h.host.clone(), qos_limits(&h.qos)))
            .collect(),
    }
}

pub fn qos_limits(q: &conf::Qos) -> QosLimits {
    QosLimits {
        iops: q.iops,
        read_bytes_per_sec: q.read_mbps.saturating_mul(MB),
        write_bytes_per_sec: q.write_mbps.saturating_mul(MB),
        total_bytes_per_sec: q.total_mbps.saturating_mul(MB),
        burst: std::time::Duration::from_millis(u64::from(q.burst_ms)),
    }
}

fn ana_state(s: conf::multipath::AnaState) -> AnaState {
    use conf::multipath::AnaState as C;
    match s {
        C::Optimized => AnaState::Optimized,
        C::NonOptimized => AnaState::NonOptimized,
        C::Inaccessible => AnaState::Inaccessible,
        C::PersistentLoss => AnaState::PersistentLoss,
        C::Change => AnaState::Change,
    }
}

/// `global.cntlid_min/max` and `[[ana_groups]]` → the core's multipath settings.
fn multipath(config: &conf::Config) -> Result<MultipathConfig, MappingError> {
    let global = &config.global;
    Ok(MultipathConfig {
        cntlid_min: narrow("global.cntlid_min", global.cntlid_min.into())?,
        cntlid_max: narrow("global.cntlid_max", global.cntlid_max.into())?,
        ana_groups: config
            .ana_groups
            .iter()
            .map(|g| AnaGroupConfig {
                id: g.id,
                state: ana_state(g.state),
                port_states: g
                    .port_states
                    .iter()
                    .map(|p| (p.port, ana_state(p.state)))
                    .collect(),
            })
            .collect(),
    })
}

/// A namespace's `faults` in bytes (validation bounded `slba + blocks` in bytes).
fn fault_rules(namespace: &conf::Namespace) -> Vec<storage::fault::FaultRule> {
    use storage::fault::{FaultOn, FaultRule};
    let bs = u64::from(namespace.block_size);
    namespace
        .faults
        .iter()
        .map(|f| FaultRule {
            offset: f.slba.saturating_mul(bs),
            len: f.blocks.saturating_mul(bs),
            on: match f.on {
                conf::FaultOn::Read => FaultOn::Reads,
                conf::FaultOn::Write => FaultOn::Writes,
                conf::FaultOn::Any => FaultOn::Both,
            },
            errno: f.error.map(|e| match e {
                conf::FaultError::Eio => libc::EIO,
                conf::FaultError::Enospc => libc::ENOSPC,
            }),
            latency: f
                .latency_ms
                .map(|ms| std::time::Duration::from_millis(ms.into())),
            every: f.every.unwrap_or(1),
        })
        .collect()
}

#[cfg(test)]
mod tests;
