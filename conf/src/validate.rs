//! Semantic validation: every problem in the file, each naming its key path and value.
//!
//! Deserialization already guarantees types and refuses unknown keys; this pass checks ranges,
//! cross-references and the filesystem, and keeps going after the first error so that one
//! `nvmfd check-config` run shows everything to fix.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::names::{check_nqn, parse_nguid, parse_uuid, DISCOVERY_NQN};
use crate::schema::{Config, Global, Namespace, Port, Subsystem};

/// One problem: `key: value: reason` (the value is omitted when it says nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// Key path in the file, e.g. `subsystems[0].namespaces[1].path`.
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.key, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.key, self.value, self.reason)
        }
    }
}

/// Supported LBA data sizes (Identify Namespace LBAF); both are what Linux hosts expect.
pub const BLOCK_SIZES: [u32; 2] = [512, 4096];
pub const QUEUE_SIZE_RANGE: std::ops::RangeInclusive<u32> = 16..=1024;
pub const IO_QUEUES_RANGE: std::ops::RangeInclusive<u32> = 1..=1024;
pub const REACTORS_MAX: u32 = 1024;
/// `cpu_set_t` holds CPU_SETSIZE (1024) CPUs.
pub const CPU_MAX: u32 = 1023;
/// MDTS is a power of two in units of the 4 KiB minimum page size (NVMe Base 2.0 §5.17.2.1);
/// the upper bound keeps per-slot buffers (queue size × MDTS) within reason.
pub const MAX_DATA_TRANSFER_RANGE: std::ops::RangeInclusive<u64> = 4096..=(16 << 20);
pub const KATO_RANGE_MS: std::ops::RangeInclusive<u32> = 1000..=86_400_000;
/// Time allowed from accepting a connection to its Fabrics Connect: long enough for any host
/// (Linux sends ICReq and Connect at once), short enough that idle sockets are reclaimed.
pub const CONNECT_TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u32> = 100..=600_000;
/// `sun_path` is 108 bytes including the terminating NUL.
pub const SOCKET_PATH_MAX: usize = 107;
/// Identify Controller SN and MN field widths (NVMe Base 2.0 §5.17.2.1).
pub const SERIAL_MAX: usize = 20;
pub const MODEL_MAX: usize = 40;
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

#[derive(Default)]
struct Errors(Vec<ValidationError>);

impl Errors {
    fn push(
        &mut self,
        key: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) {
        self.0.push(ValidationError {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        });
    }
}

/// Checks the whole configuration; `Err` carries every problem found, in file order.
pub fn validate(config: &Config) -> Result<(), Vec<ValidationError>> {
    let mut errors = Errors::default();
    check_global(&config.global, &mut errors);
    check_ports(&config.ports, &mut errors);
    check_subsystems(config, &mut errors);
    errors.0.extend(crate::multipath::check(config));
    errors.0.extend(crate::rdma::check(config));
    for (i, referral) in config.referrals.iter().enumerate() {
        let key = format!("referrals[{i}]");
        check_address(&format!("{key}.address"), &referral.address, &mut errors);
        check_service(&format!("{key}.service"), referral.service, &mut errors);
    }
    if errors.0.is_empty() {
        Ok(())
    } else {
        Err(errors.0)
    }
}

fn check_global(global: &Global, errors: &mut Errors) {
    if global.reactors > REACTORS_MAX {
        errors.push(
            "global.reactors",
            global.reactors,
            format!("must be 0..={REACTORS_MAX}"),
        );
    }
    let mut seen_cpus = HashMap::new();
    for (i, &cpu) in global.cpus.iter().enumerate() {
        let key = format!("global.cpus[{i}]");
        if cpu > CPU_MAX {
            errors.push(&key, cpu, format!("must be 0..={CPU_MAX}"));
        }
        if let Some(first) = seen_cpus.insert(cpu, i) {
            errors.push(
                &key,
                cpu,
                format!("duplicate CPU (also global.cpus[{first}])"),
            );
        }
    }
    if !QUEUE_SIZE_RANGE.contains(&global.max_queue_size) {
        errors.push(
            "global.max_queue_size",
            global.max_queue_size,
            format!(
                "must be {}..={}",
                QUEUE_SIZE_RANGE.start(),
                QUEUE_SIZE_RANGE.end()
            ),
        );
    }
    if !IO_QUEUES_RANGE.contains(&global.max_io_queues) {
        errors.push(
            "global.max_io_queues",
            global.max_io_queues,
            format!(
                "must be {}..={}",
                IO_QUEUES_RANGE.start(),
                IO_QUEUES_RANGE.end()
            ),
        );
    }
    let mdts = global.max_data_transfer.bytes();
    if !mdts.is_power_of_two() || !MAX_DATA_TRANSFER_RANGE.contains(&mdts) {
        errors.push(
            "global.max_data_transfer",
            global.max_data_transfer,
            "must be a power of two in 4K..=16M",
        );
    }
    let icd = global.in_capsule_data_size.bytes();
    // IOCCSZ counts 16-byte units (NVMe-oF 1.1 §4.1), so the data part must be one too.
    if icd % 16 != 0 {
        errors.push(
            "global.in_capsule_data_size",
            global.in_capsule_data_size,
            "must be a multiple of 16",
        );
    } else if icd > mdts {
        errors.push(
            "global.in_capsule_data_size",
            global.in_capsule_data_size,
            format!(
                "must not exceed max_data_transfer ({})",
                global.max_data_transfer
            ),
        );
    }
    if !KATO_RANGE_MS.contains(&global.kato_default_ms) {
        errors.push(
            "global.kato_default_ms",
            global.kato_default_ms,
            format!(
                "must be {}..={} (the keep-alive timer has 1 s granularity on Linux)",
                KATO_RANGE_MS.start(),
                KATO_RANGE_MS.end()
            ),
        );
    }
    if !CONNECT_TIMEOUT_RANGE_MS.contains(&global.connect_timeout_ms) {
        errors.push(
            "global.connect_timeout_ms",
            global.connect_timeout_ms,
            format!(
                "must be {}..={}",
                CONNECT_TIMEOUT_RANGE_MS.start(),
                CONNECT_TIMEOUT_RANGE_MS.end()
            ),
        );
    }
    if let Err(reason) = check_log_level(&global.log_level) {
        errors.push("global.log_level", &global.log_level, reason);
    }
    let socket = &global.control_socket;
    if !socket.is_absolute() {
        errors.push(
            "global.control_socket",
            socket.display(),
            "must be an absolute path",
        );
    } else if socket.as_os_str().len() > SOCKET_PATH_MAX {
        errors.push(
            "global.control_socket",
            socket.display(),
            format!("longer than {SOCKET_PATH_MAX} bytes (sun_path limit)"),
        );
    }
}

/// A `tracing` env-filter subset: comma-separated `level` or `target=level` items.
fn check_log_level(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("must not be empty".to_owned());
    }
    for item in text.split(',') {
        let item = item.trim();
        let level = match item.split_once('=') {
            Some((target, level)) => {
                let target_ok = !target.is_empty()
                    && target
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_:-".contains(&b));
                if !target_ok {
                    return Err(format!("{item:?}: bad target name"));
                }
                level
            }
            None => item,
        };
        if !LOG_LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!("{level:?} is not one of {}", LOG_LEVELS.join("/")));
        }
    }
    Ok(())
}

fn check_address(key: &str, address: &str, errors: &mut Errors) -> Option<IpAddr> {
    match address.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => {
            errors.push(key, address, "not an IPv4 or IPv6 address");
            None
        }
    }
}

fn check_service(key: &str, service: u32, errors: &mut Errors) {
    if !(1..=65535).contains(&service) {
        errors.push(key, service, "must be 1..=65535");
    }
}

fn check_ports(ports: &[Port], errors: &mut Errors) {
    if ports.is_empty() {
        errors.push("ports", "", "at least one port is required");
    }
    let mut ids = HashMap::new();
    let mut endpoints: Vec<(usize, &Port, IpAddr)> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let key = format!("ports[{i}]");
        if let Some(first) = ids.insert(port.id, i) {
            errors.push(
                format!("{key}.id"),
                port.id,
                format!("duplicate port id (also ports[{first}])"),
            );
        }
        check_service(&format!("{key}.service"), port.service, errors);
        let Some(ip) = check_address(&format!("{key}.address"), &port.address, errors) else {
            continue;
        };
        // Two listeners on the same service collide when the addresses are equal or one of
        // them is the wildcard of the same family (bind() fails with EADDRINUSE).
        for (j, other, other_ip) in &endpoints {
            let overlap = ip == *other_ip
                || (ip.is_ipv4() == other_ip.is_ipv4()
                    && (ip.is_unspecified() || other_ip.is_unspecified()));
            if other.transport == port.transport && other.service == port.service && overlap {
                errors.push(
                    format!("{key}.address"),
                    format!("{}:{}", port.address, port.service),
                    format!("overlaps ports[{j}] ({}:{})", other.address, other.service),
                );
            }
        }
        endpoints.push((i, port, ip));
    }
}

fn check_subsystems(config: &Config, errors: &mut Errors) {
    let mut nqns = HashMap::new();
    // Namespace identifiers and backing files must be unique target-wide: a host folding
    // paths by UUID/NGUID would otherwise merge two different namespaces.
    let mut uuids: HashMap<[u8; 16], String> = HashMap::new();
    let mut nguids: HashMap<[u8; 16], String> = HashMap::new();
    let mut paths: HashMap<PathBuf, String> = HashMap::new();
    for (s, subsystem) in config.subsystems.iter().enumerate() {
        let key = format!("subsystems[{s}]");
        check_subsystem_identity(&key, subsystem, errors);
        if let Some(first) = nqns.insert(subsystem.nqn.as_str(), s) {
            errors.push(
                format!("{key}.nqn"),
                &subsystem.nqn,
                format!("duplicate NQN (also subsystems[{first}])"),
            );
        }
        let mut port_ids = HashMap::new();
        for (p, &port_id) in subsystem.ports.iter().enumerate() {
            let pkey = format!("{key}.ports[{p}]");
            if !config.ports.iter().any(|port| port.id == port_id) {
                errors.push(&pkey, port_id, "no port with this id in [[ports]]");
            }
            if let Some(first) = port_ids.insert(port_id, p) {
                errors.push(
                    &pkey,
                    port_id,
                    format!("listed twice (also {key}.ports[{first}])"),
                );
            }
        }
        let mut nsids = HashMap::new();
        for (n, namespace) in subsystem.namespaces.iter().enumerate() {
            let nkey = format!("{key}.namespaces[{n}]");
            if let Some(first) = nsids.insert(namespace.nsid, n) {
                errors.push(
                    format!("{nkey}.nsid"),
                    namespace.nsid,
                    format!("duplicate nsid (also {key}.namespaces[{first}])"),
                );
            }
            check_namespace(&nkey, namespace, errors);
            let mut unique = |map: &mut HashMap<[u8; 16], String>, field: &str, id| {
                if let Some(first) = map.get(&id) {
                    let value = match field {
                        "uuid" => namespace.uuid.as_deref().unwrap_or_default(),
                        _ => namespace.nguid.as_deref().unwrap_or_default(),
                    };
                    errors.push(
                        format!("{nkey}.{field}"),
                        value,
                        format!("duplicate {field} (also {first})"),
                    );
                } else {
                    map.insert(id, nkey.clone());
                }
            };
            if let Some(id) = namespace.uuid_bytes() {
                unique(&mut uuids, "uuid", id);
            }
            if let Some(id) = namespace.nguid_bytes() {
                unique(&mut nguids, "nguid", id);
            }
            if let Some(path) = &namespace.path {
                let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                if let Some(first) = paths.get(&canonical) {
                    errors.push(
                        format!("{nkey}.path"),
                        path.display(),
                        format!("already exported by {first}"),
                    );
                } else {
                    paths.insert(canonical, nkey.clone());
                }
            }
        }
    }
}

fn check_subsystem_identity(key: &str, subsystem: &Subsystem, errors: &mut Errors) {
    if subsystem.nqn == DISCOVERY_NQN {
        errors.push(
            format!("{key}.nqn"),
            &subsystem.nqn,
            "reserved for the discovery subsystem",
        );
    } else if let Err(e) = check_nqn(&subsystem.nqn) {
        errors.push(format!("{key}.nqn"), &subsystem.nqn, e.to_string());
    }
    check_ascii_field(
        &format!("{key}.serial"),
        &subsystem.serial,
        SERIAL_MAX,
        errors,
    );
    check_ascii_field(&format!("{key}.model"), &subsystem.model, MODEL_MAX, errors);
    if subsystem.allow_any_host == Some(true) && !subsystem.allowed_hosts.is_empty() {
        errors.push(
            format!("{key}.allow_any_host"),
            "true",
            "contradicts the non-empty allowed_hosts list",
        );
    }
    let mut hosts = HashMap::new();
    for (h, host) in subsystem.allowed_hosts.iter().enumerate() {
        let hkey = format!("{key}.allowed_hosts[{h}]");
        if let Err(e) = check_nqn(host) {
            errors.push(&hkey, host, e.to_string());
        }
        if let Some(first) = hosts.insert(host.as_str(), h) {
            errors.push(
                &hkey,
                host,
                format!("listed twice (also {key}.allowed_hosts[{first}])"),
            );
        }
    }
}

/// Identify Controller SN/MN are space-padded printable ASCII (NVMe Base 2.0 §5.17.2.1).
fn check_ascii_field(key: &str, value: &str, max: usize, errors: &mut Errors) {
    if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        errors.push(key, value, "must be printable ASCII");
    } else if value.len() > max {
        errors.push(key, value, format!("longer than {max} characters"));
    }
}

fn check_namespace(key: &str, namespace: &Namespace, errors: &mut Errors) {
    // NSID 0 is invalid and 0xFFFFFFFF is the broadcast value (NVMe Base 2.0 §3.2.1.2).
    if namespace.nsid == 0 || namespace.nsid == u32::MAX {
        errors.push(
            format!("{key}.nsid"),
            namespace.nsid,
            "must be 1..=4294967294",
        );
    }
    let block_size = namespace.block_size;
    let block_size_ok = BLOCK_SIZES.contains(&block_size);
    if !block_size_ok {
        errors.push(
            format!("{key}.block_size"),
            block_size,
            "must be 512 or 4096",
        );
    }
    let check_multiple = |errors: &mut Errors, field: &str, size: crate::size::ByteSize| {
        if size.bytes() == 0 {
            errors.push(format!("{key}.{field}"), size, "must be greater than 0");
        } else if block_size_ok && size.bytes() % u64::from(block_size) != 0 {
            errors.push(
                format!("{key}.{field}"),
                size,
                format!("must be a multiple of block_size ({block_size})"),
            );
        }
    };
    match (&namespace.ram_size, &namespace.path, &namespace.rbd) {
        (Some(ram_size), None, None) => check_multiple(errors, "ram_size", *ram_size),
        (None, Some(path), None) => check_backing_path(key, path, namespace, errors),
        (None, None, Some(image)) => check_rbd(key, image, namespace, errors),
        (_, _, None) => errors.push(key, "", "needs exactly one of ram_size / path"),
        _ => errors.push(key, "", "needs exactly one of ram_size / path / rbd"),
    }
    if namespace.rbd.is_none() {
        if let Some(conf) = &namespace.ceph_conf {
            errors.push(
                format!("{key}.ceph_conf"),
                conf.display(),
                "only valid with rbd",
            );
        }
        if let Some(id) = &namespace.ceph_client_id {
            errors.push(format!("{key}.ceph_client_id"), id, "only valid with rbd");
        }
    }
    if let Some(size) = namespace.size {
        if namespace.path.is_none() {
            errors.push(
                format!("{key}.size"),
                size,
                "only valid with path (RAM namespaces use ram_size)",
            );
        } else {
            check_multiple(errors, "size", size);
            if namespace.read_only {
                errors.push(
                    format!("{key}.size"),
                    size,
                    "cannot create or extend a read_only namespace's file",
                );
            }
        }
    }
    if let Some(uuid) = &namespace.uuid {
        match parse_uuid(uuid) {
            None => errors.push(format!("{key}.uuid"), uuid, "not a UUID (8-4-4-4-12 hex)"),
            Some(bytes) if bytes == [0; 16] => {
                errors.push(format!("{key}.uuid"), uuid, "the nil UUID means \"none\"")
            }
            Some(_) => {}
        }
    }
    if let Some(nguid) = &namespace.nguid {
        match parse_nguid(nguid) {
            None => errors.push(format!("{key}.nguid"), nguid, "not 32 hex digits"),
            // An all-zero NGUID means "not reported" (NVMe Base 2.0 §5.17.2.2).
            Some(bytes) if bytes == [0; 16] => {
                errors.push(format!("{key}.nguid"), nguid, "all zeros means \"none\"")
            }
            Some(_) => {}
        }
    }
}

/// `rbd = "pool/image"` or `"pool/namespace/image"` (as the `rbd` tool names images); no
/// snapshots (`@snap`): a namespace is writable storage.
fn check_rbd(key: &str, image: &str, namespace: &Namespace, errors: &mut Errors) {
    let rkey = format!("{key}.rbd");
    let parts: Vec<&str> = image.split('/').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
        errors.push(
            &rkey,
            image,
            "must be \"pool/image\" or \"pool/namespace/image\"",
        );
    } else if image.contains('@') {
        errors.push(&rkey, image, "snapshots (@) cannot be exported");
    } else if image.contains('\0') || image.chars().any(char::is_whitespace) {
        errors.push(&rkey, image, "contains NUL or whitespace");
    }
    if let Some(conf) = &namespace.ceph_conf {
        let ckey = format!("{key}.ceph_conf");
        if !conf.is_absolute() {
            errors.push(&ckey, conf.display(), "must be an absolute path");
        } else if !conf.is_file() {
            errors.push(&ckey, conf.display(), "no such file");
        }
    }
    if let Some(id) = &namespace.ceph_client_id {
        let bare = id.strip_prefix("client.").unwrap_or(id);
        if bare.is_empty() || id.contains('\0') || id.chars().any(char::is_whitespace) {
            errors.push(
                format!("{key}.ceph_client_id"),
                id,
                "must be a client id such as \"admin\" or \"client.admin\"",
            );
        }
    }
}

fn check_backing_path(key: &str, path: &Path, namespace: &Namespace, errors: &mut Errors) {
    use std::os::unix::fs::FileTypeExt;
    let pkey = format!("{key}.path");
    if !path.is_absolute() {
        errors.push(&pkey, path.display(), "must be an absolute path");
        return;
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_block_device() => {
            if let Some(size) = namespace.size {
                errors.push(
                    format!("{key}.size"),
                    size,
                    "only applies to regular files, not block devices",
                );
            }
        }
        Ok(meta) if meta.is_file() => {
            if meta.len() == 0 && namespace.size.is_none() {
                errors.push(&pkey, path.display(), "empty file (set size to extend it)");
            }
        }
        Ok(_) => errors.push(&pkey, path.display(), "not a regular file or block device"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if namespace.size.is_none() {
                errors.push(&pkey, path.display(), "no such file");
            } else if let Some(parent) = path.parent().filter(|p| !p.is_dir()) {
                errors.push(
                    &pkey,
                    path.display(),
                    format!("cannot be created: no such directory {}", parent.display()),
                );
            }
        }
        Err(e) => errors.push(&pkey, path.display(), format!("cannot access: {e}")),
    }
}
