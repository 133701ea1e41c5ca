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
mod tests {
    use super::*;

    #[test]
    fn maps_rbd_images_with_and_without_a_rados_namespace() {
        // A second subsystem beside the embedded default's.
        let toml = format!(
            r#"{}
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:ceph"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
rbd = "rbd/disk0"
[[subsystems.namespaces]]
nsid = 2
rbd = "volumes/tenant-a/disk1"
ceph_conf = "/etc/hosts"
ceph_client_id = "client.nvmfd"
block_size = 4096
"#,
            conf::EMBEDDED_DEFAULT
        );
        let config = conf::Config::parse_toml(&toml).unwrap();
        config.validate().unwrap();
        let target = target_config(&config).unwrap();
        let ns = &target.subsystems[1].namespaces;
        assert_eq!(
            ns[0].backend,
            BackendConfig::Rbd(storage::RbdTarget {
                pool: "rbd".into(),
                namespace: None,
                image: "disk0".into(),
                ceph_conf: None,
                client_id: None,
            })
        );
        assert_eq!(
            ns[1].backend,
            BackendConfig::Rbd(storage::RbdTarget {
                pool: "volumes".into(),
                namespace: Some("tenant-a".into()),
                image: "disk1".into(),
                ceph_conf: Some("/etc/hosts".into()),
                client_id: Some("client.nvmfd".into()),
            })
        );
        assert_eq!(ns[1].block_size, 4096);
    }

    #[test]
    fn maps_the_embedded_default() {
        let config = conf::Config::load_with_env(None, conf::EnvSource::None).unwrap();
        let target = target_config(&config).unwrap();
        assert_eq!(
            target.ports,
            vec![PortConfig {
                id: 1,
                transport: TransportKind::Tcp,
                address: "127.0.0.1".parse().unwrap(),
                service: 4420,
                secure_channel: Default::default(),
            }]
        );
        assert_eq!(target.limits, Limits::default());
        let subsystem = &target.subsystems[0];
        assert_eq!(subsystem.nqn, "nqn.2026-12.dev.nvmfd:ram0");
        assert!(subsystem.allow_any_host);
        assert_eq!(
            subsystem.namespaces[0].backend,
            BackendConfig::Ram { size: 1 << 30 }
        );
        assert_eq!(subsystem.namespaces[0].block_size, 512);
        assert_eq!(subsystem.namespaces[0].ana_group, 1);
        assert_eq!(target.multipath, MultipathConfig::default());
    }

    #[test]
    fn maps_null_namespaces_and_refuses_mixed_storage() {
        let toml = |storage: &str| {
            format!(
                "[[ports]]\nid = 1\ntransport = \"tcp\"\naddress = \"127.0.0.1\"\nservice = 4420\n\
                 [[subsystems]]\nnqn = \"nqn.2026-12.dev.nvmfd:null\"\nallow_any_host = true\n\
                 [[subsystems.namespaces]]\nnsid = 1\nblock_size = 4096\n{storage}\n"
            )
        };
        let config = conf::Config::parse_toml(&toml("null_size = \"1T\"")).unwrap();
        config.validate().unwrap();
        let target = target_config(&config).unwrap();
        assert_eq!(
            target.subsystems[0].namespaces[0].backend,
            BackendConfig::Null { size: 1 << 40 }
        );
        // Faults wrap the namespace's storage, in bytes of its block size.
        let faulty = "null_size = \"1M\"\n\
                      faults = [{ slba = 2, blocks = 3, on = \"any\", error = \"enospc\" },\
                                { slba = 9, blocks = 1, on = \"read\", latency_ms = 250, every = 4 }]";
        let config = conf::Config::parse_toml(&toml(faulty)).unwrap();
        config.validate().unwrap();
        let target = target_config(&config).unwrap();
        use storage::fault::{FaultOn, FaultRule};
        let rules = vec![
            FaultRule {
                offset: 2 * 4096,
                len: 3 * 4096,
                on: FaultOn::Both,
                errno: Some(libc::ENOSPC),
                latency: None,
                every: 1,
            },
            FaultRule {
                offset: 9 * 4096,
                len: 4096,
                on: FaultOn::Reads,
                errno: None,
                latency: Some(std::time::Duration::from_millis(250)),
                every: 4,
            },
        ];
        assert_eq!(
            target.subsystems[0].namespaces[0].backend,
            BackendConfig::Faulty {
                inner: Box::new(BackendConfig::Null { size: 1 << 20 }),
                rules,
            }
        );
        for (storage, complaint) in [
            (
                "ram_size = \"1M\"\n\
                 faults = [{ slba = 0, blocks = 0, on = \"read\", error = \"eio\" }]",
                "faults[0].blocks",
            ),
            (
                "ram_size = \"1M\"\nfaults = [{ slba = 0, blocks = 1, on = \"read\" }]",
                "needs error, latency_ms or both",
            ),
            (
                "ram_size = \"1M\"\nfaults = [{ slba = 0, blocks = 1, on = \"read\", latency_ms = 0 }]",
                "faults[0].latency_ms",
            ),
            (
                "ram_size = \"1M\"\n\
                 faults = [{ slba = 0, blocks = 1, on = \"read\", error = \"eio\", every = 0 }]",
                "faults[0].every",
            ),
            (
                "null_size = \"1T\"\nram_size = \"1M\"",
                "null_size excludes",
            ),
            ("null_size = \"1000\"", "multiple of block_size"),
            ("null_size = \"0\"", "greater than 0"),
        ] {
            let config = conf::Config::parse_toml(&toml(storage)).unwrap();
            let err = format!("{:?}", config.validate().unwrap_err());
            assert!(err.contains(complaint), "{storage}: {err}");
        }
    }

    #[test]
    fn maps_ana_groups_and_cntlid_range() {
        // The file's limits are the core's.
        assert_eq!(conf::multipath::ANA_GROUP_MAX, nvme::ana::MAX_ANA_GROUP);
        assert_eq!(
            conf::multipath::CNTLID_MAX,
            u32::from(nvme::spec::MAX_CNTLID)
        );
        let toml = r#"
[global]
cntlid_min = 101
cntlid_max = 200
[[ports]]
id = 2
transport = "tcp"
address = "127.0.0.1"
service = 4421
[[ana_groups]]
id = 1
state = "inaccessible"
port_states = [{ port = 2, state = "non-optimized" }]
[[ana_groups]]
id = 7
state = "change"
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:mp"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
ana_group = 7
"#;
        let config = conf::Config::parse_toml(toml).unwrap();
        config.validate().unwrap();
        let target = target_config(&config).unwrap();
        assert_eq!(target.subsystems[0].namespaces[0].ana_group, 7);
        let mp = &target.multipath;
        assert_eq!((mp.cntlid_min, mp.cntlid_max), (101, 200));
        assert_eq!(mp.ana_groups.len(), 2);
        assert_eq!(mp.ana_groups[0].state, AnaState::Inaccessible);
        assert_eq!(
            mp.ana_groups[0].port_states.get(&2),
            Some(&AnaState::NonOptimized)
        );
        assert_eq!(mp.ana_groups[1].state, AnaState::Change);
        // And the core accepts it.
        nvme::target::Target::with_opener(target, &storage::open).unwrap();
    }

    #[test]
    fn maps_files_block_devices_identifiers_and_host_lists() {
        let dir = std::env::temp_dir().join(format!("nvmfd-mapping-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("disk.img");
        std::fs::write(&image, vec![0u8; 4096]).unwrap();
        let toml = format!(
            r#"
[[ports]]
id = 7
transport = "tcp"
address = "::1"
service = 4421
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:files"
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32"]
ports = [7]
[[subsystems.namespaces]]
nsid = 1
path = "{image}"
direct_io = false
uuid = "26ffc8ce-73b4-321d-9685-7d7a9872c460"
[[subsystems.namespaces]]
nsid = 2
path = "{new}"
size = "1M"
block_size = 4096
[[referrals]]
transport = "rdma"
address = "192.0.2.1"
service = 4420
"#,
            image = image.display(),
            new = dir.join("new.img").display()
        );
        let config = conf::Config::parse_toml(&toml).unwrap();
        config.validate().unwrap();
        let target = target_config(&config).unwrap();
        let subsystem = &target.subsystems[0];
        assert!(!subsystem.allow_any_host);
        assert_eq!(subsystem.ports, vec![7]);
        assert_eq!(
            subsystem.namespaces[0].backend,
            BackendConfig::File {
                path: image.clone(),
                size: None,
                direct_io: false
            }
        );
        assert_eq!(subsystem.namespaces[0].uuid.unwrap()[0], 0x26);
        assert_eq!(subsystem.namespaces[0].nguid, None);
        assert_eq!(
            subsystem.namespaces[1].backend,
            BackendConfig::File {
                path: dir.join("new.img"),
                size: Some(1 << 20),
                direct_io: true
            }
        );
        assert_eq!(target.referrals[0].transport, TransportKind::Rdma);
        std::fs::remove_dir_all(&dir).unwrap();

        // A block device maps to the block backend (checked only where /dev shows one).
        let block = std::fs::read_dir("/dev")
            .ok()
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()));
        if let Some(block) = block {
            let mut namespace = conf::Namespace::new_ram(1, conf::ByteSize(0));
            namespace.ram_size = None;
            namespace.path = Some(block.clone());
            assert_eq!(
                backend("k".into(), &block, &namespace).unwrap(),
                BackendConfig::Block { path: block }
            );
        }
    }
}
