//! RAII wrappers over librdmacm and libibverbs: the only module of nvmfd with verbs `unsafe`.
//!
//! Ownership mirrors the verbs object graph so that Rust's drop order releases in the order
//! the libraries require: a `QueuePair` (QP + its connection `CmId`) before the
//! `CompletionQueue` it uses, the CQ before its `CompletionChannel`, every `MemoryRegion`
//! before the `ProtectionDomain` (MRs hold an `Rc` to their PD), and `CmId`s before the
//! `EventChannel` they report on (ids hold an `Arc` to it: a connection's id moves to another
//! reactor's channel, `DetachedId`). Every constructor that fails
//! part-way releases what it created.

use std::ffi::c_void;
use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::sync::Arc;

use rdma_sys as sys;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum VerbsError {
    #[error("{call} failed")]
    Call {
        call: &'static str,
        #[source]
        source: io::Error,
    },
}

impl VerbsError {
    fn last(call: &'static str) -> Self {
        Self::Call {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// Verbs calls report errors either as `-1` + errno or as a positive errno.
    fn from_ret(call: &'static str, ret: i32) -> Self {
        let source = if ret > 0 {
            io::Error::from_raw_os_error(ret)
        } else {
            io::Error::last_os_error()
        };
        Self::Call { call, source }
    }

    /// `Ok` for a 0 return, else the error of `call`.
    fn check(call: &'static str, ret: i32) -> Result<(), Self> {
        if ret == 0 {
            Ok(())
        } else {
            Err(Self::from_ret(call, ret))
        }
    }

    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Call { source, .. } => source.raw_os_error(),
        }
    }
}

fn set_nonblocking(fd: RawFd, call: &'static str) -> Result<(), VerbsError> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL touch no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(VerbsError::last(call));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(VerbsError::last(call));
    }
    Ok(())
}

fn is_would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

// ---------------------------------------------------------------------------------------------
// Connection manager

/// Number of RDMA devices librdmacm can use (0 when the kernel has no RDMA stack or no
/// device, e.g. no `rdma_rxe` link on a machine without an HCA).
pub fn device_count() -> usize {
    let mut n = 0;
    // SAFETY: rdma_get_devices returns an owned, NULL-terminated list (or NULL) and the count.
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    if !list.is_null() {
        // SAFETY: the list came from rdma_get_devices and is freed once.
        unsafe { sys::rdma_free_devices(list) };
    }
    n.max(0) as usize
}

/// An rdma_cm event channel; its fd is non-blocking and pollable (EPOLLIN = events pending).
#[derive(Debug)]
pub struct EventChannel {
    raw: NonNull<sys::rdma_event_channel>,
}

impl EventChannel {
    pub fn new() -> Result<Arc<Self>, VerbsError> {
        // SAFETY: no arguments; returns an owned channel or NULL with errno set.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("rdma_create_event_channel"))?;
        let channel = Self { raw };
        set_nonblocking(channel.fd(), "fcntl(rdma_cm channel)")?;
        Ok(Arc::new(channel))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: `raw` is a live channel owned by self.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// The next pending event, or `None` when the channel is drained.
    pub fn get_event(&self) -> Result<Option<CmEvent>, VerbsError> {
        let mut event = ptr::null_mut();
        // SAFETY: the channel is live; on success `event` points to an event we must ack.
        let ret = unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut event) };
        if ret != 0 {
            let err = io::Error::last_os_error();
            if is_would_block(&err) {
                return Ok(None);
            }
            return Err(VerbsError::Call {
                call: "rdma_get_cm_event",
                source: err,
            });
        }
        Ok(NonNull::new(event).map(|raw| CmEvent { raw }))
    }
}

// SAFETY: a channel is an fd plus librdmacm's bookkeeping; librdmacm serialises its use
// internally (an id's migration writes the new channel's fd, events are read from it). nvmfd
// reads events only on the reactor that owns the channel; other threads only keep it alive
// (a `DetachedId` on its way to another reactor) or drop it.
unsafe impl Send for EventChannel {}
// SAFETY: as for `Send`: shared references only read the fd.
unsafe impl Sync for EventChannel {}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd belongs to the channel and stays open until the channel is dropped,
        // which the borrow's lifetime (tied to &self) rules out.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every CmId and DetachedId using this channel holds an Arc to it, so none is
        // left (closing the channel would destroy their kernel ids).
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) }
    }
}

/// CM event kinds nvmfd acts on; the rest are logged by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    ConnectRequest,
    Established,
    Disconnected,
    TimewaitExit,
    DeviceRemoval,
    Rejected,
    ConnectError,
    Unreachable,
    AddrChange,
    /// Active side (host): `resolve_addr` found the local RDMA device for the destination.
    AddrResolved,
    AddrError,
    /// Active side: `resolve_route` found the path; the id can `connect`.
    RouteResolved,
    RouteError,
    Other(u32),
}

/// Connection parameters carried by a CONNECT_REQUEST, copied out of the event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParams {
    pub private_data: Vec<u8>,
    /// From the passive side's view (the kernel swaps the host's values): how many RDMA READs
    /// we may have outstanding towards the host (our ORD) ...
    pub initiator_depth: u8,
    /// ... and how many the host may have outstanding towards us (our IRD).
    pub responder_resources: u8,
}

/// One event from an `EventChannel`; acknowledged (`rdma_ack_cm_event`) on drop.
#[derive(Debug)]
pub struct CmEvent {
    raw: NonNull<sys::rdma_cm_event>,
}

impl CmEvent {
    pub fn kind(&self) -> CmEventKind {
        use sys::rdma_cm_event_type::*;
        // SAFETY: the event stays valid until acked in Drop.
        match unsafe { (*self.raw.as_ptr()).event } {
            RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
            RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            other => CmEventKind::Other(other),
        }
    }

    pub fn status(&self) -> i32 {
        // SAFETY: as in `kind`.
        unsafe { (*self.raw.as_ptr()).status }
    }

    /// The `context` word of the id the event is about (nvmfd stores connection tokens there;
    /// the listener's own id has context 0).
    pub fn id_context(&self) -> usize {
        // SAFETY: as in `kind`; `id` is never NULL for the events a listener receives.
        unsafe {
            let id = (*self.raw.as_ptr()).id;
            if id.is_null() {
                0
            } else {
                (*id).context as usize
            }
        }
    }

    /// Whether the event is about the listening id itself (e.g. DEVICE_REMOVAL of the port).
    pub fn is_for(&self, id: &CmId) -> bool {
        // SAFETY: as in `kind`.
        unsafe { (*self.raw.as_ptr()).id == id.raw.as_ptr() }
    }

    /// Connection parameters of a CONNECT_REQUEST, private data copied and bounded by the
    /// length the CM reports (at most 255 bytes: the field is a u8).
    pub fn conn_params(&self) -> ConnParams {
        // SAFETY: as in `kind`. For connection events `param.conn` is the active union member;
        // `private_data` points to `private_data_len` bytes owned by the event.
        unsafe {
            let conn = &(*self.raw.as_ptr()).param.conn;
            let data = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            ConnParams {
                private_data: data,
                initiator_depth: conn.initiator_depth,
                responder_resources: conn.responder_resources,
            }
        }
    }

    /// Takes ownership of the new connection id of a CONNECT_REQUEST (librdmacm creates it
    /// on our channel; we must destroy it, after acking this event).
    pub fn take_request_id(&self, channel: &Arc<EventChannel>) -> Option<CmId> {
        if self.kind() != CmEventKind::ConnectRequest {
            return None;
        }
        // SAFETY: as in `kind`; for CONNECT_REQUEST `id` is a fresh id nobody else owns.
        let raw = unsafe { (*self.raw.as_ptr()).id };
        NonNull::new(raw).map(|raw| CmId {
            raw,
            _channel: Arc::clone(channel),
        })
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: each event is acked exactly once, here.
        unsafe {
            sys::rdma_ack_cm_event(self.raw.as_ptr());
        }
    }
}

/// Device limits needed for queue sizing and accept parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    /// Max outstanding RDMA READs we may issue per QP (our ORD limit).
    pub max_qp_init_rd_atom: u8,
    /// Max outstanding RDMA READs a peer may issue to us per QP (our IRD limit).
    pub max_qp_rd_atom: u8,
    /// Largest shared receive queue (0: the device has no SRQ support).
    pub max_srq_wr: u32,
}

/// An rdma_cm id: the listener's, or one connection's (which then also owns the QP).
#[derive(Debug)]
pub struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    _channel: Arc<EventChannel>,
}

fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::write(ptr::addr_of_mut!(storage).cast(), sin) };
            (storage, std::mem::size_of::<libc::sockaddr_in>() as _)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { ptr::write(ptr::addr_of_mut!(storage).cast(), sin6) };
            (storage, std::mem::size_of::<libc::sockaddr_in6>() as _)
        }
    }
}

fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Connection parameters of an accept or a connect. `private_data` must outlive their use
/// (the CM copies at most 255 bytes of it during the call).
fn conn_param(
    private_data: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
) -> sys::rdma_conn_param {
    sys::rdma_conn_param {
        private_data: private_data.as_ptr().cast(),
        private_data_len: private_data.len().min(255) as u8,
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count: 7,
        // 7 = retry forever on receiver-not-ready: a peer that outruns the reposted receives
        // is slowed down, not disconnected (back-pressure; the Linux host sets 7 as well).
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

impl CmId {
    /// A reliable-connected (RDMA_PS_TCP) id on `channel`.
    pub fn new(channel: &Arc<EventChannel>) -> Result<Self, VerbsError> {
        let mut raw = ptr::null_mut();
        // SAFETY: channel is live; on success `raw` is an id we own.
        let ret = unsafe {
            sys::rdma_create_id(
                channel.raw.as_ptr(),
                &mut raw,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            return Err(VerbsError::from_ret("rdma_create_id", ret));
        }
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("rdma_create_id"))?;
        Ok(Self {
            raw,
            _channel: Arc::clone(channel),
        })
    }

    pub fn bind(&self, addr: SocketAddr) -> Result<(), VerbsError> {
        let (mut storage, _len) = to_sockaddr(addr);
        // SAFETY: id is live; the address is a valid sockaddr that rdma_bind_addr copies.
        let ret =
            unsafe { sys::rdma_bind_addr(self.raw.as_ptr(), ptr::addr_of_mut!(storage).cast()) };
        VerbsError::check("rdma_bind_addr", ret)
    }

    pub fn listen(&self, backlog: i32) -> Result<(), VerbsError> {
        // SAFETY: id is live and bound.
        let ret = unsafe { sys::rdma_listen(self.raw.as_ptr(), backlog) };
        VerbsError::check("rdma_listen", ret)
    }

    /// Stores `token` in the id's context word so that CM events can be routed.
    pub fn set_context(&self, token: usize) {
        // SAFETY: id is live; `context` is an opaque word librdmacm never dereferences.
        unsafe { (*self.raw.as_ptr()).context = token as *mut c_void }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: id is live; the route's address union holds a sockaddr_storage-sized value.
        unsafe {
            let addr = &(*self.raw.as_ptr()).route.addr;
            from_sockaddr(&addr.src_addr_union.src_storage)
        }
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in `local_addr`.
        unsafe {
            let addr = &(*self.raw.as_ptr()).route.addr;
            from_sockaddr(&addr.dst_addr_union.dst_storage)
        }
    }

    /// The verbs device this id is bound to (NULL for a wildcard listener before any request).
    fn context_ptr(&self) -> *mut sys::ibv_context {
        // SAFETY: id is live.
        unsafe { (*self.raw.as_ptr()).verbs }
    }

    /// The name of the verbs device this id is bound to (`mlx5_0`, `rxe0`): `None` for a
    /// wildcard listener, which is bound to no device.
    pub fn device_name(&self) -> Option<String> {
        let ctx = self.context_ptr();
        if ctx.is_null() {
            return None;
        }
        // SAFETY: ctx is the live device context of this id, and its `device` lives as long
        // as the context; ibv_get_device_name only reads that device.
        let name = unsafe { sys::ibv_get_device_name((*ctx).device) };
        if name.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated name stored in the device, valid while the context is;
        // copied out at once.
        let name = unsafe { std::ffi::CStr::from_ptr(name) };
        Some(name.to_string_lossy().into_owned())
    }

    /// An opaque, stable key for the device (used to find the per-device pools).
    pub fn device_key(&self) -> usize {
        self.context_ptr() as usize
    }

    pub fn device_caps(&self) -> Result<DeviceCaps, VerbsError> {
        let ctx = self.context_ptr();
        if ctx.is_null() {
            return Err(VerbsError::Call {
                call: "ibv_query_device",
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: ctx is the live device context of this id; attr is writable.
        let ret = unsafe { sys::ibv_query_device(ctx, attr.as_mut_ptr()) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_query_device", ret));
        }
        // SAFETY: ibv_query_device filled the structure.
        let attr = unsafe { attr.assume_init() };
        Ok(DeviceCaps {
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_qp_init_rd_atom: attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
            max_qp_rd_atom: attr.max_qp_rd_atom.clamp(0, 255) as u8,
            max_srq_wr: if attr.max_srq > 0 {
                attr.max_srq_wr.max(0) as u32
            } else {
                0
            },
        })
    }

    pub fn alloc_pd(&self) -> Result<Rc<ProtectionDomain>, VerbsError> {
        let ctx = self.context_ptr();
        if ctx.is_null() {
            return Err(VerbsError::Call {
                call: "ibv_alloc_pd",
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        // SAFETY: ctx is a live device context (owned by librdmacm for the process lifetime).
        let raw = unsafe { sys::ibv_alloc_pd(ctx) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_alloc_pd"))?;
        Ok(Rc::new(ProtectionDomain { raw, ctx }))
    }

    /// Accepts a connection request with the given private data and RDMA read limits.
    pub fn accept(
        &self,
        private_data: &[u8],
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<(), VerbsError> {
        let mut param = conn_param(private_data, responder_resources, initiator_depth);
        // SAFETY: id is live with a QP; param and private data outlive the call.
        let ret = unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut param) };
        VerbsError::check("rdma_accept", ret)
    }

    pub fn reject(&self, private_data: &[u8]) -> Result<(), VerbsError> {
        // SAFETY: id is live; the private data outlives the call.
        let ret = unsafe {
            sys::rdma_reject(
                self.raw.as_ptr(),
                private_data.as_ptr().cast(),
                private_data.len().min(255) as u8,
            )
        };
        VerbsError::check("rdma_reject", ret)
    }

    /// Active side: starts resolving `dst` to a local RDMA device (the id binds to it);
    /// ADDR_RESOLVED or ADDR_ERROR follows on the channel.
    pub fn resolve_addr(&self, dst: SocketAddr, timeout_ms: i32) -> Result<(), VerbsError> {
        let (mut storage, _len) = to_sockaddr(dst);
        // SAFETY: id is live; src NULL lets the CM pick the source; dst is a valid sockaddr
        // that rdma_resolve_addr copies before returning.
        let ret = unsafe {
            sys::rdma_resolve_addr(
                self.raw.as_ptr(),
                ptr::null_mut(),
                ptr::addr_of_mut!(storage).cast(),
                timeout_ms,
            )
        };
        VerbsError::check("rdma_resolve_addr", ret)
    }

    /// Active side, after ADDR_RESOLVED: ROUTE_RESOLVED or ROUTE_ERROR follows.
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), VerbsError> {
        // SAFETY: id is live and its address is resolved.
        let ret = unsafe { sys::rdma_resolve_route(self.raw.as_ptr(), timeout_ms) };
        VerbsError::check("rdma_resolve_route", ret)
    }

    /// Active side, with a QP on the id: sends the connect request with `private_data`.
    /// `responder_resources`: RDMA READs the peer may have outstanding towards us;
    /// `initiator_depth`: those we may have outstanding towards the peer. ESTABLISHED,
    /// REJECTED, UNREACHABLE or CONNECT_ERROR follows.
    pub fn connect(
        &self,
        private_data: &[u8],
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<(), VerbsError> {
        let mut param = conn_param(private_data, responder_resources, initiator_depth);
        // SAFETY: id is live with a QP (rdma_connect takes its number from id->qp); param
        // and the private data outlive the call, which copies them.
        let ret = unsafe { sys::rdma_connect(self.raw.as_ptr(), &mut param) };
        VerbsError::check("rdma_connect", ret)
    }

    pub fn disconnect(&self) -> Result<(), VerbsError> {
        // SAFETY: id is live.
        let ret = unsafe { sys::rdma_disconnect(self.raw.as_ptr()) };
        VerbsError::check("rdma_disconnect", ret)
    }
}

impl CmId {
    /// Takes the id off this thread for another reactor to `adopt` it. Only ids without a
    /// QP (a CONNECT_REQUEST's new id, before accept) are detached.
    pub fn detach(self) -> DetachedId {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again, so the Arc is moved out exactly once
        // and the id is not destroyed here.
        let channel = unsafe { ptr::read(&me._channel) };
        DetachedId {
            raw: me.raw,
            _channel: channel,
        }
    }
}

/// A connection's id between its CONNECT_REQUEST, read on the listener's reactor, and its
/// adoption by the reactor that serves the connection. It keeps the listener's channel open
/// (closing a channel destroys the kernel ids reported on it) until `adopt` has moved the id
/// to the serving reactor's channel (`rdma_migrate_id`); dropped unadopted, it destroys the
/// id, which refuses the host's connect request.
#[derive(Debug)]
pub struct DetachedId {
    raw: NonNull<sys::rdma_cm_id>,
    _channel: Arc<EventChannel>,
}

// SAFETY: the id is owned by this value alone (no QP, no other handle) and used by one thread
// at a time; librdmacm ids are bound to an event channel, not to a thread.
unsafe impl Send for DetachedId {}

impl DetachedId {
    /// Moves the id's events to `channel` (owned by the calling reactor) and returns the id.
    pub fn adopt(self, channel: &Arc<EventChannel>) -> Result<CmId, VerbsError> {
        // SAFETY: both the id and the channel are live; every event reported for the id on
        // the old channel was acked by the listener (rdma_migrate_id waits for those acks).
        let ret = unsafe { sys::rdma_migrate_id(self.raw.as_ptr(), channel.raw.as_ptr()) };
        if ret != 0 {
            return Err(VerbsError::from_ret("rdma_migrate_id", ret));
        }
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; its Arc to the old channel is
        // released here, after the migration.
        drop(unsafe { ptr::read(&me._channel) });
        Ok(CmId {
            raw: me.raw,
            _channel: Arc::clone(channel),
        })
    }
}

impl Drop for DetachedId {
    fn drop(&mut self) {
        // SAFETY: never adopted, so the id is live and owned; the old channel (held by
        // `_channel`) is still open.
        unsafe {
            sys::rdma_destroy_id(self.raw.as_ptr());
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: id is live and owned; its events were acked (CmEvent acks on drop and never
        // outlives the reactor iteration that read it), and any QP was destroyed by
        // `QueuePair::drop` first.
        unsafe {
            sys::rdma_destroy_id(self.raw.as_ptr());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Verbs resources

#[derive(Debug)]
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    ctx: *mut sys::ibv_context,
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Rc to it, so none is left.
        let ret = unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_dealloc_pd failed");
        }
    }
}

/// A registered memory region. The target registers for local access only
/// (`IBV_ACCESS_LOCAL_WRITE`: the HCA may write into it for receives and RDMA READ results;
/// no remote access is ever granted); the host side (`nvmfd-perf`) also grants remote read
/// and write, for the keyed SGL data blocks the target moves data through.
#[derive(Debug)]
pub struct MemoryRegion {
    raw: NonNull<sys::ibv_mr>,
    _pd: Rc<ProtectionDomain>,
}

impl MemoryRegion {
    /// Registers `len` bytes at `addr`. The caller keeps the memory mapped for the MR's life
    /// (the pool declares the MR before its mapping, so the MR drops first).
    pub fn register_local(
        pd: &Rc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
    ) -> Result<Self, VerbsError> {
        Self::register(pd, addr, len, sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
    }

    /// Registers `len` bytes at `addr` for local write and remote read and write: the peer
    /// gets the rkey (NVMe RDMA 1.0b §2.2, host buffers of keyed SGL data blocks).
    pub fn register_remote(
        pd: &Rc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
    ) -> Result<Self, VerbsError> {
        use sys::ibv_access_flags as a;
        Self::register(
            pd,
            addr,
            len,
            a::IBV_ACCESS_LOCAL_WRITE | a::IBV_ACCESS_REMOTE_READ | a::IBV_ACCESS_REMOTE_WRITE,
        )
    }

    fn register(
        pd: &Rc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: sys::ibv_access_flags,
    ) -> Result<Self, VerbsError> {
        // SAFETY: pd is live; addr/len describe a mapping the caller keeps alive.
        let raw = unsafe { sys::ibv_reg_mr(pd.raw.as_ptr(), addr.cast(), len, access.0 as i32) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_reg_mr"))?;
        Ok(Self {
            raw,
            _pd: Rc::clone(pd),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is live.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: the MR is live.
        unsafe { (*self.raw.as_ptr()).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: the MR is live and deregistered once; no WR referencing it is outstanding
        // because QPs are destroyed before the pools they use are released.
        let ret = unsafe { sys::ibv_dereg_mr(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_dereg_mr failed");
        }
    }
}

/// A completion channel: its non-blocking fd becomes readable when an armed CQ has a
/// completion (same readiness model as a socket).
#[derive(Debug)]
pub struct CompletionChannel {
    raw: NonNull<sys::ibv_comp_channel>,
    _pd: Rc<ProtectionDomain>,
}

impl CompletionChannel {
    pub fn new(pd: &Rc<ProtectionDomain>) -> Result<Rc<Self>, VerbsError> {
        // SAFETY: pd.ctx is the live device context the PD was allocated on.
        let raw = unsafe { sys::ibv_create_comp_channel(pd.ctx) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_comp_channel"))?;
        let channel = Self {
            raw,
            _pd: Rc::clone(pd),
        };
        set_nonblocking(channel.fd(), "fcntl(completion channel)")?;
        Ok(Rc::new(channel))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is live.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: as for `EventChannel`: open for as long as &self lives.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel holds an Rc to it, so none is left.
        let ret = unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_comp_channel failed");
        }
    }
}

/// One polled work completion, copied out of `ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or the failure status (flush errors after a disconnect, …).
    pub status: u32,
    pub opcode: WcOpcode,
    pub byte_len: u32,
}

impl WorkCompletion {
    pub fn is_success(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
    /// Other opcodes, or unspecified (errored completions do not carry a valid opcode).
    Other(u32),
}

#[derive(Debug)]
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    channel: Rc<CompletionChannel>,
}

impl CompletionQueue {
    pub fn new(channel: &Rc<CompletionChannel>, entries: u32) -> Result<Self, VerbsError> {
        let entries = i32::try_from(entries).map_err(|_| VerbsError::Call {
            call: "ibv_create_cq",
            source: io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // SAFETY: channel and its device context are live.
        let raw = unsafe {
            sys::ibv_create_cq(
                (*channel.raw.as_ptr()).context,
                entries,
                ptr::null_mut(),
                channel.raw.as_ptr(),
                0,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_cq"))?;
        Ok(Self {
            raw,
            channel: Rc::clone(channel),
        })
    }

    /// Arms the CQ: the channel fd becomes readable at the next completion.
    pub fn req_notify(&self) -> Result<(), VerbsError> {
        // SAFETY: the CQ is live.
        let ret = unsafe { sys::ibv_req_notify_cq(self.raw.as_ptr(), 0) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    /// Consumes pending channel events for this CQ (each acked at once, so destroying the CQ
    /// never waits). Returns how many there were.
    pub fn get_events(&self) -> Result<u32, VerbsError> {
        let mut n = 0;
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking.
            let ret =
                unsafe { sys::ibv_get_cq_event(self.channel.raw.as_ptr(), &mut cq, &mut ctx) };
            if ret != 0 {
                let err = io::Error::last_os_error();
                if is_would_block(&err) {
                    return Ok(n);
                }
                return Err(VerbsError::Call {
                    call: "ibv_get_cq_event",
                    source: err,
                });
            }
            // SAFETY: the event is for a CQ on our channel; only this CQ uses the channel.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }

    /// Polls up to `out.capacity()` completions into `out` (cleared first).
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<(), VerbsError> {
        const BATCH: usize = 32;
        out.clear();
        while out.len() < max {
            let mut wcs: [MaybeUninit<sys::ibv_wc>; BATCH] =
                [const { MaybeUninit::uninit() }; BATCH];
            let want = (max - out.len()).min(BATCH) as i32;
            // SAFETY: the CQ is live; `wcs` has room for `want` entries.
            let n = unsafe { sys::ibv_poll_cq(self.raw.as_ptr(), want, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(VerbsError::from_ret("ibv_poll_cq", -n));
            }
            for wc in &wcs[..n as usize] {
                // SAFETY: ibv_poll_cq initialised the first `n` entries.
                let wc = unsafe { wc.assume_init_ref() };
                use sys::ibv_wc_opcode::*;
                let opcode = match wc.opcode {
                    IBV_WC_SEND => WcOpcode::Send,
                    IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                    IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
                    IBV_WC_RECV => WcOpcode::Recv,
                    other => WcOpcode::Other(other),
                };
                out.push(WorkCompletion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    opcode,
                    byte_len: wc.byte_len,
                });
            }
            if n < want {
                break;
            }
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: QPs using the CQ are destroyed first (declared before it by their owners)
        // and every channel event was acked in `get_events`.
        let ret = unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_cq failed");
        }
    }
}

/// Scatter/gather element: registered local memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBuf {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// The send-queue work requests NVMe/RDMA needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Response capsule; `invalidate` = SEND_WITH_INV of the host's rkey.
    Send { invalidate: Option<u32> },
    /// Pull host data (host → controller) into `local`.
    RdmaRead { remote_addr: u64, rkey: u32 },
    /// Push data (controller → host) from `local`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
}

/// Posts one receive WR with a single SGE to a QP's or an SRQ's receive queue.
fn post_recv_wr(
    call: &'static str,
    buf: LocalBuf,
    wr_id: u64,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> i32,
) -> Result<(), VerbsError> {
    let mut sge = sys::ibv_sge {
        addr: buf.addr,
        length: buf.len,
        lkey: buf.lkey,
    };
    let mut wr = sys::ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = ptr::null_mut();
    let ret = post(&mut wr, &mut bad);
    if ret != 0 {
        return Err(VerbsError::from_ret(call, ret));
    }
    Ok(())
}

/// A shared receive queue: one pool of posted receive buffers for every QP created with it
/// (NVMe RDMA 1.0b leaves receive provisioning to the target; nvmet's `use_srq`). A receive
/// completion arrives on the CQ of the QP the message was for, carrying the SRQ WR's id.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    raw: NonNull<sys::ibv_srq>,
    max_wr: u32,
    _pd: Rc<ProtectionDomain>,
}

impl SharedReceiveQueue {
    /// An SRQ for up to `max_wr` single-SGE receives (the caller bounds it by the device's
    /// `max_srq_wr`; the provider may round it up).
    pub fn new(pd: &Rc<ProtectionDomain>, max_wr: u32) -> Result<Rc<Self>, VerbsError> {
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: pd is live; attr outlives the call (the provider writes the actual sizes
        // back into it).
        let raw = unsafe { sys::ibv_create_srq(pd.raw.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_srq"))?;
        Ok(Rc::new(Self {
            raw,
            max_wr: attr.attr.max_wr,
            _pd: Rc::clone(pd),
        }))
    }

    /// Receive WRs the SRQ holds (≥ what was asked for).
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    pub fn post_recv(&self, wr_id: u64, buf: LocalBuf) -> Result<(), VerbsError> {
        post_recv_wr("ibv_post_srq_recv", buf, wr_id, |wr, bad| {
            // SAFETY: the SRQ is live; wr and its SGE outlive the call (the provider copies
            // them); the buffer is registered memory owned by the SRQ's buffer ring, which
            // outlives the SRQ (`SrqBuffers` is dropped after every QP and the SRQ itself).
            unsafe { sys::ibv_post_srq_recv(self.raw.as_ptr(), wr, bad) }
        })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: every QP created with this SRQ holds an Rc to it, so none is left.
        let ret = unsafe { sys::ibv_destroy_srq(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_srq failed");
        }
    }
}

/// An RC queue pair created on a connection's `CmId` (which it owns).
pub struct QueuePair {
    // Drop order: QP (in Drop) then the id, then the CQ, SRQ and PD references.
    id: CmId,
    qp: NonNull<sys::ibv_qp>,
    _cq: Rc<CompletionQueue>,
    /// Receives go here instead of the QP's own receive queue.
    srq: Option<Rc<SharedReceiveQueue>>,
    _pd: Rc<ProtectionDomain>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("id", &self.id).finish()
    }
}

/// QP sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
}

impl QueuePair {
    /// Creates the QP on `id`, with both queues on `cq`, receiving from `srq` when given
    /// (`caps.max_recv_wr` is then ignored). On failure the id is handed back so the caller
    /// can still reject the connection.
    pub fn create(
        id: CmId,
        pd: &Rc<ProtectionDomain>,
        cq: &Rc<CompletionQueue>,
        srq: Option<&Rc<SharedReceiveQueue>>,
        caps: QpCaps,
    ) -> Result<Self, (CmId, VerbsError)> {
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.raw.as_ptr(),
            recv_cq: cq.raw.as_ptr(),
            srq: srq.map_or(ptr::null_mut(), |s| s.raw.as_ptr()),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: if srq.is_some() { 0 } else { caps.max_recv_wr },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: id, pd, cq and srq are live; attr outlives the call.
        let ret = unsafe { sys::rdma_create_qp(id.raw.as_ptr(), pd.raw.as_ptr(), &mut attr) };
        if ret != 0 {
            return Err((id, VerbsError::from_ret("rdma_create_qp", ret)));
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        let qp = unsafe { (*id.raw.as_ptr()).qp };
        match NonNull::new(qp) {
            Some(qp) => Ok(Self {
                id,
                qp,
                _cq: Rc::clone(cq),
                srq: srq.map(Rc::clone),
                _pd: Rc::clone(pd),
            }),
            None => Err((id, VerbsError::last("rdma_create_qp"))),
        }
    }

    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Posts a receive to the QP, or to its SRQ when it has one.
    pub fn post_recv(&self, wr_id: u64, buf: LocalBuf) -> Result<(), VerbsError> {
        if let Some(srq) = &self.srq {
            return srq.post_recv(wr_id, buf);
        }
        post_recv_wr("ibv_post_recv", buf, wr_id, |wr, bad| {
            // SAFETY: the QP is live; wr and sge outlive the call (the provider copies them);
            // the buffer is registered memory kept alive until the QP is destroyed.
            unsafe { sys::ibv_post_recv(self.qp.as_ptr(), wr, bad) }
        })
    }

    /// Posts one signaled send-queue WR.
    pub fn post_send(&self, wr_id: u64, op: SendOp, buf: LocalBuf) -> Result<(), VerbsError> {
        let mut sge = sys::ibv_sge {
            addr: buf.addr,
            length: buf.len,
            lkey: buf.lkey,
        };
        // SAFETY: ibv_send_wr is plain old data; all-zero is the neutral value of every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        match op {
            SendOp::Send { invalidate: None } => wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
            SendOp::Send {
                invalidate: Some(rkey),
            } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
                wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live; wr/sge outlive the call; the local buffer is registered
        // memory that stays allocated until this WR's completion has been polled.
        let ret = unsafe { sys::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_post_send", ret));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: the QP belongs to `id` and is destroyed once, before the id (dropped right
        // after) and before the CQ/PD (kept alive by our Rc fields).
        unsafe { sys::rdma_destroy_qp(self.id.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests;
