//! One NVMe/TCP connection on the target: Contract 5 of ARCHITECTURE.md.
//!
//! It owns the non-blocking socket, the receive state machine, the command slots with their
//! preallocated data buffers, the send queue, and the `nvme::queue::Queue` it feeds. The
//! reactor calls `on_readable` / `on_writable` / `on_io_complete` / `on_tick`; nothing here
//! blocks.
//!
//! Flow (NVMe/TCP 1.0 §3.3–§3.6): ICReq → ICResp; then per command: CapsuleCmd [in-capsule
//! data] → SGL checks → `Queue::prepare` → [R2T → H2CData …] → `Queue::execute` →
//! [`on_io_complete` → `Queue::finish`] → [C2HData] → CapsuleResp.

use std::io::{self, IoSliceMut, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::backend::IoSubmit;
use nvme::queue::{Direction, Outcome, PeerInfo, Queue, Response};
use nvme::target::Target;
use nvme::wire::{SglType, Sqe, Status};
use tracing::{debug, info, warn};

use super::buffers::SlotBuffers;
use super::pdu::{
    digest, encode_header, offsets, DataHeader, Digests, EncodedHeader, Fes, IcReq, IcResp,
    PduHeader, PduType, R2t, RecvLimits, Role, TermReq, MAX_HEADER_BUF, MIN_MAXH2CDATA,
};
use super::recv::{DataSink, Discard, Event, Receiver};
use super::send::{SendItem, SendQueue};

/// NVMe/TCP 1.0 §2.2: the admin queue's in-capsule data size is 8 KiB (Linux hosts send
/// admin writes up to that size in-capsule regardless of IOCCSZ).
pub const ADMIN_IN_CAPSULE_DATA: u32 = 8192;

/// Socket read chunk for headers and small PDUs.
const STAGING: usize = 32 * 1024;

/// After a fatal error, at most this much unread input is drained so that closing the
/// socket sends FIN (and the termination request arrives) rather than RST.
const DRAIN_ON_CLOSE: usize = 1 << 20;

/// A connection that has not completed a Fabrics Connect by then is closed: an idle or
/// half-open socket must not hold buffers forever (no keep-alive runs before Connect).
/// The default of [`TcpConnection::with_connect_timeout`].
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnStatus {
    Open,
    Closed,
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
    /// C2HData queued from this slot's buffer; free once it is written.
    Sending,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: SlotState,
    sqe: Sqe,
    /// The command's data length (from the SGL).
    len: u32,
    /// In-capsule data bytes received with the capsule.
    capsule_len: u32,
}

impl Slot {
    fn free() -> Self {
        Slot {
            state: SlotState::Free,
            sqe: Sqe::default(),
            len: 0,
            capsule_len: 0,
        }
    }
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
enum CloseReason<'a> {
    PeerClosed,
    Io(io::Error),
    Protocol { fes: Option<Fes>, what: String },
    HostTerminated(&'a TermReq),
    NoConnect,
    Core(nvme::queue::TerminateReason),
}

/// Writes PDU data into a slot buffer (the feed path: bytes already in the staging buffer).
struct SlotSink<'a>(&'a mut [u8]);

impl DataSink for SlotSink<'_> {
    fn write(&mut self, offset: u32, bytes: &[u8]) {
        let start = offset as usize;
        if let Some(dst) = self.0.get_mut(start..start + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }
}

pub struct TcpConnection {
    stream: TcpStream,
    token: u32,
    peer: PeerInfo,
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
    /// A capsule that arrived while every slot was busy (its data, if any, is still unread).
    parked: Option<(Sqe, u32)>,
    staging: Box<[u8]>,
    staged_pos: usize,
    staged_end: usize,
    send: SendQueue,
    inflight: usize,
    closed: bool,
    created: Instant,
    connect_timeout: Duration,
}

impl std::fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection")
            .field("token", &self.token)
            .field("peer", &self.peer.remote)
            .field("qid", &self.queue.qid())
            .field("slots", &self.slots.len())
            .field("inflight", &self.inflight)
            .field("closed", &self.closed)
            .finish()
    }
}

impl TcpConnection {
    pub fn new(
        stream: TcpStream,
        token: u32,
        target: Arc<Target>,
        peer: PeerInfo,
        params: TcpParams,
    ) -> Self {
        // ICResp rules (§3.6.2.3): MAXH2CDATA is a multiple of 4 and at least 4096.
        let maxh2cdata = (params.max_h2c_data & !3).max(MIN_MAXH2CDATA);
        let capsule_limit = params.in_capsule_data_size.max(ADMIN_IN_CAPSULE_DATA);
        let slot_size = params.max_data_transfer.max(capsule_limit) as usize;
        // Before Connect the queue size is unknown: one slot serves the Connect itself.
        let (buffers, closed) = match SlotBuffers::new(1, slot_size) {
            Ok(b) => (b, false),
            Err(e) => {
                warn!(peer = %peer.remote, error = %e, "NVMe/TCP: cannot allocate command buffers, closing");
                (SlotBuffers::empty(), true)
            }
        };
        if closed {
            let _ = stream.shutdown(Shutdown::Both);
        }
        // Small PDUs (responses, R2Ts) must not wait for Nagle; the send path already
        // gathers what is ready into one writev (Linux nvmet sets TCP_NODELAY too).
        let _ = stream.set_nodelay(true);
        Self {
            stream,
            token,
            peer,
            params,
            queue: Queue::new(target, peer),
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
            parked: None,
            staging: vec![0u8; STAGING].into_boxed_slice(),
            staged_pos: 0,
            staged_end: 0,
            send: SendQueue::default(),
            inflight: 0,
            closed,
            created: Instant::now(),
            connect_timeout: CONNECT_TIMEOUT,
        }
    }

    /// Closes the connection when no Fabrics Connect completed within `timeout` of its
    /// creation (default [`CONNECT_TIMEOUT`]; `global.connect_timeout_ms` in the daemon).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn wants_write(&self) -> bool {
        !self.closed && !self.send.is_empty()
    }

    pub fn inflight_ops(&self) -> usize {
        self.inflight
    }

    /// The core queue (for statistics and tests).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    fn status(&self) -> ConnStatus {
        if self.closed {
            ConnStatus::Closed
        } else {
            ConnStatus::Open
        }
    }

    fn tag(&self, slot: u16) -> u64 {
        (self.token as u64) << 32 | slot as u64
    }

    /// Reads and processes until the socket is drained (EAGAIN) or every slot is busy.
    pub fn on_readable(&mut self, io: &mut dyn IoSubmit) -> ConnStatus {
        self.pump(io);
        self.after_io(Instant::now(), io);
        self.status()
    }

    pub fn on_writable(&mut self) -> ConnStatus {
        self.flush();
        self.status()
    }

    /// A backend op of this connection finished (`tag` low 32 bits = slot).
    pub fn on_io_complete(&mut self, tag: u64, result: i32, io: &mut dyn IoSubmit) -> ConnStatus {
        let slot = (tag & 0xffff_ffff) as usize;
        match self.slots.get(slot) {
            Some(s) if s.state == SlotState::Submitted => {
                self.inflight -= 1;
                let sqe = s.sqe;
                let resp = self.queue.finish(&sqe, result);
                self.respond(slot as u16, resp);
            }
            _ => {
                warn!(peer = %self.peer.remote, tag, "NVMe/TCP: completion for a slot with no op in flight");
                return self.status();
            }
        }
        if !self.closed {
            self.pump(io);
            self.after_io(Instant::now(), io);
        }
        self.status()
    }

    /// Periodic work (at least every 100 ms): keep-alive and AER completions from the core,
    /// and resuming a connection that was back-pressured by slot exhaustion (`after_io`).
    /// The socket is not read here: a connection that is not back-pressured last stopped
    /// reading at EAGAIN, and the next byte brings a new edge-triggered EPOLLIN — so an idle
    /// connection costs no system call per tick.
    pub fn on_tick(&mut self, now: Instant, io: &mut dyn IoSubmit) -> ConnStatus {
        if !self.closed
            && self.queue.qid().is_none()
            && now.saturating_duration_since(self.created) > self.connect_timeout
        {
            self.close(CloseReason::NoConnect);
        }
        if !self.closed {
            self.after_io(now, io);
        }
        self.status()
    }

    /// After any processing: completions from the core (AERs, keep-alive expiry), one gather
    /// send, and — when that freed what a back-pressured capsule waited for — more input,
    /// repeated so nothing processed here waits for the next wake-up to be sent.
    fn after_io(&mut self, now: Instant, io: &mut dyn IoSubmit) {
        loop {
            if self.closed {
                return;
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
                return;
            }
            self.flush();
            if self.closed || self.parked.is_none() || !self.can_accept() {
                return;
            }
            self.pump(io);
        }
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

    /// Processes buffered input, then reads the socket, until EAGAIN, back-pressure or close.
    fn pump(&mut self, io: &mut dyn IoSubmit) {
        if let Some((sqe, data_len)) = self.parked {
            if !self.can_accept() {
                return;
            }
            self.parked = None;
            self.on_capsule(sqe, data_len, io);
        }
        while !self.closed && self.parked.is_none() {
            if self.staged_pos < self.staged_end {
                self.process_staging(io);
                continue;
            }
            match self.read_socket(io) {
                Ok(true) => {}
                Ok(false) => return,
                Err(reason) => {
                    self.close(reason);
                    return;
                }
            }
        }
    }

    /// One read from the socket. In a data phase with nothing buffered, the data goes
    /// straight into the command's buffer (and whatever follows into the staging buffer).
    /// Returns false on EAGAIN.
    fn read_socket(&mut self, io: &mut dyn IoSubmit) -> Result<bool, CloseReason<'static>> {
        self.staged_pos = 0;
        self.staged_end = 0;
        let direct = match (self.rx.data_window(), self.dest) {
            (Some(w), DataDest::Slot { slot, base }) => Some((w, slot, base)),
            _ => None,
        };
        let res = if let Some((w, slot, base)) = direct {
            let start = (base + w.offset) as usize;
            let end = start + w.remaining as usize;
            let buf = self.buffers.get_mut(slot as usize);
            let Some(dest) = buf.get_mut(start..end) else {
                return Err(CloseReason::Protocol {
                    fes: None,
                    what: "data placement outside the slot buffer".into(),
                });
            };
            let mut iov = [
                IoSliceMut::new(dest),
                IoSliceMut::new(&mut self.staging[..]),
            ];
            match (&self.stream).read_vectored(&mut iov) {
                Ok(n) => {
                    let k = n.min(w.remaining as usize);
                    let placed = &self.buffers.get(slot as usize)[start..start + k];
                    let ev = self.rx.data_placed(placed);
                    self.staged_end = n - k;
                    if let Some(ev) = ev {
                        self.on_event(ev, io);
                    }
                    Ok(n)
                }
                Err(e) => Err(e),
            }
        } else {
            (&self.stream)
                .read(&mut self.staging)
                .inspect(|&n| self.staged_end = n)
        };
        match res {
            Ok(0) => Err(CloseReason::PeerClosed),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(CloseReason::Io(e)),
        }
    }

    /// Feeds buffered bytes to the receive machine until they run out or an event asks
    /// to stop (back-pressure, close).
    fn process_staging(&mut self, io: &mut dyn IoSubmit) {
        while self.staged_pos < self.staged_end && !self.closed && self.parked.is_none() {
            let input = &self.staging[self.staged_pos..self.staged_end];
            // The sink is consulted only for data bytes (pad bytes before them are skipped).
            let result = match self.dest {
                DataDest::Slot { slot, base } => {
                    let buf = &mut self.buffers.get_mut(slot as usize)[base as usize..];
                    self.rx.feed(input, &mut SlotSink(buf))
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
                    debug!(peer = %self.peer.remote, cid = sqe.cid, "NVMe/TCP: all slots busy, pausing reads");
                    self.parked = Some((sqe, data_len));
                } else {
                    self.on_capsule(sqe, data_len, io);
                }
            }
            PduHeader::H2CData { hdr, .. } => self.on_h2c_data(hdr),
            PduHeader::H2CTermReq(t) => self.close(CloseReason::HostTerminated(&t)),
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
        self.host_pda = (ic.hpda as usize + 1) * 4;
        self.established = true;
        // CPDA 0: we take data at any dword alignment.
        self.rx.establish(digests, 4);
        debug!(peer = %self.peer.remote, ?digests, hpda = ic.hpda, "NVMe/TCP: connection initialised");
    }

    fn on_capsule(&mut self, sqe: Sqe, data_len: u32, io: &mut dyn IoSubmit) {
        let Some(slot) = self.free.pop() else {
            self.parked = Some((sqe, data_len));
            return;
        };
        let s = &mut self.slots[slot as usize];
        s.sqe = sqe;
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
                    debug!(peer = %self.peer.remote, cid = s.sqe.cid, "NVMe/TCP: in-capsule data digest error");
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
                    debug!(peer = %self.peer.remote, cid = s.sqe.cid, "NVMe/TCP: H2CData digest error");
                    self.reject(slot, Status::TRANSIENT_TRANSPORT_ERROR);
                } else {
                    self.run(slot, io);
                }
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
        let SlotState::H2C {
            received, r2t_end, ..
        } = s.state
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
        if let SlotState::H2C { received, .. } = &mut self.slots[hdr.ttag as usize].state {
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
        let buf = &mut self.buffers.get_mut(slot as usize)[..s.len as usize];
        match self.queue.execute(&s.sqe, buf, tag, io) {
            Outcome::Complete(resp) => self.respond(slot, resp),
            Outcome::Submitted => {
                self.inflight += 1;
                self.slots[slot as usize].state = SlotState::Submitted;
            }
            Outcome::Held => self.slots[slot as usize].state = SlotState::Held,
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
        let s = self.slots[slot as usize];
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
        let ddgst = self
            .digests
            .data
            .then(|| digest(&self.buffers.get(slot as usize)[..data_len as usize]));
        self.send
            .push(SendItem::with_data(head, slot, data_len, ddgst));
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
    /// (Contract 2: buffers allocated once per queue, when its size is known).
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
                self.free = (0..want as u16).rev().collect();
                debug!(peer = %self.peer.remote, qid = ?self.queue.qid(), slots = want, "NVMe/TCP: queue sized");
            }
            Err(e) => self.close(CloseReason::Protocol {
                fes: None,
                what: format!("cannot allocate {want} command buffers: {e}"),
            }),
        }
    }

    fn flush(&mut self) {
        if self.closed {
            return;
        }
        let (slots, free) = (&mut self.slots, &mut self.free);
        let result = self
            .send
            .flush(&self.stream, &self.buffers, |slot| sent(slots, free, slot));
        match result {
            Ok(_) => self.maybe_resize(),
            Err(e) => self.close(CloseReason::Io(e)),
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

    fn close(&mut self, reason: CloseReason<'_>) {
        if self.closed {
            return;
        }
        let peer = self.peer.remote;
        let qid = self.queue.qid();
        match &reason {
            CloseReason::PeerClosed => info!(%peer, ?qid, "NVMe/TCP: connection closed by host"),
            CloseReason::Io(e) => warn!(%peer, ?qid, error = %e, "NVMe/TCP: connection failed"),
            CloseReason::Protocol { fes, what } => {
                warn!(%peer, ?qid, ?fes, "NVMe/TCP: terminating connection: {what}")
            }
            CloseReason::HostTerminated(t) => warn!(
                %peer, ?qid, fes = t.fes, fei = t.fei,
                "NVMe/TCP: host terminated the connection (H2CTermReq)"
            ),
            CloseReason::Core(r) => info!(%peer, ?qid, reason = ?r, "NVMe/TCP: closing queue"),
            CloseReason::NoConnect => warn!(
                %peer,
                "NVMe/TCP: no Fabrics Connect within {} ms, closing",
                self.connect_timeout.as_millis()
            ),
        }
        if matches!(reason, CloseReason::Protocol { .. } | CloseReason::Core(_)) {
            // Best effort: get the termination request — or, when the core ends the queue,
            // the responses already queued (a Fabrics Disconnect's completion comes before
            // the queue is deleted, NVMe-oF 1.1 §3.3.4; every accepted command gets its
            // response, Contract 1) — out, then let the host see FIN rather than RST
            // (unread input would turn close into a reset and drop what is still queued).
            let (slots, free) = (&mut self.slots, &mut self.free);
            let _ = self
                .send
                .flush(&self.stream, &self.buffers, |slot| sent(slots, free, slot));
            let _ = self.stream.shutdown(Shutdown::Write);
            let mut drained = 0;
            let mut sink = [0u8; 4096];
            while drained < DRAIN_ON_CLOSE {
                match (&self.stream).read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => drained += n,
                }
            }
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        self.closed = true;
        self.parked = None;
        // Buffers stay until every submitted op completed (Contract 2); free the rest.
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
