//! Per-connection NVMe/RDMA command state machine, sans-IO: it consumes work completions,
//! backend completions and time, and emits work requests through [`WorkPoster`] (the QP in
//! production, a recorder in tests). It never calls verbs itself.
//!
//! Life of a command (NVMe RDMA Transport 1.0b §2, §3.4):
//! 1. A command capsule arrives in one of `depth` pre-posted receive buffers.
//! 2. The SQE (and in-capsule data) is copied out and the receive is reposted.
//! 3. The SGL decides how data moves: keyed data block (4h/0h, 4h/Fh) → RDMA READ/WRITE of
//!    the host's buffer; data block with offset (0h/1h) → in-capsule data; anything else is
//!    rejected with SGL Descriptor Type Invalid.
//! 4. Host → controller: RDMA READ into a pool buffer (at most ORD reads in flight), then
//!    `execute`. Controller → host: `execute`, then RDMA WRITE, then the response SEND (an RC
//!    QP executes them in order, so the host sees the data before the completion).
//! 5. The response goes out as SEND, or SEND_WITH_INV of the host's rkey when the SGL asked
//!    for invalidation (subtype Fh).
//!
//! Every resource shortage (contexts, data buffers, ORD) parks the command in a FIFO; nothing
//! is ever dropped. Any failed work completion or post is fatal to the connection.
//!
//! Receive buffers are either the connection's own ring (`depth` buffers posted to its QP) or
//! the device's shared receive queue ([`SrqBuffers`]): then any connection of the device may
//! receive into any SRQ buffer, and the connection that polled the completion reposts it once
//! the capsule is consumed — also while closing, or the SRQ would lose it for good.

use std::cell::{Ref, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

use nvme::queue::{Direction, Outcome, PollResult, Response};
use nvme::wire::{Cqe, SglDescriptor, SglType, Sqe, Status};
use storage::fixedbuf::WithBuffer;
use storage::IoSubmit;

use super::pool::{DevicePools, PoolBuffer};
use super::verbs::{LocalBuf, QueuePair, SendOp, VerbsError, WorkCompletion};
use crate::conn::ConnStatus;
use crate::dispatch::Dispatch;
use crate::timing::Timing;

/// Where work requests go.
pub trait WorkPoster {
    fn post_recv(&mut self, wr_id: u64, buf: LocalBuf) -> Result<(), VerbsError>;
    fn post_send(&mut self, wr_id: u64, op: SendOp, buf: LocalBuf) -> Result<(), VerbsError>;
}

impl WorkPoster for QueuePair {
    fn post_recv(&mut self, wr_id: u64, buf: LocalBuf) -> Result<(), VerbsError> {
        QueuePair::post_recv(self, wr_id, buf)
    }
    fn post_send(&mut self, wr_id: u64, op: SendOp, buf: LocalBuf) -> Result<(), VerbsError> {
        QueuePair::post_send(self, wr_id, op, buf)
    }
}

/// Work request ids: kind in the top byte, index below. Errored completions carry no valid
/// opcode, so the id alone must say what completed.
mod wr_id {
    pub const RECV: u64 = 1 << 56;
    pub const SEND: u64 = 2 << 56;
    pub const READ: u64 = 3 << 56;
    pub const WRITE: u64 = 4 << 56;
    pub const KIND_MASK: u64 = 0xff << 56;

    pub fn split(id: u64) -> (u64, u32) {
        (id & KIND_MASK, id as u32)
    }
}

/// The receive buffers of one device's shared receive queue, indexed by the receive WR id.
#[derive(Clone)]
pub struct SrqBuffers(Rc<RefCell<Vec<PoolBuffer>>>);

impl std::fmt::Debug for SrqBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrqBuffers")
            .field("len", &self.len())
            .finish()
    }
}

impl SrqBuffers {
    pub fn new(bufs: Vec<PoolBuffer>) -> Self {
        Self(Rc::new(RefCell::new(bufs)))
    }

    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Posts every buffer, once, right after the SRQ was created (before any QP uses it).
    pub fn post_all(
        &self,
        post_recv: &mut dyn FnMut(u64, LocalBuf) -> Result<(), VerbsError>,
    ) -> Result<(), VerbsError> {
        for (idx, b) in self.0.borrow().iter().enumerate() {
            post_recv(wr_id::RECV | idx as u64, local_buf(b))?;
        }
        Ok(())
    }
}

fn local_buf(b: &PoolBuffer) -> LocalBuf {
    LocalBuf {
        addr: b.addr(),
        len: b.len() as u32,
        lkey: b.lkey(),
    }
}

/// Why a connection was closed by the state machine (for the one log line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    #[error("command capsule of {0} bytes is shorter than an SQE")]
    ShortCapsule(u32),
    #[error("work completion {wr_id:#x} failed with status {status}")]
    CompletionFailed { wr_id: u64, status: u32 },
    #[error("unexpected work completion id {0:#x}")]
    UnknownCompletion(u64),
    #[error("posting a work request failed: {0}")]
    Post(String),
    #[error("the controller was terminated: {0}")]
    Terminated(String),
    #[error("the connection manager reported the connection gone (host disconnect, timewait exit or device removal)")]
    Disconnected,
}

/// Negotiated shape of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnShape {
    /// Receive buffers kept posted = HSQSIZE + 1 (the accept's CRQSIZE).
    pub depth: u16,
    /// Command contexts (≥ depth: responses still being sent occupy a context).
    pub contexts: u16,
    /// RDMA READs we may have outstanding (the accepted initiator depth, ≥ 1).
    pub ord: u8,
    /// Largest in-capsule data accepted (IOCCSZ × 16 − 64).
    pub in_capsule_data_size: u32,
    /// Largest transfer (MDTS in bytes; the data buffer size).
    pub max_data_transfer: u32,
}

/// Where the command's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataSource {
    None,
    Keyed { addr: u64, len: u32, rkey: u32 },
    InCapsule { offset: u32, len: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CtxState {
    Free,
    /// Waiting for a data buffer (FIFO `wait_data`); for in-capsule data the receive buffer
    /// is still held (`recv`).
    WaitData,
    /// Waiting for an ORD slot (FIFO `wait_read`).
    WaitRead,
    Reading,
    /// A backend op was submitted; `on_io_complete` finishes it.
    Executing,
    /// Held by the core (Asynchronous Event Request); completed by `Queue::poll`.
    Held,
    /// The core could not start it yet (`Outcome::Blocked`); `on_tick` runs it again.
    Blocked,
    /// WRITE and/or SEND posted; freed when `outstanding` reaches 0.
    Responding,
}

struct Ctx {
    state: CtxState,
    sqe: Sqe,
    direction: Direction,
    source: DataSource,
    invalidate: Option<u32>,
    /// Receive buffer index still held (in-capsule data not yet copied).
    recv: Option<u32>,
    data: Option<PoolBuffer>,
    data_len: u32,
    response: PoolBuffer,
    outstanding: u8,
    /// An Abort asked for this command while its RDMA READ was in flight (a posted READ
    /// cannot be recalled): it completes with Abort Requested when the READ is done.
    abort_after_read: bool,
    /// An Abort asked the backend to cancel this command's op: answered on its completion.
    cancelling: bool,
    /// Found waiting for a data buffer with the pool empty, and counted (once per command).
    pool_wait_counted: bool,
    /// When timing (`Dispatch::timing`): the receive completion of the capsule, and the
    /// submission of the command's backend op.
    arrived: Option<u64>,
    submitted: Option<u64>,
}

/// The per-connection state machine.
pub struct ConnCore<D: Dispatch> {
    dispatch: D,
    token: u32,
    shape: ConnShape,
    pools: DevicePools,
    /// Own ring (posted to the QP) or the device's SRQ buffers (`shared_recv`).
    recv_bufs: Rc<RefCell<Vec<PoolBuffer>>>,
    shared_recv: bool,
    ctxs: Vec<Ctx>,
    free_ctxs: Vec<u32>,
    /// Received capsules (receive index, byte length) waiting for a free context.
    pending_recv: VecDeque<(u32, u32, Option<u64>)>,
    wait_data: VecDeque<u32>,
    wait_read: VecDeque<u32>,
    reads_in_flight: u8,
    io_in_flight: usize,
    closing: Option<ConnError>,
    /// Command times, when the shell gives them (`set_time`, `handed_over`).
    timing: Timing,
}

impl<D: Dispatch> ConnCore<D> {
    /// Takes the connection's receive and response buffers from the device pools (`None`
    /// when the pools cannot hold another connection: reject with NO_RSC).
    pub fn new(dispatch: D, token: u32, shape: ConnShape, pools: DevicePools) -> Option<Self> {
        let recv_bufs = pools.capsules.take_many(shape.depth.into())?;
        Self::build(
            dispatch,
            token,
            shape,
            pools,
            Rc::new(RefCell::new(recv_bufs)),
            false,
        )
    }

    /// A connection whose QP receives from the device's shared receive queue: only its
    /// response buffers come from the pools.
    pub fn with_srq(
        dispatch: D,
        token: u32,
        shape: ConnShape,
        pools: DevicePools,
        srq: &SrqBuffers,
    ) -> Option<Self> {
        Self::build(dispatch, token, shape, pools, Rc::clone(&srq.0), true)
    }

    fn build(
        dispatch: D,
        token: u32,
        shape: ConnShape,
        pools: DevicePools,
        recv_bufs: Rc<RefCell<Vec<PoolBuffer>>>,
        shared_recv: bool,
    ) -> Option<Self> {
        let responses = pools.responses.take_many(shape.contexts.into())?;
        let ctxs = responses
            .into_iter()
            .map(|response| Ctx {
                state: CtxState::Free,
                sqe: Sqe::default(),
                direction: Direction::None,
                source: DataSource::None,
                invalidate: None,
                recv: None,
                data: None,
                data_len: 0,
                response,
                outstanding: 0,
                abort_after_read: false,
                cancelling: false,
                pool_wait_counted: false,
                arrived: None,
                submitted: None,
            })
            .collect();
        Some(Self {
            dispatch,
            token,
            shape: ConnShape {
                ord: shape.ord.max(1),
                ..shape
            },
            pools,
            recv_bufs,
            shared_recv,
            ctxs,
            free_ctxs: (0..u32::from(shape.contexts)).rev().collect(),
            pending_recv: VecDeque::new(),
            wait_data: VecDeque::new(),
            wait_read: VecDeque::new(),
            reads_in_flight: 0,
            io_in_flight: 0,
            closing: None,
            timing: Timing::default(),
        })
    }

    /// Whether the shell is to tell the times of what it handles (`set_time`,
    /// `handed_over`): the dispatch core counts latencies. Otherwise no clock need be read.
    pub fn timing(&self) -> bool {
        self.dispatch.timing()
    }

    /// The time of the work or backend completions the next calls handle (when timing): a
    /// capsule whose receive completes in the next `on_completions` arrived then; an op
    /// completed by the next `on_io_complete` completed then.
    pub fn set_time(&mut self, now: Instant) {
        self.timing.set(now);
    }

    /// Responses were posted whose latency is recorded at the next [`ConnCore::handed_over`].
    pub fn has_timed(&self) -> bool {
        self.timing.has_responded()
    }

    /// Every response posted since the last call was on the queue pair by `at`: its latency
    /// (capsule arrival to then) goes to the dispatch core's metrics.
    pub fn handed_over(&mut self, at: Instant) {
        self.timing.handed_over(at, &mut self.dispatch);
    }

    pub fn dispatch_mut(&mut self) -> &mut D {
        &mut self.dispatch
    }

    pub fn shape(&self) -> ConnShape {
        self.shape
    }

    pub fn close_reason(&self) -> Option<&ConnError> {
        self.closing.as_ref()
    }

    pub fn status(&self) -> ConnStatus {
        if self.closing.is_some() {
            ConnStatus::Closed
        } else {
            ConnStatus::Open
        }
    }

    /// Backend ops still owning a data buffer of this connection.
    pub fn inflight_ops(&self) -> usize {
        self.io_in_flight
    }

    /// Posts every receive buffer; called once, before accepting the connection (a host may
    /// send its first capsule as soon as it sees the accept). Nothing to do with an SRQ: its
    /// buffers were posted when it was created.
    pub fn post_initial_receives(&mut self, qp: &mut dyn WorkPoster) -> ConnStatus {
        if !self.shared_recv {
            for idx in 0..self.recv_len() {
                self.repost_recv(qp, idx);
            }
        }
        self.status()
    }

    fn recv_len(&self) -> u32 {
        self.recv_bufs.borrow().len() as u32
    }

    /// Whether the receives come from a shared receive queue.
    pub fn uses_srq(&self) -> bool {
        self.shared_recv
    }

    /// Once closed, hands every SRQ buffer this connection still holds (capsules waiting for
    /// a context, in-capsule data waiting for a data buffer) back to the SRQ. Own receive
    /// rings need nothing: they return to the pool with the connection.
    pub fn return_receives(&mut self, qp: &mut dyn WorkPoster) {
        if !self.shared_recv || self.closing.is_none() {
            return;
        }
        let mut held: Vec<u32> = self.pending_recv.drain(..).map(|(r, _, _)| r).collect();
        held.extend(self.ctxs.iter_mut().filter_map(|c| c.recv.take()));
        for idx in held {
            self.repost_recv(qp, idx);
        }
    }

    /// Marks the connection dead (disconnect / device removal / reactor decision).
    pub fn close(&mut self, why: ConnError) {
        if self.closing.is_none() {
            self.closing = Some(why);
        }
    }

    fn fail(&mut self, why: ConnError) {
        if self.closing.is_none() {
            tracing::warn!(token = self.token, error = %why, "closing RDMA connection");
        }
        self.close(why);
    }

    fn tag(&self, ctx: u32) -> u64 {
        (u64::from(self.token) << 32) | u64::from(ctx)
    }

    fn repost_recv(&mut self, qp: &mut dyn WorkPoster, idx: u32) {
        // An own ring dies with the connection; an SRQ buffer must go back to the SRQ, which
        // outlives this connection's QP.
        if self.closing.is_some() && !self.shared_recv {
            return;
        }
        let buf = local_buf(&self.recv_bufs.borrow()[idx as usize]);
        if let Err(e) = qp.post_recv(wr_id::RECV | u64::from(idx), buf) {
            self.fail(ConnError::Post(e.to_string()));
        }
    }

    /// Feeds polled work completions.
    pub fn on_completions(
        &mut self,
        wcs: &[WorkCompletion],
        qp: &mut dyn WorkPoster,
        io: &mut dyn IoSubmit,
    ) -> ConnStatus {
        for wc in wcs {
            self.on_completion(wc, qp, io);
        }
        self.make_progress(qp, io);
        self.status()
    }

    fn on_completion(
        &mut self,
        wc: &WorkCompletion,
        qp: &mut dyn WorkPoster,
        io: &mut dyn IoSubmit,
    ) {
        let (kind, idx) = wr_id::split(wc.wr_id);
        let valid = match kind {
            wr_id::RECV => idx < self.recv_len(),
            wr_id::SEND | wr_id::READ | wr_id::WRITE => (idx as usize) < self.ctxs.len(),
            _ => false,
        };
        if !valid {
            self.fail(ConnError::UnknownCompletion(wc.wr_id));
            return;
        }
        if !wc.is_success() {
            // After a disconnect every posted WR completes with a flush error: release what
            // the WR held, but do not start anything new.
            self.fail(ConnError::CompletionFailed {
                wr_id: wc.wr_id,
                status: wc.status,
            });
        }
        match kind {
            wr_id::RECV => {
                if wc.is_success() {
                    self.on_recv(idx, wc.byte_len, qp, io);
                } else {
                    // With an SRQ even a failed receive consumed an SRQ entry.
                    self.repost_recv(qp, idx);
                }
            }
            wr_id::READ => {
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                let ctx = &mut self.ctxs[idx as usize];
                ctx.outstanding = ctx.outstanding.saturating_sub(1);
                if self.closing.is_some() {
                    self.release_ctx(idx);
                } else if std::mem::take(&mut self.ctxs[idx as usize].abort_after_read) {
                    self.abort_now(idx, qp);
                } else {
                    self.execute(idx, qp, io);
                }
            }
            _ => {
                // SEND or WRITE of a response.
                let ctx = &mut self.ctxs[idx as usize];
                ctx.outstanding = ctx.outstanding.saturating_sub(1);
                if ctx.outstanding == 0 && ctx.state == CtxState::Responding {
                    self.release_ctx(idx);
                }
            }
        }
    }

    fn release_ctx(&mut self, idx: u32) {
        let ctx = &mut self.ctxs[idx as usize];
        ctx.state = CtxState::Free;
        ctx.data = None;
        ctx.recv = None;
        ctx.outstanding = 0;
        ctx.abort_after_read = false;
        ctx.cancelling = false;
        self.free_ctxs.push(idx);
    }

    fn on_recv(
        &mut self,
        recv: u32,
        byte_len: u32,
        qp: &mut dyn WorkPoster,
        io: &mut dyn IoSubmit,
    ) {
        if self.closing.is_some() {
            // Only an SRQ buffer is reposted now (see `repost_recv`).
            self.repost_recv(qp, recv);
            return;
        }
        if (byte_len as usize) < Sqe::SIZE {
            // NVMe RDMA 1.0b §3.4: a command capsule is at least an SQE; the Linux target
            // treats a shorter one as a fatal transport error too.
            self.fail(ConnError::ShortCapsule(byte_len));
            self.repost_recv(qp, recv);
            return;
        }
        match self.free_ctxs.pop() {
            Some(ctx) => {
                self.ctxs[ctx as usize].arrived = self.timing.now();
                self.start_command(ctx, recv, byte_len, qp, io)
            }
            None => self
                .pending_recv
                .push_back((recv, byte_len, self.timing.now())),
        }
    }

    /// Decides where the data is, or the SGL error status (NVMe RDMA 1.0b §2.3; NVMe Base
    /// 2.0 §4.3.2: only keyed data blocks and in-capsule offset blocks are valid here).
    fn classify_sgl(
        &self,
        dptr: &SglDescriptor,
        received_data: u32,
    ) -> Result<(DataSource, Option<u32>), Status> {
        match dptr.sgl_type {
            SglType::KeyedDataBlock | SglType::KeyedDataBlockInvalidate => {
                if dptr.length > self.shape.max_data_transfer {
                    return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                }
                if dptr.length == 0 {
                    return Ok((DataSource::None, None));
                }
                let invalidate =
                    (dptr.sgl_type == SglType::KeyedDataBlockInvalidate).then_some(dptr.key);
                Ok((
                    DataSource::Keyed {
                        addr: dptr.address,
                        len: dptr.length,
                        rkey: dptr.key,
                    },
                    invalidate,
                ))
            }
            SglType::DataBlockOffset => {
                let end = dptr.address.checked_add(u64::from(dptr.length));
                match end {
                    Some(end) if end <= u64::from(self.shape.in_capsule_data_size) => {}
                    _ => return Err(Status::SGL_OFFSET_INVALID.with_dnr()),
                }
                // The capsule must actually carry the bytes the descriptor points at.
                if end.unwrap_or(u64::MAX) > u64::from(received_data) {
                    return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                }
                if dptr.length == 0 {
                    return Ok((DataSource::None, None));
                }
                Ok((
                    DataSource::InCapsule {
                        offset: dptr.address as u32,
                        len: dptr.length,
                    },
                    None,
                ))
            }
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
        }
    }

    fn start_command(
        &mut self,
        idx: u32,
        recv: u32,
        byte_len: u32,
        qp: &mut dyn WorkPoster,
        io: &mut dyn IoSubmit,
    ) {
        // The HCA never reports more than the posted length; clamp anyway so that a faulty
        // provider cannot make us index past the buffer.
        let (decoded, byte_len) = {
            let bufs = self.recv_bufs.borrow();
            let capsule = bufs[recv as usize].as_slice();
            let byte_len = byte_len.min(capsule.len() as u32);
            (Sqe::decode(&capsule[..Sqe::SIZE]), byte_len)
        };
        let sqe = match decoded {
            Ok(sqe) => sqe,
            Err(_) => {
                // Cannot happen for 64 bytes; treated as a short capsule rather than panicking.
                self.free_ctxs.push(idx);
                self.fail(ConnError::ShortCapsule(byte_len));
                self.repost_recv(qp, recv);
                return;
            }
        };
        let received_data = byte_len - Sqe::SIZE as u32;
        {
            let ctx = &mut self.ctxs[idx as usize];
            ctx.sqe = sqe;
            ctx.direction = Direction::None;
            ctx.source = DataSource::None;
            ctx.invalidate = None;
            ctx.recv = None;
            ctx.data = None;
            ctx.data_len = 0;
            ctx.outstanding = 0;
        }
        let classified = self.classify_sgl(&sqe.dptr, received_data);
        let (source, invalidate) = match classified {
            Ok(c) => c,
            Err(status) => {
                self.repost_recv(qp, recv);
                let resp = self.dispatch.reject(&sqe, status);
                self.respond(idx, resp, qp);
                return;
            }
        };
        let data_len = match source {
            DataSource::None => 0,
            DataSource::Keyed { len, .. } | DataSource::InCapsule { len, .. } => len,
        };
        {
            let ctx = &mut self.ctxs[idx as usize];
            ctx.source = source;
            ctx.invalidate = invalidate;
            ctx.data_len = data_len;
        }
        let direction = match self.dispatch.prepare(&sqe, data_len) {
            Ok(d) => d,
            Err(status) => {
                self.repost_recv(qp, recv);
                let resp = self.dispatch.reject(&sqe, status);
                self.respond(idx, resp, qp);
                return;
            }
        };
        // In-capsule data only makes sense for host → controller transfers (NVMe RDMA 1.0b
        // §2.3; nvmet answers Invalid Field as well).
        if matches!(source, DataSource::InCapsule { .. })
            && direction != Direction::HostToController
        {
            self.repost_recv(qp, recv);
            let resp = self.dispatch.reject(&sqe, Status::INVALID_FIELD.with_dnr());
            self.respond(idx, resp, qp);
            return;
        }
        self.ctxs[idx as usize].direction = direction;
        if direction == Direction::None || data_len == 0 {
            self.repost_recv(qp, recv);
            self.execute(idx, qp, io);
            return;
        }
        if matches!(source, DataSource::InCapsule { .. }) {
            // Keep the receive buffer until the data has been copied out.
            self.ctxs[idx as usize].recv = Some(recv);
        } else {
            self.repost_recv(qp, recv);
        }
        self.ctxs[idx as usize].state = CtxState::WaitData;
        self.ctxs[idx as usize].pool_wait_counted = false;
        self.wait_data.push_back(idx);
    }

    /// Retries everything parked on a resource, oldest first.
    fn make_progress(&mut self, qp: &mut dyn WorkPoster, io: &mut dyn IoSubmit) {
        if self.closing.is_some() {
            self.return_receives(qp);
            return;
        }
        while let Some(&idx) = self.wait_data.front() {
            let Some(buf) = self.pools.data.take() else {
                self.count_pool_waits();
                break;
            };
            self.wait_data.pop_front();
            self.ctxs[idx as usize].data = Some(buf);
            self.data_ready(idx, qp, io);
        }
        while self.reads_in_flight < self.shape.ord {
            let Some(idx) = self.wait_read.pop_front() else {
                break;
            };
            self.post_read(idx, qp);
        }
        while !self.free_ctxs.is_empty() {
            let Some((recv, len, arrived)) = self.pending_recv.pop_front() else {
                break;
            };
            let idx = self.free_ctxs.pop().unwrap_or_default();
            self.ctxs[idx as usize].arrived = arrived;
            self.start_command(idx, recv, len, qp, io);
        }
    }

    /// The pool is empty: every command queued for a buffer waits (each counted once).
    #[cold]
    fn count_pool_waits(&mut self) {
        for &idx in &self.wait_data {
            let ctx = &mut self.ctxs[idx as usize];
            if !ctx.pool_wait_counted {
                ctx.pool_wait_counted = true;
                self.dispatch.pool_wait();
            }
        }
    }

    fn data_ready(&mut self, idx: u32, qp: &mut dyn WorkPoster, io: &mut dyn IoSubmit) {
        let ctx = &self.ctxs[idx as usize];
        match (ctx.direction, ctx.source) {
            (Direction::HostToController, DataSource::InCapsule { offset, len }) => {
                let recv = ctx.recv.unwrap_or_default();
                let start = Sqe::SIZE + offset as usize;
                let bufs: Ref<'_, Vec<PoolBuffer>> = self.recv_bufs.borrow();
                let src = &bufs[recv as usize].as_slice()[start..start + len as usize];
                let ctx = &mut self.ctxs[idx as usize];
                if let Some(data) = ctx.data.as_mut() {
                    data.as_mut_slice()[..len as usize].copy_from_slice(src);
                }
                ctx.recv = None;
                drop(bufs);
                self.repost_recv(qp, recv);
                self.execute(idx, qp, io);
            }
            (Direction::HostToController, DataSource::Keyed { .. }) => {
                if self.reads_in_flight < self.shape.ord && self.wait_read.is_empty() {
                    self.post_read(idx, qp);
                } else {
                    self.ctxs[idx as usize].state = CtxState::WaitRead;
                    self.wait_read.push_back(idx);
                }
            }
            _ => self.execute(idx, qp, io),
        }
    }

    fn post_read(&mut self, idx: u32, qp: &mut dyn WorkPoster) {
        let ctx = &mut self.ctxs[idx as usize];
        let DataSource::Keyed { addr, len, rkey } = ctx.source else {
            return;
        };
        let Some(data) = ctx.data.as_ref() else {
            return;
        };
        let local = LocalBuf {
            addr: data.addr(),
            len,
            lkey: data.lkey(),
        };
        ctx.state = CtxState::Reading;
        ctx.outstanding += 1;
        self.reads_in_flight += 1;
        if let Err(e) = qp.post_send(
            wr_id::READ | u64::from(idx),
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey,
            },
            local,
        ) {
            self.fail(ConnError::Post(e.to_string()));
        }
    }

    fn execute(&mut self, idx: u32, qp: &mut dyn WorkPoster, io: &mut dyn IoSubmit) {
        let tag = self.tag(idx);
        let ctx = &mut self.ctxs[idx as usize];
        let len = ctx.data_len as usize;
        let sqe = ctx.sqe;
        let outcome = match ctx.data.as_mut() {
            Some(buf) => {
                // Backend ops on the pool buffer may be issued on a ring registration of it.
                let mut io = WithBuffer::new(io, buf.unit());
                self.dispatch
                    .execute(&sqe, &mut buf.as_mut_slice()[..len], tag, &mut io)
            }
            None => self.dispatch.execute(&sqe, &mut [], tag, io),
        };
        match outcome {
            Outcome::Complete(resp) => self.respond(idx, resp, qp),
            Outcome::Submitted => {
                self.ctxs[idx as usize].state = CtxState::Executing;
                self.ctxs[idx as usize].submitted = self.timing.now();
                self.io_in_flight += 1;
            }
            Outcome::Held => self.ctxs[idx as usize].state = CtxState::Held,
            Outcome::Blocked => self.ctxs[idx as usize].state = CtxState::Blocked,
        }
    }

    /// Sends the data (controller → host) and the response capsule.
    fn respond(&mut self, idx: u32, resp: Response, qp: &mut dyn WorkPoster) {
        if self.closing.is_some() {
            self.release_ctx(idx);
            return;
        }
        let ctx = &mut self.ctxs[idx as usize];
        self.timing.responded(&ctx.sqe, ctx.arrived);
        ctx.state = CtxState::Responding;
        ctx.response.as_mut_slice()[..Cqe::SIZE].copy_from_slice(&resp.cqe.encode());
        let mut posts: [Option<(u64, SendOp, LocalBuf)>; 2] = [None, None];
        if let (Direction::ControllerToHost, DataSource::Keyed { addr, len, rkey }, Some(data)) =
            (ctx.direction, ctx.source, ctx.data.as_ref())
        {
            let write_len = resp.data_len.min(len).min(ctx.data_len);
            if write_len > 0 {
                posts[0] = Some((
                    wr_id::WRITE | u64::from(idx),
                    SendOp::RdmaWrite {
                        remote_addr: addr,
                        rkey,
                    },
                    LocalBuf {
                        addr: data.addr(),
                        len: write_len,
                        lkey: data.lkey(),
                    },
                ));
            }
        }
        posts[1] = Some((
            wr_id::SEND | u64::from(idx),
            SendOp::Send {
                invalidate: ctx.invalidate,
            },
            LocalBuf {
                addr: ctx.response.addr(),
                len: Cqe::SIZE as u32,
                lkey: ctx.response.lkey(),
            },
        ));
        for (id, op, buf) in posts.into_iter().flatten() {
            self.ctxs[idx as usize].outstanding += 1;
            if let Err(e) = qp.post_send(id, op, buf) {
                self.ctxs[idx as usize].outstanding -= 1;
                self.fail(ConnError::Post(e.to_string()));
                if self.ctxs[idx as usize].outstanding == 0 {
                    self.release_ctx(idx);
                }
                return;
            }
        }
    }

    /// Completion of a backend op submitted with `tag` (connection contract routing: `tag >> 32` is
    /// this connection's token, the low half the context).
    pub fn on_io_complete(
        &mut self,
        tag: u64,
        result: i32,
        qp: &mut dyn WorkPoster,
        io: &mut dyn IoSubmit,
    ) -> ConnStatus {
        let idx = tag as u32;
        let known = (tag >> 32) as u32 == self.token
            && self
                .ctxs
                .get(idx as usize)
                .is_some_and(|c| c.state == CtxState::Executing);
        if !known {
            tracing::error!(
                tag,
                token = self.token,
                "completion for an unknown RDMA command"
            );
            return self.status();
        }
        self.io_in_flight -= 1;
        let sqe = self.ctxs[idx as usize].sqe;
        let submitted = self.ctxs[idx as usize].submitted;
        self.timing
            .backend_done(&sqe, submitted, &mut self.dispatch);
        if std::mem::take(&mut self.ctxs[idx as usize].cancelling) {
            // nvm::finish completes a cancelled op with Abort Requested.
            self.dispatch
                .answer_abort(sqe.cid, result == -libc::ECANCELED);
        }
        match self.dispatch.finish(&sqe, result) {
            Some(resp) => self.respond(idx, resp, qp),
            // Not done (a fused Write after its Compare): run it again now.
            None => {
                self.ctxs[idx as usize].state = CtxState::Blocked;
                if self.closing.is_none() {
                    self.execute(idx, qp, io);
                }
            }
        }
        self.make_progress(qp, io);
        self.status()
    }

    /// Periodic work (≥ every 100 ms and after wake-ups): commands the core blocked (writes
    /// waiting for a fused Compare and Write, and its Write waiting for the Compare's data),
    /// held AERs and fused Compare halves, keep-alive, and commands parked on data buffers
    /// that another connection may have released.
    pub fn on_tick(
        &mut self,
        now: Instant,
        qp: &mut dyn WorkPoster,
        io: &mut dyn IoSubmit,
    ) -> ConnStatus {
        // Blocked commands run now submit their ops now.
        self.timing.advance(now);
        // A closing connection starts nothing new; its blocked commands just go away.
        for idx in 0..self.ctxs.len() {
            let c = &self.ctxs[idx];
            if self.closing.is_none()
                && c.state == CtxState::Blocked
                && self.dispatch.may_run(&c.sqe, now)
            {
                self.execute(idx as u32, qp, io);
            }
        }
        // Commands skipped above wait for a QoS limit: wake this connection at the first's time.
        if let Some(at) = self.dispatch.next_wake() {
            io.wake_at(at);
        }
        if self.closing.is_none() {
            for cid in self.dispatch.take_abort_requests() {
                if let Some(aborted) = self.abort(cid, qp, io) {
                    self.dispatch.answer_abort(cid, aborted);
                }
            }
        }
        let PollResult {
            completions,
            terminate,
        } = self.dispatch.poll(now);
        for resp in completions {
            let held = self
                .ctxs
                .iter()
                .position(|c| c.state == CtxState::Held && c.sqe.cid == resp.cqe.cid);
            match held {
                Some(idx) => self.respond(idx as u32, resp, qp),
                None => tracing::error!(
                    cid = resp.cqe.cid,
                    "core completed a command this RDMA connection does not hold"
                ),
            }
        }
        if let Some(reason) = terminate {
            self.fail(ConnError::Terminated(format!("{reason:?}")));
        }
        self.make_progress(qp, io);
        self.status()
    }

    /// Aborts command `cid` if it has not started (NVMe Base 2.0 §5.1): waiting for a data
    /// buffer or an RDMA READ slot, or blocked by the core; its RDMA READ in flight, once the
    /// READ is done (`abort_after_read`, answered then: `None`); its backend op if the
    /// submitter can cancel it (answered on its completion: `None`). A capsule still waiting
    /// for a context, or a command held by the core, runs on: not aborted.
    fn abort(&mut self, cid: u16, qp: &mut dyn WorkPoster, io: &mut dyn IoSubmit) -> Option<bool> {
        let found = self.ctxs.iter().position(|c| {
            c.sqe.cid == cid
                && matches!(
                    c.state,
                    CtxState::WaitData
                        | CtxState::WaitRead
                        | CtxState::Blocked
                        | CtxState::Reading
                        | CtxState::Executing
                )
        });
        let Some(idx) = found else {
            return Some(false);
        };
        let ctx = &mut self.ctxs[idx];
        if ctx.sqe.fuse() != 0 {
            // A fused half is never aborted alone (see `Queue::abort_waiting`).
            return Some(false);
        }
        if ctx.state == CtxState::Reading {
            ctx.abort_after_read = true;
            return None;
        }
        if ctx.state == CtxState::Executing {
            let tag = self.tag(idx as u32);
            if !io.cancel(tag) {
                return Some(false);
            }
            self.ctxs[idx].cancelling = true;
            return None;
        }
        Some(self.abort_now(idx as u32, qp))
    }

    /// Completes the waiting command of context `idx` with Abort Requested, giving back what it
    /// waited with (its place in a wait queue, the receive buffer of its in-capsule data), and
    /// answers the Abort when it came after a READ.
    fn abort_now(&mut self, idx: u32, qp: &mut dyn WorkPoster) -> bool {
        let sqe = self.ctxs[idx as usize].sqe;
        let after_read = self.ctxs[idx as usize].state == CtxState::Reading;
        let Some(resp) = self.dispatch.abort_waiting(&sqe) else {
            if after_read {
                self.dispatch.answer_abort(sqe.cid, false);
            }
            return false;
        };
        self.wait_data.retain(|&i| i != idx);
        self.wait_read.retain(|&i| i != idx);
        if let Some(recv) = self.ctxs[idx as usize].recv.take() {
            self.repost_recv(qp, recv);
        }
        self.respond(idx, resp, qp);
        if after_read {
            self.dispatch.answer_abort(sqe.cid, true);
        }
        true
    }

    #[cfg(test)]
    fn data_of(&mut self, ctx: u32) -> Option<&mut [u8]> {
        self.ctxs[ctx as usize]
            .data
            .as_mut()
            .map(|d| d.as_mut_slice())
    }

    /// Copies a capsule into the receive buffer of `wr_id`, as the HCA's DMA does (the
    /// in-memory NIC of `rdma::profile`); its byte length, or `None` for an unknown id or a
    /// capsule larger than the buffer.
    pub(crate) fn write_capsule(&mut self, wr_id: u64, sqe: &[u8; 64], data: &[u8]) -> Option<u32> {
        let (kind, idx) = wr_id::split(wr_id);
        if kind != wr_id::RECV {
            return None;
        }
        let mut bufs = self.recv_bufs.borrow_mut();
        let buf = bufs.get_mut(idx as usize)?.as_mut_slice();
        let len = 64 + data.len();
        buf.get_mut(..64)?.copy_from_slice(sqe);
        buf.get_mut(64..len)?.copy_from_slice(data);
        u32::try_from(len).ok()
    }

    /// The completion queue entry in the response buffer a SEND was posted from (the host's
    /// view of it), or `None` if `buf` is no response buffer of this connection.
    pub(crate) fn sent_response(&self, buf: &LocalBuf) -> Option<Cqe> {
        let ctx = self.ctxs.iter().find(|c| c.response.addr() == buf.addr)?;
        Cqe::decode(ctx.response.as_slice().get(..16)?).ok()
    }

    #[cfg(test)]
    fn recv_buf(&mut self, idx: u32) -> std::cell::RefMut<'_, [u8]> {
        std::cell::RefMut::map(self.recv_bufs.borrow_mut(), |b| {
            b[idx as usize].as_mut_slice()
        })
    }
}

#[cfg(test)]
mod tests;
