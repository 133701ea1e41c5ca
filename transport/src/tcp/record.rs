//! The user-space TLS 1.3 record layer: what a TLS connection uses when the kernel cannot take
//! the record keys (no `tls` ULP, or `setsockopt(SOL_TLS)` refused them). The session stays
//! in OpenSSL after the handshake and is fed from memory: ciphertext read from the
//! non-blocking socket goes into a bounded receive buffer that OpenSSL reads records from,
//! and every record OpenSSL produces (application data, the KeyUpdate it answers a peer's
//! request with, an alert) lands in a send buffer that is written to the socket when it
//! takes it. OpenSSL therefore never touches the socket and never blocks; the connection
//! above sees a plaintext byte stream with the socket's own WouldBlock / end-of-stream
//! semantics (`super::conn`), so [`super::TcpCore`] is the same with and without TLS.
//!
//! One socket read feeds as many records as it brought: a read call opens records from the
//! receive buffer into the caller's buffers until they are full or the receive buffer holds
//! no whole record more, and reads the socket only when it had nothing to open — so a burst
//! of small records costs the connection above one read call (and one round of answers), not
//! one per record. Both buffers are bounded: the receive buffer ([`RECEIVE_BUFFER`]) and the
//! caller's.
//!
//! KeyUpdate (RFC 8446 §4.6.3) is handled by OpenSSL: new receive keys, and when the peer
//! asks, a KeyUpdate of our own. A peer that sends record after record carrying no data
//! (a KeyUpdate flood) is cut off after [`MAX_RECORDS_WITHOUT_DATA`] of them, and one that
//! requests updates without reading our answers after [`SEND_LIMIT`] bytes pile up: either
//! closes that connection only.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use openssl::ssl::{ErrorCode, SslStream};

/// Ciphertext read from the socket at once (four full records; OpenSSL empties it before
/// the next socket read).
pub(super) const RECEIVE_BUFFER: usize = 4 * (MAX_RECORD + 256 + 5);
/// Largest TLS plaintext fragment (RFC 8446 §5.1).
const MAX_RECORD: usize = 16384;
/// Plaintext taken from the connection per write call: sealed at once into the send buffer.
const WRITE_CHUNK: usize = 64 * 1024;
/// Sealed bytes waiting for the socket above which no more plaintext is taken; a peer whose
/// KeyUpdate requests leave more than twice this unsent is not reading and is dropped.
pub const SEND_LIMIT: usize = 256 * 1024;
/// Records in a row that carry no application data (KeyUpdates, empty records) after which
/// the peer is taken to be flooding: RFC 8446 sets no limit; a host rekeys after gigabytes.
pub const MAX_RECORDS_WITHOUT_DATA: u32 = 64;

/// The transport OpenSSL reads and writes: the socket itself during the handshake (blocking,
/// bounded by a deadline), memory afterwards.
pub struct LinkIo {
    socket: Option<TcpStream>,
    deadline: Option<Instant>,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    tx: Vec<u8>,
    tx_start: usize,
    records: RecordBoundaries,
}

impl std::fmt::Debug for LinkIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkIo")
            .field("socket", &self.socket)
            .field("unsent", &self.unsent())
            .finish_non_exhaustive()
    }
}

impl LinkIo {
    /// OpenSSL on the socket; each read and write waits at most until `deadline` (or as the
    /// socket's own timeouts say when None).
    pub fn socket(stream: TcpStream, deadline: Option<Instant>) -> Self {
        LinkIo {
            socket: Some(stream),
            deadline,
            rx: Box::default(),
            rx_start: 0,
            rx_end: 0,
            tx: Vec::new(),
            tx_start: 0,
            records: RecordBoundaries::default(),
        }
    }

    pub fn stream(&self) -> Option<&TcpStream> {
        self.socket.as_ref()
    }

    /// Stays on the socket, bounded by its own timeouts from now on (a blocking client).
    pub(super) fn keep_socket(&mut self) {
        self.deadline = None;
    }

    /// Switches to memory and gives the socket back.
    fn switch_to_memory(&mut self) -> Option<TcpStream> {
        self.rx = vec![0u8; RECEIVE_BUFFER].into_boxed_slice();
        self.deadline = None;
        self.socket.take()
    }

    fn bound(deadline: Option<Instant>) -> io::Result<Option<std::time::Duration>> {
        let Some(deadline) = deadline else {
            return Ok(None);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            ))
        } else {
            Ok(Some(left))
        }
    }

    fn unsent(&self) -> usize {
        self.tx.len() - self.tx_start
    }
}

impl Read for LinkIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline = self.deadline;
        if let Some(socket) = &mut self.socket {
            let bound = Self::bound(deadline)?;
            if bound.is_some() {
                socket.set_read_timeout(bound)?;
            }
            return socket.read(buf);
        }
        if self.rx_start == self.rx_end {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.rx_end - self.rx_start);
        buf[..n].copy_from_slice(&self.rx[self.rx_start..self.rx_start + n]);
        self.records.consume(&buf[..n]);
        self.rx_start += n;
        Ok(n)
    }
}

impl Write for LinkIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let deadline = self.deadline;
        if let Some(socket) = &mut self.socket {
            let bound = Self::bound(deadline)?;
            if bound.is_some() {
                socket.set_write_timeout(bound)?;
            }
            return socket.write(buf);
        }
        self.tx.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.socket {
            Some(socket) => socket.flush(),
            None => Ok(()),
        }
    }
}

/// Counts the TLS records (RFC 8446 §5.1: 5-byte header, 16-bit length) in the ciphertext
/// OpenSSL reads. Without read-ahead it reads a record's header, then exactly its body, so
/// the count says how many records each `SSL_read` consumed.
#[derive(Default)]
struct RecordBoundaries {
    header: [u8; 5],
    header_len: usize,
    body_left: usize,
    complete: u64,
}

impl RecordBoundaries {
    fn consume(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.header_len < 5 {
                let n = bytes.len().min(5 - self.header_len);
                self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len == 5 {
                    self.body_left =
                        usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                }
            } else {
                let n = bytes.len().min(self.body_left);
                self.body_left -= n;
                bytes = &bytes[n..];
            }
            if self.header_len == 5 && self.body_left == 0 {
                self.header_len = 0;
                self.complete += 1;
            }
        }
    }

    fn at_boundary(&self) -> bool {
        self.header_len == 0
    }
}

/// One connection's TLS session after the handshake, with its record layer in user space.
pub struct RecordLayer {
    tls: SslStream<LinkIo>,
    /// Records in a row that carried no application data.
    without_data: u32,
    scratch: Vec<u8>,
    /// How the stream ended (end of stream, or the error), found while opening records
    /// after some plaintext of the same call: returned by the next call.
    deferred: Option<io::Result<usize>>,
}

/// What one `SSL_read` gave.
enum Opened {
    Data(usize),
    /// The receive buffer holds no whole record more.
    NeedInput,
    /// The end of the stream (`Ok(0)`) or the error that ends the connection.
    End(io::Result<usize>),
}

impl std::fmt::Debug for RecordLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordLayer")
            .field("unsent", &self.tls.get_ref().unsent())
            .finish_non_exhaustive()
    }
}

impl RecordLayer {
    /// Takes over a session whose handshake ran on the socket; returns the socket (now
    /// non-blocking, without timeouts) and the record layer.
    pub fn new(mut tls: SslStream<LinkIo>) -> io::Result<(TcpStream, Self)> {
        let stream = tls
            .get_mut()
            .switch_to_memory()
            .ok_or_else(|| io::Error::other("TLS session without a socket"))?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        stream.set_nonblocking(true)?;
        let layer = RecordLayer {
            tls,
            without_data: 0,
            scratch: Vec::with_capacity(MAX_RECORD),
            deferred: None,
        };
        Ok((stream, layer))
    }

    /// Plaintext into `buf` ([`RecordLayer::read_vectored`] with one buffer).
    pub fn read<S: Read + Write>(&mut self, sock: &mut S, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(sock, &mut [IoSliceMut::new(buf)])
    }

    /// Plaintext into `bufs`, in order: from records already received — as many as there are
    /// and the buffers take — else from one read of what the socket has. `Ok(0)` when the
    /// peer closed (close_notify, or end of stream at a record boundary); WouldBlock when the
    /// socket is drained; any TLS failure (an alert, a record that does not authenticate, a
    /// record cut short by end of stream, a KeyUpdate flood) is an error after which the
    /// connection must close. An end found after some plaintext is returned by the next call.
    pub fn read_vectored<S: Read + Write>(
        &mut self,
        sock: &mut S,
        bufs: &mut [IoSliceMut<'_>],
    ) -> io::Result<usize> {
        if let Some(end) = self.deferred.take() {
            return end;
        }
        let mut filled = 0;
        let (mut i, mut at) = (0, 0);
        let end = loop {
            while i < bufs.len() && at == bufs[i].len() {
                i += 1;
                at = 0;
            }
            if i == bufs.len() {
                return Ok(filled);
            }
            match self.open(&mut bufs[i][at..]) {
                Opened::Data(n) => {
                    filled += n;
                    at += n;
                }
                // What the last socket read brought is delivered; the socket is read by the
                // next call (the caller reads until WouldBlock).
                Opened::NeedInput if filled > 0 => return Ok(filled),
                Opened::NeedInput => {
                    // A KeyUpdate just read may have queued our answer.
                    self.send_answers(sock)?;
                    if let Some(end) = self.receive(sock)? {
                        break end;
                    }
                }
                Opened::End(end) => break end,
            }
        };
        if filled == 0 {
            return end;
        }
        self.deferred = Some(end);
        Ok(filled)
    }

    /// One `SSL_read` from the receive buffer into `buf` (not empty).
    fn open(&mut self, buf: &mut [u8]) -> Opened {
        let before = self.tls.get_ref().records.complete;
        let result = self.tls.ssl_read(buf);
        let consumed = self.tls.get_ref().records.complete - before;
        match result {
            Ok(n) => {
                // The last record consumed carried the data; any before it did not.
                if let Err(e) = self.without_data(consumed.saturating_sub(1)) {
                    return Opened::End(Err(e));
                }
                if consumed > 0 {
                    self.without_data = 0;
                }
                Opened::Data(n)
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => match self.without_data(consumed) {
                Ok(()) => Opened::NeedInput,
                Err(e) => Opened::End(Err(e)),
            },
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Opened::End(Ok(0)),
            Err(e) => Opened::End(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("TLS record layer: {e}"),
            ))),
        }
    }

    /// One socket read into the (empty) receive buffer: None when it brought ciphertext,
    /// else how the stream ended.
    fn receive<S: Read>(&mut self, sock: &mut S) -> io::Result<Option<io::Result<usize>>> {
        let io = self.tls.get_mut();
        io.rx_start = 0;
        io.rx_end = 0;
        let n = loop {
            match sock.read(&mut io.rx) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            return Ok(Some(if io.records.at_boundary() {
                Ok(0)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "end of stream inside a TLS record",
                ))
            }));
        }
        io.rx_end = n;
        Ok(None)
    }

    fn without_data(&mut self, records: u64) -> io::Result<()> {
        let records = u32::try_from(records).unwrap_or(u32::MAX);
        self.without_data = self.without_data.saturating_add(records);
        if self.without_data > MAX_RECORDS_WITHOUT_DATA {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} TLS records in a row without data (KeyUpdate flood?)",
                    self.without_data
                ),
            ));
        }
        Ok(())
    }

    /// Sends what reading produced (KeyUpdate answers) if the socket takes it; a peer that
    /// keeps asking without reading is dropped.
    fn send_answers<S: Write>(&mut self, sock: &mut S) -> io::Result<()> {
        match self.flush(sock) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        if self.tls.get_ref().unsent() > 2 * SEND_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer does not read the TLS records it asks for",
            ));
        }
        Ok(())
    }

    /// Seals plaintext from `bufs` (up to [`WRITE_CHUNK`] bytes, small pieces gathered into
    /// one record) and sends what the socket takes. Returns how many plaintext bytes were
    /// taken — all of them are the layer's to deliver from then on; WouldBlock when the send
    /// buffer is full.
    pub fn write_vectored<S: Write>(
        &mut self,
        sock: &mut S,
        bufs: &[IoSlice<'_>],
    ) -> io::Result<usize> {
        match self.flush(sock) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        if self.tls.get_ref().unsent() >= SEND_LIMIT {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut taken = 0;
        for buf in bufs {
            let take = buf.len().min(WRITE_CHUNK - taken);
            let piece = &buf[..take];
            if self.scratch.len() + take <= MAX_RECORD {
                self.scratch.extend_from_slice(piece);
            } else {
                self.seal_scratch()?;
                if take >= MAX_RECORD {
                    self.seal(piece)?;
                } else {
                    self.scratch.extend_from_slice(piece);
                }
            }
            taken += take;
            if taken == WRITE_CHUNK {
                break;
            }
        }
        self.seal_scratch()?;
        match self.flush(sock) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        Ok(taken)
    }

    fn seal_scratch(&mut self) -> io::Result<()> {
        if self.scratch.is_empty() {
            return Ok(());
        }
        let scratch = std::mem::take(&mut self.scratch);
        let result = self.seal(&scratch);
        self.scratch = scratch;
        self.scratch.clear();
        result
    }

    /// Writing to memory never blocks, so OpenSSL takes all of `plain` at once.
    fn seal(&mut self, mut plain: &[u8]) -> io::Result<()> {
        while !plain.is_empty() {
            let n = self.tls.ssl_write(plain).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("TLS record layer: {e}"))
            })?;
            plain = &plain[n..];
        }
        Ok(())
    }

    /// Writes sealed records to the socket: Ok when none is left, WouldBlock when the socket
    /// is full.
    pub fn flush<S: Write>(&mut self, sock: &mut S) -> io::Result<()> {
        let io = self.tls.get_mut();
        while io.tx_start < io.tx.len() {
            match sock.write(&io.tx[io.tx_start..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => io.tx_start += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        io.tx.clear();
        io.tx_start = 0;
        Ok(())
    }

    /// Sealed records not yet written to the socket.
    pub fn has_output(&self) -> bool {
        self.tls.get_ref().unsent() > 0
    }

    /// Asks for a KeyUpdate ([`key_update`]), sealed into the send buffer at once.
    pub fn key_update(&mut self, request_peer: bool) -> io::Result<()> {
        key_update(&mut self.tls, request_peer)
    }
}

/// Sends a KeyUpdate (RFC 8446 §4.6.3) on `tls` and switches to the new send keys, requesting
/// one from the peer too when `request_peer`. For tests and hostile clients.
pub fn key_update(tls: &mut SslStream<LinkIo>, request_peer: bool) -> io::Result<()> {
    super::tls_ffi::key_update(tls.ssl(), request_peer)
        .map_err(|e| io::Error::other(format!("KeyUpdate: {e}")))?;
    // SSL_do_handshake runs OpenSSL's state machine, which writes the pending KeyUpdate.
    tls.do_handshake()
        .map_err(|e| io::Error::other(format!("KeyUpdate: {e}")))
}
