//! One accepted NVMe/RDMA queue as the reactor sees it (ARCHITECTURE.md, RDMA contract): the
//! verbs objects (QP, CQ, completion channel) around the sans-I/O [`ConnCore`].
//!
//! Readiness model, as for TCP: the completion-channel fd is non-blocking and signals EPOLLIN;
//! the reactor calls `on_readable` when it fires. Never registered for EPOLLOUT: every send is
//! a posted work request.

use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;
use std::time::Instant;

use nvme::queue::Queue;
use storage::IoSubmit;

use super::core::{ConnCore, ConnError};
use super::verbs::{CompletionChannel, CompletionQueue, QueuePair, WorkCompletion};
use crate::conn::{ConnStatus, Connection};

pub struct RdmaConnection {
    // Drop order matters: the QP first (no more DMA into pool buffers), then the state
    // machine (returns its buffers to the pools), then the CQ and its channel.
    qp: QueuePair,
    core: ConnCore<Queue>,
    cq: Rc<CompletionQueue>,
    channel: Rc<CompletionChannel>,
    token: u32,
    disconnect_sent: bool,
    wcs: Vec<WorkCompletion>,
    /// `ibv_req_notify_cq` is in effect (cleared by the channel event it raises).
    armed: bool,
    /// The reactor polls the CQ itself: channel events do not re-arm it.
    busy_poll: bool,
}

impl RdmaConnection {
    pub(super) fn new(
        qp: QueuePair,
        core: ConnCore<Queue>,
        cq: Rc<CompletionQueue>,
        channel: Rc<CompletionChannel>,
        token: u32,
    ) -> Self {
        Self {
            qp,
            core,
            cq,
            channel,
            token,
            disconnect_sent: false,
            wcs: Vec::with_capacity(64),
            // The acceptor armed the CQ before accepting.
            armed: true,
            busy_poll: false,
        }
    }

    pub fn token(&self) -> u32 {
        self.token
    }

    pub fn status(&self) -> ConnStatus {
        self.core.status()
    }

    /// Why the connection closed (for the reactor's log line), once it has.
    pub fn close_reason(&self) -> Option<String> {
        self.core.close_reason().map(|e| e.to_string())
    }

    /// Requests a channel event for the next completion; `false` (connection closed) if the
    /// provider refused.
    fn arm(&mut self) -> bool {
        match self.cq.req_notify() {
            Ok(()) => {
                self.armed = true;
                true
            }
            Err(e) => {
                self.core.close(ConnError::Post(e.to_string()));
                false
            }
        }
    }

    /// Polls until the CQ is empty; returns the number of completions handled.
    fn drain(&mut self, io: &mut dyn IoSubmit) -> usize {
        let mut n = 0;
        loop {
            if let Err(e) = self.cq.poll(&mut self.wcs, 64) {
                self.core.close(ConnError::Post(e.to_string()));
                break;
            }
            if self.wcs.is_empty() {
                break;
            }
            n += self.wcs.len();
            if self.core.timing() {
                // The capsules of this batch arrived by now (one clock read per batch).
                self.core.set_time(Instant::now());
            }
            let wcs = std::mem::take(&mut self.wcs);
            self.core.on_completions(&wcs, &mut self.qp, io);
            self.wcs = wcs;
            self.hand_over();
        }
        n
    }

    /// The responses posted while handling the last completions are on the queue pair now:
    /// their latency ends here (timing only).
    fn hand_over(&mut self) {
        if self.core.has_timed() {
            self.core.handed_over(Instant::now());
        }
    }

    fn after(&mut self) -> ConnStatus {
        let status = self.core.status();
        if status == ConnStatus::Closed {
            // SRQ buffers this connection still held go back to the device's SRQ.
            self.core.return_receives(&mut self.qp);
        }
        if status == ConnStatus::Closed && !self.disconnect_sent {
            self.disconnect_sent = true;
            if let Some(why) = self.core.close_reason() {
                tracing::info!(token = self.token, reason = %why, "NVMe/RDMA connection closed");
            }
            // Moves the QP to error: outstanding WRs complete with flush errors, the host
            // gets a DREQ. Failure only means the CM already tore it down.
            if let Err(e) = self.qp.id().disconnect() {
                tracing::debug!(token = self.token, error = %e, "rdma_disconnect");
            }
        }
        status
    }
}

impl Connection for RdmaConnection {
    /// Completion channel fd (EPOLLIN).
    fn fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// The completion channel fired: consume its events, re-arm (unless busy polling), drain
    /// the CQ.
    fn on_readable(&mut self, io: &mut dyn IoSubmit) -> ConnStatus {
        if let Err(e) = self.cq.get_events() {
            self.core.close(ConnError::Post(e.to_string()));
            return self.after();
        }
        self.armed = false;
        if !self.busy_poll && !self.arm() {
            return self.after();
        }
        self.drain(io);
        self.after()
    }

    /// Never registered for EPOLLOUT: every send is a posted work request.
    fn on_writable(&mut self) -> ConnStatus {
        self.core.status()
    }

    fn on_io_complete(&mut self, tag: u64, result: i32, io: &mut dyn IoSubmit) -> ConnStatus {
        if self.core.timing() {
            self.core.set_time(Instant::now());
        }
        self.core.on_io_complete(tag, result, &mut self.qp, io);
        self.hand_over();
        self.after()
    }

    /// At least every 100 ms: keep-alive, held AERs, commands parked on busy pools.
    fn on_tick(&mut self, now: Instant, io: &mut dyn IoSubmit) -> ConnStatus {
        self.core.on_tick(now, &mut self.qp, io);
        self.hand_over();
        self.after()
    }

    fn wants_write(&self) -> bool {
        false
    }

    /// Backend ops still using this connection's buffers; drop the connection only at 0.
    fn inflight_ops(&self) -> usize {
        self.core.inflight_ops()
    }

    /// The CM reported the connection gone.
    fn on_disconnected(&mut self) -> ConnStatus {
        self.core.close(ConnError::Disconnected);
        self.after()
    }

    // `shut_down`: nothing to do, the connection disconnects its QP itself when it closes.

    /// Busy-poll mode: drains the CQ without waiting for the channel.
    fn busy_poll(&mut self, io: &mut dyn IoSubmit) -> Option<(ConnStatus, usize)> {
        let n = self.drain(io);
        Some((self.after(), n))
    }

    /// Busy polling on: the reactor calls `busy_poll` every turn and channel events stop
    /// re-arming the CQ. Off: re-arm, then drain once more, because a completion that landed
    /// between the last poll and the re-arm raises no event.
    fn set_busy_poll(&mut self, on: bool, io: &mut dyn IoSubmit) -> ConnStatus {
        self.busy_poll = on;
        if !on && !self.armed && self.arm() {
            self.drain(io);
        }
        self.after()
    }
}
