//! The raw loopback reference: a request/response TCP peer with no NVMe in it, driven by the
//! same I/O loop with the same message sizes and queue depth as the NVMe/TCP run. Its
//! throughput is the ceiling the target's figures are divided by.
//!
//! Wire format of the reference (ours, not a standard): every request starts with an 8-byte
//! header `request_len: u32 LE, response_len: u32 LE` (request_len counts the header);
//! the peer answers each request, in order, with `response_len` bytes.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use transport::tcp::pdu::{CAPSULE_CMD_HEADER_LEN, CAPSULE_RESP_LEN, DATA_HEADER_LEN, R2T_LEN};

use crate::engine::{Completion, EngineError, Protocol};
use crate::sendq::SendQueue;
use crate::workload::IoRequest;

const ECHO_HEADER_LEN: usize = 8;
/// Largest request or response the peer accepts (bounds what a header can ask for).
pub const MAX_ECHO_MESSAGE: u32 = 64 << 20;
const RECV_BUFFER: usize = 512 * 1024;
/// Zeroes the peer answers with, referenced by as many iovecs as a response needs.
const ZERO_CHUNK: usize = 256 * 1024;
const SERVER_IOV: usize = 64;

/// Bytes on the wire of one NVMe/TCP I/O without digests, as the same run would send them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageSizes {
    /// Host → controller bytes: header part and data part.
    pub request_header: u32,
    pub request_data: u32,
    /// Controller → host bytes.
    pub response: u32,
}

impl MessageSizes {
    /// Read: CapsuleCmd → C2HData + CapsuleResp. In-capsule write: CapsuleCmd with data →
    /// CapsuleResp. Larger write: CapsuleCmd, R2T, H2CData, CapsuleResp — folded into one
    /// round trip here (so the reference is, if anything, a slightly higher ceiling).
    pub fn for_io(read: bool, bs: u32, in_capsule_limit: u32) -> Self {
        let cmd = CAPSULE_CMD_HEADER_LEN as u32;
        let resp = CAPSULE_RESP_LEN as u32;
        let data_hdr = DATA_HEADER_LEN as u32;
        if read {
            Self {
                request_header: cmd,
                request_data: 0,
                response: data_hdr + bs + resp,
            }
        } else if bs <= in_capsule_limit {
            Self {
                request_header: cmd,
                request_data: bs,
                response: resp,
            }
        } else {
            Self {
                request_header: cmd + data_hdr,
                request_data: bs,
                response: R2T_LEN as u32 + resp,
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    read: bool,
    start: Instant,
    /// Response bytes still to come.
    left: u32,
}

/// Client side of the reference on one connection.
pub struct EchoQueue {
    qd: usize,
    bs: u32,
    in_capsule_limit: u32,
    fifo: VecDeque<Outstanding>,
    /// Zeroes to pad request headers with.
    pad: [u8; 128],
}

impl EchoQueue {
    pub fn new(qd: u32, bs: u32, in_capsule_limit: u32) -> Self {
        Self {
            qd: qd.max(1) as usize,
            bs,
            in_capsule_limit,
            fifo: VecDeque::with_capacity(qd.max(1) as usize),
            pad: [0; 128],
        }
    }
}

impl Protocol for EchoQueue {
    fn can_submit(&self) -> bool {
        self.fifo.len() < self.qd
    }

    fn outstanding(&self) -> usize {
        self.fifo.len()
    }

    fn submit(&mut self, io: IoRequest, now: Instant, out: &mut SendQueue) {
        let m = MessageSizes::for_io(io.read, self.bs, self.in_capsule_limit);
        let total = m.request_header + m.request_data;
        let mut header = [0u8; ECHO_HEADER_LEN];
        header[..4].copy_from_slice(&total.to_le_bytes());
        header[4..].copy_from_slice(&m.response.to_le_bytes());
        out.push_header(&header);
        let pad = m.request_header as usize - ECHO_HEADER_LEN;
        out.push_header(&self.pad[..pad.min(self.pad.len())]);
        out.push_payload(0, m.request_data as usize);
        self.fifo.push_back(Outstanding {
            read: io.read,
            start: now,
            left: m.response,
        });
    }

    fn on_bytes(
        &mut self,
        mut bytes: &[u8],
        _out: &mut SendQueue,
        done: &mut Vec<Completion>,
    ) -> Result<(), EngineError> {
        while !bytes.is_empty() {
            let front = self.fifo.front_mut().ok_or(EngineError::Protocol(
                "echo peer sent bytes nobody asked for",
            ))?;
            let n = (front.left as usize).min(bytes.len());
            front.left -= n as u32;
            bytes = &bytes[n..];
            if front.left == 0 {
                let o = self.fifo.pop_front().expect("front exists");
                done.push(Completion {
                    read: o.read,
                    start: o.start,
                    ok: true,
                });
            }
        }
        Ok(())
    }
}

/// Server-side state of one connection.
struct PeerConn {
    stream: TcpStream,
    header: [u8; ECHO_HEADER_LEN],
    have: usize,
    /// Body bytes of the current request still to skip.
    skip: u64,
    /// Response bytes owed.
    owe: u64,
    epollout: bool,
}

impl PeerConn {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            header: [0; ECHO_HEADER_LEN],
            have: 0,
            skip: 0,
            owe: 0,
            epollout: false,
        }
    }

    /// Reads what arrived and answers it; false when the connection is finished (closed by
    /// the client, a socket error or a malformed request).
    fn serve(&mut self, rbuf: &mut [u8], zeroes: &[u8]) -> bool {
        loop {
            match self.stream.read(rbuf) {
                Ok(0) => return false,
                Ok(k) => {
                    if !self.consume(&rbuf[..k]) {
                        return false;
                    }
                    if k < rbuf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        self.send(zeroes).is_ok()
    }

    /// Parses requests; returns false on a malformed header.
    fn consume(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = (self.skip as usize).min(bytes.len());
                self.skip -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = (ECHO_HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == ECHO_HEADER_LEN {
                self.have = 0;
                let req = u32::from_le_bytes(self.header[..4].try_into().expect("4 bytes"));
                let resp = u32::from_le_bytes(self.header[4..].try_into().expect("4 bytes"));
                if !(ECHO_HEADER_LEN as u32..=MAX_ECHO_MESSAGE).contains(&req)
                    || resp > MAX_ECHO_MESSAGE
                {
                    return false;
                }
                self.skip = (req as usize - ECHO_HEADER_LEN) as u64;
                self.owe += resp as u64;
            }
        }
        true
    }

    /// Sends owed bytes with one writev; false when the socket is full.
    fn send(&mut self, zeroes: &[u8]) -> io::Result<bool> {
        while self.owe > 0 {
            let mut iov = [IoSlice::new(&[]); SERVER_IOV];
            let mut left = self.owe;
            let mut n = 0;
            while left > 0 && n < SERVER_IOV {
                let k = (left as usize).min(zeroes.len());
                iov[n] = IoSlice::new(&zeroes[..k]);
                left -= k as u64;
                n += 1;
            }
            match self.stream.write_vectored(&iov[..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => self.owe -= k as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Serves the reference protocol on `listener` (one thread, epoll) until `stop` is set.
pub fn serve(listener: TcpListener, stop: Arc<AtomicBool>) -> io::Result<()> {
    serve_polling(listener, stop, Duration::ZERO)
}

/// [`serve`], polling like nvmfd's `poll_window_us`: after a wake-up that found work, epoll
/// is asked with a zero timeout until `window` passes without work, so the reference pays
/// the same (no) sleep per round trip as a polling target; idle, it sleeps.
pub fn serve_polling(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    window: Duration,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
    const LISTENER: u64 = u64::MAX;
    epoll
        .add(
            listener.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
        )
        .map_err(io::Error::from)?;
    // Index = epoll token; a closed connection's entry is None and reused by the next accept.
    let mut conns: Vec<Option<PeerConn>> = Vec::new();
    let mut events = vec![EpollEvent::empty(); 256];
    let mut rbuf = vec![0u8; RECV_BUFFER];
    let zeroes = vec![0u8; ZERO_CHUNK];
    let mut poll_until: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let timeout = if poll_until.is_some() {
            EpollTimeout::ZERO
        } else {
            EpollTimeout::from(100u16)
        };
        let n = match epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => 0,
            Err(e) => return Err(e.into()),
        };
        let now = Instant::now();
        if n > 0 && !window.is_zero() {
            poll_until = Some(now + window);
        } else if poll_until.is_some_and(|t| now >= t) {
            poll_until = None;
        }
        for ev in &events[..n] {
            if ev.data() == LISTENER {
                accept_all(&listener, &epoll, &mut conns)?;
                continue;
            }
            let token = ev.data();
            let Some(c) = conns.get_mut(token as usize).and_then(Option::as_mut) else {
                continue;
            };
            if !c.serve(&mut rbuf, &zeroes) {
                let _ = epoll.delete(c.stream.as_fd());
                conns[token as usize] = None;
                continue;
            }
            let want_out = c.owe > 0;
            if want_out != c.epollout {
                let mut flags = EpollFlags::EPOLLIN;
                if want_out {
                    flags |= EpollFlags::EPOLLOUT;
                }
                epoll
                    .modify(c.stream.as_fd(), &mut EpollEvent::new(flags, token))
                    .map_err(io::Error::from)?;
                c.epollout = want_out;
            }
        }
    }
    Ok(())
}

fn accept_all(
    listener: &TcpListener,
    epoll: &Epoll,
    conns: &mut Vec<Option<PeerConn>>,
) -> io::Result<()> {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors and the like: keep serving the connections we have.
            Err(_) => return Ok(()),
        };
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let token = conns
            .iter()
            .position(Option::is_none)
            .unwrap_or(conns.len());
        epoll
            .add(
                stream.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, token as u64),
            )
            .map_err(io::Error::from)?;
        let c = Some(PeerConn::new(stream));
        if token == conns.len() {
            conns.push(c);
        } else {
            conns[token] = c;
        }
    }
}

/// Binds `addr` and serves in the calling thread, polling for `window` after work.
pub fn run_server(addr: SocketAddr, stop: Arc<AtomicBool>, window: Duration) -> io::Result<()> {
    serve_polling(TcpListener::bind(addr)?, stop, window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_sizes_follow_nvme_tcp() {
        let r = MessageSizes::for_io(true, 4096, 8192);
        assert_eq!(
            (r.request_header, r.request_data, r.response),
            (72, 0, 24 + 4096 + 24)
        );
        let w = MessageSizes::for_io(false, 4096, 8192);
        assert_eq!(
            (w.request_header, w.request_data, w.response),
            (72, 4096, 24)
        );
        let big = MessageSizes::for_io(false, 131072, 8192);
        assert_eq!(
            (big.request_header, big.request_data, big.response),
            (96, 131072, 48)
        );
    }

    #[test]
    fn client_completes_in_order_across_split_responses() {
        let mut q = EchoQueue::new(4, 4096, 8192);
        let mut out = SendQueue::with_capacity(4);
        let t = Instant::now();
        q.submit(
            IoRequest {
                read: true,
                slba: 0,
            },
            t,
            &mut out,
        );
        q.submit(
            IoRequest {
                read: false,
                slba: 8,
            },
            t,
            &mut out,
        );
        assert_eq!(out.pending_bytes(), 72 + 72 + 4096);
        let mut done = Vec::new();
        let stream = vec![0u8; 4144 + 24];
        q.on_bytes(&stream[..100], &mut out, &mut done).unwrap();
        assert!(done.is_empty());
        q.on_bytes(&stream[100..4150], &mut out, &mut done).unwrap();
        assert_eq!(done.len(), 1);
        assert!(done[0].read);
        q.on_bytes(&stream[4150..], &mut out, &mut done).unwrap();
        assert_eq!(done.len(), 2);
        assert!(!done[1].read);
        assert!(q.on_bytes(&[0], &mut out, &mut done).is_err());
    }

    #[test]
    fn peer_parses_requests_split_anywhere_and_rejects_bad_headers() {
        let (a, _b) = loopback_pair();
        let mut c = PeerConn::new(a);
        let mut msg = Vec::new();
        for (req, resp) in [(72u32, 4144u32), (72 + 4096, 24), (8, 0)] {
            msg.extend_from_slice(&req.to_le_bytes());
            msg.extend_from_slice(&resp.to_le_bytes());
            msg.resize(msg.len() + req as usize - 8, 0);
        }
        for piece in msg.chunks(5) {
            assert!(c.consume(piece));
        }
        assert_eq!(c.owe, 4144 + 24);
        assert_eq!((c.have, c.skip), (0, 0));
        let mut bad = Vec::new();
        bad.extend_from_slice(&4u32.to_le_bytes());
        bad.extend_from_slice(&0u32.to_le_bytes());
        assert!(!c.consume(&bad), "request shorter than its header");
    }

    fn loopback_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }
}
