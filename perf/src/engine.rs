//! The I/O loop of one worker thread: several connections on one epoll instance, each kept at
//! its queue depth. Per wake-up and connection: drain the socket into one large receive
//! buffer, let the protocol turn bytes into completions, top the queue up again and send
//! everything queued with one `writev`. Nothing is allocated per I/O.

use std::io;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use transport::tcp::pdu::{PduError, PduType};

use crate::sendq::SendQueue;
use crate::socket::Socket;
use crate::stats::Stats;
use crate::workload::{IoGenerator, IoRequest};

/// Receive buffer per worker: big enough to take many completions (or several 128 KiB reads)
/// per `read(2)`.
const MIN_RECV_BUFFER: usize = 512 * 1024;
/// How long the loop waits for outstanding I/Os after the measurement ended.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest sleep in `epoll_wait`, so the end of the run is noticed without traffic.
pub const WAIT_SLICE_MS: u16 = 10;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("epoll: {0}")]
    Epoll(#[from] nix::Error),
    #[error("malformed PDU from the controller: {0}")]
    Pdu(#[from] PduError),
    #[error("controller terminated the connection: FES {fes:#x}, FEI {fei:#x}")]
    Terminated { fes: u16, fei: u32 },
    #[error("unexpected {0:?} PDU")]
    UnexpectedPdu(PduType),
    #[error("PDU for command id {0:#x}, which is not outstanding")]
    UnknownCid(u16),
    #[error("{what} outside the command's data (cid {cid:#x}, offset {offset}, length {len})")]
    OutOfRange {
        what: &'static str,
        cid: u16,
        offset: u32,
        len: u32,
    },
    #[error("connection closed by the peer with {0} I/O outstanding")]
    Closed(usize),
    #[error("peer protocol violation: {0}")]
    Protocol(&'static str),
    #[error("{0} I/O still outstanding {DRAIN_TIMEOUT:?} after the end of the run")]
    DrainTimeout(usize),
}

/// A finished I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub read: bool,
    /// When it was queued for sending.
    pub start: Instant,
    /// Success status (and intact data digest).
    pub ok: bool,
}

/// The wire protocol of one connection (NVMe/TCP, or the raw echo reference).
pub trait Protocol {
    /// Whether another command fits the queue depth.
    fn can_submit(&self) -> bool;
    fn outstanding(&self) -> usize;
    /// Queues the PDUs of `io` in `out`; `now` is its start time.
    fn submit(&mut self, io: IoRequest, now: Instant, out: &mut SendQueue);
    /// Consumes received bytes; finished I/Os go to `done`, data the peer asks for
    /// (H2CData) to `out`.
    fn on_bytes(
        &mut self,
        bytes: &[u8],
        out: &mut SendQueue,
        done: &mut Vec<Completion>,
    ) -> Result<(), EngineError>;
}

/// One connection driven by the loop.
pub struct Connection<P> {
    stream: Socket,
    proto: P,
    generator: IoGenerator,
    sendq: SendQueue,
    /// I/Os still to submit when the run is count-limited.
    budget: Option<u64>,
    qd: u32,
    /// epoll data word: the connection's index in its worker.
    token: u64,
    epollout: bool,
}

impl<P: Protocol> Connection<P> {
    /// `stream` must be non-blocking.
    pub fn new(
        stream: Socket,
        proto: P,
        generator: IoGenerator,
        qd: u32,
        budget: Option<u64>,
    ) -> Self {
        Self {
            stream,
            proto,
            generator,
            sendq: SendQueue::with_capacity(qd as usize * 2),
            budget,
            qd,
            token: 0,
            epollout: false,
        }
    }

    fn fill(&mut self, now: Instant) {
        while self.proto.can_submit() && self.budget != Some(0) {
            let io = self.generator.next_io();
            self.proto.submit(io, now, &mut self.sendq);
            if let Some(b) = self.budget.as_mut() {
                *b -= 1;
            }
        }
    }

    fn finished(&self) -> bool {
        self.budget == Some(0) && self.proto.outstanding() == 0 && self.sendq.is_empty()
    }
}

/// When the run starts, when measuring starts (after the warm-up) and when it stops
/// (None: when every connection used up its I/O budget).
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    pub start: Instant,
    pub measure_from: Instant,
    pub stop_at: Option<Instant>,
}

/// What a worker hands back.
#[derive(Debug)]
pub struct WorkerResult {
    pub stats: Stats,
    /// The last completion that was counted (end of a count-limited run).
    pub last_completion: Option<Instant>,
}

/// Worker options.
#[derive(Debug, Clone, Copy)]
pub struct WorkerConfig {
    /// Bytes per I/O (for the MiB/s figure).
    pub bs: u32,
    /// Spin on `epoll_wait(0)` instead of sleeping in it.
    pub busy_poll: bool,
}

/// What a worker measures: finished I/Os inside the measurement window of the timeline.
#[derive(Debug)]
pub struct Recorder {
    timeline: Timeline,
    bs: u32,
    stats: Stats,
    last_completion: Option<Instant>,
}

impl Recorder {
    pub fn new(timeline: Timeline, bs: u32) -> Self {
        Self {
            timeline,
            bs,
            stats: Stats::new(),
            last_completion: None,
        }
    }

    /// Sleeps until the timeline's start.
    pub fn wait_for_start(&self) {
        if let Some(wait) = self.timeline.start.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }

    /// An I/O submitted at `start` finished at `now`; counted when `now` is in the window.
    pub fn record(&mut self, read: bool, start: Instant, ok: bool, now: Instant) {
        let t = &self.timeline;
        if now >= t.measure_from && !matches!(t.stop_at, Some(stop) if now >= stop) {
            self.stats.record(read, self.bs, now - start, ok);
            self.last_completion = Some(now);
        }
    }

    pub fn finish(self) -> WorkerResult {
        WorkerResult {
            stats: self.stats,
            last_completion: self.last_completion,
        }
    }
}

/// The end of a worker's run: at the timeline's stop it stops submitting and drains (for at
/// most [`DRAIN_TIMEOUT`]); a count-limited run ends when every queue used up its budget.
#[derive(Debug, Default)]
pub struct RunEnd {
    drain_deadline: Option<Instant>,
}

impl RunEnd {
    /// Whether new I/O may still be submitted.
    pub fn submitting(&self) -> bool {
        self.drain_deadline.is_none()
    }

    /// After a turn: `Ok(true)` when the worker is done, `Err(n)` when `n` I/Os are still
    /// outstanding at the drain deadline. `outstanding` is asked only while draining,
    /// `budgets_done` (every queue used up its I/O budget, nothing left to send) only before.
    pub fn check(
        &mut self,
        timeline: &Timeline,
        outstanding: impl FnOnce() -> usize,
        budgets_done: impl FnOnce() -> bool,
    ) -> Result<bool, usize> {
        let now = Instant::now();
        if self.drain_deadline.is_none() && timeline.stop_at.is_some_and(|t| now >= t) {
            self.drain_deadline = Some(now + DRAIN_TIMEOUT);
        }
        let Some(deadline) = self.drain_deadline else {
            return Ok(budgets_done());
        };
        match outstanding() {
            0 => Ok(true),
            n if now >= deadline => Err(n),
            _ => Ok(false),
        }
    }
}

/// Runs `conns` until the timeline ends; `payload` backs every write.
pub fn run_worker<P: Protocol>(
    mut conns: Vec<Connection<P>>,
    payload: &[u8],
    timeline: Timeline,
    cfg: WorkerConfig,
) -> Result<WorkerResult, EngineError> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    for (i, c) in conns.iter_mut().enumerate() {
        c.token = i as u64;
        epoll.add(c.stream.fd(), EpollEvent::new(EpollFlags::EPOLLIN, c.token))?;
    }
    let mut events = vec![EpollEvent::empty(); conns.len().clamp(1, 1024)];
    let mut rbuf = vec![0u8; MIN_RECV_BUFFER.max(4 * cfg.bs as usize)];
    let qd_max = conns.iter().map(|c| c.qd as usize).max().unwrap_or(1);
    let mut done: Vec<Completion> = Vec::with_capacity(qd_max);
    let mut recorder = Recorder::new(timeline, cfg.bs);
    recorder.wait_for_start();
    let now = Instant::now();
    for c in conns.iter_mut() {
        c.fill(now);
        flush(&epoll, c, payload)?;
    }

    let timeout = if cfg.busy_poll {
        EpollTimeout::ZERO
    } else {
        EpollTimeout::from(WAIT_SLICE_MS)
    };
    let mut end = RunEnd::default();
    loop {
        let n = match epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => 0,
            Err(e) => return Err(e.into()),
        };
        for ev in &events[..n] {
            let c = &mut conns[ev.data() as usize];
            let flags = ev.events();
            if flags.contains(EpollFlags::EPOLLOUT) {
                flush(&epoll, c, payload)?;
            }
            if !flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR)
            {
                continue;
            }
            receive(c, &mut rbuf, &mut done)?;
            let now = Instant::now();
            for d in done.drain(..) {
                recorder.record(d.read, d.start, d.ok, now);
            }
            if end.submitting() {
                c.fill(now);
            }
            flush(&epoll, c, payload)?;
        }
        let finished = end.check(
            &timeline,
            || conns.iter().map(|c| c.proto.outstanding()).sum(),
            || conns.iter().all(Connection::finished),
        );
        if finished.map_err(EngineError::DrainTimeout)? {
            break;
        }
    }
    Ok(recorder.finish())
}

/// Reads until the socket is empty, feeding the protocol.
fn receive<P: Protocol>(
    c: &mut Connection<P>,
    rbuf: &mut [u8],
    done: &mut Vec<Completion>,
) -> Result<(), EngineError> {
    loop {
        match c.stream.read(rbuf) {
            Ok(0) => return Err(EngineError::Closed(c.proto.outstanding())),
            Ok(n) => {
                c.proto.on_bytes(&rbuf[..n], &mut c.sendq, done)?;
                if n < rbuf.len() && c.stream.short_read_drains() {
                    // A short read means the socket is drained: skip the EAGAIN round trip.
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends what is queued; arms EPOLLOUT while the socket is full, disarms it after.
fn flush<P>(epoll: &Epoll, c: &mut Connection<P>, payload: &[u8]) -> Result<(), EngineError> {
    if c.sendq.is_empty() && !c.epollout && !c.stream.has_output() {
        return Ok(());
    }
    let all_sent = c.sendq.flush(&mut c.stream, payload)? && c.stream.send_sealed()?;
    if all_sent == c.epollout {
        let mut flags = EpollFlags::EPOLLIN;
        if !all_sent {
            flags |= EpollFlags::EPOLLOUT;
        }
        let mut ev = EpollEvent::new(flags, c.token);
        epoll.modify(c.stream.fd(), &mut ev)?;
        c.epollout = !all_sent;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_counts_only_inside_the_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = Recorder::new(
            Timeline {
                start: t0,
                measure_from: t0 + s,
                stop_at: Some(t0 + 3 * s),
            },
            4096,
        );
        r.record(true, t0, true, t0 + s / 2); // warm-up
        r.record(true, t0 + s, true, t0 + 2 * s);
        r.record(false, t0 + s, false, t0 + 2 * s);
        r.record(true, t0 + 2 * s, true, t0 + 3 * s); // at the stop: drained, not counted
        let w = r.finish();
        assert_eq!(w.stats.ios(), 2);
        assert_eq!(w.last_completion, Some(t0 + 2 * s));
    }

    #[test]
    fn run_end_drains_after_the_stop_and_follows_budgets_without_one() {
        let now = Instant::now();
        let timed = Timeline {
            start: now,
            measure_from: now,
            stop_at: Some(now),
        };
        let mut end = RunEnd::default();
        assert!(end.submitting());
        assert_eq!(end.check(&timed, || 3, || unreachable!()), Ok(false));
        assert!(!end.submitting(), "no new I/O after the stop");
        assert_eq!(end.check(&timed, || 0, || unreachable!()), Ok(true));
        // Past the drain deadline with I/O outstanding.
        let mut late = RunEnd {
            drain_deadline: Some(now),
        };
        assert_eq!(late.check(&timed, || 2, || unreachable!()), Err(2));

        let counted = Timeline {
            stop_at: None,
            ..timed
        };
        let mut end = RunEnd::default();
        assert_eq!(end.check(&counted, || unreachable!(), || false), Ok(false));
        assert_eq!(end.check(&counted, || unreachable!(), || true), Ok(true));
        assert!(end.submitting());
    }
}
