//! One NVMe/TCP connection as the reactor sees it (ARCHITECTURE.md, connection contract): the
//! non-blocking socket around the sans-I/O [`TcpCore`]. Readiness wakes it; it drains the
//! socket into the buffers the core hands out until EAGAIN or back-pressure, and writes the
//! core's queued PDUs with one gather write. Nothing here blocks. On a TLS connection whose
//! record layer is in user space, [`RecordLayer`] sits between the socket and the core (its
//! bounded buffers are the only ones); with kernel TLS the socket already carries plaintext.

use std::io::{self, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::queue::{PeerInfo, Queue};
use nvme::target::Target;
use storage::IoSubmit;

use super::core::{CloseReason, Hangup, ReadBuf, TcpCore, TcpParams};
use super::record::RecordLayer;
use super::send::iovec_batch;
use super::zerocopy;
use crate::conn::{ConnStatus, Connection};

/// After a fatal error, at most this much unread input is drained so that closing the
/// socket sends FIN (and the termination request arrives) rather than RST.
const DRAIN_ON_CLOSE: usize = 1 << 20;

#[derive(Debug)]
pub struct TcpConnection {
    stream: TcpStream,
    /// The user-space TLS record layer (None: plaintext, or kernel TLS).
    tls: Option<Box<RecordLayer>>,
    core: TcpCore,
    /// The last clock read while handling the current event (timing only): the time of its
    /// processing afterwards, so that timing costs no extra read.
    clock: Option<Instant>,
    /// Zero-copy sends (`[global] zerocopy_send_threshold`), None when off.
    zc: Option<ZeroCopy>,
}

/// Zero-copy sending state of a connection.
#[derive(Debug)]
struct ZeroCopy {
    /// PDU data of at least this many bytes goes out with `MSG_ZEROCOPY`.
    threshold: usize,
    /// The id the kernel gives the next successful zero-copy send.
    next_id: u32,
    /// The kernel said it copied (loopback, no scatter-gather): logged once.
    copied_logged: bool,
}

impl TcpConnection {
    pub fn new(
        stream: TcpStream,
        token: u32,
        target: Arc<Target>,
        peer: PeerInfo,
        params: TcpParams,
    ) -> Self {
        Self::with_queue(stream, None, token, Queue::new(target, peer), peer, params)
    }

    /// A connection secured by TLS (`super::tls`) with the PSK identity of `hostnqn` and
    /// `subnqn`: its Fabrics Connect must name them. `record` is the user-space record layer,
    /// None under kernel TLS.
    #[allow(clippy::too_many_arguments)]
    pub fn new_tls(
        stream: TcpStream,
        record: Option<Box<RecordLayer>>,
        token: u32,
        target: Arc<Target>,
        peer: PeerInfo,
        params: TcpParams,
        hostnqn: String,
        subnqn: String,
    ) -> Self {
        let queue = Queue::new(target, peer).with_tls_identity(hostnqn, subnqn);
        Self::with_queue(stream, record, token, queue, peer, params)
    }

    fn with_queue(
        stream: TcpStream,
        tls: Option<Box<RecordLayer>>,
        token: u32,
        queue: Queue,
        peer: PeerInfo,
        params: TcpParams,
    ) -> Self {
        let core = TcpCore::new(queue, token, peer.remote, params, Instant::now());
        // Small PDUs (responses, R2Ts) must not wait for Nagle; the send path already
        // gathers what is ready into one writev (Linux nvmet sets TCP_NODELAY too).
        let _ = stream.set_nodelay(true);
        let mut conn = Self {
            stream,
            tls,
            core,
            clock: None,
            zc: None,
        };
        conn.hang_up();
        conn
    }

    /// Closes the connection when no Fabrics Connect completed within `timeout` of its
    /// creation (default [`super::core::CONNECT_TIMEOUT`]; `global.connect_timeout_ms` in
    /// the daemon).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.core.set_connect_timeout(timeout);
        self
    }

    /// Names each command's slot buffer to the reactor's ring, which may register it
    /// (`[global] uring_fixed_buffers`; off by default: no cost per command then).
    pub fn with_fixed_buffers(mut self, on: bool) -> Self {
        self.core.set_fixed_buffers(on);
        self
    }

    /// Sends PDU data of at least `threshold` bytes zero-copy (`MSG_ZEROCOPY`; 0 = off). Not
    /// on a TLS connection, whose records are sealed into buffers of their own; off when the
    /// kernel refuses `SO_ZEROCOPY`.
    pub fn with_zerocopy(mut self, threshold: usize) -> Self {
        if threshold == 0 || self.tls.is_some() {
            return self;
        }
        match zerocopy::enable(self.stream.as_fd()) {
            Ok(()) => {
                self.zc = Some(ZeroCopy {
                    threshold,
                    next_id: 0,
                    copied_logged: false,
                })
            }
            Err(e) => tracing::warn!(error = %e, "SO_ZEROCOPY refused; sending with copies"),
        }
        self
    }

    /// Takes the kernel's zero-copy notifications off the error queue: their slots are free
    /// again (and a capsule parked for want of one may go on: `after_io`).
    fn reap_zerocopy(&mut self) {
        let Some(zc) = &mut self.zc else {
            return;
        };
        if self.core.zerocopy_outstanding() == 0 {
            return;
        }
        let core = &mut self.core;
        let mut copied = false;
        let res = zerocopy::notifications(self.stream.as_fd(), &mut |d: zerocopy::Done| {
            copied |= d.copied;
            core.zerocopy_done(d.lo, d.hi);
        });
        if copied && !zc.copied_logged {
            zc.copied_logged = true;
            tracing::debug!(peer = ?self.stream.peer_addr().ok(), "zero-copy sends were copied by the kernel (loopback or no scatter-gather)");
        }
        if let Err(e) = res {
            self.core.close(CloseReason::Io(e));
        }
    }

    /// Reads and processes until the socket is drained (EAGAIN), every slot is busy, or the
    /// connection closed.
    fn pump(&mut self, io: &mut dyn IoSubmit) {
        self.core.resume(io);
        while self.core.wants_input() {
            let res = match (self.core.read_buf(), &mut self.tls) {
                (None, _) => return,
                (Some(ReadBuf::Staging(buf)), None) => (&self.stream).read(buf),
                (Some(ReadBuf::Direct { data, staging }), None) => {
                    let mut iov = [IoSliceMut::new(data), IoSliceMut::new(staging)];
                    (&self.stream).read_vectored(&mut iov)
                }
                (Some(ReadBuf::Staging(buf)), Some(tls)) => tls.read(&mut &self.stream, buf),
                // Decrypted straight into the command's buffer, then what follows into the
                // staging buffer, from as many records as one socket read brought.
                (Some(ReadBuf::Direct { data, staging }), Some(tls)) => {
                    let mut iov = [IoSliceMut::new(data), IoSliceMut::new(staging)];
                    tls.read_vectored(&mut &self.stream, &mut iov)
                }
            };
            match res {
                Ok(0) => self.core.close(CloseReason::PeerClosed),
                Ok(n) => {
                    if self.core.timing() {
                        // The capsules this read completes arrived now.
                        let now = self.stamp();
                        self.core.set_time(now);
                    }
                    self.core.received(n, io);
                    // Answer what this read completed before reading on. Holding the
                    // responses until EAGAIN turned a QD32 write stream (133 KiB of capsules,
                    // five staging reads) into lockstep: the host got no completion, so
                    // sent nothing, until the whole batch was read, and each side idled
                    // while the other worked (docs/performance.md, "The write stall").
                    if self.core.has_output() || self.tls_output() {
                        self.flush();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.core.close(CloseReason::Io(e)),
            }
        }
    }

    /// After any processing: completions from the core (AERs, keep-alive expiry), one gather
    /// send, and — when that freed what a back-pressured capsule waited for — more input,
    /// repeated so nothing processed here waits for the next wake-up to be sent.
    fn after_io(&mut self, now: Instant, io: &mut dyn IoSubmit) {
        while !self.core.is_closed() {
            self.core.poll(now, io);
            if self.core.is_closed() {
                return;
            }
            self.flush();
            if !self.core.can_resume() {
                return;
            }
            self.pump(io);
        }
    }

    /// Sealed TLS records waiting for the socket.
    fn tls_output(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| tls.has_output())
    }

    /// Reads the clock (timing): the time of what is handled next, and of this event's
    /// processing afterwards (`now`).
    fn stamp(&mut self) -> Instant {
        let now = Instant::now();
        self.clock = Some(now);
        now
    }

    /// The time of the processing after this event's I/O: the last clock read, or a new one.
    fn now(&mut self) -> Instant {
        self.clock.take().unwrap_or_else(Instant::now)
    }

    /// Sends what the core queued while the connection is open. The responses among it are
    /// handed to the socket once the write returns: their latency ends then.
    fn flush(&mut self) {
        if self.core.is_closed() {
            return;
        }
        if let Err(e) = self.write_queued() {
            self.core.close(CloseReason::Io(e));
        }
        if self.core.has_timed() {
            let now = self.stamp();
            self.core.handed_over(now);
        }
    }

    /// Gather writes until the queue is empty (`Ok(true)`) or the socket is full.
    fn write_queued(&mut self) -> io::Result<bool> {
        if let Some(tls) = &mut self.tls {
            match tls.flush(&mut &self.stream) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        while self.core.has_output() {
            let mut iov = iovec_batch();
            let threshold = self.zc.as_ref().map_or(0, |zc| zc.threshold);
            let batch = self.core.send_batch(&mut iov, threshold);
            let want = batch.want;
            let written = match &mut self.tls {
                None if batch.zerocopy => zerocopy::send(self.stream.as_fd(), &iov),
                None => (&self.stream).write_vectored(&iov),
                Some(tls) => tls.write_vectored(&mut &self.stream, &iov),
            };
            let n = match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The socket's option memory for notifications ran out (optmem_max): copy
                // this batch; the next big one tries zero-copy again.
                Err(e) if batch.zerocopy && e.raw_os_error() == Some(libc::ENOBUFS) => {
                    drop(iov);
                    let mut iov = iovec_batch();
                    let _ = self.core.send_batch(&mut iov, 0);
                    match (&self.stream).write_vectored(&iov) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => {
                            drop(iov);
                            self.core.sent(n);
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            drop(iov);
            match &mut self.zc {
                Some(zc) if batch.zerocopy => {
                    let id = zc.next_id;
                    zc.next_id = id.wrapping_add(1);
                    self.core.sent_zerocopy(n, id);
                }
                _ => self.core.sent(n),
            }
            // The record layer takes a bounded chunk at a time; it is full only when records
            // are still waiting for the socket.
            if n < want && (self.tls.is_none() || self.tls_output()) {
                // The socket buffer is full; EPOLLOUT will tell when to continue.
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The core closed: act on the socket as it asked ([`Hangup`]).
    fn hang_up(&mut self) {
        let Some(hangup) = self.core.take_hangup() else {
            return;
        };
        if hangup == Hangup::AfterFlush {
            let _ = self.write_queued();
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
    }

    fn status(&mut self) -> ConnStatus {
        self.hang_up();
        self.core.status()
    }
}

impl Connection for TcpConnection {
    fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Reads and processes until the socket is drained (EAGAIN) or every slot is busy.
    fn on_readable(&mut self, io: &mut dyn IoSubmit) -> ConnStatus {
        self.clock = None;
        // EPOLLERR comes this way too: zero-copy notifications on the error queue.
        self.reap_zerocopy();
        self.pump(io);
        let now = self.now();
        self.after_io(now, io);
        self.status()
    }

    fn on_writable(&mut self) -> ConnStatus {
        self.flush();
        self.status()
    }

    /// A backend op of this connection finished (`tag` low 32 bits = slot).
    fn on_io_complete(&mut self, tag: u64, result: i32, io: &mut dyn IoSubmit) -> ConnStatus {
        self.clock = None;
        if self.core.timing() {
            let now = self.stamp();
            self.core.set_time(now);
        }
        if self.core.on_io_complete(tag, result) && !self.core.is_closed() {
            self.pump(io);
            let now = self.now();
            self.after_io(now, io);
        }
        self.status()
    }

    /// The responses of all `done` go out in one gather write. The socket is read again only
    /// when a capsule was parked for want of the slots these completions freed (`after_io`):
    /// otherwise the last read ended at EAGAIN and new input brings a new edge.
    fn on_io_completions(&mut self, done: &[(u64, i32)], io: &mut dyn IoSubmit) -> ConnStatus {
        self.clock = None;
        if self.core.timing() {
            // One clock read for the batch: its ops completed by now.
            let now = self.stamp();
            self.core.set_time(now);
        }
        let mut any = false;
        for &(tag, result) in done {
            any |= self.core.on_io_complete(tag, result);
        }
        if any && !self.core.is_closed() {
            let now = self.now();
            self.after_io(now, io);
        }
        self.status()
    }

    /// Periodic work (at least every 100 ms): the Connect timeout, keep-alive and AER
    /// completions from the core, and resuming a connection that was back-pressured by slot
    /// exhaustion (`after_io`). The socket is not read here: a connection that is not
    /// back-pressured last stopped reading at EAGAIN, and the next byte brings a new
    /// edge-triggered EPOLLIN — so an idle connection costs no system call per tick.
    fn on_tick(&mut self, now: Instant, io: &mut dyn IoSubmit) -> ConnStatus {
        self.clock = None;
        self.core.check_connect_timeout(now);
        self.reap_zerocopy();
        self.after_io(now, io);
        self.status()
    }

    fn wants_write(&self) -> bool {
        self.core.wants_write() || self.tls_output()
    }

    fn inflight_ops(&self) -> usize {
        self.core.inflight_ops()
    }

    /// TCP learns about the peer from the socket itself.
    fn on_disconnected(&mut self) -> ConnStatus {
        self.core.status()
    }

    /// The peer sees FIN now; the socket itself closes when the connection is dropped after
    /// its I/O has drained.
    fn shut_down(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
