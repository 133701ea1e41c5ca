//! The rdma_cm listener of one configured RDMA port and the per-reactor acceptor that sets
//! its connections up (ARCHITECTURE.md, RDMA contract and placement); the connections are
//! `conn::RdmaConnection`.
//!
//! Readiness model, as for TCP: the listener's and the acceptor's event-channel fds and each
//! connection's completion-channel fd are non-blocking and signal EPOLLIN; the reactor calls
//! `RdmaListener::on_event`, `RdmaAcceptor::on_event` or `RdmaConnection`'s `on_readable` when
//! they fire. The listener only takes connect requests (`PendingConnect`, which may cross
//! threads); the reactor chosen to serve one hands it to its own `RdmaAcceptor`, which moves
//! the new id onto its event channel (`rdma_migrate_id`) and builds the QP, CQ and buffers
//! there. Verbs objects and pools are per reactor (`Rc`, not `Sync`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;
use std::sync::Arc;

use nvme::queue::{PeerInfo, Queue, TransportKind};
use nvme::target::Target;
use thiserror::Error;

use super::cm::{CmLimits, CmRejectStatus, ConnectAccept, ConnectReject, ConnectRequest};
use super::conn::RdmaConnection;
use super::core::{ConnCore, ConnShape, SrqBuffers};
use super::pool::{DevicePools, PoolError, PoolParams};
use super::verbs::{
    self, CmEventKind, CmId, CompletionChannel, CompletionQueue, DetachedId, DeviceCaps,
    EventChannel, ProtectionDomain, QpCaps, QueuePair, SharedReceiveQueue, VerbsError,
};
use crate::conn::ConnStatus;

/// Transport parameters of an RDMA port (from `conf` global limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaParams {
    /// `[[ports]] id`, reported to the core in `PeerInfo`.
    pub port_id: u16,
    /// In-capsule data bytes (IOCCSZ = (64 + this) / 16).
    pub in_capsule_data_size: u32,
    /// MDTS in bytes; each data buffer has this size.
    pub max_data_transfer: u32,
    /// Entries per I/O queue (MQES + 1).
    pub max_queue_entries: u16,
    pub max_io_queues: u16,
    /// Per device: receive capsule buffers shared by all connections (Σ queue depths), or
    /// the size of the shared receive queue.
    pub capsule_buffers: u32,
    /// Per device: response buffers; a connection takes two per queue entry (see
    /// `shape_for`), so this bounds Σ queue depths when receives come from an SRQ.
    pub response_buffers: u32,
    /// Per device: data buffers; commands wait for one when all are busy.
    pub data_buffers: u32,
    /// One shared receive queue per device holding all `capsule_buffers`, instead of a
    /// receive ring per queue pair.
    pub shared_receive_queue: bool,
}

impl RdmaParams {
    /// The pools of one device on one of `reactors` reactors: the per-device counts split
    /// evenly (rounded up), so registered memory does not grow with the reactor count.
    /// Connections are placed by load, so each reactor serves about its share of them; each
    /// share still holds one full-depth queue (receives and responses) when the device's
    /// count does, so that no reactor refuses a queue the whole device could take.
    pub(crate) fn pool_params(&self, reactors: u32) -> PoolParams {
        let share = |n: u32, floor: u32| n.div_ceil(reactors.max(1)).max(n.min(floor));
        let depth = u32::from(self.max_queue_entries);
        PoolParams {
            in_capsule_data_size: self.in_capsule_data_size,
            max_data_transfer: self.max_data_transfer,
            capsule_buffers: share(self.capsule_buffers, depth),
            response_buffers: share(self.response_buffers, 2 * depth),
            data_buffers: share(self.data_buffers, 1),
        }
    }
}

#[derive(Debug, Error)]
pub enum RdmaError {
    /// The kernel has no RDMA stack, no RDMA device is present, or the address is not on an
    /// RDMA-capable interface. The daemon logs one line and keeps serving TCP.
    #[error("RDMA not available: {0}")]
    NotSupported(#[source] VerbsError),
    #[error("no RDMA device present")]
    NoDevice,
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: VerbsError,
    },
    #[error("invalid RDMA pool parameters")]
    Pool(#[source] PoolError),
}

fn is_unsupported(e: &VerbsError) -> bool {
    matches!(
        e.errno(),
        Some(
            libc::ENODEV
                | libc::ENOENT
                | libc::ENOSYS
                | libc::EAFNOSUPPORT
                | libc::EADDRNOTAVAIL
                | libc::EPROTONOSUPPORT
        )
    )
}

/// An error and its source, for the one log line of a failed device set-up.
fn error_text(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// What a burst of the listener's CM events means for the reactor.
#[derive(Debug)]
pub enum ListenerEvent {
    /// A host asks to connect: pick the reactor to serve it and call its
    /// `RdmaAcceptor::accept` there (dropping the request refuses the host).
    Request(PendingConnect),
    /// The device under the listening address was removed: the port accepts no more. Its
    /// connections each get their own DEVICE_REMOVAL on their acceptor's channel
    /// (`RdmaAcceptor::on_event`); drop them once `inflight_ops() == 0` (rdma_cm's part of
    /// the removal waits for them). The listener itself may be dropped or kept; it holds no
    /// device resources.
    /// Known limit: with a provider that cannot disassociate user contexts (rxe), the uverbs
    /// part of the removal also waits until the process closes the device context, which
    /// librdmacm keeps open — `rdma link delete` then completes only when nvmfd exits.
    ListenerRemoved,
}

/// A connect request on its way from the listener to the reactor that serves it. It holds
/// the new id (not yet accepted) and what the acceptor needs to answer it; `Send`.
#[derive(Debug)]
pub struct PendingConnect {
    id: DetachedId,
    conn: verbs::ConnParams,
    params: RdmaParams,
    listen_addr: SocketAddr,
}

impl PendingConnect {
    pub fn port_id(&self) -> u16 {
        self.params.port_id
    }
}

/// A device's shared receive queue and the buffers posted to it. Field order is drop order:
/// the SRQ goes before its buffers.
struct DeviceSrq {
    srq: Rc<SharedReceiveQueue>,
    bufs: SrqBuffers,
}

struct Device {
    pd: Rc<ProtectionDomain>,
    caps: DeviceCaps,
    srq: Option<DeviceSrq>,
    pools: DevicePools,
}

/// Owns no connection: a request leaves it as a `PendingConnect`, whose id holds the event
/// channel by reference count until an acceptor migrates the id to its own channel, and
/// accepted connections report on their acceptor's channel. So to close the port (reload)
/// the listener is simply dropped: the listening id goes at once (the address is free,
/// requests the kernel queued and nobody read are refused), while requests already on their
/// way to a reactor keep the channel open and are accepted there.
#[derive(Debug)]
pub struct RdmaListener {
    // Drop order: the id before the channel it reports on (the id also holds an Arc).
    // `None` once DEVICE_REMOVAL took the listening id away.
    id: Option<CmId>,
    channel: Arc<EventChannel>,
    addr: SocketAddr,
    params: RdmaParams,
    removed: bool,
}

impl RdmaListener {
    /// Binds and listens. Pools are created per device when the first connection on that
    /// device arrives (a wildcard address may span several devices).
    pub fn new(addr: IpAddr, port: u16, params: RdmaParams) -> Result<Self, RdmaError> {
        params.pool_params(1).validate().map_err(RdmaError::Pool)?;
        let addr = SocketAddr::new(addr, port);
        let channel = EventChannel::new().map_err(RdmaError::NotSupported)?;
        if verbs::device_count() == 0 {
            return Err(RdmaError::NoDevice);
        }
        let id = CmId::new(&channel).map_err(RdmaError::NotSupported)?;
        id.bind(addr).map_err(|e| {
            if is_unsupported(&e) {
                RdmaError::NotSupported(e)
            } else {
                RdmaError::Listen { addr, source: e }
            }
        })?;
        // Backlog as the Linux target (nvmet_rdma_enable_port).
        id.listen(128)
            .map_err(|source| RdmaError::Listen { addr, source })?;
        tracing::info!(%addr, port_id = params.port_id, "listening for NVMe/RDMA");
        Ok(Self {
            id: Some(id),
            channel,
            addr,
            params,
            removed: false,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The RDMA device the address is on (`None` for a wildcard address, or once removed).
    pub fn device_name(&self) -> Option<String> {
        self.id.as_ref()?.device_name()
    }

    /// The CM event channel fd (EPOLLIN).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// Drains the listener's CM events. Connections' own events come on their acceptor's
    /// channel, never here: each request's id leaves this channel when it is accepted.
    pub fn on_event(&mut self, out: &mut Vec<ListenerEvent>) {
        loop {
            let event = match self.channel.get_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(error = %e, "reading RDMA CM events failed");
                    return;
                }
            };
            let kind = event.kind();
            let for_listener = self.id.as_ref().is_some_and(|id| event.is_for(id));
            match kind {
                CmEventKind::ConnectRequest => {
                    let conn = event.conn_params();
                    let id = event.take_request_id(&self.channel);
                    // Ack before anything can destroy or migrate the new id: both wait for
                    // the acks of every event reported on it.
                    drop(event);
                    if self.id.is_none() {
                        // Queued before DEVICE_REMOVAL took the listening id: destroying the
                        // new id rejects the host's request.
                        tracing::debug!(addr = %self.addr, "connect request after the port closed; refused");
                        continue;
                    }
                    if let Some(id) = id {
                        out.push(ListenerEvent::Request(PendingConnect {
                            id: id.detach(),
                            conn,
                            params: self.params,
                            listen_addr: self.addr,
                        }));
                    }
                }
                CmEventKind::DeviceRemoval if for_listener => {
                    drop(event);
                    tracing::error!(addr = %self.addr, "RDMA device removed under the listener");
                    // The kernel finishes the removal only once every id on the device is
                    // destroyed: drop the listening id now (its event is acked above).
                    self.id = None;
                    self.removed = true;
                    out.push(ListenerEvent::ListenerRemoved);
                }
                CmEventKind::AddrChange if for_listener => {
                    drop(event);
                    tracing::warn!(addr = %self.addr, "address of the RDMA listener changed");
                }
                other => {
                    // An event for a request id still on its way to its reactor (context 0).
                    drop(event);
                    tracing::debug!(event = ?other, "ignored RDMA CM event on the listener");
                }
            }
        }
    }

    /// Whether DEVICE_REMOVAL hit the listening id (the port no longer accepts).
    pub fn is_removed(&self) -> bool {
        self.removed
    }
}

/// One reactor's side of NVMe/RDMA: the event channel its connections' ids report on, and
/// per device the PD, registered pools and SRQ that its connections share (created with the
/// first connection on that device). Every port's requests placed on this reactor land here.
pub struct RdmaAcceptor {
    reactor: usize,
    /// Reactors sharing each device's pool budget (`RdmaParams::pool_params`).
    reactors: u32,
    // Drop order: devices (their SRQ and pools) before the channel; connections hold their
    // own `Rc`s to what they use.
    devices: HashMap<usize, Device>,
    channel: Arc<EventChannel>,
}

impl std::fmt::Debug for RdmaAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaAcceptor")
            .field("reactor", &self.reactor)
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl RdmaAcceptor {
    /// The acceptor of reactor `reactor` out of `reactors`.
    pub fn new(reactor: usize, reactors: u32) -> Result<Self, RdmaError> {
        Ok(Self {
            reactor,
            reactors,
            devices: HashMap::new(),
            channel: EventChannel::new().map_err(RdmaError::NotSupported)?,
        })
    }

    /// The CM event channel fd of this reactor's connections (EPOLLIN).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// Sets a connection up on this reactor and accepts it, or refuses the host (`None`).
    /// `token` is the reactor-unique connection token (0: none left, refused).
    pub fn accept(
        &mut self,
        request: PendingConnect,
        target: &Arc<Target>,
        token: u32,
    ) -> Option<RdmaConnection> {
        let PendingConnect {
            id,
            conn,
            params,
            listen_addr,
        } = request;
        let id = match id.adopt(&self.channel) {
            Ok(id) => id,
            Err(e) => {
                // Dropping the request destroyed the id, which refuses the host.
                tracing::error!(reactor = self.reactor, error = %e, "cannot take over the RDMA connect request");
                return None;
            }
        };
        if token == 0 {
            tracing::error!("connection table full; RDMA connect request refused");
            Self::reject(&id, id.peer_addr(), CmRejectStatus::NoResources);
            return None;
        }
        self.connect(id, &conn, &params, listen_addr, target, token)
    }

    /// Drains the CM events of this reactor's connections into `disconnected` (tokens of
    /// connections that are gone: host disconnect, timewait exit, connect error, device
    /// removal): call `on_disconnected()` on each, then drop it once `inflight_ops() == 0`.
    pub fn on_event(&mut self, disconnected: &mut Vec<u32>) {
        loop {
            let event = match self.channel.get_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(error = %e, "reading RDMA CM events failed");
                    return;
                }
            };
            let kind = event.kind();
            let token = event.id_context() as u32;
            match kind {
                CmEventKind::Established => {
                    drop(event);
                    tracing::debug!(token, reactor = self.reactor, "RDMA connection established");
                }
                CmEventKind::Disconnected
                | CmEventKind::TimewaitExit
                | CmEventKind::DeviceRemoval
                | CmEventKind::AddrChange
                | CmEventKind::Rejected
                | CmEventKind::ConnectError
                | CmEventKind::Unreachable => {
                    let status = event.status();
                    drop(event);
                    if kind == CmEventKind::DeviceRemoval {
                        // Forget the device's pools; connections still hold theirs until
                        // they are dropped.
                        self.devices.clear();
                    }
                    if token != 0 {
                        tracing::debug!(token, ?kind, status, "RDMA connection event");
                        disconnected.push(token);
                    }
                }
                CmEventKind::ConnectRequest
                | CmEventKind::AddrResolved
                | CmEventKind::AddrError
                | CmEventKind::RouteResolved
                | CmEventKind::RouteError
                | CmEventKind::Other(_) => {
                    drop(event);
                    tracing::debug!(?kind, "ignored RDMA CM event");
                }
            }
        }
    }

    fn reject(id: &CmId, peer: Option<SocketAddr>, status: CmRejectStatus) {
        tracing::warn!(peer = ?peer, %status, "rejecting NVMe/RDMA connect request");
        if let Err(e) = id.reject(&ConnectReject { status }.encode()) {
            tracing::warn!(error = %e, "rdma_reject failed");
        }
    }

    fn device(&mut self, id: &CmId, params: &RdmaParams) -> Result<&Device, String> {
        let key = id.device_key();
        if !self.devices.contains_key(&key) {
            let caps = id.device_caps().map_err(|e| e.to_string())?;
            let pd = id.alloc_pd().map_err(|e| e.to_string())?;
            let pool = params.pool_params(self.reactors);
            let pools = DevicePools::registered(&pool, &pd).map_err(|e| error_text(&e))?;
            tracing::info!(
                reactor = self.reactor,
                capsules = pool.capsule_buffers,
                responses = pool.response_buffers,
                data_buffers = pool.data_buffers,
                data_buffer_size = pool.max_data_transfer,
                "registered RDMA buffer pools for a device"
            );
            let srq = if params.shared_receive_queue {
                Self::create_srq(&pd, &caps, &pools, params.max_queue_entries)?
            } else {
                None
            };
            self.devices.insert(
                key,
                Device {
                    pd,
                    caps,
                    srq,
                    pools,
                },
            );
        }
        self.devices
            .get(&key)
            .ok_or_else(|| "device vanished".into())
    }

    /// The device's SRQ with every capsule buffer posted to it, bounded by the device's
    /// `max_srq_wr`; `None` (per-QP receive rings) when the device has no SRQ support.
    fn create_srq(
        pd: &Rc<ProtectionDomain>,
        caps: &DeviceCaps,
        pools: &DevicePools,
        queue_entries: u16,
    ) -> Result<Option<DeviceSrq>, String> {
        if caps.max_srq_wr == 0 {
            tracing::warn!(
                "the RDMA device has no shared receive queues; using a receive ring per queue pair"
            );
            return Ok(None);
        }
        let wanted = pools.capsules.available() as u32;
        let entries = wanted.min(caps.max_srq_wr);
        if entries < wanted {
            tracing::warn!(
                wanted,
                entries,
                "shared receive queue limited by the device (max_srq_wr)"
            );
        }
        if entries < u32::from(queue_entries) {
            // Still correct: a host at full depth is slowed by receiver-not-ready retries.
            tracing::warn!(
                entries,
                queue_entries,
                "shared receive queue smaller than one queue's depth"
            );
        }
        let srq = SharedReceiveQueue::new(pd, entries).map_err(|e| error_text(&e))?;
        let bufs = pools
            .capsules
            .take_many(entries as usize)
            .ok_or_else(|| "capsule pool smaller than the SRQ".to_owned())?;
        let bufs = SrqBuffers::new(bufs);
        bufs.post_all(&mut |wr_id, buf| srq.post_recv(wr_id, buf))
            .map_err(|e| error_text(&e))?;
        tracing::info!(
            entries,
            max_srq_wr = caps.max_srq_wr,
            "shared receive queue created for a device"
        );
        Ok(Some(DeviceSrq { srq, bufs }))
    }

    fn connect(
        &mut self,
        id: CmId,
        params: &verbs::ConnParams,
        rdma_params: &RdmaParams,
        listen_addr: SocketAddr,
        target: &Arc<Target>,
        token: u32,
    ) -> Option<RdmaConnection> {
        let peer = id.peer_addr();
        let limits = CmLimits {
            max_io_queues: rdma_params.max_io_queues,
            max_queue_entries: rdma_params.max_queue_entries,
        };
        let geometry = match ConnectRequest::decode(&params.private_data)
            .and_then(|req| req.validate(&limits))
        {
            Ok(g) => g,
            Err(status) => {
                Self::reject(&id, peer, status);
                return None;
            }
        };
        let rdma_params = *rdma_params;
        let reactor = self.reactor;
        let device = match self.device(&id, &rdma_params) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot set up the RDMA device");
                Self::reject(&id, peer, CmRejectStatus::NoResources);
                return None;
            }
        };
        let shape = match shape_for(geometry.depth, params, &device.caps, &rdma_params) {
            Ok(s) => s,
            Err(status) => {
                Self::reject(&id, peer, status);
                return None;
            }
        };
        let pd = Rc::clone(&device.pd);
        let pools = device.pools.clone();
        let srq = device
            .srq
            .as_ref()
            .map(|s| (Rc::clone(&s.srq), s.bufs.clone()));
        let responder_resources = params.responder_resources.min(device.caps.max_qp_rd_atom);
        let (cq_entries, qp_caps) = queue_sizes(&shape);

        let built = CompletionChannel::new(&pd).and_then(|ch| {
            let cq = CompletionQueue::new(&ch, cq_entries)?;
            Ok((ch, Rc::new(cq)))
        });
        let (channel, cq) = match built {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "cannot create the RDMA completion queue");
                Self::reject(&id, peer, CmRejectStatus::NoResources);
                return None;
            }
        };
        let mut qp = match QueuePair::create(id, &pd, &cq, srq.as_ref().map(|(q, _)| q), qp_caps) {
            Ok(qp) => qp,
            Err((id, e)) => {
                tracing::error!(error = %e, "cannot create the RDMA queue pair");
                Self::reject(&id, peer, CmRejectStatus::NoResources);
                return None;
            }
        };
        qp.id().set_context(token as usize);
        let local = qp.id().local_addr().unwrap_or(listen_addr);
        let remote = peer.unwrap_or(SocketAddr::new(listen_addr.ip(), 0));
        let queue = Queue::new(
            Arc::clone(target),
            PeerInfo {
                transport: TransportKind::Rdma,
                port_id: rdma_params.port_id,
                local,
                remote,
                reactor: u16::try_from(reactor).ok(),
            },
        );
        let core = match &srq {
            Some((_, bufs)) => ConnCore::with_srq(queue, token, shape, pools, bufs),
            None => ConnCore::new(queue, token, shape, pools),
        };
        let Some(mut core) = core else {
            // Receive or response buffers of the device are all taken by other connections.
            Self::reject(qp.id(), peer, CmRejectStatus::NoResources);
            return None;
        };
        if core.post_initial_receives(&mut qp) == ConnStatus::Closed {
            tracing::error!(token, "posting receive buffers failed");
            return None;
        }
        if let Err(e) = cq.req_notify() {
            tracing::error!(token, error = %e, "arming the RDMA completion queue failed");
            return None;
        }
        let accept = ConnectAccept {
            crqsize: geometry.depth,
        };
        if let Err(e) = qp
            .id()
            .accept(&accept.encode(), responder_resources, shape.ord)
        {
            tracing::error!(token, error = %e, "rdma_accept failed");
            return None;
        }
        tracing::info!(
            token,
            reactor,
            peer = ?remote,
            qid = geometry.qid,
            depth = geometry.depth,
            ord = shape.ord,
            srq = srq.is_some(),
            "accepted NVMe/RDMA connection"
        );
        Some(RdmaConnection::new(qp, core, cq, channel, token))
    }
}

/// Contexts, ORD and limits for a validated request (pure; unit-tested).
pub(crate) fn shape_for(
    depth: u16,
    params: &verbs::ConnParams,
    caps: &DeviceCaps,
    rdma: &RdmaParams,
) -> Result<ConnShape, CmRejectStatus> {
    // Our ORD: what the host grants (its responder resources, reported to the passive side
    // as initiator_depth) capped by the device. Without it no host data can be read.
    let ord = params.initiator_depth.min(caps.max_qp_init_rd_atom);
    if ord == 0 {
        return Err(CmRejectStatus::InvalidOrd);
    }
    // Two contexts per entry: a response whose SEND completion is not yet polled still
    // occupies one while the host already sends the next command (as nvmet's 2× rsps).
    let contexts = depth.saturating_mul(2);
    let shape = ConnShape {
        depth,
        contexts,
        ord,
        in_capsule_data_size: rdma.in_capsule_data_size,
        max_data_transfer: rdma.max_data_transfer,
    };
    let (cq_entries, qp) = queue_sizes(&shape);
    if qp.max_send_wr > caps.max_qp_wr
        || qp.max_recv_wr > caps.max_qp_wr
        || cq_entries > caps.max_cqe
    {
        return Err(CmRejectStatus::NoResources);
    }
    Ok(shape)
}

/// CQ and QP sizes: every context has at most two signaled send WRs outstanding (READ, or
/// WRITE + SEND), plus `depth` receives, all on one CQ. With an SRQ the QP has no receive
/// queue of its own, but the host still has at most `depth` capsules in flight to it, so the
/// CQ is sized the same.
fn queue_sizes(shape: &ConnShape) -> (u32, QpCaps) {
    let max_send_wr = u32::from(shape.contexts) * 2;
    let max_recv_wr = u32::from(shape.depth);
    (
        max_send_wr + max_recv_wr,
        QpCaps {
            max_send_wr,
            max_recv_wr,
        },
    )
}

#[cfg(test)]
mod tests;
