//! `nvmfd` (run): configuration → target → listeners → reactors, then signals, reload,
//! watchdog and shutdown on the main thread.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nvme::backend::uring::{RingOptions, UringEngine};
use nvme::target::{PortConfig, Target, TransportKind};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::control::proto::{ApplyView, Request, Response, Saved, StatusView};
use crate::control::{ControlCall, ControlSocket};
use crate::logging::LogHandle;
use crate::mapping::target_config;
use crate::notify::Notifier;
use crate::reactor::{
    self, Control, EventListener, EventListenerBuilder, EventListenerChange, Listener,
    ListenerUpdate, Reactor, ReactorHandle,
};
use crate::topology::{self, Sysfs};

/// How long a reload waits for a reactor to open or close an RDMA listener (rdma_cm bind and
/// listen; the buffer pools are registered only with the first connection).
const RDMA_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Submission entries per reactor ring (the kernel rounds up; overflow is queued in the
/// engine, never refused).
const RING_ENTRIES: u32 = 1024;
/// A reactor that has not ticked (every 100 ms) for this long is considered wedged.
const STALL_AFTER: Duration = Duration::from_secs(2);
/// Extra time, beyond the reactors' own drain bound, before the main thread gives up on them.
const JOIN_GRACE: Duration = Duration::from_secs(1);
/// Main-thread poll period when no watchdog is configured.
const IDLE_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
    #[error("cannot build the target: {0}")]
    Target(#[source] nvme::target::TargetError),
    #[error("port {port_id} ({address}): {transport} listeners are not served by this build")]
    UnsupportedTransport {
        port_id: u16,
        address: SocketAddr,
        transport: &'static str,
    },
    #[error(
        "port {port_id}: cannot listen on {address}: {source}{}",
        in_use_hint(source, address)
    )]
    Bind {
        port_id: u16,
        address: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("signal handling: {0}")]
    Signals(#[source] io::Error),
    #[error("reactor {id}: {reason}")]
    Reactor { id: usize, reason: String },
    #[error("reactor {id} ended unexpectedly (see the panic above); its connections are gone")]
    ReactorDied { id: usize },
    #[error("cannot start the authentication workers: {0}")]
    AuthPool(std::io::Error),
    #[error("cannot start reactor thread: {0}")]
    Spawn(#[source] io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot start the SMART/Health saver thread: {0}")]
    Health(#[source] io::Error),
    #[error("{0}")]
    Gateway(String),
    #[error("fenced: this gateway's RADOS client was blocklisted by another gateway of its group; restart to rejoin")]
    Fenced,
    #[error("metrics.listen {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Signals, as seen by the main loop: flags set by the handlers plus a self-pipe to wake
/// `poll`. A second SIGTERM/SIGINT while stopping exits at once (handled in the handler by
/// `register_conditional_shutdown`, so it works even if the main thread is stuck).
struct Signals {
    terminate: Arc<AtomicBool>,
    hangup: Arc<AtomicBool>,
    wake: UnixStream,
    /// The write end of the self-pipe, for the control socket to wake `wait`.
    waker: UnixStream,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        let terminate = Arc::new(AtomicBool::new(false));
        let hangup = Arc::new(AtomicBool::new(false));
        let (wake, writer) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        for signal in [SIGTERM, SIGINT] {
            // Order matters: the conditional exit checks the flag before this signal sets it.
            signal_hook::flag::register_conditional_shutdown(signal, 1, Arc::clone(&terminate))?;
            signal_hook::flag::register(signal, Arc::clone(&terminate))?;
        }
        signal_hook::flag::register(SIGHUP, Arc::clone(&hangup))?;
        for signal in [SIGTERM, SIGINT, SIGHUP] {
            signal_hook::low_level::pipe::register(signal, writer.try_clone()?)?;
        }
        Ok(Signals {
            terminate,
            hangup,
            wake,
            waker: writer,
        })
    }

    /// A function that wakes `wait` (a full pipe already means "awake": errors are moot).
    fn waker(&self) -> io::Result<crate::control::Waker> {
        let writer = self.waker.try_clone()?;
        Ok(Box::new(move || {
            let _ = std::io::Write::write(&mut &writer, &[1]);
        }))
    }

    /// Sleeps until a signal or `timeout`.
    fn wait(&self, timeout: Duration) {
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.wake.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(millis));
        let mut sink = [0u8; 64];
        while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
    }
}

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

/// The control socket while serving: its accept thread and the queue of calls to answer.
struct ControlEndpoint {
    _socket: ControlSocket,
    calls: std::sync::mpsc::Receiver<ControlCall>,
}

/// The keys of `new` that differ from `old` and cannot change while running (marked
/// restart-only in the schema, `conf::schema::KEYS`): the `[rdma]` pool sizes are those of the
/// listeners running (RDMA ports themselves open and close live); reactors, CPUs and the limits
/// are baked into every queue; the log format into the installed logger; a TLS port's policy
/// and server are set up at start (its keys, `[[tls_keys]]`, change live); the state directory
/// is read at start.
fn restart_only_changes(old: &conf::Config, new: &conf::Config) -> Vec<&'static str> {
    conf::schema::restart_only_changes(old, new)
}

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

/// A port and the NUMA node of its NIC, for the placement log line.
#[derive(Debug, Clone)]
struct PortNode {
    port_id: u16,
    transport: &'static str,
    address: SocketAddr,
    node: Option<u32>,
}

/// One line per port: its node and the reactors that take its connections
/// (`topology::serving`, the rule the reactors place by).
fn log_placement(port: &PortNode, handles: &[Arc<ReactorHandle>]) {
    let reactors = reactor::serving_reactors(handles, port.node);
    let (port_id, transport, address) = (port.port_id, port.transport, port.address);
    match port.node {
        Some(node) if handles.iter().any(|h| h.node() == Some(node)) => tracing::info!(
            port_id,
            transport,
            %address,
            node,
            ?reactors,
            "port on NUMA node {node}: connections go to the reactors of that node"
        ),
        Some(node) => tracing::info!(
            port_id,
            transport,
            %address,
            node,
            ?reactors,
            "port on NUMA node {node}, which has no reactor: connections go to every reactor"
        ),
        None => tracing::info!(
            port_id,
            transport,
            %address,
            ?reactors,
            "port: no NUMA node known; connections go to every reactor"
        ),
    }
}

/// Binds every TCP port now (so that errors stop start-up before READY=1) and returns the
/// RDMA ports, which are opened on their reactor thread (verbs objects are not `Send`).
fn bind(
    target: &Target,
    tls: &HashMap<u16, Arc<crate::tls::TlsGate>>,
    sysfs: &Sysfs,
) -> Result<(Vec<Listener>, Vec<PortConfig>), ServeError> {
    let mut listeners = Vec::new();
    let mut rdma_ports = Vec::new();
    for port in target.ports() {
        let address = SocketAddr::new(port.address, port.service);
        if port.transport == TransportKind::Rdma {
            if cfg!(feature = "rdma") {
                rdma_ports.push(port);
                continue;
            }
            return Err(ServeError::UnsupportedTransport {
                port_id: port.id,
                address,
                transport: "rdma",
            });
        }
        let bind_err = |source| ServeError::Bind {
            port_id: port.id,
            address,
            source,
        };
        let socket = TcpListener::bind(address).map_err(bind_err)?;
        socket.set_nonblocking(true).map_err(bind_err)?;
        tracing::info!(
            port_id = port.id,
            transport = "tcp",
            address = %socket.local_addr().unwrap_or(address),
            "listening"
        );
        listeners.push(Listener {
            socket,
            port_id: port.id,
            tls: tls.get(&port.id).cloned(),
            node: sysfs.address_node(port.address),
        });
    }
    Ok((listeners, rdma_ports))
}

/// Opens the RDMA ports assigned to one reactor. "No RDMA here" (no device, no kernel
/// support) is one log line and the port stays dark, as the RDMA contract asks; any other failure
/// stops start-up.
#[cfg(feature = "rdma")]
fn open_rdma_ports(
    ports: &[PortConfig],
    target: &Arc<Target>,
    rdma: &conf::Rdma,
    sysfs: &Sysfs,
) -> Result<Vec<Box<dyn EventListener>>, String> {
    use transport::rdma::RdmaError;
    let mut listeners: Vec<Box<dyn EventListener>> = Vec::new();
    for port in ports {
        let listener = crate::conn::RdmaPort::new(
            port.address,
            port.service,
            port.id,
            Arc::clone(target),
            rdma,
            sysfs,
        );
        match listener {
            Ok(listener) => listeners.push(Box::new(listener)),
            Err(e @ (RdmaError::NotSupported(_) | RdmaError::NoDevice)) => tracing::warn!(
                port_id = port.id,
                address = %SocketAddr::new(port.address, port.service),
                "NVMe/RDMA port not served: {}",
                error_chain(&e)
            ),
            Err(e) => return Err(format!("port {}: {}", port.id, error_chain(&e))),
        }
    }
    Ok(listeners)
}

#[cfg(not(feature = "rdma"))]
fn open_rdma_ports(
    _ports: &[PortConfig],
    _target: &Arc<Target>,
    _rdma: &conf::Rdma,
    _sysfs: &Sysfs,
) -> Result<Vec<Box<dyn EventListener>>, String> {
    Ok(Vec::new())
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
    let cluster = nvme::backend::rbd::shared_cluster().ok_or_else(|| {
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
        let target = Target::new(mapped).map_err(ServeError::Target)?;
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

    /// Serves until SIGTERM/SIGINT; returns after a graceful stop.
    pub fn serve(mut self, signals_installed: SignalsGuard) -> Result<(), ServeError> {
        let signals = signals_installed.0;
        let control = self.open_control(&signals);
        if let Some(gateway) = &mut self.gateway {
            let wake = signals.waker().map_err(ServeError::Signals)?;
            if let Err(e) = gateway.start(wake) {
                drop(control);
                self.stop_reactors();
                return Err(ServeError::Gateway(e));
            }
        }
        self.notifier.ready(&self.status_line());
        tracing::info!("ready");
        let watchdog = self.notifier.watchdog_interval();
        let period = watchdog.unwrap_or(IDLE_POLL).min(IDLE_POLL);
        let mut last_beats: Vec<u64> = self.heartbeats();
        let mut advanced_at: Vec<Instant> = vec![Instant::now(); last_beats.len()];
        let mut last_ping = Instant::now();
        let mut last_status = Instant::now();
        loop {
            signals.wait(period);
            if signals.terminate.load(Ordering::Acquire) {
                break;
            }
            // A reactor only returns when told to stop: one that has ended on its own
            // (a panic) took its connections with it and serves nothing more. Exit with
            // a failure instead of running half-dead, so the service manager restarts us.
            if let Some(id) = self.threads.iter().position(|t| t.is_finished()) {
                tracing::error!(reactor = id, "reactor thread ended unexpectedly; stopping");
                self.notifier.stopping();
                drop(control);
                self.stop_reactors();
                return Err(ServeError::ReactorDied { id });
            }
            if signals.hangup.swap(false, Ordering::AcqRel) {
                let _ = self.reload();
            }
            if let Some(control) = &control {
                for call in crate::control::pending(&control.calls) {
                    let response = self.control_call(call.request, call.transient);
                    let _ = call.reply.send(response);
                }
            }
            if self.gateway_poll() {
                self.notifier.stopping();
                drop(control);
                self.stop_reactors();
                return Err(ServeError::Fenced);
            }
            // Storage resized underneath (RBD): republish and notify hosts (AEN).
            for (nqn, nsid) in self.target.refresh_capacities() {
                tracing::info!(subsystem = %nqn, nsid, "namespace capacity changed; hosts notified");
            }
            let now = Instant::now();
            let beats = self.heartbeats();
            for (id, (beat, last)) in beats.iter().zip(last_beats.iter_mut()).enumerate() {
                if beat != last {
                    *last = *beat;
                    advanced_at[id] = now;
                }
            }
            if let Some(interval) = watchdog {
                if now.duration_since(last_ping) >= interval {
                    last_ping = now;
                    // Ping only while every reactor is still ticking: a wedged reactor must
                    // make systemd restart us rather than be papered over.
                    let stalled: Vec<usize> = advanced_at
                        .iter()
                        .enumerate()
                        .filter(|(_, at)| now.duration_since(**at) > STALL_AFTER)
                        .map(|(id, _)| id)
                        .collect();
                    if stalled.is_empty() {
                        self.notifier.watchdog();
                    } else {
                        tracing::error!(?stalled, "reactor(s) stalled; withholding watchdog ping");
                    }
                }
            }
            if now.duration_since(last_status) >= Duration::from_secs(10) {
                last_status = now;
                self.notifier.status(&self.status_line());
            }
        }
        tracing::info!("stopping on signal");
        self.notifier.stopping();
        // No more control requests: the socket file goes before the listeners do.
        drop(control);
        self.stop_reactors();
        // After the reactors: no I/O in flight when the groups are handed back.
        if let Some(gateway) = &mut self.gateway {
            gateway.stop();
        }
        if let Some(health) = self.health.take() {
            health.shut_down();
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// Applies the gateway group's ANA changes (hosts get the ANA change AEN); `true` when
    /// this gateway is fenced and must stop.
    fn gateway_poll(&mut self) -> bool {
        let Some(gateway) = &mut self.gateway else {
            return false;
        };
        let poll = gateway.poll();
        if poll.changed {
            match self.apply_config(self.config.clone()) {
                Ok(summary) => tracing::info!(%summary, "gateway group: ANA states applied"),
                Err(e) => tracing::error!("gateway group: ANA states not applied: {e}"),
            }
        }
        poll.fenced
    }

    fn heartbeats(&self) -> Vec<u64> {
        self.handles
            .iter()
            .map(|h| h.heartbeat.load(Ordering::Relaxed))
            .collect()
    }

    fn stop_reactors(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        for handle in &self.handles {
            handle.wake();
        }
        // Reactors bound their own drain (DRAIN_TIMEOUT); a reactor stuck in a system call
        // must still not keep the process alive past this.
        let deadline = Instant::now() + reactor::DRAIN_TIMEOUT + JOIN_GRACE;
        while Instant::now() < deadline && !self.threads.iter().all(|t| t.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for thread in self.threads.drain(..) {
            if !thread.is_finished() {
                tracing::error!(thread = ?thread.thread().name(), "reactor did not stop in time; exiting without it");
                continue;
            }
            if thread.join().is_err() {
                tracing::error!("a reactor thread panicked");
            }
        }
    }

    /// SIGHUP: re-read and validate the file, then apply what can change live: subsystems,
    /// namespaces, hosts, referrals, TCP and RDMA listeners, ANA states, log level. A file that
    /// changes what is fixed for the life of the process (`restart_only_changes`) is refused
    /// with the list of those keys, like a file that fails validation: the running one stays
    /// untouched.
    fn reload(&mut self) -> Result<String, String> {
        self.notifier.reloading();
        tracing::info!(path = ?self.config_path, "reloading configuration");
        let outcome = conf::Config::load(self.config_path.as_deref())
            .map_err(|e| e.to_string())
            .and_then(|new| self.apply_config(new));
        match &outcome {
            Ok(summary) => tracing::info!(%summary, "configuration reloaded"),
            Err(e) => {
                for line in e.lines() {
                    tracing::error!("reload refused: {line}");
                }
            }
        }
        let status = match outcome {
            Ok(_) => self.status_line(),
            Err(_) => format!(
                "reload failed, previous configuration kept; {}",
                self.status_line()
            ),
        };
        self.notifier.ready(&status);
        outcome
    }

    /// Makes `new` the running configuration (a reloaded file or a control socket edit):
    /// validate, map, bind new TCP listeners, `Target::apply`, move listeners. Any failure
    /// leaves the running configuration as it was.
    fn apply_config(&mut self, new: conf::Config) -> Result<String, String> {
        let old = &self.config;
        let needs_restart = restart_only_changes(old, &new);
        if !needs_restart.is_empty() {
            // Refused rather than half-applied: reporting success while ignoring a key made the
            // operator believe e.g. a new reactor count was in force.
            return Err(format!(
                "these settings take effect only on restart (the running configuration is kept): {}",
                needs_restart.join(", ")
            ));
        }
        // Re-validate the merged result: kept ports must still satisfy the new subsystems.
        new.validate().map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        // Warned about once, when the name first appears (not at every later edit).
        for warning in new.warnings() {
            if !old.subsystems.iter().any(|s| s.nqn == warning.value) {
                tracing::warn!("{warning}");
            }
        }
        let mut mapped = nvme::target::TargetConfig {
            reservation_stores: self.reservation_stores.clone(),
            ..target_config(&new).map_err(|e| e.to_string())?
        };
        if let Some(g) = &self.gateway {
            g.overlay(&mut mapped);
        }
        // Key files are read (and refused) before anything live changes.
        let tls_keys = (old.tls_keys != new.tls_keys)
            .then(|| crate::tls::load_keys(&new.tls_keys))
            .transpose()?;
        // New TCP sockets are bound before anything live changes; on any failure below they are
        // dropped and nothing changed.
        let update = self.listener_changes(&mapped.ports)?;
        // New RDMA listeners likewise open first (on their reactors), and close again if the
        // target refuses the configuration.
        let (rdma_gone, rdma_new) = self.rdma_changes(&mapped.ports);
        let rdma_opened = self.open_rdma_listeners(rdma_new)?;
        let summary = match self.target.apply(mapped) {
            Ok(summary) => summary,
            Err(e) => {
                self.close_rdma_listeners(&rdma_opened);
                return Err(error_chain(&e));
            }
        };
        if !rdma_gone.is_empty() || !rdma_opened.is_empty() {
            tracing::info!(
                removed = ?rdma_gone.iter().map(|(p, _)| p.id).collect::<Vec<_>>(),
                added = ?rdma_opened.iter().map(|(p, _)| p.id).collect::<Vec<_>>(),
                "RDMA listeners changed"
            );
        }
        self.close_rdma_listeners(&rdma_gone);
        self.rdma_placement
            .retain(|placed| !rdma_gone.contains(placed));
        self.rdma_placement.extend(rdma_opened);
        if !update.remove.is_empty() || !update.add.is_empty() {
            tracing::info!(
                removed = ?update.remove,
                added = ?update.add.iter().map(|l| l.port_id).collect::<Vec<_>>(),
                "TCP listeners changed"
            );
            if !self.handles[0].update_listeners(update) {
                return Err("reactor 0 is gone; listeners not updated".to_owned());
            }
        }
        if let Some(keys) = tls_keys {
            let count = keys.len();
            self.tls_keys.replace(keys);
            tracing::info!(
                keys = count,
                "TLS keys replaced: new handshakes use them, established sessions keep theirs"
            );
        }
        if let Err(e) = self.log.set_level(&new.global.log_level) {
            tracing::warn!(error = %e, "log_level not applied");
        }
        self.config = new;
        log_topology(&self.target);
        Ok(format!(
            "subsystems +{:?} -{:?} ~{:?}, namespaces +{:?} -{:?}, shown to other hosts {:?}, \
             QoS changed {:?}, genctr {}, ANA chgcnt {}",
            summary.subsystems_added,
            summary.subsystems_removed,
            summary.subsystems_changed,
            summary.namespaces_added,
            summary.namespaces_removed,
            summary.namespaces_visibility_changed,
            summary.qos_changed,
            summary.discovery_genctr,
            summary.ana_chgcnt
        ))
    }
}

impl Server {
    /// The control socket (`global.control_socket`). Not fatal when unavailable: the target
    /// serves without it (logged), so that e.g. a second daemon for tests never steals the
    /// socket of a running one.
    fn open_control(&self, signals: &Signals) -> Option<ControlEndpoint> {
        let path = &self.config.global.control_socket;
        let (tx, calls) = std::sync::mpsc::channel();
        let opened = signals
            .waker()
            .map_err(|e| e.to_string())
            .and_then(|wake| ControlSocket::open(path, tx, wake).map_err(|e| error_chain(&e)));
        match opened {
            Ok(socket) => Some(ControlEndpoint {
                _socket: socket,
                calls,
            }),
            Err(e) => {
                tracing::warn!("running without a control socket: {e}");
                None
            }
        }
    }

    /// One control socket request, on the main thread. An applied edit is written through to
    /// the configuration file unless `transient`.
    fn control_call(&mut self, request: Request, transient: bool) -> Response {
        use crate::control::commands as cmd;
        if request.is_change() {
            tracing::info!(?request, "control request");
        } else {
            tracing::debug!(?request, "control request");
        }
        fn answer(r: Result<impl serde::Serialize, String>) -> Response {
            match r {
                Ok(view) => Response::success(view),
                Err(e) => Response::failure(e),
            }
        }
        match request {
            Request::Status => Response::success(self.status_view()),
            Request::Subsystems => Response::success(cmd::subsystems(&self.target)),
            Request::Subsystem { nqn } => answer(cmd::subsystem_detail(&self.target, &nqn)),
            Request::Namespaces { nqn } => answer(cmd::namespaces(&self.target, nqn.as_deref())),
            Request::Ports => Response::success(cmd::ports(&self.target)),
            Request::Controllers { nqn } => answer(cmd::controllers(&self.target, nqn.as_deref())),
            Request::Qos { nqn } => answer(cmd::qos(&self.target, nqn.as_deref())),
            Request::Top => answer(
                self.metrics
                    .as_ref()
                    .map(|m| cmd::top(&m.registry))
                    .ok_or_else(|| {
                        "metrics are off: add [metrics] enabled = true (or listen = \"…\") to the \
                         configuration and restart"
                            .to_owned()
                    }),
            ),
            Request::Gateways => answer(
                self.gateway
                    .as_ref()
                    .map(|g| g.view())
                    .ok_or_else(|| "no [gateway_group] in the configuration".to_owned()),
            ),
            Request::SetAnaState { group, .. }
                if self.gateway.as_ref().is_some_and(|g| g.manages(group)) =>
            {
                Response::failure(format!(
                    "ANA group {group} is managed by the gateway group (its lease decides its \
                     state); see nvmfd ctl gateways"
                ))
            }
            Request::Reload => answer(self.reload().map(|summary| ApplyView {
                summary,
                saved: None,
            })),
            Request::WriteConfig { path } => answer(
                path.map_or_else(|| cmd::default_write_path(self.config_path.as_deref()), Ok)
                    .and_then(|path| cmd::write_config(&self.config, &path, cmd::RUNNING_HEADER)),
            ),
            edit => {
                let outcome = cmd::edit(&self.config, &edit).and_then(|new| self.apply_config(new));
                match &outcome {
                    Ok(summary) => tracing::info!(%summary, "control change applied"),
                    Err(e) => tracing::warn!("control change refused: {e}"),
                }
                answer(outcome.map(|summary| {
                    let saved = if transient {
                        Saved::Transient
                    } else {
                        self.save_edit(&edit)
                    };
                    match &saved {
                        Saved::Written { path } => {
                            tracing::info!(path = %path.display(), "control change saved")
                        }
                        Saved::Transient => {}
                        Saved::Failed { reason } => tracing::warn!(
                            "control change applied but not saved (the next reload or \
                             restart undoes it): {reason}"
                        ),
                    }
                    ApplyView {
                        summary,
                        saved: Some(saved),
                    }
                }))
            }
        }
    }

    /// Writes an applied edit through to the configuration file: the same edit applied to the
    /// file as it is now (without the `NVMFD_*` environment overrides, which stay where they
    /// are), written atomically. The file is re-read rather than the running configuration
    /// written, so that overrides are not baked in.
    fn save_edit(&self, edit: &Request) -> Saved {
        use crate::control::commands as cmd;
        let Some(path) = &self.config_path else {
            return Saved::Failed {
                reason: "running on the built-in configuration: there is no file to update \
                         (write-config PATH saves the running configuration)"
                    .to_owned(),
            };
        };
        let origin = path.display().to_string();
        let outcome = std::fs::read_to_string(path)
            .map_err(|e| format!("{origin}: {e}"))
            .and_then(|text| {
                conf::Config::parse(&origin, &text, conf::EnvSource::None)
                    .map_err(|e| e.to_string())
            })
            .and_then(|file| cmd::edit(&file, edit).map_err(|e| format!("{origin}: {e}")))
            .and_then(|edited| {
                edited.validate().map_err(|errors| {
                    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    format!("{origin} would not validate: {}", list.join("; "))
                })?;
                cmd::write_config(&edited, path, cmd::EDITED_HEADER)
            });
        match outcome {
            Ok(view) => Saved::Written { path: view.path },
            Err(reason) => Saved::Failed { reason },
        }
    }

    fn status_view(&self) -> StatusView {
        let nqns = self.target.subsystem_nqns();
        let namespaces = nqns
            .iter()
            .filter_map(|nqn| self.target.subsystem(nqn))
            .map(|s| s.namespaces().len())
            .sum();
        let controllers =
            crate::control::commands::controllers(&self.target, None).map_or(0, |c| c.len());
        StatusView {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_secs: self.target.started().elapsed().as_secs(),
            config_path: self.config_path.clone(),
            subsystems: nqns.len(),
            namespaces,
            ports: self.target.ports().len(),
            controllers,
            connections: self
                .handles
                .iter()
                .map(|h| h.connections.load(Ordering::Relaxed))
                .sum(),
            discovery_genctr: self.target.discovery_genctr(),
            auth_failures: self.target.auth_failures().total(),
        }
    }

    /// RDMA ports to close (gone or moved, with their reactor) and to open (new or moved).
    fn rdma_changes(
        &self,
        new_ports: &[PortConfig],
    ) -> (Vec<(PortConfig, usize)>, Vec<PortConfig>) {
        let new: Vec<&PortConfig> = new_ports
            .iter()
            .filter(|p| p.transport == TransportKind::Rdma)
            .collect();
        let gone = self
            .rdma_placement
            .iter()
            .filter(|(old, _)| !new.contains(&old))
            .cloned()
            .collect();
        let added = new
            .into_iter()
            .filter(|n| !self.rdma_placement.iter().any(|(old, _)| old == *n))
            .cloned()
            .collect();
        (gone, added)
    }

    /// Opens `ports` on the reactors holding the fewest RDMA ports and waits until each
    /// listens. A port this machine cannot serve (no RDMA device, address not on one) is
    /// logged and placed anyway, as at start-up. On a failure the listeners opened so far are
    /// closed again and nothing changed.
    fn open_rdma_listeners(
        &self,
        ports: Vec<PortConfig>,
    ) -> Result<Vec<(PortConfig, usize)>, String> {
        let mut opened: Vec<(PortConfig, usize)> = Vec::new();
        for port in ports {
            let outcome = if cfg!(feature = "rdma") {
                let reactor = (0..self.handles.len())
                    .min_by_key(|r| {
                        self.rdma_placement
                            .iter()
                            .chain(&opened)
                            .filter(|(_, placed)| placed == r)
                            .count()
                    })
                    .unwrap_or(0);
                let (target, rdma, p, sysfs) = (
                    Arc::clone(&self.target),
                    self.config.rdma.clone(),
                    port.clone(),
                    self.sysfs.clone(),
                );
                let build: EventListenerBuilder = Box::new(move || {
                    open_rdma_ports(std::slice::from_ref(&p), &target, &rdma, &sysfs)
                        .map(|mut l| l.pop())
                });
                let (reply, answer) = std::sync::mpsc::channel();
                self.handles[reactor]
                    .change_event_listener(EventListenerChange::Add { build, reply });
                match answer.recv_timeout(RDMA_CHANGE_TIMEOUT) {
                    Ok(Ok(_listening)) => Ok(reactor),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(format!("reactor {reactor} did not answer")),
                }
            } else {
                Err("this nvmfd is built without RDMA support".to_owned())
            };
            match outcome {
                Ok(reactor) => opened.push((port, reactor)),
                Err(e) => {
                    self.close_rdma_listeners(&opened);
                    return Err(format!("port {}: {e}", port.id));
                }
            }
        }
        Ok(opened)
    }

    /// Stops the listeners of `ports` from accepting (their connections stay) and waits for
    /// each reactor to have done it.
    fn close_rdma_listeners(&self, ports: &[(PortConfig, usize)]) {
        for (port, reactor) in ports {
            let (reply, answer) = std::sync::mpsc::channel();
            let change = EventListenerChange::Remove {
                port_id: port.id,
                address: SocketAddr::new(port.address, port.service),
                reply,
            };
            if self.handles[*reactor].change_event_listener(change)
                && answer.recv_timeout(RDMA_CHANGE_TIMEOUT).is_err()
            {
                tracing::warn!(
                    port_id = port.id,
                    reactor,
                    "reactor did not confirm closing the RDMA listener"
                );
            }
        }
    }

    /// TCP listeners to close (ports gone or moved) and to open (new or moved, bound here).
    fn listener_changes(&self, new_ports: &[PortConfig]) -> Result<ListenerUpdate, String> {
        let tcp = |ports: Vec<PortConfig>| -> Vec<PortConfig> {
            ports
                .into_iter()
                .filter(|p| p.transport == TransportKind::Tcp)
                .collect()
        };
        let old = tcp(self.target.ports());
        let new = tcp(new_ports.to_vec());
        let mut update = ListenerUpdate {
            remove: old
                .iter()
                .filter(|o| !new.contains(o))
                .map(|o| o.id)
                .collect(),
            add: Vec::new(),
        };
        for port in new.iter().filter(|n| !old.contains(n)) {
            let address = SocketAddr::new(port.address, port.service);
            let socket = TcpListener::bind(address)
                .and_then(|socket| socket.set_nonblocking(true).map(|()| socket))
                .map_err(|e| format!("port {}: cannot listen on {address}: {e}", port.id))?;
            tracing::info!(port_id = port.id, transport = "tcp", %address, "listening");
            let node = self.sysfs.address_node(port.address);
            let placed = PortNode {
                port_id: port.id,
                transport: "tcp",
                address,
                node,
            };
            log_placement(&placed, &self.handles);
            // TLS ports are restart-only (`restart_only_changes`): a port opened here is plain.
            update.add.push(Listener {
                socket,
                port_id: port.id,
                tls: None,
                node,
            });
        }
        Ok(update)
    }
}

/// What to look at when a port is taken: who else listens there.
fn in_use_hint(error: &io::Error, address: &SocketAddr) -> String {
    if error.kind() != io::ErrorKind::AddrInUse {
        return String::new();
    }
    format!(
        " (another process listens there: another nvmfd, or the kernel target nvmet; \
         `ss -ltnp 'sport = :{}'` names it)",
        address.port()
    )
}

impl ServeError {
    /// The `[[ports]]` id of an error about one port.
    pub fn port_id(&self) -> Option<u16> {
        match self {
            ServeError::Bind { port_id, .. } | ServeError::UnsupportedTransport { port_id, .. } => {
                Some(*port_id)
            }
            _ => None,
        }
    }
}

/// An error and its sources on one line ("cannot build the target: …: …: No such file").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Signal handlers are installed before anything is bound, so that a SIGTERM during start-up
/// is not lost (it is acted upon as soon as the main loop runs).
pub struct SignalsGuard(Signals);

pub fn install_signals() -> Result<SignalsGuard, ServeError> {
    Signals::install()
        .map(SignalsGuard)
        .map_err(ServeError::Signals)
}

#[cfg(test)]
mod tests {
    use super::restart_only_changes;

    const BASE: &str = r#"
[global]
reactors = 2

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420

[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:test"
allow_any_host = true

"#;

    fn parse(text: &str) -> conf::Config {
        conf::Config::parse_toml(text).expect("test configuration parses")
    }

    #[test]
    fn live_changes_need_no_restart() {
        let old = parse(BASE);
        let new = parse(&BASE.replace("service = 4420", "service = 4421"));
        assert!(restart_only_changes(&old, &new).is_empty());
        let new = parse(&format!("{BASE}\n[[ports]]\nid = 2\ntransport = \"tcp\"\naddress = \"127.0.0.1\"\nservice = 4422\n"));
        assert!(restart_only_changes(&old, &new).is_empty());
    }

    #[test]
    fn restart_only_keys_are_named() {
        let old = parse(BASE);
        let new = parse(&BASE.replace("reactors = 2", "reactors = 1\nmax_io_queues = 4"));
        assert_eq!(
            restart_only_changes(&old, &new),
            ["global.reactors", "global.max_io_queues"]
        );
        // RDMA ports open and close live; their pool sizes do not change under them.
        let rdma_port =
            "\n[[ports]]\nid = 2\ntransport = \"rdma\"\naddress = \"127.0.0.1\"\nservice = 4420\n";
        let new = parse(&format!("{BASE}{rdma_port}"));
        assert!(restart_only_changes(&old, &new).is_empty());
        let new = parse(&format!(
            "{BASE}{rdma_port}\n[rdma]\ncapsule_buffers = 512\n"
        ));
        assert_eq!(restart_only_changes(&old, &new), ["rdma"]);
        // A TLS port is set up at start; plain ports change live.
        let new = parse(&BASE.replace("service = 4420", "service = 4420\ntls = \"required\""));
        assert_eq!(restart_only_changes(&old, &new), ["ports[].tls"]);
        let new = parse(&BASE.replace("reactors = 2", "reactors = 2\nstate_dir = \"/x\""));
        assert_eq!(restart_only_changes(&old, &new), ["global.state_dir"]);
        let new = parse(&BASE.replace(
            "reactors = 2",
            "reactors = 2\ndiscovery_nqn = \"nqn.2026-12.dev.nvmfd:disc\"",
        ));
        assert_eq!(restart_only_changes(&old, &new), ["global.discovery_nqn"]);
    }
}
