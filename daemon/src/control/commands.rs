//! What the control socket's commands see and do, apart from applying: views of the live
//! target (subsystems, namespaces with counters, ports, controllers) and edits of the running
//! configuration. An edit yields a new `conf::Config`; the server applies it exactly like a
//! reloaded file (`Server::apply_config` → `Target::apply`), so hosts get the same AENs.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use conf::multipath::{AnaGroup, AnaState, PortAnaState};
use nvme::namespace::BackendConfig;
use nvme::subsystem::Subsystem;
use nvme::target::{Target, TransportKind};

use super::proto::{
    ClassView, ControllerView, NamespaceView, PortView, QueueReactor, Request, SubsystemDetail,
    SubsystemView, TopRow, TopView, WriteConfigView,
};

fn transport_name(t: TransportKind) -> &'static str {
    match t {
        TransportKind::Tcp => "tcp",
        TransportKind::Rdma => "rdma",
    }
}

fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn no_such_subsystem(nqn: &str) -> String {
    format!("no subsystem {nqn}")
}

fn live_subsystem(target: &Target, nqn: &str) -> Result<Arc<Subsystem>, String> {
    target.subsystem(nqn).ok_or_else(|| no_such_subsystem(nqn))
}

fn subsystem_view(subsystem: &Subsystem) -> SubsystemView {
    let settings = subsystem.settings();
    SubsystemView {
        nqn: subsystem.nqn.clone(),
        serial: settings.serial.clone(),
        model: settings.model.clone(),
        allow_any_host: settings.allow_any_host,
        allowed_hosts: settings.allowed_hosts.iter().cloned().collect(),
        ports: settings.ports.iter().copied().collect(),
        namespaces: subsystem.namespaces().len(),
        controllers: live_controllers(subsystem).len(),
    }
}

fn live_controllers(subsystem: &Subsystem) -> Vec<Arc<nvme::controller::Controller>> {
    subsystem
        .controllers()
        .into_iter()
        .filter(|c| c.terminated().is_none())
        .collect()
}

pub fn subsystems(target: &Target) -> Vec<SubsystemView> {
    target
        .subsystem_nqns()
        .iter()
        .filter_map(|nqn| target.subsystem(nqn))
        .map(|s| subsystem_view(&s))
        .collect()
}

pub fn subsystem_detail(target: &Target, nqn: &str) -> Result<SubsystemDetail, String> {
    let subsystem = live_subsystem(target, nqn)?;
    Ok(SubsystemDetail {
        subsystem: subsystem_view(&subsystem),
        namespace_list: namespace_views(&subsystem),
        controller_list: controller_views(&subsystem),
    })
}

fn namespace_views(subsystem: &Subsystem) -> Vec<NamespaceView> {
    subsystem
        .namespaces()
        .iter()
        .map(|ns| {
            let stats = ns.stats.snapshot();
            let path = match &ns.config.backend {
                BackendConfig::File { path, .. } | BackendConfig::Block { path } => {
                    Some(path.clone())
                }
                _ => None,
            };
            NamespaceView {
                nqn: subsystem.nqn.clone(),
                nsid: ns.nsid,
                backend: ns.backend.kind().to_owned(),
                path,
                size_bytes: ns.blocks << ns.lba_shift,
                block_size: ns.block_size,
                read_only: ns.read_only,
                uuid: uuid_text(&ns.uuid),
                read_commands: stats.read_commands,
                write_commands: stats.write_commands,
                bytes_read: stats.bytes_read,
                bytes_written: stats.bytes_written,
            }
        })
        .collect()
}

/// `nqn` None: every subsystem.
pub fn namespaces(target: &Target, nqn: Option<&str>) -> Result<Vec<NamespaceView>, String> {
    match nqn {
        Some(nqn) => Ok(namespace_views(&*live_subsystem(target, nqn)?)),
        None => Ok(target
            .subsystem_nqns()
            .iter()
            .filter_map(|nqn| target.subsystem(nqn))
            .flat_map(|s| namespace_views(&s))
            .collect()),
    }
}

fn controller_views(subsystem: &Subsystem) -> Vec<ControllerView> {
    live_controllers(subsystem)
        .iter()
        .map(|c| {
            // Taken before the view: `c.lock()` below holds the state lock to the end of it.
            let queue_reactors = c
                .queue_reactors()
                .into_iter()
                .map(|(qid, reactor)| QueueReactor { qid, reactor })
                .collect();
            ControllerView {
                nqn: subsystem.nqn.clone(),
                cntlid: c.cntlid,
                host_nqn: c.hostnqn.clone(),
                host_address: c.peer.remote.to_string(),
                transport: transport_name(c.peer.transport).to_owned(),
                port_id: c.peer.port_id,
                queues: 1 + c.io_queue_count(),
                kato_ms: c.lock().kato_ms,
                queue_reactors,
            }
        })
        .collect()
}

/// `nqn` None: every subsystem, the discovery subsystem included.
/// `top`: cumulative I/O counters per namespace and per controller, from the metrics
/// registry (the same sums the OpenMetrics endpoint shows).
pub fn top(registry: &nvme::metrics::Registry) -> TopView {
    use nvme::metrics::{Class, ClassCounters};
    let view = |c: &ClassCounters| ClassView {
        commands: c.commands,
        bytes: c.bytes,
        latency_count: c.latency.count,
        latency_sum_ns: c.latency.sum_ns,
        latency_buckets: c.latency.buckets.to_vec(),
    };
    let views = crate::metrics::Views::new(registry, None, true);
    let namespaces = views
        .namespaces
        .iter()
        .map(|((nqn, nsid), (classes, _))| TopRow {
            nqn: nqn.clone(),
            nsid: Some(*nsid),
            cntlid: None,
            host_nqn: None,
            read: view(&classes[Class::Read as usize]),
            write: view(&classes[Class::Write as usize]),
            flush: view(&classes[Class::Flush as usize]),
            other: view(&classes[Class::Other as usize]),
        })
        .collect();
    let controllers = views
        .controllers
        .iter()
        .map(|((nqn, cntlid, host), q)| TopRow {
            nqn: nqn.clone(),
            nsid: None,
            cntlid: Some(*cntlid),
            host_nqn: Some(host.clone()),
            read: view(&q.class_total(Class::Read)),
            write: view(&q.class_total(Class::Write)),
            flush: view(&q.class_total(Class::Flush)),
            other: view(&q.class_total(Class::Other)),
        })
        .collect();
    TopView {
        namespaces,
        controllers,
    }
}

pub fn controllers(target: &Target, nqn: Option<&str>) -> Result<Vec<ControllerView>, String> {
    let discovery = target.discovery_subsystem();
    match nqn {
        Some(nqn) if nqn == discovery.nqn => Ok(controller_views(discovery)),
        Some(nqn) => Ok(controller_views(&*live_subsystem(target, nqn)?)),
        None => {
            let mut all = controller_views(discovery);
            for nqn in target.subsystem_nqns() {
                if let Some(s) = target.subsystem(&nqn) {
                    all.extend(controller_views(&s));
                }
            }
            Ok(all)
        }
    }
}

pub fn ports(target: &Target) -> Vec<PortView> {
    let subsystems: Vec<Arc<Subsystem>> = target
        .subsystem_nqns()
        .iter()
        .filter_map(|nqn| target.subsystem(nqn))
        .collect();
    let all_controllers: Vec<_> = std::iter::once(Arc::clone(target.discovery_subsystem()))
        .chain(subsystems.iter().cloned())
        .flat_map(|s| live_controllers(&s))
        .collect();
    target
        .ports()
        .into_iter()
        .map(|p| PortView {
            id: p.id,
            transport: transport_name(p.transport).to_owned(),
            address: p.address.to_string(),
            service: p.service,
            subsystems: subsystems
                .iter()
                .filter(|s| s.exported_on(p.id))
                .map(|s| s.nqn.clone())
                .collect(),
            controllers: all_controllers
                .iter()
                .filter(|c| c.peer.port_id == p.id)
                .count(),
        })
        .collect()
}

fn subsystem_mut<'a>(
    config: &'a mut conf::Config,
    nqn: &str,
) -> Result<&'a mut conf::Subsystem, String> {
    config
        .subsystems
        .iter_mut()
        .find(|s| s.nqn == nqn)
        .ok_or_else(|| no_such_subsystem(nqn))
}

/// RDMA listeners live on their reactors from start-up on (verbs objects are not `Send`); a
/// reload keeps them as they are, so an edit that would change them is refused up front
/// rather than reported as applied.
const RDMA_FIXED: &str =
    "RDMA ports are fixed while nvmfd runs: change them in the file and restart";

/// The running configuration with one `add-*` / `remove-*` request applied; the caller
/// validates and applies the result as a whole. Other requests are not edits.
pub fn edit(config: &conf::Config, request: &Request) -> Result<conf::Config, String> {
    let mut new = config.clone();
    match request {
        Request::AddNamespace { nqn, namespace } => {
            let subsystem = subsystem_mut(&mut new, nqn)?;
            if subsystem
                .namespaces
                .iter()
                .any(|n| n.nsid == namespace.nsid)
            {
                return Err(format!("{nqn} already has namespace {}", namespace.nsid));
            }
            subsystem.namespaces.push((**namespace).clone());
            subsystem.namespaces.sort_by_key(|n| n.nsid);
        }
        Request::RemoveNamespace { nqn, nsid } => {
            let subsystem = subsystem_mut(&mut new, nqn)?;
            let before = subsystem.namespaces.len();
            subsystem.namespaces.retain(|n| n.nsid != *nsid);
            if subsystem.namespaces.len() == before {
                return Err(format!("{nqn} has no namespace {nsid}"));
            }
        }
        Request::SetNamespaceHosts { nqn, nsid, hosts } => {
            let subsystem = subsystem_mut(&mut new, nqn)?;
            let namespace = subsystem
                .namespaces
                .iter_mut()
                .find(|n| n.nsid == *nsid)
                .ok_or_else(|| format!("{nqn} has no namespace {nsid}"))?;
            namespace.hosts = hosts.clone();
        }
        Request::AddHost { nqn, host } => {
            let subsystem = subsystem_mut(&mut new, nqn)?;
            if subsystem.host_nqns().any(|h| h == host) {
                return Err(format!("{host} is already allowed on {nqn}"));
            }
            subsystem.allowed_hosts.push(host.clone());
        }
        Request::RemoveHost { nqn, host } => {
            let subsystem = subsystem_mut(&mut new, nqn)?;
            let before = subsystem.allowed_hosts.len() + subsystem.hosts.len();
            subsystem.allowed_hosts.retain(|h| h != host);
            subsystem.hosts.retain(|h| h.nqn != *host);
            if subsystem.allowed_hosts.len() + subsystem.hosts.len() == before {
                return Err(format!("{host} is not in the allowed hosts of {nqn}"));
            }
            // A subsystem without hosts must say allow_any_host: removing the last host keeps
            // it closed, never opens it to everyone. (Applying the edit disconnects the
            // host's live controllers.)
            if subsystem.host_nqns().next().is_none() && subsystem.allow_any_host.is_none() {
                subsystem.allow_any_host = Some(false);
            }
        }
        Request::SetHostKey { nqn, host } => {
            let subsystem = subsystem_mut(&mut new, nqn)?;
            if subsystem.allows_any_host() {
                return Err(format!(
                    "{nqn} allows any host: keys need a host list (set allow_any_host = false)"
                ));
            }
            subsystem.allowed_hosts.retain(|h| *h != host.nqn);
            match subsystem.hosts.iter_mut().find(|h| h.nqn == host.nqn) {
                Some(entry) => *entry = host.clone(),
                None => subsystem.hosts.push(host.clone()),
            }
        }
        Request::SetTlsKey { key } => {
            match new
                .tls_keys
                .iter_mut()
                .find(|k| k.host == key.host && k.subsystem == key.subsystem)
            {
                Some(entry) => *entry = key.clone(),
                None => new.tls_keys.push(key.clone()),
            }
        }
        Request::RemoveTlsKey { host, subsystem } => {
            let before = new.tls_keys.len();
            new.tls_keys
                .retain(|k| !(k.host == *host && k.subsystem == *subsystem));
            if new.tls_keys.len() == before {
                return Err(match subsystem {
                    Some(s) => format!("no TLS key for {host} on {s}"),
                    None => format!("no TLS key for {host} (for every subsystem)"),
                });
            }
        }
        Request::AddPort { port } if port.transport == conf::Transport::Rdma => {
            return Err(RDMA_FIXED.to_owned());
        }
        Request::AddPort { port } => {
            if new.ports.iter().any(|p| p.id == port.id) {
                return Err(format!("port {} exists already", port.id));
            }
            new.ports.push(port.clone());
            new.ports.sort_by_key(|p| p.id);
        }
        Request::RemovePort { id } => {
            if new
                .ports
                .iter()
                .any(|p| p.id == *id && p.transport == conf::Transport::Rdma)
            {
                return Err(RDMA_FIXED.to_owned());
            }
            let before = new.ports.len();
            new.ports.retain(|p| p.id != *id);
            if new.ports.len() == before {
                return Err(format!("no port {id}"));
            }
            // Subsystems that named it: drop the reference (validation refuses unknown port
            // ids). One left with no ports at all would be exported on every port: refuse.
            for subsystem in &mut new.subsystems {
                if subsystem.ports.contains(id) {
                    subsystem.ports.retain(|p| p != id);
                    if subsystem.ports.is_empty() {
                        return Err(format!(
                            "port {id} is the only port of {}; remove the subsystem's port \
                             list first or add another port to it",
                            subsystem.nqn
                        ));
                    }
                }
            }
        }
        Request::SetAnaState { group, state, port } => {
            set_ana_state(&mut new, *group, *state, *port)?
        }
        Request::SetQos {
            nqn,
            nsid,
            host,
            qos,
        } => set_qos(subsystem_mut(&mut new, nqn)?, *nsid, host.as_deref(), qos)?,
        other => return Err(format!("{other:?} is not a configuration edit")),
    }
    Ok(new)
}

/// `set-qos`: a namespace's `qos` key or a `host_qos` entry; limits that are all 0 remove it.
fn set_qos(
    subsystem: &mut conf::Subsystem,
    nsid: Option<u32>,
    host: Option<&str>,
    qos: &conf::Qos,
) -> Result<(), String> {
    let limit = (!qos.is_unlimited()).then_some(*qos);
    match (nsid, host) {
        (Some(nsid), None) => {
            let nqn = &subsystem.nqn;
            let namespace = subsystem
                .namespaces
                .iter_mut()
                .find(|n| n.nsid == nsid)
                .ok_or_else(|| format!("{nqn} has no namespace {nsid}"))?;
            namespace.qos = limit;
        }
        (None, Some(host)) => {
            subsystem.host_qos.retain(|h| h.host != host);
            if let Some(qos) = limit {
                subsystem.host_qos.push(conf::HostQos {
                    host: host.to_owned(),
                    qos,
                });
            }
        }
        _ => return Err("set-qos needs a namespace (nsid) or a host, not both".to_owned()),
    }
    Ok(())
}

/// The QoS limiters of one subsystem (or all), with their counters.
pub fn qos(target: &Target, nqn: Option<&str>) -> Result<Vec<super::proto::QosView>, String> {
    let subsystems = match nqn {
        Some(nqn) => vec![live_subsystem(target, nqn)?],
        None => target
            .subsystem_nqns()
            .iter()
            .filter_map(|nqn| target.subsystem(nqn))
            .collect(),
    };
    let view = |nqn: &str, nsid, host, l: &nvme::qos::Limiter| {
        let limits = l.limits();
        let c = l.counters();
        super::proto::QosView {
            nqn: nqn.to_owned(),
            nsid,
            host,
            limits: conf::Qos {
                iops: limits.iops,
                read_mbps: limits.read_bytes_per_sec / nvme::qos::MB,
                write_mbps: limits.write_bytes_per_sec / nvme::qos::MB,
                total_mbps: limits.total_bytes_per_sec / nvme::qos::MB,
                burst_ms: limits.burst.as_millis() as u32,
            },
            commands: c.commands,
            read_bytes: c.read_bytes,
            write_bytes: c.write_bytes,
            held_commands: c.held_commands,
            held_ns: c.held_ns,
        }
    };
    let mut out = Vec::new();
    for s in subsystems {
        let table = s.qos();
        for (nsid, l) in &table.namespaces {
            out.push(view(&s.nqn, Some(*nsid), None, l));
        }
        for (host, l) in &table.hosts {
            out.push(view(&s.nqn, None, Some(host.clone()), l));
        }
    }
    Ok(out)
}

/// `set-ana-state`: the group's state on one port (a `port_states` entry), or on every port
/// (its `state`, and per-port states dropped). Group 1 exists without an `[[ana_groups]]`
/// entry, so one is added for it when needed; other groups must be declared.
fn set_ana_state(
    config: &mut conf::Config,
    group: u32,
    state: AnaState,
    port: Option<u16>,
) -> Result<(), String> {
    if let Some(id) = port {
        if !config.ports.iter().any(|p| p.id == id) {
            return Err(format!("no port {id}"));
        }
    }
    let index = match config.ana_groups.iter().position(|g| g.id == group) {
        Some(i) => i,
        None if group == conf::multipath::DEFAULT_ANA_GROUP => {
            config.ana_groups.push(AnaGroup {
                id: group,
                state: AnaState::default(),
                port_states: Vec::new(),
            });
            config.ana_groups.len() - 1
        }
        None => {
            return Err(format!(
                "no ANA group {group} (declare it in [[ana_groups]])"
            ))
        }
    };
    let entry = &mut config.ana_groups[index];
    match port {
        None => {
            entry.state = state;
            entry.port_states.clear();
        }
        Some(id) => {
            entry.port_states.retain(|p| p.port != id);
            entry.port_states.push(PortAnaState { port: id, state });
            entry.port_states.sort_by_key(|p| p.port);
        }
    }
    Ok(())
}

/// First line of a file written by `write-config`.
pub const RUNNING_HEADER: &str = "# Written by nvmfd write-config (the running configuration).";
/// First line of a configuration file an applied `nvmfd ctl` edit was written through to.
pub const EDITED_HEADER: &str =
    "# Rewritten by nvmfd after an `nvmfd ctl` change (comments are not kept).";

/// Writes `config` as TOML to `path` after a `header` comment, atomically: a temporary file
/// in the same directory, fsync, rename over `path`, fsync of the directory (so that after a
/// crash the file is either the old or the new one, never a mix or empty). An existing file
/// keeps its permissions; a new one is 0600.
pub fn write_config(
    config: &conf::Config,
    path: &Path,
    header: &str,
) -> Result<WriteConfigView, String> {
    let text = config.to_toml().map_err(|e| e.to_string())?;
    let text = format!("{header}\n{text}");
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o600);
    let inline_keys = config
        .subsystems
        .iter()
        .flat_map(|s| &s.hosts)
        .any(|h| h.dhchap_key.is_some() || h.dhchap_ctrl_key.is_some());
    if inline_keys && mode & 0o077 != 0 {
        return Err(format!(
            "{}: the configuration holds inline DH-HMAC-CHAP keys and the file is readable by \
             group or others (mode {:o}): chmod 600 it, or use key files",
            path.display(),
            mode & 0o777
        ));
    }
    let file_name = path
        .file_name()
        .ok_or_else(|| format!("{}: not a file path", path.display()))?;
    let mut temp_name = file_name.to_owned();
    temp_name.push(format!(".tmp-{}", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(format!("{}: {e}", path.display()));
    }
    // The rename is durable once the directory entry is.
    let directory = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(directory)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| format!("{}: fsync: {e}", directory.display()))?;
    Ok(WriteConfigView {
        path: path.to_owned(),
        bytes: text.len(),
    })
}

/// Where `write-config` goes without a PATH.
pub fn default_write_path(config_path: Option<&Path>) -> Result<PathBuf, String> {
    config_path
        .map(Path::to_owned)
        .ok_or_else(|| "running on the built-in configuration: give a PATH".to_owned())
}

#[cfg(test)]
mod tests;
