//! `nvmfd` (run): configuration → target → listeners → reactors, then signals, reload,
//! watchdog and shutdown on the main thread. One job a file: `start` (target, ports,
//! reactors), `run` (the main loop: signals, watchdog, shutdown), `reload` (a new
//! configuration applied live), `listeners` (binding, placing and moving the ports'
//! listeners), `control_calls` (control socket requests), `signals`, `error`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nvme::target::{PortConfig, Target};

use crate::logging::LogHandle;
use crate::notify::Notifier;
use crate::reactor::{Control, ReactorHandle};
use crate::topology::Sysfs;

mod control_calls;
mod error;
mod listeners;
mod reload;
mod run;
mod signals;
mod start;

pub use error::error_chain;
pub use signals::install_signals;

/// Everything the main thread keeps while serving.
pub struct Server {
    config_path: Option<PathBuf>,
    config: conf::Config,
    target: Arc<Target>,
    log: LogHandle,
    notifier: Notifier,
    control: Arc<Control>,
    handles: Vec<Arc<ReactorHandle>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// What the metrics read (when `[metrics]` counts), and the HTTP endpoint.
    metrics: Option<crate::metrics::Sources>,
    _metrics_endpoint: Option<crate::metrics::http::Endpoint>,
    /// Each RDMA port and the reactor it lives on (served or not: "no RDMA here" too).
    rdma_placement: Vec<(PortConfig, usize)>,
    /// Saves the SMART/Health counters in `[global] state_dir` (when set).
    health: Option<crate::health::Keeper>,
    /// The PSKs of the TLS ports' handshakes (`[[tls_keys]]`, replaced live).
    tls_keys: Arc<crate::tls::PskTable>,
    /// Where the NUMA nodes of new ports' NICs are read.
    sysfs: Sysfs,
    /// This gateway's part in a `[gateway_group]` (it decides the managed ANA groups' states).
    gateway: Option<crate::gateway::Host>,
    /// The gateway group's shared reservation state (kept across reloads).
    reservation_stores: Option<nvme::reservation::SharedStores>,
}

fn log_topology(target: &Target) {
    for nqn in target.subsystem_nqns() {
        let Some(subsystem) = target.subsystem(&nqn) else {
            continue;
        };
        let settings = subsystem.settings();
        let table = subsystem.namespaces();
        tracing::info!(
            nqn = %nqn,
            serial = %settings.serial,
            any_host = settings.allow_any_host,
            hosts = settings.allowed_hosts.len(),
            namespaces = table.len(),
            "subsystem"
        );
        for ns in table.iter() {
            tracing::info!(
                nqn = %nqn,
                nsid = ns.nsid,
                backend = ns.backend.kind(),
                size = ns.blocks << ns.lba_shift,
                block_size = ns.block_size,
                read_only = ns.read_only,
                "namespace"
            );
        }
    }
}

impl Server {
    fn status_line(&self) -> String {
        let ports: Vec<String> = self
            .target
            .ports()
            .iter()
            .map(|p| SocketAddr::new(p.address, p.service).to_string())
            .collect();
        format!(
            "serving {} subsystem(s) on {}; {} connection(s)",
            self.target.subsystem_nqns().len(),
            ports.join(", "),
            self.handles
                .iter()
                .map(|h| h.connections.load(Ordering::Relaxed))
                .sum::<usize>()
        )
    }
}
