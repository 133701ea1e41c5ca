//! The sans-I/O core of one NVMe/TCP connection on the target (the shape of the kernel's
//! `nvme_tcp_data_ready` / `io_work`: readiness wakes the queue, which drains its socket
//! through the per-queue PDU receive machine). It owns the receive state machine, the command
//! slots with their preallocated data buffers, R2T, the send queue and the dispatch core it
//! feeds, and never touches a socket: the shell (`super::conn::TcpConnection`) reads into
//! the buffers [`TcpCore::read_buf`] hands out and reports the count with
//! [`TcpCore::received`], and writes the iovecs of [`TcpCore::send_iovecs`] and reports them
//! with [`TcpCore::sent`]. Headers are parsed where a read left them, data is read straight
//! into the command's slot buffer and sent from it: no copy beyond what the socket does.
//!
//! Flow (NVMe/TCP 1.0 §3.3–§3.6): ICReq → ICResp; then per command: CapsuleCmd [in-capsule
//! data] → SGL checks → `prepare` → [R2T → H2CData …] → `execute` → [`on_io_complete` →
//! `finish`] → [C2HData] → CapsuleResp.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nvme::queue::{Direction, Outcome, Queue, Response, TerminateReason};
use nvme::wire::{SglType, Sqe, Status};
use storage::fixedbuf::WithBuffer;
use storage::{IoSubmit, Lent};
use tracing::{debug, info, warn};

use super::buffers::SlotBuffers;
use super::pdu::{
    digest, encode_header, offsets, DataHeader, Digests, EncodedHeader, Fes, IcReq, IcResp,
    PduHeader, PduType, R2t, RecvLimits, Role, TermReq, MAX_HEADER_BUF, MIN_MAXH2CDATA,
};
use super::recv::{Discard, Event, Receiver};
use super::send::{Batch, IovBatch, SendItem, SendQueue};
use crate::conn::ConnStatus;
use crate::timing::Timing;

/// NVMe/TCP 1.0 §2.2: the admin queue's in-capsule data size is 8 KiB (Linux hosts send
/// admin writes up to that size in-capsule regardless of IOCCSZ).
pub const ADMIN_IN_CAPSULE_DATA: u32 = 8192;

/// Socket read chunk for headers and small PDUs.
const STAGING: usize = 32 * 1024;

/// A connection that has not completed a Fabrics Connect by then is closed: an idle or
/// half-open socket must not hold buffers forever (no keep-alive runs before Connect).
/// The default of `TcpConnection::with_connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Transport parameters of a port (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpParams {
    /// MAXH2CDATA advertised in ICResp (rounded down to a multiple of 4, at least 4096).
    pub max_h2c_data: u32,
    /// In-capsule data accepted on I/O queues (IOCCSZ = (64 + this) / 16).
    pub in_capsule_data_size: u32,
    /// MDTS in bytes: the size of every slot's data buffer.
    pub max_data_transfer: u32,
}

/// Where a command slot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Capsule accepted; its in-capsule data is arriving.
    CapsuleData,
    /// Waiting for H2CData: `received` bytes so far, the outstanding R2T ends at `r2t_end`.
    H2C {
        received: u32,
        r2t_end: u32,
        digest_error: bool,
    },
    /// A backend op is in flight.
    Submitted,
    /// Held by the core (Asynchronous Event Request) until `poll` completes it.
    Held,
    /// The core could not start it yet (`Outcome::Blocked`); `poll` runs it again.
    Blocked,
    /// C2HData queued from this slot's buffer; free once it is written.
    Sending,
    /// Aborted while an R2T of it was outstanding (NVMe Base 2.0 §5.1): the host answers
    /// that R2T even so (NVMe/TCP 1.0 §3.6.2.10), so the slot and its TTAG stay reserved until
    /// the window's data arrived, and that data is dropped. Nothing else uses the slot meanwhile.
    Draining {
        received: u32,
        r2t_end: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: SlotState,
    sqe: Sqe,
    /// The command's data length (from the SGL).
    len: u32,
    /// In-capsule data bytes received with the capsule.
    capsule_len: u32,
    /// An Abort asked the backend to cancel this command's op: answered on its completion.
    cancelling: bool,
}

impl Slot {
    fn free() -> Self {
        Slot {
            state: SlotState::Free,
            sqe: Sqe::default(),
            len: 0,
            capsule_len: 0,
            cancelling: false,
        }
    }
}

/// A slot's command times (`TcpCore::times`).
#[derive(Debug, Clone, Copy, Default)]
struct SlotTimes {
    arrived: Option<u64>,
    submitted: Option<u64>,
}

/// Where the data of the PDU being received goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataDest {
    None,
    /// Into `slot`'s buffer from byte `base`.
    Slot {
        slot: u16,
        base: u32,
    },
}

/// Why the connection is closing (logged once).
#[derive(Debug)]
pub enum CloseReason {
    /// The host closed its end (read returned 0).
    PeerClosed,
    /// The socket failed.
    Io(io::Error),
    Protocol {
        fes: Option<Fes>,
        what: String,
    },
    HostTerminated {
        fes: u16,
        fei: u32,
    },
    NoConnect,
    Core(TerminateReason),
}

/// What the shell does with its socket once the core closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hangup {
    /// Shut the socket down at once.
    Now,
    /// Best effort first: get the queued PDUs out — a termination request, or, when the core
    /// ends the queue, the responses already queued (a Fabrics Disconnect's completion comes
    /// before the queue is deleted, NVMe-oF 1.1 §3.3.4; every accepted command gets its
    /// response, dispatch contract) — then shut down writing and drain unread input, so the host
    /// sees FIN rather than RST (unread input would turn close into a reset and drop what is
    /// still queued).
    AfterFlush,
}

/// Where the next socket read goes (from [`TcpCore::read_buf`]).
#[derive(Debug)]
pub enum ReadBuf<'a> {
    /// Into the staging buffer (headers and small PDUs).
    Staging(&'a mut [u8]),
    /// A data phase with nothing buffered: first the rest of the PDU's data straight into
    /// the command's slot buffer, then whatever follows into the staging buffer (one readv).
    Direct {
        data: &'a mut [u8],
        staging: &'a mut [u8],
    },
}

pub struct TcpCore {
    token: u32,
    /// The host's address (log lines).
    peer: SocketAddr,
    params: TcpParams,
    queue: Queue,
    rx: Receiver,
    established: bool,
    digests: Digests,
    /// Host PDU data alignment in bytes (from HPDA).
    host_pda: usize,
    maxh2cdata: u32,
    slots: Vec<Slot>,
    /// Free slot indices (a stack: the most recently freed buffer is still warm in cache).
    free: Vec<u16>,
    buffers: SlotBuffers,
    dest: DataDest,
    /// The last `read_buf` was a direct read: (slot, start in its buffer, window length).
    direct: Option<(u16, usize, usize)>,
    /// A capsule that arrived while every slot was busy (its data, if any, is still unread).
    parked: Option<(Sqe, u32)>,
    /// When the parked capsule arrived (timing).
    parked_at: Option<u64>,
    /// An Abort completed the parked capsule: reading resumes (`can_resume`) although no slot
    /// was freed.
    unparked: bool,
    staging: Box<[u8]>,
    staged_pos: usize,
    staged_end: usize,
    send: SendQueue,
    inflight: usize,
    closed: bool,
    /// Set when the core closed, until the shell took it.
    hangup: Option<Hangup>,
    created: Instant,
    connect_timeout: Duration,
    /// Commands run with their slot buffer named to the submitter (`fixedbuf::WithBuffer`).
    fixed_buffers: bool,
    /// Command times, when the shell gives them (`set_time`, `handed_over`).
    timing: Timing,
    /// Per slot, when timing: the read that completed its capsule, and the submission of its
    /// backend op (beside `slots`, which are copied whole on the command path).
    times: Vec<SlotTimes>,
}

impl std::fmt::Debug for TcpCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpCore")
            .field("token", &self.token)
            .field("peer", &self.peer)
            .field("qid", &self.queue.qid())
            .field("slots", &self.slots.len())
            .field("inflight", &self.inflight)
            .field("closed", &self.closed)
            .finish()
    }
}

impl TcpCore {
    /// A new connection at `now` (the start of its Connect timeout); `token` is the high half
    /// of every backend tag it submits.
    pub fn new(
        queue: Queue,
        token: u32,
        peer: SocketAddr,
        params: TcpParams,
        now: Instant,
    ) -> Self {
        // ICResp rules (§3.6.2.3): MAXH2CDATA is a multiple of 4 and at least 4096.
        let maxh2cdata = (params.max_h2c_data & !3).max(MIN_MAXH2CDATA);
        let capsule_limit = params.in_capsule_data_size.max(ADMIN_IN_CAPSULE_DATA);
        let slot_size = params.max_data_transfer.max(capsule_limit) as usize;
        // Before Connect the queue size is unknown: one slot serves the Connect itself.
        let (buffers, hangup) = match SlotBuffers::new(1, slot_size) {
            Ok(b) => (b, None),
            Err(e) => {
                warn!(%peer, error = %e, "NVMe/TCP: cannot allocate command buffers, closing");
                (SlotBuffers::empty(), Some(Hangup::Now))
            }
        };
        Self {
            token,
            peer,
            params,
            queue,
            rx: Receiver::new(
                Role::Controller,
                RecvLimits {
                    max_capsule_data: capsule_limit,
                    max_data_pdu: maxh2cdata,
                },
            ),
            established: false,
            digests: Digests::default(),
            host_pda: 4,
            maxh2cdata,
            slots: vec![Slot::free(); 1],
            free: vec![0],
            buffers,
            dest: DataDest::None,
            direct: None,
            parked: None,
            parked_at: None,
            unparked: false,
            staging: vec![0u8; STAGING].into_boxed_slice(),
            staged_pos: 0,
            staged_end: 0,
            send: SendQueue::default(),
            inflight: 0,
            closed: hangup.is_some(),
            hangup,
            created: now,
            connect_timeout: CONNECT_TIMEOUT,
            fixed_buffers: false,
            timing: Timing::default(),
            times: vec![SlotTimes::default(); 1],
        }
    }

    /// Closes the connection when no Fabrics Connect completed within `timeout` of its
    /// creation (default [`CONNECT_TIMEOUT`]).
    pub fn set_connect_timeout(&mut self, timeout: Duration) {
        self.connect_timeout = timeout;
    }

    /// Whether commands run with their slot buffer named to the submitter, which may then
    /// issue their backend ops on a registration of it (io_uring fixed buffers).
    pub fn set_fixed_buffers(&mut self, on: bool) {
        self.fixed_buffers = on;
    }

    /// Whether the shell is to tell the times of what it hands over (`set_time`,
    /// `handed_over`): the dispatch core counts latencies. Otherwise no clock need be read.
    pub fn timing(&self) -> bool {
        self.queue.timing()
    }

    /// The time of the socket read or the backend completions the next calls handle (when
    /// timing): a capsule made whole by the next `received` arrived then; an op completed by
    /// the next `on_io_complete` completed then.
    pub fn set_time(&mut self, now: Instant) {
        self.timing.set(now);
    }

    /// Responses are queued whose latency is recorded at the next [`TcpCore::handed_over`].
    pub fn has_timed(&self) -> bool {
        self.timing.has_responded()
    }

    /// The shell handed the queued output to the socket at `at`: the latency of every response
    /// queued since the last call (capsule arrival to then) goes to the dispatch core's
    /// metrics.
    pub fn handed_over(&mut self, at: Instant) {
        self.timing.handed_over(at, &mut self.queue);
    }

    pub fn status(&self) -> ConnStatus {
        if self.closed {
            ConnStatus::Closed
        } else {
            ConnStatus::Open
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// PDUs are queued for an open connection.
    pub fn wants_write(&self) -> bool {
        !self.closed && !self.send.is_empty()
    }

    /// PDUs are queued (also after closing: [`Hangup::AfterFlush`] sends them).
    pub fn has_output(&self) -> bool {
        !self.send.is_empty()
    }

    /// Backend ops still writing into or reading from the slot buffers.
    pub fn inflight_ops(&self) -> usize {
        self.inflight
    }

    /// The core closed since the last call: what to do with the socket.
    pub fn take_hangup(&mut self) -> Option<Hangup> {
        self.hangup.take()
    }

    fn tag(&self, slot: u16) -> u64 {
        (self.token as u64) << 32 | slot as u64
    }

    /// The socket is to be read: open and not back-pressured by a parked capsule.
    pub fn wants_input(&self) -> bool {
        !self.closed && self.parked.is_none()
    }

    /// A parked capsule can go on now that a slot (or send-queue room) is free.
    pub fn can_resume(&self) -> bool {
        !self.closed && (self.unparked || (self.parked.is_some() && self.can_accept()))
    }

    /// Before reading more: the parked capsule, if it can go on now, and the input already
    /// buffered.
    pub fn resume(&mut self, io: &mut dyn IoSubmit) {
        self.unparked = false;
        if let Some((sqe, data_len)) = self.parked {
            if !self.can_accept() {
                return;
            }
            self.parked = None;
            let arrived = self.parked_at.take();
            self.on_capsule(sqe, data_len, arrived, io);
        }
        self.process_staging(io);
    }

    /// Where the next read goes; `None` once closed. In a data phase with nothing buffered,
    /// the data goes straight into the command's buffer (and whatever follows into the
    /// staging buffer). Call [`TcpCore::received`] with the count read.
    pub fn read_buf(&mut self) -> Option<ReadBuf<'_>> {
        if self.closed {
            return None;
        }
        self.staged_pos = 0;
        self.staged_end = 0;
        self.direct = None;
        let direct = match (self.rx.data_window(), self.dest) {
            (Some(w), DataDest::Slot { slot, base }) => Some((w, slot, base)),
            _ => None,
        };
        let Some((w, slot, base)) = direct else {
            return Some(ReadBuf::Staging(&mut self.staging[..]));
        };
        let start = (base + w.offset) as usize;
        let end = start + w.remaining as usize;
        if self.buffers.get(slot as usize).get(start..end).is_none() {
            self.close(CloseReason::Protocol {
                fes: None,
                what: "data placement outside the slot buffer".into(),
            });
            return None;
        }
        self.direct = Some((slot, start, w.remaining as usize));
        Some(ReadBuf::Direct {
            data: &mut self.buffers.get_mut(slot as usize)[start..end],
            staging: &mut self.staging[..],
        })
    }

    /// `n` (> 0) bytes were read into the last [`TcpCore::read_buf`]: process them, until
    /// they run out or back-pressure or close stops it.
    pub fn received(&mut self, n: usize, io: &mut dyn IoSubmit) {
        match self.direct.take() {
            Some((slot, start, window)) => {
                let k = n.min(window);
                let placed = &self.buffers.get(slot as usize)[start..start + k];
                let ev = self.rx.data_placed(placed);
                self.staged_end = n - k;
                if let Some(ev) = ev {
                    self.on_event(ev, io);
                }
            }
            None => self.staged_end = n,
        }
        self.process_staging(io);
    }

    /// Appends the unsent bytes of the queued PDUs (at most a batch) to `out`; returns their
    /// length. Data parts point into the slot buffers.
    pub fn send_iovecs<'a>(&'a self, out: &mut IovBatch<'a>) -> usize {
        self.send.gather(&self.buffers, out)
    }

    /// [`TcpCore::send_iovecs`], with PDU data of at least `threshold` bytes (0 = never) in a
    /// batch of its own to be sent zero-copy ([`Batch::zerocopy`]); report it with
    /// [`TcpCore::sent_zerocopy`].
    pub fn send_batch<'a>(&'a self, out: &mut IovBatch<'a>, threshold: usize) -> Batch {
        self.send.gather_batch(&self.buffers, out, threshold)
    }

    /// The first `n` bytes of what [`TcpCore::send_iovecs`] returned were written.
    pub fn sent(&mut self, n: usize) {
        let (slots, free) = (&mut self.slots, &mut self.free);
        self.send.advance(n, |slot| sent(slots, free, slot));
        self.maybe_resize();
    }

    /// `n` bytes of a zero-copy batch went out in the socket's zero-copy send `id`: the
    /// command's slot stays busy (its buffer unchanged, a lent range held) until
    /// [`TcpCore::zerocopy_done`] reports `id`.
    pub fn sent_zerocopy(&mut self, n: usize, id: u32) {
        let (slots, free) = (&mut self.slots, &mut self.free);
        self.send
            .advance_zerocopy(n, id, |slot| sent(slots, free, slot));
        self.maybe_resize();
    }

    /// The kernel finished with the zero-copy sends `lo..=hi` (its error-queue
    /// notification): their slots are free again.
    pub fn zerocopy_done(&mut self, lo: u32, hi: u32) {
        let (slots, free) = (&mut self.slots, &mut self.free);
        self.send
            .zerocopy_done(lo, hi, |slot| sent(slots, free, slot));
        self.maybe_resize();
    }

    /// Zero-copy sends not reported done yet.
    pub fn zerocopy_outstanding(&self) -> usize {
        self.send.zerocopy_outstanding()
    }

    /// A backend op of this connection finished (`tag` low 32 bits = slot). `false`: no op
    /// of this connection was in flight there (logged, nothing changed). A command the core
    /// has not finished (a fused Write after its Compare) is blocked: `poll` runs it again.
    pub fn on_io_complete(&mut self, tag: u64, result: i32) -> bool {
        let slot = (tag & 0xffff_ffff) as usize;
        match self.slots.get(slot) {
            Some(s) if s.state == SlotState::Submitted => {
                self.inflight -= 1;
                let sqe = s.sqe;
                let submitted = self.times[slot].submitted;
                self.timing.backend_done(&sqe, submitted, &mut self.queue);
                if std::mem::take(&mut self.slots[slot].cancelling) {
                    // The op's status says whether the cancel came in time (nvm::finish
                    // completes a cancelled op with Abort Requested).
                    self.queue.answer_abort(sqe.cid, result == -libc::ECANCELED);
                }
                match self.queue.finish(&sqe, result) {
                    Some(resp) => self.respond(slot as u16, resp),
                    None => self.slots[slot].state = SlotState::Blocked,
                }
                true
            }
            _ => {
                warn!(peer = %self.peer, tag, "NVMe/TCP: completion for a slot with no op in flight");
                false
            }
        }
    }

    /// Closes a connection that completed no Fabrics Connect within its timeout.
    pub fn check_connect_timeout(&mut self, now: Instant) {
        if !self.closed
            && self.queue.qid().is_none()
            && now.saturating_duration_since(self.created) > self.connect_timeout
        {
            self.close(CloseReason::NoConnect);
        }
    }

    /// Runs blocked commands again (in slot order), then takes completions from the dispatch
    /// core (held AERs, fused Compare halves) and its verdict on the queue (keep-alive
    /// expiry, controller deletion).
    pub fn poll(&mut self, now: Instant, io: &mut dyn IoSubmit) {
        if self.closed {
            return;
        }
        // Blocked commands run now submit their ops now.
        self.timing.advance(now);
        for slot in 0..self.slots.len() {
            let s = &self.slots[slot];
            if s.state == SlotState::Blocked && self.queue.may_run(&s.sqe, now) {
                self.run(slot as u16, io);
            }
        }
        // Commands skipped above wait for a QoS limit: wake this connection at the first's time.
        if let Some(at) = self.queue.next_wake() {
            io.wake_at(at);
        }
        for cid in self.queue.take_abort_requests() {
            let aborted = self.abort(cid, io);
            debug!(peer = %self.peer, cid, ?aborted, "NVMe/TCP: Abort of a command of this queue");
            if let Some(aborted) = aborted {
                self.queue.answer_abort(cid, aborted);
            }
        }
        let poll = self.queue.poll(now);
        for resp in poll.completions {
            match self.find_held(resp.cqe.cid) {
                Some(slot) => self.respond(slot, resp),
                None => self.send_response(resp),
            }
        }
        if let Some(reason) = poll.terminate {
            self.close(CloseReason::Core(reason));
        }
    }

    /// Aborts command `cid` if it has not started (NVMe Base 2.0 §5.1): parked by
    /// back-pressure, waiting for H2CData, or blocked by the core. It completes once, with
    /// Abort Requested, and frees its slot (after the outstanding R2T's data, see
    /// `SlotState::Draining`). A command in the backend is cancelled if the submitter can
    /// (`IoSubmit::cancel`): answered when its op completes (`None` now). A command receiving
    /// in-capsule data or held by the core runs on: `false`, not aborted.
    fn abort(&mut self, cid: u16, io: &mut dyn IoSubmit) -> Option<bool> {
        if let Some((sqe, _)) = self.parked.filter(|(sqe, _)| sqe.cid == cid) {
            // Its in-capsule data, if any, is still unread: with no destination it is
            // read and discarded like any PDU data nobody wants.
            let Some(resp) = self.queue.abort_waiting(&sqe) else {
                return Some(false);
            };
            self.parked = None;
            self.unparked = true;
            self.send_response(resp);
            return Some(true);
        }
        let found = self.slots.iter().position(|s| {
            s.sqe.cid == cid
                && matches!(
                    s.state,
                    SlotState::H2C { .. } | SlotState::Blocked | SlotState::Submitted
                )
        });
        let Some(slot) = found else {
            return Some(false);
        };
        let s = self.slots[slot];
        let (received, r2t_end) = match s.state {
            SlotState::H2C {
                received, r2t_end, ..
            } => (received, r2t_end),
            SlotState::Blocked => (0, 0),
            // A fused half is never aborted alone (see `Queue::abort_waiting`).
            SlotState::Submitted if s.sqe.fuse() == 0 && io.cancel(self.tag(slot as u16)) => {
                self.slots[slot].cancelling = true;
                return None;
            }
            _ => return Some(false),
        };
        let Some(resp) = self.queue.abort_waiting(&s.sqe) else {
            return Some(false);
        };
        // Data of this slot still to come: an R2T window not filled, or the PDU whose data is
        // being placed right now.
        let placing = matches!(self.dest, DataDest::Slot { slot: d, .. } if d as usize == slot);
        if received < r2t_end || placing {
            self.slots[slot].state = SlotState::Draining { received, r2t_end };
            self.send_response(resp);
        } else {
            self.respond(slot as u16, resp);
        }
        Some(true)
    }

    fn find_held(&self, cid: u16) -> Option<u16> {
        self.slots
            .iter()
            .position(|s| s.state == SlotState::Held && s.sqe.cid == cid)
            .map(|i| i as u16)
    }

    /// Whether a new command can be taken: a slot is free and the send queue is within its
    /// bound. A conforming host never has more than `sq_entries` commands outstanding, each
    /// with at most two queued PDUs (R2T, or C2HData + CapsuleResp), so the bound only bites
    /// on a host that sends commands without reading the responses — which then waits.
    fn can_accept(&self) -> bool {
        !self.free.is_empty() && self.send.len() <= 2 * self.slots.len() + 2
    }

    fn release(&mut self, slot: u16) {
        self.slots[slot as usize].state = SlotState::Free;
        self.free.push(slot);
    }

    /// Feeds buffered bytes to the receive machine until they run out or an event asks
    /// to stop (back-pressure, close).
    fn process_staging(&mut self, io: &mut dyn IoSubmit) {
        while self.staged_pos < self.staged_end && !self.closed && self.parked.is_none() {
            let input = &self.staging[self.staged_pos..self.staged_end];
            // The sink is consulted only for data bytes (pad bytes before them are skipped).
            let result = match self.dest {
                DataDest::Slot { slot, base } => {
                    let mut buf = &mut self.buffers.get_mut(slot as usize)[base as usize..];
                    self.rx.feed(input, &mut buf)
                }
                _ => self.rx.feed(input, &mut Discard),
            };
            match result {
                Ok((used, ev)) => {
                    self.staged_pos += used;
                    if let Some(ev) = ev {
                        self.on_event(ev, io);
                    }
                }
                Err(e) => {
                    let fes = e.fes();
                    let what = e.to_string();
                    if let Some(fes) = fes {
                        self.queue_term_req(fes, e.fei());
                    }
                    self.close(CloseReason::Protocol { fes, what });
                }
            }
        }
    }

    fn on_event(&mut self, ev: Event, io: &mut dyn IoSubmit) {
        match ev {
            Event::Pdu { header, data_len } => {
                // Each PDU names its own data destination (if it has data).
                self.dest = DataDest::None;
                self.on_pdu(header, data_len, io)
            }
            Event::DataComplete { digest_ok } => {
                let dest = std::mem::replace(&mut self.dest, DataDest::None);
                if let DataDest::Slot { slot, .. } = dest {
                    self.on_data_complete(slot, digest_ok, io);
                }
            }
        }
    }

    fn on_pdu(&mut self, header: PduHeader, data_len: u32, io: &mut dyn IoSubmit) {
        match header {
            PduHeader::IcReq(ic) => self.on_icreq(ic),
            PduHeader::CapsuleCmd(sqe) => {
                if !self.can_accept() {
                    // Back-pressure (not an error): wait for a slot before reading on.
                    debug!(peer = %self.peer, cid = sqe.cid, "NVMe/TCP: all slots busy, pausing reads");
                    self.parked = Some((sqe, data_len));
                    self.parked_at = self.timing.now();
                } else {
                    self.on_capsule(sqe, data_len, self.timing.now(), io);
                }
            }
            PduHeader::H2CData { hdr, .. } => self.on_h2c_data(hdr),
            PduHeader::H2CTermReq(t) => self.close(CloseReason::HostTerminated {
                fes: t.fes,
                fei: t.fei,
            }),
            // The receiver only yields host-to-controller PDUs on this side.
            other => self.fatal(
                Fes::InvalidPduHeaderField,
                0,
                format!("unexpected {:?}", other.pdu_type()),
            ),
        }
    }

    /// ICReq (§3.6.2.2): PFV 0 only; any HPDA up to 31 is honoured by padding C2HData;
    /// digests are enabled exactly as asked.
    fn on_icreq(&mut self, ic: IcReq) {
        if ic.pfv != 0 {
            return self.fatal(
                Fes::UnsupportedParameter,
                8,
                format!("ICReq PFV {}", ic.pfv),
            );
        }
        if ic.hpda > 31 {
            return self.fatal(
                Fes::UnsupportedParameter,
                10,
                format!("ICReq HPDA {}", ic.hpda),
            );
        }
        let digests = Digests::from_dgst(ic.dgst);
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            dgst: digests.to_dgst(),
            maxh2cdata: self.maxh2cdata,
        };
        let mut head = EncodedHeader {
            bytes: [0; MAX_HEADER_BUF],
            len: 0,
        };
        let bytes = resp.encode();
        head.bytes[..bytes.len()].copy_from_slice(&bytes);
        head.len = bytes.len();
        self.send.push(SendItem::header_only(head));
        self.digests = digests;
        // Reads of RAM and null namespaces go out from the namespace's memory, unless a data
        // digest must be computed over them first (`storage::ram`: the bytes may change
        // between the digest and the send).
        self.queue.lend_reads(!digests.data);
        self.host_pda = (ic.hpda as usize + 1) * 4;
        self.established = true;
        // CPDA 0: we take data at any dword alignment.
        self.rx.establish(digests, 4);
        debug!(peer = %self.peer, ?digests, hpda = ic.hpda, "NVMe/TCP: connection initialised");
    }

    fn on_capsule(&mut self, sqe: Sqe, data_len: u32, arrived: Option<u64>, io: &mut dyn IoSubmit) {
        let Some(slot) = self.free.pop() else {
            self.parked = Some((sqe, data_len));
            self.parked_at = arrived;
            return;
        };
        let s = &mut self.slots[slot as usize];
        s.sqe = sqe;
        self.times[slot as usize].arrived = arrived;
        s.len = 0;
        s.capsule_len = data_len;
        s.state = SlotState::CapsuleData;
        if data_len > 0 {
            // Bounded by the receiver (≤ capsule_limit ≤ slot size) before any data arrived.
            self.dest = DataDest::Slot { slot, base: 0 };
        } else {
            self.start_command(slot, io);
        }
    }

    fn on_data_complete(&mut self, slot: u16, digest_ok: bool, io: &mut dyn IoSubmit) {
        let s = self.slots[slot as usize];
        match s.state {
            SlotState::CapsuleData => {
                if digest_ok {
                    self.start_command(slot, io);
                } else {
                    // §3.6.1.2 / interop: a data digest error fails only this command.
                    debug!(peer = %self.peer, cid = s.sqe.cid, "NVMe/TCP: in-capsule data digest error");
                    self.reject(slot, Status::TRANSIENT_TRANSPORT_ERROR);
                }
            }
            SlotState::H2C {
                received,
                r2t_end,
                digest_error,
            } => {
                let digest_error = digest_error || !digest_ok;
                if received < r2t_end {
                    self.slots[slot as usize].state = SlotState::H2C {
                        received,
                        r2t_end,
                        digest_error,
                    };
                    return;
                }
                if received < s.len {
                    self.slots[slot as usize].state = SlotState::H2C {
                        received,
                        r2t_end,
                        digest_error,
                    };
                    self.send_r2t(slot, received);
                } else if digest_error {
                    debug!(peer = %self.peer, cid = s.sqe.cid, "NVMe/TCP: H2CData digest error");
                    self.reject(slot, Status::TRANSIENT_TRANSPORT_ERROR);
                } else {
                    self.run(slot, io);
                }
            }
            SlotState::Draining { received, r2t_end } if received >= r2t_end => {
                debug!(peer = %self.peer, cid = s.sqe.cid, "NVMe/TCP: data of an aborted command dropped");
                self.release(slot);
                self.maybe_resize();
            }
            _ => {}
        }
    }

    /// The transport's part of command admission: the SGL (NVMe/TCP 1.0 §3.5.1: transport
    /// SGL data block, or data block with offset for in-capsule data), then the core's.
    fn start_command(&mut self, slot: u16, io: &mut dyn IoSubmit) {
        let s = self.slots[slot as usize];
        let sgl = s.sqe.dptr;
        let in_capsule_max = if self.queue.qid().is_some_and(|q| q > 0) {
            self.params.in_capsule_data_size
        } else {
            ADMIN_IN_CAPSULE_DATA
        };
        let slot_size = self.buffers.slot_size() as u64;
        let check = match sgl.sgl_type {
            SglType::TransportDataBlock if s.capsule_len > 0 => {
                Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
            }
            SglType::TransportDataBlock if sgl.address != 0 => Err(Status::SGL_OFFSET_INVALID),
            SglType::TransportDataBlock if sgl.length as u64 > slot_size => {
                Err(Status::DATA_SGL_LENGTH_INVALID)
            }
            SglType::TransportDataBlock => Ok(false),
            SglType::DataBlockOffset if sgl.length > in_capsule_max => {
                Err(Status::DATA_SGL_LENGTH_INVALID)
            }
            SglType::DataBlockOffset if sgl.address > s.capsule_len as u64 => {
                Err(Status::SGL_OFFSET_INVALID)
            }
            SglType::DataBlockOffset if sgl.address + sgl.length as u64 > s.capsule_len as u64 => {
                Err(Status::DATA_SGL_LENGTH_INVALID)
            }
            SglType::DataBlockOffset => Ok(true),
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        };
        let in_capsule = match check {
            Ok(v) => v,
            Err(status) => return self.reject(slot, status.with_dnr()),
        };
        let len = sgl.length;
        self.slots[slot as usize].len = len;
        let dir = match self.queue.prepare(&s.sqe, len) {
            Ok(d) => d,
            Err(status) => return self.reject(slot, status),
        };
        if in_capsule && len > 0 {
            if dir != Direction::HostToController {
                // Interop notes: an offset SGL on a read is an SGL error.
                return self.reject(slot, Status::SGL_OFFSET_INVALID.with_dnr());
            }
            if sgl.address != 0 {
                // The core wants the data at the start of the (4096-aligned) buffer.
                let from = sgl.address as usize;
                self.buffers
                    .get_mut(slot as usize)
                    .copy_within(from..from + len as usize, 0);
            }
        }
        if dir == Direction::HostToController && !in_capsule && len > 0 {
            self.slots[slot as usize].state = SlotState::H2C {
                received: 0,
                r2t_end: 0,
                digest_error: false,
            };
            return self.send_r2t(slot, 0);
        }
        self.run(slot, io);
    }

    /// Asks for the next chunk of a write (§3.6.2.10): one R2T outstanding per command,
    /// each at most MAXH2CDATA so the Linux host answers it with one H2CData PDU.
    fn send_r2t(&mut self, slot: u16, offset: u32) {
        let s = &mut self.slots[slot as usize];
        let r2tl = (s.len - offset).min(self.maxh2cdata);
        if let SlotState::H2C { r2t_end, .. } = &mut s.state {
            *r2t_end = offset + r2tl;
        }
        let r2t = PduHeader::R2T(R2t {
            cccid: s.sqe.cid,
            ttag: slot,
            r2to: offset,
            r2tl,
        });
        let head = encode_header(&r2t, self.digests, 0, self.host_pda);
        self.send.push(SendItem::header_only(head));
    }

    /// H2CData (§3.6.2.8): must answer the outstanding R2T of a live command, in order.
    fn on_h2c_data(&mut self, hdr: DataHeader) {
        let Some(s) = self.slots.get(hdr.ttag as usize).copied() else {
            return self.fatal(
                Fes::InvalidPduHeaderField,
                offsets::TTAG,
                format!("H2CData TTAG {} is not a command slot", hdr.ttag),
            );
        };
        let (SlotState::H2C {
            received, r2t_end, ..
        }
        | SlotState::Draining { received, r2t_end }) = s.state
        else {
            return self.fatal(
                Fes::PduSequenceError,
                0,
                format!("H2CData for TTAG {} which awaits no data", hdr.ttag),
            );
        };
        if hdr.cccid != s.sqe.cid {
            return self.fatal(
                Fes::InvalidPduHeaderField,
                offsets::CCCID,
                format!(
                    "H2CData CCCID {:#x} does not match TTAG {}",
                    hdr.cccid, hdr.ttag
                ),
            );
        }
        if hdr.datao != received {
            return self.fatal(
                Fes::DataTransferOutOfRange,
                0,
                format!(
                    "H2CData DATAO {} but {} bytes received",
                    hdr.datao, received
                ),
            );
        }
        if hdr.datao as u64 + hdr.datal as u64 > r2t_end as u64 {
            return self.fatal(
                Fes::DataTransferOutOfRange,
                0,
                format!(
                    "H2CData {}+{} beyond the R2T window ending at {}",
                    hdr.datao, hdr.datal, r2t_end
                ),
            );
        }
        if let SlotState::H2C { received, .. } | SlotState::Draining { received, .. } =
            &mut self.slots[hdr.ttag as usize].state
        {
            *received += hdr.datal;
        }
        self.dest = DataDest::Slot {
            slot: hdr.ttag,
            base: hdr.datao,
        };
    }

    /// Runs the command in `slot` on the core with its data buffer.
    fn run(&mut self, slot: u16, io: &mut dyn IoSubmit) {
        let s = self.slots[slot as usize];
        let tag = self.tag(slot);
        // Backend ops on the slot's buffer may be issued on a ring registration of it.
        let mut with_buffer;
        let io: &mut dyn IoSubmit = if self.fixed_buffers {
            with_buffer = WithBuffer::new(io, self.buffers.unit(slot as usize));
            &mut with_buffer
        } else {
            io
        };
        let buf = &mut self.buffers.get_mut(slot as usize)[..s.len as usize];
        match self.queue.execute(&s.sqe, buf, tag, io) {
            Outcome::Complete(resp) => {
                let lent = self.queue.take_lent();
                self.respond_from(slot, resp, lent)
            }
            Outcome::Submitted => {
                self.inflight += 1;
                self.slots[slot as usize].state = SlotState::Submitted;
                self.times[slot as usize].submitted = self.timing.now();
            }
            Outcome::Held => self.slots[slot as usize].state = SlotState::Held,
            Outcome::Blocked => self.slots[slot as usize].state = SlotState::Blocked,
        }
    }

    fn reject(&mut self, slot: u16, status: Status) {
        let sqe = self.slots[slot as usize].sqe;
        let resp = self.queue.reject(&sqe, status);
        self.respond(slot, resp);
    }

    /// Queues the response of `slot`'s command: C2HData from the slot buffer when the core
    /// returns data, then the CapsuleResp unless the SUCCESS flag stands in for it
    /// (§3.6.2.9: only when the host disabled SQ flow control).
    fn respond(&mut self, slot: u16, resp: Response) {
        self.respond_from(slot, resp, None)
    }

    /// [`TcpCore::respond`], with the data taken from the backend's memory when the core lent
    /// it (`lent`) rather than from the slot buffer. The slot stays busy until the data is
    /// sent either way, which keeps the send queue bounded by the slots.
    fn respond_from(&mut self, slot: u16, resp: Response, lent: Option<Lent>) {
        let s = self.slots[slot as usize];
        if !self.closed {
            self.timing
                .responded(&s.sqe, self.times[slot as usize].arrived);
        }
        let data_len = resp.data_len.min(s.len);
        if self.closed || data_len == 0 {
            self.release(slot);
            if !self.closed {
                self.send_response(resp);
            }
            self.maybe_resize();
            return;
        }
        let success = self.queue.flow_control_disabled() && resp.cqe.status.is_success();
        let hdr = PduHeader::C2HData {
            hdr: DataHeader {
                cccid: s.sqe.cid,
                ttag: 0,
                datao: 0,
                datal: data_len,
            },
            last: true,
            success,
        };
        let head = encode_header(&hdr, self.digests, data_len, self.host_pda);
        match lent {
            // Lending is off while data digests are on (see `on_icreq`), so no digest here.
            Some(mut bytes) if !self.digests.data && bytes.len() >= data_len as usize => {
                bytes.truncate(data_len as usize);
                self.send.push_lent(head, slot, bytes);
            }
            lent => {
                let buf = &mut self.buffers.get_mut(slot as usize)[..data_len as usize];
                if let Some(bytes) = lent {
                    // Never taken with lending set up as above; a guard, not a path.
                    let n = bytes.len().min(buf.len());
                    buf[..n].copy_from_slice(&bytes.as_bytes()[..n]);
                }
                let ddgst = self.digests.data.then(|| digest(buf));
                self.send
                    .push(SendItem::with_data(head, slot, data_len, ddgst));
            }
        }
        self.slots[slot as usize].state = SlotState::Sending;
        if !success {
            self.send_response(resp);
        }
    }

    fn send_response(&mut self, resp: Response) {
        let head = encode_header(
            &PduHeader::CapsuleResp(resp.cqe),
            self.digests,
            0,
            self.host_pda,
        );
        self.send.push(SendItem::header_only(head));
    }

    /// After a successful Connect the queue size is known: size the slot table to it
    /// (backend contract: buffers allocated once per queue, when its size is known).
    fn maybe_resize(&mut self) {
        let want = self.queue.sq_entries() as usize;
        if self.closed || want == 0 || want == self.slots.len() || self.queue.qid().is_none() {
            return;
        }
        // Queued headers are copies; only C2HData (state Sending) points into the buffers.
        if self.free.len() != self.slots.len() {
            return;
        }
        match SlotBuffers::new(want, self.buffers.slot_size()) {
            Ok(b) => {
                self.buffers = b;
                self.slots = vec![Slot::free(); want];
                self.times = vec![SlotTimes::default(); want];
                self.free = (0..want as u16).rev().collect();
                debug!(peer = %self.peer, qid = ?self.queue.qid(), slots = want, "NVMe/TCP: queue sized");
            }
            Err(e) => self.close(CloseReason::Protocol {
                fes: None,
                what: format!("cannot allocate {want} command buffers: {e}"),
            }),
        }
    }

    fn queue_term_req(&mut self, fes: Fes, fei: u32) {
        // §3.6.2.5: C2HTermReq carries the offending header (≤ 128 bytes), never digests.
        let t = TermReq::new(fes, fei, self.rx.header_bytes());
        let bytes = t.encode(PduType::C2HTermReq);
        let mut head = EncodedHeader {
            bytes: [0; MAX_HEADER_BUF],
            len: bytes.len(),
        };
        head.bytes[..bytes.len()].copy_from_slice(&bytes);
        self.send.push(SendItem::header_only(head));
    }

    /// A fatal transport error: report it with a C2HTermReq and close.
    fn fatal(&mut self, fes: Fes, fei: u32, what: String) {
        self.queue_term_req(fes, fei);
        self.close(CloseReason::Protocol {
            fes: Some(fes),
            what,
        });
    }

    /// Closes the connection (once): logs why, tells the shell what to do with the socket
    /// ([`TcpCore::take_hangup`]), frees every slot no backend op still uses.
    pub fn close(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        let peer = self.peer;
        let qid = self.queue.qid();
        match &reason {
            CloseReason::PeerClosed => info!(%peer, ?qid, "NVMe/TCP: connection closed by host"),
            CloseReason::Io(e) => warn!(%peer, ?qid, error = %e, "NVMe/TCP: connection failed"),
            CloseReason::Protocol { fes, what } => {
                warn!(%peer, ?qid, ?fes, "NVMe/TCP: terminating connection: {what}")
            }
            CloseReason::HostTerminated { fes, fei } => warn!(
                %peer, ?qid, fes, fei,
                "NVMe/TCP: host terminated the connection (H2CTermReq)"
            ),
            CloseReason::Core(r) => info!(%peer, ?qid, reason = ?r, "NVMe/TCP: closing queue"),
            CloseReason::NoConnect => warn!(
                %peer,
                "NVMe/TCP: no Fabrics Connect within {} ms, closing",
                self.connect_timeout.as_millis()
            ),
        }
        self.hangup = Some(
            if matches!(reason, CloseReason::Protocol { .. } | CloseReason::Core(_)) {
                Hangup::AfterFlush
            } else {
                Hangup::Now
            },
        );
        self.closed = true;
        self.parked = None;
        // Buffers stay until every submitted op completed (backend contract); free the rest. The
        // queued C2HData of a lingering close still reads its slot buffer: nothing writes
        // into a closed connection's buffers but the ops in flight.
        self.free.clear();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.state != SlotState::Submitted {
                s.state = SlotState::Free;
                self.free.push(i as u16);
            }
        }
    }
}

/// A C2HData PDU from `slot`'s buffer was fully written: the slot is free again.
fn sent(slots: &mut [Slot], free: &mut Vec<u16>, slot: u16) {
    if let Some(s) = slots.get_mut(slot as usize) {
        if s.state == SlotState::Sending {
            s.state = SlotState::Free;
            free.push(slot);
        }
    }
}

#[cfg(test)]
mod tests;
