//! NVMe/RDMA host side (`--transport rdma`): the verbs shell around `rdma_proto`.
//!
//! A queue is an rdma_cm connection with its own protection domain, completion queue and
//! registered buffers (`transport::rdma::{verbs, pool}`, the project's only verbs code):
//! resolve address and route, create the QP, post the receives, connect with the NVMe/RDMA
//! private data (NVMe RDMA Transport 1.0b §3.2, Figure 4: RECFMT 0, QID, HRQSIZE, HSQSIZE,
//! as the Linux host sends them), then Fabrics Connect over it. The admin queue is driven
//! one command at a time ([`AdminQueue`]); the I/O queues by [`run_worker`], which keeps
//! each at its queue depth and polls the completion queues (or sleeps on their completion
//! channels). Verbs objects are `Rc`-bound to one thread, so every I/O queue is connected
//! on the worker thread that drives it.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nvme::wire::fabrics::ConnectData;
use nvme::wire::identify::IDENTIFY_DATA_SIZE;
use nvme::wire::{Cqe, DecodeError, Sqe};
use transport::rdma::cm::{
    CmRejectStatus, ConnectAccept, ConnectReject, ConnectRequest, RECFMT_1_0,
};
use transport::rdma::pool::{BufferPool, PoolError, PoolGeometry};
use transport::rdma::verbs::{
    CmEvent, CmEventKind, CmId, CompletionChannel, CompletionQueue, EventChannel, QpCaps,
    QueuePair, VerbsError, WorkCompletion,
};

use crate::command::io_sqe;
use crate::engine::{
    Recorder, RunEnd, Timeline, WorkerConfig, WorkerResult, DRAIN_TIMEOUT, WAIT_SLICE_MS,
};
use crate::rdma_proto::{Finished, HostQueue, QueueBuffers, QueueError, Transfer};
use crate::setup::{
    connect_io_queue, queue_entries, AdminData, AdminError, AdminQueue, AdminReply, ControllerInfo,
    HostParams, SetupError, ADMIN_QUEUE_ENTRIES,
};
use crate::workload::IoGenerator;

/// Completions taken from a CQ per poll call.
const POLL_BATCH: usize = 64;
/// Pause between polls of a blocking admin command or CM event wait.
const SETUP_POLL: Duration = Duration::from_micros(200);

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("no RDMA device (the kernel has no RDMA stack or no device: load rdma_rxe and add a soft-RoCE link, or use an HCA)")]
    NoDevice,
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    #[error("registered buffers: {0}")]
    Pool(#[from] PoolError),
    #[error("queue: {0}")]
    Queue(#[from] QueueError),
    #[error("{0}")]
    Setup(#[from] SetupError),
    #[error("epoll: {0}")]
    Epoll(#[from] nix::Error),
    #[error("rdma_cm, {what}: {kind:?} (status {status})")]
    CmEvent {
        what: &'static str,
        kind: CmEventKind,
        status: i32,
    },
    #[error("rdma_cm, {0}: no event within the timeout")]
    CmTimeout(&'static str),
    #[error("queue {qid}: the target refused the connection: NVMe RDMA CM status {code:#x} ({})",
            reject_reason(.code))]
    Rejected { qid: u16, code: u16 },
    #[error("queue {qid}: the target refused the connection without NVMe RDMA private data (CM status {status})")]
    RejectedByCm { qid: u16, status: i32 },
    #[error("queue {qid}: accept private data: {source}")]
    Accept {
        qid: u16,
        #[source]
        source: DecodeError,
    },
    #[error("queue {qid}: the accept's CRQSIZE {crqsize} is below the {slots} commands the host sends at once")]
    SmallCrq { qid: u16, crqsize: u16, slots: u16 },
    #[error("{0} I/O still outstanding {DRAIN_TIMEOUT:?} after the end of the run")]
    DrainTimeout(usize),
}

/// The meaning of a reject's NVMe RDMA CM status (NVMe RDMA 1.0b Figure 6).
fn reject_reason(code: &u16) -> String {
    CmRejectStatus::from_code(*code).map_or_else(|| "undefined".into(), |s| s.to_string())
}

/// The shape of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueShape {
    pub qid: u16,
    /// Queue entries: HSQSIZE + 1, and the receives posted (HRQSIZE).
    pub entries: u16,
    /// Commands outstanding at most (≤ entries).
    pub slots: u16,
    /// Bytes of each slot's data buffer.
    pub data_size: u32,
    /// Write payload bytes carried in every capsule (0: writes are keyed).
    pub in_capsule: u32,
}

/// One connected NVMe/RDMA queue.
pub struct RdmaQueue {
    // Drop order: the QP (and its CM id) before the buffers' registrations and the CQ.
    qp: QueuePair,
    core: HostQueue,
    cq: Rc<CompletionQueue>,
    channel: Rc<CompletionChannel>,
    wcs: Vec<WorkCompletion>,
    timeout: Duration,
}

impl Drop for RdmaQueue {
    fn drop(&mut self) {
        // A DREQ lets the target tear the queue down at once instead of at its timeout.
        let _ = self.qp.id().disconnect();
    }
}

/// The next CM event, waiting up to `deadline`.
fn next_event(
    events: &EventChannel,
    what: &'static str,
    deadline: Instant,
) -> Result<CmEvent, RdmaError> {
    loop {
        if let Some(ev) = events.get_event()? {
            return Ok(ev);
        }
        if Instant::now() >= deadline {
            return Err(RdmaError::CmTimeout(what));
        }
        std::thread::sleep(SETUP_POLL);
    }
}

fn expect_event(
    events: &EventChannel,
    want: CmEventKind,
    what: &'static str,
    deadline: Instant,
) -> Result<(), RdmaError> {
    let ev = next_event(events, what, deadline)?;
    if ev.kind() != want {
        return Err(RdmaError::CmEvent {
            what,
            kind: ev.kind(),
            status: ev.status(),
        });
    }
    Ok(())
}

impl RdmaQueue {
    /// Connects queue `shape.qid` to `addr`; `payload` (at least `in_capsule` bytes) backs
    /// every write the queue sends.
    pub fn connect(
        addr: SocketAddr,
        shape: QueueShape,
        payload: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Self, RdmaError> {
        let deadline = Instant::now() + timeout;
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let events = EventChannel::new()?;
        let id = CmId::new(&events)?;
        id.resolve_addr(addr, timeout_ms)?;
        expect_event(
            &events,
            CmEventKind::AddrResolved,
            "address resolution",
            deadline,
        )?;
        id.resolve_route(timeout_ms)?;
        expect_event(
            &events,
            CmEventKind::RouteResolved,
            "route resolution",
            deadline,
        )?;
        let caps = id.device_caps()?;
        let pd = id.alloc_pd()?;

        let slots = usize::from(shape.slots);
        let entries = usize::from(shape.entries);
        let capsules = BufferPool::registered(
            PoolGeometry {
                buffer_size: Sqe::SIZE + shape.in_capsule as usize,
                align: 64,
                count: slots,
            },
            &pd,
        )?;
        let responses = BufferPool::registered(
            PoolGeometry {
                buffer_size: Cqe::SIZE,
                align: 16,
                count: entries,
            },
            &pd,
        )?;
        let data = BufferPool::registered_remote(
            PoolGeometry {
                buffer_size: shape.data_size as usize,
                align: 4096,
                count: slots + usize::from(payload.is_some()),
            },
            &pd,
        )?;
        let payload = match payload {
            Some(bytes) => {
                let mut b = data.take().ok_or(QueueError::Layout("payload buffer"))?;
                let n = bytes.len().min(b.len());
                b.as_mut_slice()[..n].copy_from_slice(&bytes[..n]);
                Some(b)
            }
            None => None,
        };
        let missing = |what| RdmaError::Queue(QueueError::Layout(what));
        let bufs = QueueBuffers {
            capsules: capsules
                .take_many(slots)
                .ok_or_else(|| missing("capsules"))?,
            responses: responses
                .take_many(entries)
                .ok_or_else(|| missing("responses"))?,
            data: data.take_many(slots).ok_or_else(|| missing("data"))?,
            payload,
        };
        let core = HostQueue::new(bufs, shape.in_capsule)?;

        let channel = CompletionChannel::new(&pd)?;
        let cq = Rc::new(CompletionQueue::new(&channel, (slots + entries) as u32)?);
        let qp = QueuePair::create(
            id,
            &pd,
            &cq,
            None,
            QpCaps {
                max_send_wr: slots as u32,
                max_recv_wr: entries as u32,
            },
        )
        .map_err(|(_, e)| e)?;
        let mut queue = Self {
            qp,
            core,
            cq,
            channel,
            wcs: Vec::with_capacity(POLL_BATCH),
            timeout,
        };
        queue.core.post_receives(&mut queue.qp)?;
        let request = ConnectRequest {
            recfmt: RECFMT_1_0,
            qid: shape.qid,
            hrqsize: shape.entries,
            hsqsize: shape.entries - 1,
            cntlid: 0,
        };
        // The target RDMA READs write data from us: grant it the device's limit of
        // outstanding reads (responder resources); we never read from the target.
        queue
            .qp
            .id()
            .connect(&request.encode(), caps.max_qp_rd_atom, 0)?;
        let ev = next_event(&events, "connect", deadline)?;
        let qid = shape.qid;
        match ev.kind() {
            CmEventKind::Established => {
                let accept = ConnectAccept::decode(&ev.conn_params().private_data)
                    .map_err(|source| RdmaError::Accept { qid, source })?;
                if accept.crqsize < shape.slots {
                    return Err(RdmaError::SmallCrq {
                        qid,
                        crqsize: accept.crqsize,
                        slots: shape.slots,
                    });
                }
            }
            CmEventKind::Rejected => {
                return Err(
                    match ConnectReject::decode_status(&ev.conn_params().private_data) {
                        Ok(code) => RdmaError::Rejected { qid, code },
                        Err(_) => RdmaError::RejectedByCm {
                            qid,
                            status: ev.status(),
                        },
                    },
                )
            }
            kind => {
                return Err(RdmaError::CmEvent {
                    what: "connect",
                    kind,
                    status: ev.status(),
                })
            }
        }
        Ok(queue)
    }

    /// Polls one batch of completions into the protocol; returns how many were polled.
    fn poll(&mut self, done: &mut Vec<Finished>) -> Result<usize, RdmaError> {
        self.cq.poll(&mut self.wcs, POLL_BATCH)?;
        self.core.on_completions(&self.wcs, &mut self.qp, done)?;
        Ok(self.wcs.len())
    }
}

impl AdminQueue for RdmaQueue {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>) -> Result<AdminReply, AdminError> {
        let transfer = match data {
            AdminData::None => Transfer::None,
            AdminData::Write(bytes) => Transfer::Write(bytes),
            AdminData::Read(n) => Transfer::Read(n),
        };
        let cid = self
            .core
            .submit(sqe, transfer, Instant::now(), &mut self.qp)?;
        let deadline = Instant::now() + self.timeout;
        let mut done = Vec::new();
        loop {
            self.cq
                .poll(&mut self.wcs, POLL_BATCH)
                .map_err(QueueError::from)?;
            self.core
                .on_completions(&self.wcs, &mut self.qp, &mut done)?;
            if let Some(f) = done.iter().find(|f| f.cid == cid) {
                let data = match data {
                    AdminData::Read(n) => self.core.data(cid, n).to_vec(),
                    _ => Vec::new(),
                };
                return Ok(AdminReply { cqe: f.cqe, data });
            }
            if Instant::now() >= deadline {
                return Err(QueueError::Timeout(self.timeout).into());
            }
            std::thread::sleep(SETUP_POLL);
        }
    }
}

/// The admin queue of a new association (Linux: NVME_AQ_DEPTH entries). One command at a
/// time: one slot, with room for Identify data (and the 1024 bytes of Connect data).
pub fn connect_admin(host: &HostParams) -> Result<RdmaQueue, RdmaError> {
    if transport::rdma::verbs::device_count() == 0 {
        return Err(RdmaError::NoDevice);
    }
    RdmaQueue::connect(
        host.addr,
        QueueShape {
            qid: 0,
            entries: ADMIN_QUEUE_ENTRIES,
            slots: 1,
            data_size: IDENTIFY_DATA_SIZE as u32,
            in_capsule: 0,
        },
        None,
        host.timeout,
    )
}

/// What an I/O queue runs.
#[derive(Debug, Clone, Copy)]
pub struct IoParams {
    pub nsid: u32,
    pub bs: u32,
    /// Blocks per I/O.
    pub nlb: u32,
    pub qd: u32,
    /// Writes of at most this many bytes go in-capsule (the controller's IOCCSZ-derived
    /// limit, or lower).
    pub in_capsule_limit: u32,
}

/// An I/O queue with what it issues.
pub struct IoQueue {
    queue: RdmaQueue,
    params: IoParams,
    generator: IoGenerator,
    /// I/Os still to submit when the run is count-limited.
    budget: Option<u64>,
}

impl IoQueue {
    /// Connects I/O queue `qid` of `ctrl` and runs its Fabrics Connect.
    pub fn open(
        host: &HostParams,
        ctrl: &ControllerInfo,
        qid: u16,
        params: IoParams,
        payload: &[u8],
        generator: IoGenerator,
        budget: Option<u64>,
    ) -> Result<Self, RdmaError> {
        let entries = queue_entries(params.qd);
        let slots = params.qd.min(entries) as u16;
        let shape = QueueShape {
            qid,
            entries: entries as u16,
            slots,
            // The Connect data travels keyed from a slot's buffer too.
            data_size: params.bs.max(ConnectData::SIZE as u32),
            in_capsule: if params.bs <= params.in_capsule_limit {
                params.bs
            } else {
                0
            },
        };
        let mut queue = RdmaQueue::connect(host.addr, shape, Some(payload), host.timeout)?;
        connect_io_queue(&mut queue, host, ctrl, qid, entries)?;
        Ok(Self {
            queue,
            params,
            generator,
            budget,
        })
    }

    fn fill(&mut self, now: Instant) -> Result<(), RdmaError> {
        while self.queue.core.can_submit() && self.budget != Some(0) {
            let io = self.generator.next_io();
            let p = self.params;
            let transfer = if io.read {
                Transfer::Read(p.bs)
            } else {
                Transfer::Payload(p.bs)
            };
            let sqe = io_sqe(p.nsid, p.nlb, 0, io);
            self.queue
                .core
                .submit(sqe, transfer, now, &mut self.queue.qp)?;
            if let Some(b) = self.budget.as_mut() {
                *b -= 1;
            }
        }
        Ok(())
    }

    fn finished(&self) -> bool {
        self.budget == Some(0) && self.queue.core.outstanding() == 0
    }
}

/// Runs `queues` until the timeline ends: polls every completion queue, records what
/// finished and tops each queue up again. Without busy polling it sleeps on the completion
/// channels between rounds (armed before the last poll, so no completion is missed).
pub fn run_worker(
    mut queues: Vec<IoQueue>,
    timeline: Timeline,
    cfg: WorkerConfig,
) -> Result<WorkerResult, RdmaError> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    for (i, q) in queues.iter().enumerate() {
        epoll.add(
            q.queue.channel.as_ref(),
            EpollEvent::new(EpollFlags::EPOLLIN, i as u64),
        )?;
    }
    let mut events = vec![EpollEvent::empty(); queues.len().clamp(1, 1024)];
    let mut done: Vec<Finished> = Vec::with_capacity(POLL_BATCH);
    let mut recorder = Recorder::new(timeline, cfg.bs);
    recorder.wait_for_start();
    let now = Instant::now();
    for q in queues.iter_mut() {
        q.fill(now)?;
    }
    let mut end = RunEnd::default();
    loop {
        for q in queues.iter_mut() {
            if !cfg.busy_poll {
                q.queue.cq.get_events()?;
                q.queue.cq.req_notify()?;
            }
            loop {
                let n = q.queue.poll(&mut done)?;
                let now = Instant::now();
                for f in done.drain(..) {
                    recorder.record(f.read, f.start, f.cqe.status.is_success(), now);
                }
                if end.submitting() {
                    q.fill(now)?;
                }
                if n < POLL_BATCH {
                    break;
                }
            }
        }
        let finished = end.check(
            &timeline,
            || queues.iter().map(|q| q.queue.core.outstanding()).sum(),
            || queues.iter().all(IoQueue::finished),
        );
        if finished.map_err(RdmaError::DrainTimeout)? {
            break;
        }
        if !cfg.busy_poll {
            match epoll.wait(&mut events, EpollTimeout::from(WAIT_SLICE_MS)) {
                Ok(_) | Err(nix::Error::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(recorder.finish())
}
