//! Reactors: one thread per core, each with its own epoll, io_uring and connections.
//!
//! A wake-up processes ready descriptors (listeners, connections, the cross-thread
//! wake eventfd, the io_uring completion eventfd), routes io_uring completions to connections by
//! `tag >> 32` (connection contract; all of a connection's completions of the turn in one
//! `on_io_completions` call), flushes the ring once (one `io_uring_enter` for every op the
//! turn queued), and ticks every connection at
//! least every [`TICK`]. Connections are registered edge-triggered; EPOLLOUT is armed only while
//! the connection has bytes queued. Back-pressure: a connection that stopped reading because
//! every command slot was busy resumes on its own when a completion or tick frees one (contract
//! 5); when the slot was waiting for socket space instead, the EPOLLOUT event is followed by a
//! read, because no new EPOLLIN edge comes for data already in the socket buffer.
//!
//! The steady-state loop allocates nothing and takes no lock: the epoll event array, the
//! completion scratch vector and the slab are reused; the accept hand-off channel is touched only
//! when a connection arrives.

#[cfg(any(feature = "rdma", test))]
use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use storage::uring::UringEngine;
use storage::IoSubmit;
use transport::conn::{ConnStatus, Connection};

use crate::topology;

mod busy_poll;

/// Connections are ticked (keep-alive, held AERs) at least this often (dispatch contract: ≥ every
/// 100 ms).
pub const TICK: Duration = Duration::from_millis(TICK_MS as u64);
const TICK_MS: u16 = 100;
/// How long a stopping reactor waits for in-flight I/O and queued responses.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_EVENTS: usize = 256;
/// epoll user data outside the connection token space (tokens are u32).
const WAKE_KEY: u64 = u64::MAX;
const URING_KEY: u64 = u64::MAX - 1;
const LISTENER_KEY_BASE: u64 = 1 << 40;
const ACCEPTOR_KEY: u64 = u64::MAX - 2;
const EVENT_LISTENER_KEY_BASE: u64 = 1 << 41;

/// A connection of any transport, as the reactor holds it (one vtable call per event).
pub type Conn = Box<dyn Connection>;

/// A listener that takes connection requests itself (rdma_cm): readiness on `fd()`, then
/// `on_event` drains its events. TCP listeners are plain sockets handled by the reactor.
/// It owns no connection: each request becomes a `PendingConnection` that holds what it
/// needs (rdma_cm: the request's id and, by reference count, the listener's event channel
/// until an acceptor adopts the id), and accepted connections report through their
/// reactor's `Acceptor`. So a reload that removes the port drops the listener at once
/// (which stops listening) and its connections keep working.
pub trait EventListener {
    fn fd(&self) -> BorrowedFd<'_>;
    fn port_id(&self) -> u16;
    /// The address it listens on: a reload names the listener to close by port id and address
    /// (a port that moved has its new listener open before the old one closes).
    fn address(&self) -> SocketAddr;
    /// The NUMA node of the device it listens on, if known (`crate::topology`): its
    /// connections go to reactors on that node.
    fn node(&self) -> Option<u32>;
    fn on_event(&mut self, out: &mut Vec<ListenerOutput>);
}

#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub enum ListenerOutput {
    /// A host asks to connect: the request goes to the least-loaded reactor, which sets the
    /// connection up there (`PendingConnection::accept`).
    Request(Box<dyn PendingConnection>),
    /// The listener can no longer accept (device removed).
    Removed,
}

/// A connection request taken by an event listener on one reactor and set up by the reactor
/// chosen to serve it (rdma_cm: the new id moves to that reactor's event channel, and the
/// QP, CQ and buffers are made there).
pub trait PendingConnection: Send + std::fmt::Debug {
    fn port_id(&self) -> u16;
    /// Sets the connection up on the calling reactor under `token` (0: no token left: refuse
    /// the host). `acceptor` is this reactor's acceptor for the connections' own events,
    /// created by this call on first use; `None` returned means the host was refused.
    fn accept(
        self: Box<Self>,
        acceptor: &mut Option<Box<dyn Acceptor>>,
        place: Placement,
        token: u32,
    ) -> Option<Conn>;
}

/// Where a connection is being set up: reactor `reactor` of `reactors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub reactor: usize,
    pub reactors: usize,
}

/// A reactor's side of connections that report events outside their own fd (rdma_cm: the
/// reactor's CM event channel, on which its connections' DISCONNECTED etc. arrive).
pub trait Acceptor {
    fn fd(&self) -> BorrowedFd<'_>;
    /// Pushes the tokens of connections that are gone.
    fn on_event(&mut self, disconnected: &mut Vec<u32>);
    /// For `PendingConnection::accept` to find its own type (only the RDMA side has one).
    #[cfg(any(feature = "rdma", test))]
    fn as_any(&mut self) -> &mut dyn Any;
}

/// A socket accepted by a listener, on its way to a reactor.
#[derive(Debug)]
pub struct Accepted {
    pub stream: TcpStream,
    pub port_id: u16,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The TLS session of a TLS connection: its PSK identity and record layer.
    pub tls: Option<crate::tls::TlsConnection>,
}

/// The part of a reactor other threads see.
#[derive(Debug)]
pub struct ReactorHandle {
    wake: EventFd,
    inbox: Sender<Inbound>,
    /// Advanced on every tick; the watchdog pings systemd only while every reactor advances.
    pub heartbeat: AtomicU64,
    pub connections: AtomicUsize,
    /// Nanoseconds spent handling events (metrics on), stored by the reactor on every tick.
    pub busy_ns: AtomicU64,
    /// Connections handed over and not yet taken from the inbox: counted as load so that
    /// accepts in quick succession do not all pick the same reactor.
    pending: AtomicUsize,
    /// The NUMA node of the CPU the reactor is pinned to; set by the reactor thread once
    /// pinned, never for an unpinned reactor.
    node: OnceLock<u32>,
}

impl ReactorHandle {
    pub fn wake(&self) {
        // An eventfd counter only fails to accept a write at u64::MAX - 1, and then the reactor
        // has a wake-up pending anyway.
        let _ = self.wake.write(1);
    }

    /// Hands a connection over; `false` if the reactor has exited.
    pub fn hand_over(&self, accepted: Accepted) -> bool {
        self.send_connection(Inbound::Connection(accepted))
    }

    /// Hands a connection request over; `false` (the request dropped: host refused) if the
    /// reactor has exited.
    pub fn hand_over_request(&self, request: Box<dyn PendingConnection>) -> bool {
        self.send_connection(Inbound::Request(request))
    }

    fn send_connection(&self, inbound: Inbound) -> bool {
        self.count_pending();
        let sent = self.inbox.send(inbound).is_ok();
        if !sent {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
        self.wake();
        sent
    }

    /// The NUMA node the reactor runs on (pinned), if known.
    pub fn node(&self) -> Option<u32> {
        self.node.get().copied()
    }

    /// Records the node of the CPU the reactor thread has just been pinned to.
    pub fn set_node(&self, node: u32) {
        let _ = self.node.set(node);
    }

    /// A connection placed on this reactor counts as its load from now until the reactor has
    /// counted it in `connections` (or dropped it): see `Reactor::take_in`.
    fn count_pending(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections this reactor serves or is about to (placement of new connections).
    pub fn load(&self) -> usize {
        // `pending` first: the reactor releases a pending count (Release) only after counting
        // the connection, so a released count read here (Acquire) comes with the connection.
        let pending = self.pending.load(Ordering::Acquire);
        self.connections.load(Ordering::Relaxed) + pending
    }

    /// Replaces TCP listeners (reload): `remove` port ids first, then `add`.
    pub fn update_listeners(&self, update: ListenerUpdate) -> bool {
        let sent = self.inbox.send(Inbound::Listeners(update)).is_ok();
        self.wake();
        sent
    }

    /// Adds or removes an event listener (reload of an RDMA port); `false` if the reactor has
    /// exited (the change's reply channel then closes unanswered).
    pub fn change_event_listener(&self, change: EventListenerChange) -> bool {
        let sent = self.inbox.send(Inbound::EventListener(change)).is_ok();
        self.wake();
        sent
    }
}

/// Process-wide stop request, set by the signal handler thread.
#[derive(Debug, Default)]
pub struct Control {
    pub stop: AtomicBool,
}

/// A listening socket owned by reactor 0.
#[derive(Debug)]
pub struct Listener {
    pub socket: TcpListener,
    pub port_id: u16,
    /// TLS ports: accepted sockets go through the handshake thread first (`crate::tls`).
    pub tls: Option<Arc<crate::tls::TlsGate>>,
    /// The NUMA node of the interface holding the address, if known (`crate::topology`).
    pub node: Option<u32>,
}

/// Listener changes from a configuration reload.
#[derive(Debug, Default)]
pub struct ListenerUpdate {
    pub remove: Vec<u16>,
    pub add: Vec<Listener>,
}

/// Builds an event listener on the reactor's own thread (verbs objects are not `Send`):
/// `Ok(None)` when the port cannot be served on this machine (no RDMA), which start-up too
/// only logs.
pub type EventListenerBuilder =
    Box<dyn FnOnce() -> Result<Option<Box<dyn EventListener>>, String> + Send>;

/// An event listener (RDMA port) added or removed by a reload; each answers on `reply` once
/// the reactor has done it.
pub enum EventListenerChange {
    /// Open a listener; the reply is whether it listens (`Ok(false)`: not served here).
    Add {
        build: EventListenerBuilder,
        reply: Sender<Result<bool, String>>,
    },
    /// Close (drop) the listener of `port_id` at `address`; its connections stay, as they
    /// are not its own (`EventListener`). The reply is whether there was one.
    Remove {
        port_id: u16,
        address: SocketAddr,
        reply: Sender<bool>,
    },
}

impl std::fmt::Debug for EventListenerChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Add { .. } => f.write_str("Add"),
            Self::Remove {
                port_id, address, ..
            } => write!(f, "Remove({port_id}, {address})"),
        }
    }
}

/// What other threads send a reactor.
#[derive(Debug)]
pub enum Inbound {
    Connection(Accepted),
    Request(Box<dyn PendingConnection>),
    Listeners(ListenerUpdate),
    EventListener(EventListenerChange),
}

struct Slot {
    conn: Conn,
    /// EPOLLOUT currently in the interest set.
    out_armed: bool,
    /// Closed: deregistered, socket shut down, kept only until its I/O has drained.
    closed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    #[error("epoll: {0}")]
    Epoll(#[source] nix::Error),
    #[error("eventfd: {0}")]
    EventFd(#[source] nix::Error),
    #[error(transparent)]
    Uring(#[from] storage::uring::UringError),
}

/// Builds the per-reactor connection from an accepted socket and its token.
pub type ConnectionFactory = Box<dyn FnMut(Accepted, u32) -> io::Result<Conn> + Send>;

pub struct Reactor {
    id: usize,
    epoll: Epoll,
    engine: UringEngine,
    handle: Arc<ReactorHandle>,
    inbox: Receiver<Inbound>,
    /// Every reactor's handle, for round-robin hand-off (reactor 0 only uses it).
    peers: Vec<Arc<ReactorHandle>>,
    control: Arc<Control>,
    listeners: Vec<Listener>,
    /// TCP listeners taken out of the epoll after an accept error, back at the next tick.
    paused_listeners: Vec<u16>,
    /// An accept error was logged and none has succeeded since (log once, not every tick).
    accept_failing: bool,
    event_listeners: Vec<Option<Box<dyn EventListener>>>,
    retired_listeners: Vec<Box<dyn EventListener>>,
    /// Created by the first connection request placed here; registered under `ACCEPTOR_KEY`.
    acceptor: Option<Box<dyn Acceptor>>,
    disconnected: Vec<u32>,
    listener_output: Vec<ListenerOutput>,
    next_peer: usize,
    /// Connections by token. Token 0 is never handed out (transports use 0 for "none").
    slots: Vec<Option<Slot>>,
    /// Free tokens, reused oldest-first so that a late event for a released token (an RDMA CM
    /// event racing the release) is unlikely to meet a new connection under the same token.
    free: VecDeque<u32>,
    completions: Vec<(u64, i32)>,
    factory: ConnectionFactory,
    busy: busy_poll::BusyPoll,
    /// Busy time is measured (`[metrics]` on): one clock read per wake-up.
    count_busy: bool,
    busy_ns: u64,
}

/// Creates the handle (shared) and the pieces the reactor thread will own.
pub fn handle() -> Result<(Arc<ReactorHandle>, Receiver<Inbound>), ReactorError> {
    let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map_err(ReactorError::EventFd)?;
    let (inbox, receiver) = std::sync::mpsc::channel();
    Ok((
        Arc::new(ReactorHandle {
            wake,
            inbox,
            heartbeat: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            busy_ns: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            node: OnceLock::new(),
        }),
        receiver,
    ))
}

impl Reactor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: usize,
        handle: Arc<ReactorHandle>,
        inbox: Receiver<Inbound>,
        peers: Vec<Arc<ReactorHandle>>,
        control: Arc<Control>,
        listeners: Vec<Listener>,
        event_listeners: Vec<Box<dyn EventListener>>,
        engine: UringEngine,
        factory: ConnectionFactory,
    ) -> Result<Self, ReactorError> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(ReactorError::Epoll)?;
        epoll
            .add(
                handle.wake.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, WAKE_KEY),
            )
            .map_err(ReactorError::Epoll)?;
        // SAFETY: the engine's eventfd lives as long as the engine, which this reactor owns for
        // as long as the epoll instance exists.
        let uring_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(engine.fd()) };
        epoll
            .add(uring_fd, EpollEvent::new(EpollFlags::EPOLLIN, URING_KEY))
            .map_err(ReactorError::Epoll)?;
        for listener in &listeners {
            epoll
                .add(
                    listener.socket.as_fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN, listener_key(listener.port_id)),
                )
                .map_err(ReactorError::Epoll)?;
        }
        for (i, listener) in event_listeners.iter().enumerate() {
            epoll
                .add(
                    listener.fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN, EVENT_LISTENER_KEY_BASE + i as u64),
                )
                .map_err(ReactorError::Epoll)?;
        }
        Ok(Reactor {
            id,
            epoll,
            engine,
            handle,
            inbox,
            peers,
            control,
            listeners,
            paused_listeners: Vec::new(),
            accept_failing: false,
            event_listeners: event_listeners.into_iter().map(Some).collect(),
            retired_listeners: Vec::new(),
            acceptor: None,
            disconnected: Vec::new(),
            listener_output: Vec::new(),
            next_peer: id,
            slots: vec![None],
            free: VecDeque::new(),
            completions: Vec::new(),
            factory,
            busy: busy_poll::BusyPoll::new(0),
            count_busy: false,
            busy_ns: 0,
        })
    }

    /// Busy-polls pollable (RDMA) connections for up to `us` µs of idleness (0 = off).
    pub fn with_busy_poll(mut self, us: u32) -> Self {
        self.busy = busy_poll::BusyPoll::new(us);
        self
    }

    /// Measures the time spent handling events, for the metrics.
    pub fn with_busy_time(mut self, on: bool) -> Self {
        self.count_busy = on;
        self
    }

    /// Runs until a stop is requested and the connections have drained (or [`DRAIN_TIMEOUT`]).
    pub fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); MAX_EVENTS];
        let mut last_tick = Instant::now();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            let timeout = EpollTimeout::from(self.busy.timeout_ms(self.sleep_ms()));
            let ready = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::Error::EINTR) => 0,
                Err(e) => {
                    tracing::error!(reactor = self.id, error = %e, "epoll_wait failed; reactor stops");
                    break;
                }
            };
            let woke = self.count_busy.then(Instant::now);
            let mut reap = false;
            for event in &events[..ready] {
                match event.data() {
                    WAKE_KEY => self.on_wake(),
                    URING_KEY => reap = true,
                    ACCEPTOR_KEY => self.on_acceptor(),
                    key if key >= EVENT_LISTENER_KEY_BASE => {
                        self.on_event_listener((key - EVENT_LISTENER_KEY_BASE) as usize)
                    }
                    key if key >= LISTENER_KEY_BASE => {
                        self.on_listener((key - LISTENER_KEY_BASE) as u16)
                    }
                    key => self.on_connection_event(
                        key as u32,
                        event.events(),
                        drain_deadline.is_some(),
                    ),
                }
            }
            if reap {
                self.reap();
                // A write lock another reactor released (fused Compare and Write): the
                // connections run their blocked commands again now, not at the next tick.
                if self.engine.external().is_some_and(|e| e.take_wake()) {
                    self.tick(Instant::now());
                }
            }
            self.busy_poll_turn(ready > 0);
            self.engine.flush();

            let now = Instant::now();
            if let Some(woke) = woke {
                self.busy_ns += now.saturating_duration_since(woke).as_nanos() as u64;
            }
            // Commands held by a QoS limit asked to go on by now: their connections run
            // them again (each asks for its next wake-up if some still wait).
            let qos_due = self.engine.wake_at().is_some_and(|at| at <= now);
            if qos_due {
                self.engine.take_wake_at();
            }
            if qos_due || now.duration_since(last_tick) >= TICK {
                if !qos_due {
                    last_tick = now;
                }
                self.tick(now);
                self.engine.flush();
            }

            if drain_deadline.is_none() && self.control.stop.load(Ordering::Acquire) {
                drain_deadline = Some(now + DRAIN_TIMEOUT);
                self.begin_drain();
            }
            if let Some(deadline) = drain_deadline {
                self.close_drained();
                if self.live_connections() == 0 {
                    break;
                }
                if now >= deadline {
                    break;
                }
            }
        }
        // Connections go before the listeners that may own their devices (field order would
        // drop the listeners first).
        self.abandon_remaining();
        self.busy_poll_summary();
        tracing::debug!(reactor = self.id, "reactor stopped");
    }

    /// How long epoll may sleep: a tick, or less when a command held by a QoS limit may go
    /// sooner (rounded up to the millisecond epoll counts in).
    fn sleep_ms(&self) -> u16 {
        match self.engine.wake_at() {
            None => TICK_MS,
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                left.as_micros().div_ceil(1000).min(u128::from(TICK_MS)) as u16
            }
        }
    }

    fn live_connections(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn on_wake(&mut self) {
        // Drain the counter (non-blocking; EAGAIN when it was consumed already).
        let _ = self.handle.wake.read();
        while let Ok(inbound) = self.inbox.try_recv() {
            self.take_in(inbound);
        }
    }

    /// Acts on one message: from the inbox, or a connection (request) this reactor placed on
    /// itself, which like a handed-over one was counted as pending when placed.
    fn take_in(&mut self, inbound: Inbound) {
        let connection = matches!(inbound, Inbound::Connection(_) | Inbound::Request(_));
        let stopping = self.control.stop.load(Ordering::Acquire);
        match inbound {
            // Dropped while stopping: closes the socket, refuses the request.
            Inbound::Connection(_) | Inbound::Request(_) if stopping => {}
            Inbound::Connection(accepted) => self.add_connection(accepted),
            Inbound::Request(request) => self.accept_request(request),
            Inbound::Listeners(_) if stopping => {}
            Inbound::Listeners(update) => self.update_listeners(update),
            // Dropped while stopping: the reply channel closes, the caller sees it.
            Inbound::EventListener(_) if stopping => {}
            Inbound::EventListener(change) => self.change_event_listener(change),
        }
        // Only now, with the connection counted in `connections` (or dropped), does it
        // stop counting as pending: released earlier, a connection placed in between (by
        // an acceptor, a TLS handshake thread) would see this reactor's load one too low.
        if connection {
            self.handle.pending.fetch_sub(1, Ordering::Release);
        }
    }

    fn update_listeners(&mut self, update: ListenerUpdate) {
        for port_id in update.remove {
            self.paused_listeners.retain(|&p| p != port_id);
            if let Some(pos) = self.listeners.iter().position(|l| l.port_id == port_id) {
                let listener = self.listeners.swap_remove(pos);
                let _ = self.epoll.delete(listener.socket.as_fd());
                tracing::info!(port_id, "listener closed (reload)");
            }
        }
        for listener in update.add {
            let event = EpollEvent::new(EpollFlags::EPOLLIN, listener_key(listener.port_id));
            match self.epoll.add(listener.socket.as_fd(), event) {
                Ok(()) => {
                    tracing::info!(port_id = listener.port_id, "listener added (reload)");
                    self.listeners.push(listener);
                }
                Err(e) => {
                    tracing::error!(port_id = listener.port_id, error = %e, "cannot watch new listener")
                }
            }
        }
    }

    fn change_event_listener(&mut self, change: EventListenerChange) {
        match change {
            EventListenerChange::Add { build, reply } => {
                let outcome = build().and_then(|built| {
                    let Some(listener) = built else {
                        return Ok(false);
                    };
                    let index = self.event_listeners.len();
                    let key = EVENT_LISTENER_KEY_BASE + index as u64;
                    self.epoll
                        .add(listener.fd(), EpollEvent::new(EpollFlags::EPOLLIN, key))
                        .map_err(|e| format!("cannot watch the new listener: {e}"))?;
                    tracing::info!(
                        port_id = listener.port_id(),
                        address = %listener.address(),
                        node = ?listener.node(),
                        reactors = ?serving_reactors(&self.peers, listener.node()),
                        "listener added (reload)"
                    );
                    self.event_listeners.push(Some(listener));
                    Ok(true)
                });
                let _ = reply.send(outcome);
            }
            EventListenerChange::Remove {
                port_id,
                address,
                reply,
            } => {
                let found = self.event_listeners.iter().position(|l| {
                    l.as_ref()
                        .is_some_and(|l| l.port_id() == port_id && l.address() == address)
                });
                if let Some(listener) = found.and_then(|i| self.event_listeners[i].take()) {
                    // Dropping it stops listening; requests already taken hold what they
                    // need (see `EventListener`), and connections are not its own.
                    let _ = self.epoll.delete(listener.fd());
                    tracing::info!(
                        port_id,
                        %address,
                        "listener closed (reload); its connections stay"
                    );
                }
                let _ = reply.send(found.is_some());
            }
        }
    }

    fn on_listener(&mut self, port_id: u16) {
        loop {
            let Some(listener) = self.listeners.iter().find(|l| l.port_id == port_id) else {
                return;
            };
            let port_id = listener.port_id;
            let node = listener.node;
            let tls = listener.tls.clone();
            let (stream, remote) = match listener.socket.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ECONNABORTED and friends concern one connection only.
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) => {
                    // EMFILE/ENFILE/ENOMEM: the connection stays in the backlog. The listener
                    // is level-triggered and would report it again at once, so it sleeps until
                    // the next tick instead of spinning.
                    if self.accept_failing {
                        tracing::debug!(port_id, error = %e, "accept still failing");
                    } else {
                        tracing::warn!(port_id, error = %e, "accept failed; listener paused, retried every tick");
                        self.accept_failing = true;
                    }
                    let _ = self.epoll.delete(listener.socket.as_fd());
                    self.paused_listeners.push(port_id);
                    return;
                }
            };
            self.accept_failing = false;
            if let Err(e) = prepare_socket(&stream) {
                tracing::warn!(port_id, %remote, error = %e, "cannot configure accepted socket");
                continue;
            }
            let local = match stream.local_addr() {
                Ok(local) => local,
                Err(e) => {
                    tracing::warn!(port_id, %remote, error = %e, "getsockname failed");
                    continue;
                }
            };
            tracing::info!(port_id, %remote, %local, "connection accepted");
            if let Some(gate) = tls {
                // The reactor is chosen by load when the handshake is done (it may take up to
                // `connect_timeout_ms`); `hand_over` counts the connection as pending load.
                let peers = self.peers.clone();
                let own = Arc::clone(&self.handle);
                let start = self.next_peer;
                self.next_peer = self.next_peer.wrapping_add(1);
                gate.admit(stream, remote, move |stream, tls| {
                    let accepted = Accepted {
                        stream,
                        port_id,
                        local,
                        remote,
                        tls,
                    };
                    let reactor = peers.get(pick(&peers, node, start)).unwrap_or(&own);
                    if !reactor.hand_over(accepted) {
                        tracing::warn!(port_id, %remote, "reactor gone; connection dropped");
                    }
                });
                continue;
            }
            let accepted = Accepted {
                stream,
                port_id,
                local,
                remote,
                tls: None,
            };
            let target = self.place(node);
            if target == self.id || self.peers.is_empty() {
                self.handle.count_pending();
                self.take_in(Inbound::Connection(accepted));
            } else if !self.peers[target].hand_over(accepted) {
                tracing::warn!(reactor = target, "reactor gone; connection dropped");
            }
        }
    }

    /// The reactor for a new connection of a port on `node`: see [`pick`]; ties rotate.
    fn place(&mut self, node: Option<u32>) -> usize {
        let target = pick(&self.peers, node, self.next_peer);
        self.next_peer = target.wrapping_add(1);
        target
    }

    /// Sets a connection request up on this reactor (see `PendingConnection`).
    fn accept_request(&mut self, request: Box<dyn PendingConnection>) {
        let port_id = request.port_id();
        let token = self.reserve_token().unwrap_or(0);
        let had_acceptor = self.acceptor.is_some();
        let place = Placement {
            reactor: self.id,
            reactors: self.peers.len().max(1),
        };
        let conn = request.accept(&mut self.acceptor, place, token);
        if !had_acceptor {
            if let Some(acceptor) = &self.acceptor {
                let event = EpollEvent::new(EpollFlags::EPOLLIN, ACCEPTOR_KEY);
                if let Err(e) = self.epoll.add(acceptor.fd(), event) {
                    // Without it, disconnects are noticed only through the connections'
                    // own error completions and keep-alive.
                    tracing::error!(reactor = self.id, error = %e, "cannot watch the acceptor");
                }
            }
        }
        match conn {
            Some(conn) => {
                tracing::debug!(reactor = self.id, port_id, token, "connection placed");
                if !self.install(token, conn) {
                    tracing::warn!(port_id, "epoll registration failed; connection dropped");
                }
            }
            None if token != 0 => self.free.push_back(token),
            None => {}
        }
    }

    fn on_acceptor(&mut self) {
        let Some(acceptor) = self.acceptor.as_mut() else {
            return;
        };
        let mut gone = std::mem::take(&mut self.disconnected);
        acceptor.on_event(&mut gone);
        for token in gone.drain(..) {
            let status = self.with_conn(token, |conn, _| conn.on_disconnected());
            self.after_callback(token, status);
        }
        self.disconnected = gone;
    }

    /// Reserves a token (an empty slab entry). `None` when the u32 token space is exhausted.
    fn reserve_token(&mut self) -> Option<u32> {
        match self.free.pop_front() {
            Some(index) => Some(index),
            None => {
                let index = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(None);
                Some(index)
            }
        }
    }

    fn add_connection(&mut self, accepted: Accepted) {
        let Some(index) = self.reserve_token() else {
            tracing::error!("connection table full; connection dropped");
            return;
        };
        let remote = accepted.remote;
        let conn = match (self.factory)(accepted, index) {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(%remote, error = %e, "cannot set up connection");
                self.free.push_back(index);
                return;
            }
        };
        if self.install(index, conn) {
            // Data may already be waiting (the host sends ICReq right after connect); with
            // edge-triggered registration that edge may have passed.
            let status = self.with_conn(index, |conn, io| conn.on_readable(io));
            self.after_callback(index, status);
        } else {
            tracing::warn!(%remote, "epoll registration failed; connection dropped");
        }
    }

    /// Registers `conn` under its reserved token; on failure the token is freed.
    /// The slab keeps `conn` (and so its descriptor) until after the fd has been removed
    /// from this epoll (close path) or the epoll itself is dropped.
    fn install(&mut self, index: u32, conn: Conn) -> bool {
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
        if let Err(e) = self
            .epoll
            .add(conn.fd(), EpollEvent::new(flags, u64::from(index)))
        {
            tracing::debug!(error = %e, "epoll_ctl(ADD) failed");
            self.free.push_back(index);
            return false;
        }
        self.slots[index as usize] = Some(Slot {
            conn,
            out_armed: false,
            closed: false,
        });
        self.handle.connections.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn on_event_listener(&mut self, index: usize) {
        let Some(mut listener) = self.event_listeners.get_mut(index).and_then(Option::take) else {
            return;
        };
        let mut output = std::mem::take(&mut self.listener_output);
        listener.on_event(&mut output);
        let port_id = listener.port_id();
        let node = listener.node();
        let mut keep = true;
        for event in output.drain(..) {
            match event {
                ListenerOutput::Request(request) => {
                    let target = self.place(node);
                    if target == self.id || self.peers.is_empty() {
                        self.handle.count_pending();
                        self.take_in(Inbound::Request(request));
                    } else if !self.peers[target].hand_over_request(request) {
                        tracing::warn!(
                            port_id,
                            reactor = target,
                            "reactor gone; connection refused"
                        );
                    }
                }
                ListenerOutput::Removed => keep = false,
            }
        }
        self.listener_output = output;
        if keep {
            self.event_listeners[index] = Some(listener);
        } else {
            let _ = self.epoll.delete(listener.fd());
            tracing::warn!(port_id, "listener removed; the port no longer accepts");
            // Kept until the reactor exits.
            self.retired_listeners.push(listener);
        }
    }

    fn with_conn(
        &mut self,
        index: u32,
        f: impl FnOnce(&mut dyn Connection, &mut dyn IoSubmit) -> ConnStatus,
    ) -> ConnStatus {
        match self.slots.get_mut(index as usize) {
            Some(Some(slot)) => f(slot.conn.as_mut(), &mut self.engine),
            _ => ConnStatus::Open,
        }
    }

    fn on_connection_event(&mut self, index: u32, flags: EpollFlags, draining: bool) {
        let Some(Some(slot)) = self.slots.get(index as usize) else {
            return;
        };
        if slot.closed {
            return;
        }
        let mut status = ConnStatus::Open;
        let writable = flags.intersects(EpollFlags::EPOLLOUT);
        if writable {
            status = self.with_conn(index, |conn, _| conn.on_writable());
        }
        let readable = EpollFlags::EPOLLIN
            | EpollFlags::EPOLLRDHUP
            | EpollFlags::EPOLLHUP
            | EpollFlags::EPOLLERR;
        // After EPOLLOUT also read: sending may have ended back-pressure (see module doc).
        // A draining reactor takes no new commands; idle connections are closed by the drain.
        if status == ConnStatus::Open && !draining && (writable || flags.intersects(readable)) {
            status = self.with_conn(index, |conn, io| conn.on_readable(io));
        }
        self.after_callback(index, status);
    }

    /// Flushes queued output opportunistically, re-arms EPOLLOUT as needed, or closes.
    fn after_callback(&mut self, index: u32, mut status: ConnStatus) {
        let Some(Some(slot)) = self.slots.get_mut(index as usize) else {
            return;
        };
        if slot.closed {
            self.release_if_drained(index);
            return;
        }
        if status == ConnStatus::Open && slot.conn.wants_write() {
            status = slot.conn.on_writable();
        }
        if status == ConnStatus::Closed {
            self.close(index);
            return;
        }
        let want = slot.conn.wants_write();
        if want != slot.out_armed {
            let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
            if want {
                flags |= EpollFlags::EPOLLOUT;
            }
            let mut event = EpollEvent::new(flags, u64::from(index));
            match self.epoll.modify(slot.conn.fd(), &mut event) {
                Ok(()) => slot.out_armed = want,
                Err(e) => {
                    tracing::warn!(error = %e, "epoll_ctl(MOD) failed; closing connection");
                    self.close(index);
                }
            }
        }
    }

    fn close(&mut self, index: u32) {
        let Some(Some(slot)) = self.slots.get_mut(index as usize) else {
            return;
        };
        if slot.closed {
            return;
        }
        slot.closed = true;
        let _ = self.epoll.delete(slot.conn.fd());
        // Tell the host now, even if buffers must outlive the socket until I/O drains.
        slot.conn.shut_down();
        self.release_if_drained(index);
    }

    /// Drops a closed connection once no backend op can still write into its buffers.
    fn release_if_drained(&mut self, index: u32) {
        let drained = matches!(
            self.slots.get(index as usize),
            Some(Some(slot)) if slot.closed && slot.conn.inflight_ops() == 0
        );
        if drained {
            self.slots[index as usize] = None;
            self.free.push_back(index);
            self.handle.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn reap(&mut self) {
        let completions = &mut self.completions;
        completions.clear();
        self.engine.reap(|tag, res| completions.push((tag, res)));
        // Each connection gets its completions of this turn in one call, so that it answers
        // them with one gather write instead of one `writev` (and one read) per completion.
        // The order among a connection's completions is the ring's, which is arbitrary
        // anyway (NVMe Base 2.0 §3.4.5: no ordering between commands); unstable: no
        // allocation.
        self.completions.sort_unstable_by_key(|&(tag, _)| tag >> 32);
        let mut start = 0;
        while start < self.completions.len() {
            let index = (self.completions[start].0 >> 32) as u32;
            let end = self.completions[start..]
                .iter()
                .position(|&(tag, _)| (tag >> 32) as u32 != index)
                .map_or(self.completions.len(), |n| start + n);
            let done = &self.completions[start..end];
            start = end;
            let Some(Some(slot)) = self.slots.get_mut(index as usize) else {
                for &(tag, res) in done {
                    tracing::error!(tag, res, "completion for an unknown connection");
                }
                continue;
            };
            let status = slot.conn.on_io_completions(done, &mut self.engine);
            // Closed: released once drained. Open: arm EPOLLOUT for what it queued.
            self.after_callback(index, status);
        }
    }

    fn tick(&mut self, now: Instant) {
        self.handle.heartbeat.fetch_add(1, Ordering::Relaxed);
        if self.count_busy {
            self.handle.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        }
        for port_id in std::mem::take(&mut self.paused_listeners) {
            if let Some(listener) = self.listeners.iter().find(|l| l.port_id == port_id) {
                let event = EpollEvent::new(EpollFlags::EPOLLIN, listener_key(port_id));
                if let Err(e) = self.epoll.add(listener.socket.as_fd(), event) {
                    tracing::error!(port_id, error = %e, "cannot resume listener");
                }
            }
        }
        for index in 0..self.slots.len() as u32 {
            let live = matches!(self.slots.get(index as usize), Some(Some(slot)) if !slot.closed);
            if live {
                let status = self.with_conn(index, |conn, io| conn.on_tick(now, io));
                self.after_callback(index, status);
            }
        }
    }

    fn begin_drain(&mut self) {
        for listener in self.listeners.drain(..) {
            let _ = self.epoll.delete(listener.socket.as_fd());
            tracing::info!(port_id = listener.port_id, "listener closed");
        }
        for listener in self.event_listeners.iter_mut().filter_map(Option::take) {
            // The listener is kept (retired) until the reactor exits.
            let _ = self.epoll.delete(listener.fd());
            tracing::info!(port_id = listener.port_id(), "listener closed");
            self.retired_listeners.push(listener);
        }
        tracing::info!(
            reactor = self.id,
            connections = self.live_connections(),
            "stopping: draining connections"
        );
    }

    /// While stopping: close every connection with nothing in flight and nothing to send.
    fn close_drained(&mut self) {
        for index in 0..self.slots.len() as u32 {
            let idle = matches!(
                self.slots.get(index as usize),
                Some(Some(slot)) if !slot.closed && slot.conn.inflight_ops() == 0 && !slot.conn.wants_write()
            );
            if idle {
                self.close(index);
            }
        }
    }

    /// Drain timeout: connections with I/O still in the kernel are leaked rather than freed,
    /// because the kernel may still write into their buffers; the process is about to exit.
    fn abandon_remaining(&mut self) {
        let mut leaked = 0usize;
        for slot in self.slots.iter_mut() {
            if let Some(slot) = slot.take() {
                if slot.conn.inflight_ops() > 0 {
                    leaked += 1;
                    std::mem::forget(slot);
                }
            }
        }
        if leaked > 0 {
            tracing::warn!(
                reactor = self.id,
                connections = leaked,
                "drain timed out with I/O in flight"
            );
        }
    }
}

/// Accepted sockets: non-blocking for the reactor, TCP_NODELAY because NVMe/TCP PDUs are
/// latency-bound request/response traffic (the Linux host sets it too).
pub fn prepare_socket(stream: &TcpStream) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("id", &self.id)
            .field("connections", &self.live_connections())
            .finish_non_exhaustive()
    }
}

// Connection tokens (u32), listener keys and the two fixed keys never collide.
const _: () = assert!(LISTENER_KEY_BASE > u32::MAX as u64);
const _: () = assert!(EVENT_LISTENER_KEY_BASE > LISTENER_KEY_BASE + u16::MAX as u64);
const _: () = assert!(URING_KEY > EVENT_LISTENER_KEY_BASE + u32::MAX as u64);

/// The reactor for a new connection of a port on NUMA node `node`: among the reactors that
/// serve the port (`topology::serving`: those on its node, or all), the one with the fewest
/// connections (served or on their way), ties rotating from `start`.
fn pick(peers: &[Arc<ReactorHandle>], node: Option<u32>, start: usize) -> usize {
    let nodes: Vec<Option<u32>> = peers.iter().map(|p| p.node()).collect();
    let loads: Vec<usize> = peers.iter().map(|p| p.load()).collect();
    topology::least_loaded(&loads, &topology::serving(&nodes, node), start)
}

/// The reactors that serve a port on `node` (for the log), by index.
pub fn serving_reactors(peers: &[Arc<ReactorHandle>], node: Option<u32>) -> Vec<usize> {
    let nodes: Vec<Option<u32>> = peers.iter().map(|p| p.node()).collect();
    let serving = topology::serving(&nodes, node);
    (0..peers.len()).filter(|&r| serving[r]).collect()
}

fn listener_key(port_id: u16) -> u64 {
    LISTENER_KEY_BASE + u64::from(port_id)
}

#[cfg(test)]
mod tests;
