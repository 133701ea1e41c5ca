//! Start-up: configuration → target → ports bound → reactors running, each on its thread.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nvme::target::{PortConfig, Target};
use storage::uring::{RingOptions, UringEngine};

use super::error::{error_chain, ServeError};
use super::listeners::{bind, log_placement, open_rdma_ports, PortNode};
use super::{log_topology, Server};
use crate::logging::LogHandle;
use crate::mapping::target_config;
use crate::notify::Notifier;
use crate::reactor::{self, Control, Reactor};
use crate::topology::{self, Sysfs};

/// Submission entries per reactor ring (the kernel rounds up; overflow is queued in the
/// engine, never refused).
const RING_ENTRIES: u32 = 1024;

fn reactor_count(global: &conf::Global) -> usize {
    match (global.reactors, global.cpus.len()) {
        (0, 0) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        (0, pinned) => pinned,
        (n, _) => n as usize,
    }
}

/// Pins the calling reactor thread to its CPU of `cpus`; whether it is pinned.
fn pin(reactor: usize, cpus: &[u32]) -> bool {
    if cpus.is_empty() {
        return false;
    }
    let cpu = cpus[reactor % cpus.len()] as usize;
    let mut set = nix::sched::CpuSet::new();
    let pinned = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    match pinned {
        Ok(()) => {
            tracing::debug!(reactor, cpu, "reactor pinned");
            true
        }
        Err(e) => {
            tracing::warn!(reactor, cpu, error = %e, "cannot pin reactor; running unpinned");
            false
        }
    }
}

/// The gateway group's shared reservation objects (`[gateway_group]`), on the gateway's RADOS
/// client (`gateway::Host::connect` registered it): one client instance, so that the fence
/// that stops this gateway's image writes stops its reservation writes too.
#[cfg(feature = "rbd")]
fn group_reservations(
    config: &conf::Config,
) -> Result<Option<Arc<crate::group_reservations::GroupStores>>, ServeError> {
    let Some(g) = &config.gateway_group else {
        return Ok(None);
    };
    let cluster = storage::rbd::shared_cluster().ok_or_else(|| {
        ServeError::Gateway("gateway_group: the gateway's RADOS client is not connected".into())
    })?;
    crate::group_reservations::GroupStores::new(
        &cluster,
        &g.pool,
        g.namespace.as_deref(),
        &g.name,
        Duration::from_millis(g.lease_ms),
    )
    .map(Some)
    .map_err(|e| ServeError::Gateway(format!("gateway_group: {e}")))
}

/// Without librados there is no gateway group (`gateway::Host::connect` refused one).
#[cfg(not(feature = "rbd"))]
fn group_reservations(
    _config: &conf::Config,
) -> Result<Option<std::convert::Infallible>, ServeError> {
    Ok(None)
}

impl Server {
    /// Builds the target, binds every port and starts the reactors. Returns once everything
    /// listens (systemd READY=1 is sent by the caller right after).
    pub fn start(
        config_path: Option<PathBuf>,
        config: conf::Config,
        log: LogHandle,
        notifier: Notifier,
    ) -> Result<Server, ServeError> {
        // Before any namespace opens: RBD images open on the gateway's RADOS client.
        let gateway = crate::gateway::Host::connect(&config).map_err(ServeError::Gateway)?;
        // The group's reservation objects, on that same client (fencing it fences them).
        let group_stores = group_reservations(&config)?;
        #[cfg(feature = "rbd")]
        let reservation_stores = group_stores.as_ref().map(|g| g.shared());
        #[cfg(not(feature = "rbd"))]
        let reservation_stores = group_stores.map(|never| match never {});
        let mut mapped = nvme::target::TargetConfig {
            reservation_stores: reservation_stores.clone(),
            ..target_config(&config)?
        };
        if let Some(g) = &gateway {
            g.overlay(&mut mapped);
        }
        let target = Target::with_opener(mapped, &storage::open).map_err(ServeError::Target)?;
        // Before any queue exists: authentication work goes to the pool from the first one.
        let auth_pool = crate::auth_pool::start(&config.global).map_err(ServeError::AuthPool)?;
        target.set_auth_offload(auth_pool);
        #[cfg(feature = "rbd")]
        if let Some(g) = &group_stores {
            g.set_target(&target);
        }
        // Before any queue exists: queues decide at creation whether they count.
        let registry = config.metrics.counting().then(|| target.enable_metrics());
        log_topology(&target);
        let tls = crate::tls::gates(&config).map_err(ServeError::Tls)?;
        let sysfs = Sysfs::system();
        let (listeners, rdma_ports) = bind(&target, &tls.gates, &sysfs)?;
        let mut port_nodes: Vec<PortNode> = target
            .ports()
            .into_iter()
            .filter_map(|p| {
                let listener = listeners.iter().find(|l| l.port_id == p.id)?;
                Some(PortNode {
                    port_id: p.id,
                    transport: "tcp",
                    address: SocketAddr::new(p.address, p.service),
                    node: listener.node,
                })
            })
            .collect();
        // Restored before the reactors start (no queue counts yet), after the ports bound (a
        // start that fails on a busy port is not counted as a run that crashed).
        let health = match &config.global.state_dir {
            Some(dir) => Some(
                crate::health::Keeper::start(&target, dir.clone()).map_err(ServeError::Health)?,
            ),
            None => None,
        };

        let count = reactor_count(&config.global);
        // What each reactor's CPU says; a reactor takes it only once actually pinned there.
        let reactor_nodes = topology::reactor_nodes(&sysfs, &config.global.cpus, count);
        tracing::info!(
            nodes = sysfs.node_count(),
            reactor_nodes = ?reactor_nodes,
            "NUMA topology (sysfs)"
        );
        let rdma_placement: Vec<(PortConfig, usize)> = rdma_ports
            .into_iter()
            .enumerate()
            .map(|(i, p)| (p, i % count))
            .collect();
        let control = Arc::new(Control::default());
        let mut handles = Vec::with_capacity(count);
        let mut inboxes = Vec::with_capacity(count);
        for _ in 0..count {
            let (handle, inbox) = reactor::handle().map_err(|e| ServeError::Reactor {
                id: 0,
                reason: e.to_string(),
            })?;
            handles.push(handle);
            inboxes.push(inbox);
        }
        // Each reactor answers with its RDMA ports and their nodes, or why it failed.
        let (ready_tx, ready_rx) =
            std::sync::mpsc::channel::<(usize, Result<Vec<PortNode>, String>)>();
        let mut listeners = Some(listeners);
        let mut threads = Vec::with_capacity(count);
        for (id, inbox) in inboxes.into_iter().enumerate() {
            let handle = Arc::clone(&handles[id]);
            let peers = handles.clone();
            let control = Arc::clone(&control);
            let owned_listeners = if id == 0 {
                listeners.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            let factory = crate::conn::tcp_factory(
                Arc::clone(&target),
                Duration::from_millis(config.global.connect_timeout_ms.into()),
                id,
                config.global.uring_fixed_buffers.0 > 0,
                config.global.zerocopy_send_threshold.0 as usize,
            );
            // RDMA ports are spread over the reactors; each lives on one.
            let my_rdma_ports: Vec<PortConfig> = rdma_placement
                .iter()
                .filter(|(_, reactor)| *reactor == id)
                .map(|(p, _)| p.clone())
                .collect();
            let rdma_target = Arc::clone(&target);
            let rdma_config = config.rdma.clone();
            // One polling mechanism: `[rdma] busy_poll_us` is the older name of the window.
            let poll_window_us = config.global.poll_window_us.max(config.rdma.busy_poll_us);
            let ring_options = RingOptions {
                sqpoll_idle_ms: config
                    .global
                    .uring_sqpoll
                    .then_some(config.global.uring_sqpoll_idle_ms),
                registered_files: config.global.uring_registered_files,
                fixed_buffer_bytes: config.global.uring_fixed_buffers.0,
            };
            let cpus = config.global.cpus.clone();
            let node = reactor_nodes[id];
            let rdma_sysfs = sysfs.clone();
            let count_busy = registry.is_some();
            let ready = ready_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("reactor-{id}"))
                .spawn(move || {
                    // Authentication exponentiations belong to the pool (`auth_pool`): one
                    // asked for here fails instead of stalling every queue of the reactor.
                    nvmfd_auth::dh::forbid_exponentiation_on_this_thread();
                    // Pinned before anything of the reactor is allocated: its ring, epoll
                    // array and slab here, its connections' buffers and RDMA pools later on
                    // this thread, are first touched on its node.
                    if pin(id, &cpus) {
                        if let Some(node) = node {
                            handle.set_node(node);
                        }
                    }
                    // The ring is created on its own thread: io-wq workers are charged to the
                    // submitting task.
                    let built = UringEngine::with_options(RING_ENTRIES, ring_options)
                        .map_err(|e| error_chain(&e))
                        .and_then(|engine| {
                            let rdma = open_rdma_ports(
                                &my_rdma_ports,
                                &rdma_target,
                                &rdma_config,
                                &rdma_sysfs,
                            )?;
                            let nodes: Vec<PortNode> = rdma
                                .iter()
                                .map(|l| PortNode {
                                    port_id: l.port_id(),
                                    transport: "rdma",
                                    address: l.address(),
                                    node: l.node(),
                                })
                                .collect();
                            Reactor::new(
                                id,
                                handle,
                                inbox,
                                peers,
                                control,
                                owned_listeners,
                                rdma,
                                engine,
                                factory,
                            )
                            .map(|r| {
                                let r = r.with_busy_poll(poll_window_us).with_busy_time(count_busy);
                                (r, nodes)
                            })
                            .map_err(|e| e.to_string())
                        });
                    match built {
                        Ok((reactor, nodes)) => {
                            let _ = ready.send((id, Ok(nodes)));
                            reactor.run();
                        }
                        Err(reason) => {
                            let _ = ready.send((id, Err(reason)));
                        }
                    }
                })
                .map_err(ServeError::Spawn)?;
            threads.push(thread);
        }
        drop(ready_tx);
        let metrics = registry.map(|registry| crate::metrics::Sources {
            registry,
            reactors: handles.clone(),
            gateway: gateway.as_ref().map(|g| g.stats()),
            target: Arc::clone(&target),
        });
        let mut server = Server {
            config_path,
            config,
            target,
            log,
            notifier,
            control,
            handles,
            threads,
            metrics,
            _metrics_endpoint: None,
            rdma_placement,
            health,
            tls_keys: tls.keys,
            sysfs,
            gateway,
            reservation_stores,
        };
        for _ in 0..count {
            match ready_rx.recv() {
                Ok((_, Ok(rdma_nodes))) => port_nodes.extend(rdma_nodes),
                Ok((id, Err(reason))) => {
                    server.stop_reactors();
                    return Err(ServeError::Reactor { id, reason });
                }
                Err(_) => {
                    server.stop_reactors();
                    return Err(ServeError::Reactor {
                        id: 0,
                        reason: "reactor thread exited during start-up".to_owned(),
                    });
                }
            }
        }
        tracing::info!(reactors = count, "reactors running");
        // Every reactor has recorded its node by now (before answering).
        port_nodes.sort_by_key(|p| p.port_id);
        for port in &port_nodes {
            log_placement(port, &server.handles);
        }
        if let (Some(addr), Some(sources)) = (server.config.metrics.listen_addr(), &server.metrics)
        {
            match crate::metrics::http::Endpoint::start(addr, sources.clone()) {
                Ok(endpoint) => server._metrics_endpoint = Some(endpoint),
                Err(e) => {
                    server.stop_reactors();
                    return Err(ServeError::Metrics { addr, source: e });
                }
            }
        }
        Ok(server)
    }
}
