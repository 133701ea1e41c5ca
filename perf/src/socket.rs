//! One I/O queue's non-blocking byte stream in the I/O loop: the socket, or the socket with a
//! TLS session whose records are sealed and opened here (`transport::tcp::record`, the record
//! layer in user space) — `--tls-key`.

use std::io::{self, IoSlice, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};

use transport::client::HostStream;
use transport::tcp::record::RecordLayer;

pub struct Socket {
    stream: TcpStream,
    tls: Option<Box<RecordLayer>>,
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket")
            .field("stream", &self.stream)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Socket {
    /// A plaintext socket (must be non-blocking).
    pub fn plain(stream: TcpStream) -> Self {
        Socket { stream, tls: None }
    }

    /// Takes over a host stream after its blocking handshakes.
    pub fn new(host: HostStream) -> io::Result<Self> {
        let (stream, tls) = host.into_nonblocking()?;
        Ok(Socket { stream, tls })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Whether a short read says the socket is drained (plaintext only: the record layer
    /// returns at most one record per call).
    pub fn short_read_drains(&self) -> bool {
        self.tls.is_none()
    }

    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.tls {
            None => io::Read::read(&mut self.stream, buf),
            Some(tls) => tls.read(&mut &self.stream, buf),
        }
    }

    /// Sealed records still waiting for the socket.
    pub fn has_output(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.has_output())
    }

    /// Sends sealed records: Ok(true) when none is left, Ok(false) when the socket is full.
    pub fn send_sealed(&mut self) -> io::Result<bool> {
        let Some(tls) = &mut self.tls else {
            return Ok(true);
        };
        match tls.flush(&mut &self.stream) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.tls {
            None => (&self.stream).write_vectored(bufs),
            Some(tls) => tls.write_vectored(&mut &self.stream, bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
