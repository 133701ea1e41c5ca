//! What a reactor needs from a connection of any transport (ARCHITECTURE.md, connection and RDMA
//! contracts): one status type and one trait, implemented by `tcp::TcpConnection` and
//! `rdma::RdmaConnection` and called by the daemon's reactor through `Box<dyn Connection>`.

use std::os::fd::BorrowedFd;
use std::time::Instant;

use storage::IoSubmit;

/// Whether a connection is still usable. `Closed` is final: the reactor deregisters it and
/// drops it once `inflight_ops()` is 0 (its buffers may still be the target of backend I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnStatus {
    Open,
    Closed,
}

/// One connection as an edge-triggered event source. Tags of backend ops are
/// `(token << 32) | context`, so the reactor routes a completion by `tag >> 32`.
pub trait Connection {
    /// The descriptor to watch (EPOLLIN; EPOLLOUT while `wants_write`).
    fn fd(&self) -> BorrowedFd<'_>;
    /// Readiness: handle input until EAGAIN or back-pressure.
    fn on_readable(&mut self, io: &mut dyn IoSubmit) -> ConnStatus;
    /// The descriptor became writable: send what is queued.
    fn on_writable(&mut self) -> ConnStatus;
    /// A backend op submitted by this connection finished (`result` as io_uring reports it).
    fn on_io_complete(&mut self, tag: u64, result: i32, io: &mut dyn IoSubmit) -> ConnStatus;
    /// Several ops of this connection finished (one reactor turn's completions, `(tag,
    /// result)`): what `on_io_complete` does for each, answered together (TCP: one gather
    /// write for all their responses rather than one per completion).
    fn on_io_completions(&mut self, done: &[(u64, i32)], io: &mut dyn IoSubmit) -> ConnStatus {
        let mut status = ConnStatus::Open;
        for &(tag, result) in done {
            status = self.on_io_complete(tag, result, io);
        }
        status
    }
    /// At least every 100 ms: timers, AERs, keep-alive, resuming after back-pressure.
    fn on_tick(&mut self, now: Instant, io: &mut dyn IoSubmit) -> ConnStatus;
    /// Output is queued that the socket did not take: arm EPOLLOUT.
    fn wants_write(&self) -> bool;
    /// Backend ops still using this connection's buffers.
    fn inflight_ops(&self) -> usize;
    /// The transport's connection manager reported the peer gone (RDMA CM DISCONNECTED).
    fn on_disconnected(&mut self) -> ConnStatus;
    /// Closing: let the peer know at once (the object lives on until its I/O has drained).
    fn shut_down(&mut self) {}
    /// Busy polling (`[rdma] busy_poll_us`): handle completions without waiting for
    /// readiness. `None`: nothing to poll (TCP); else (status, completions handled).
    fn busy_poll(&mut self, _io: &mut dyn IoSubmit) -> Option<(ConnStatus, usize)> {
        None
    }
    /// Enter (`true`) or leave busy polling; leaving re-arms readiness.
    fn set_busy_poll(&mut self, _on: bool, _io: &mut dyn IoSubmit) -> ConnStatus {
        ConnStatus::Open
    }
}
