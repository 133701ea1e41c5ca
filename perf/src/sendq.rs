//! The send side of one connection: PDU headers are appended to one byte buffer, payload is
//! referenced (never copied) from the worker's read-only payload buffer, and everything
//! queued during a wake-up leaves in as few `writev(2)` calls as the iovec limit allows.

use std::io::{self, IoSlice, Write};

/// iovecs per `writev`; Linux allows 1024 (IOV_MAX), 256 keeps the array on the stack small
/// and is already ~128 PDUs.
const MAX_IOV: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    /// `len` bytes of the header buffer starting at `start`.
    Header { start: usize, len: usize },
    /// `len` bytes of the payload buffer starting at `start`.
    Payload { start: usize, len: usize },
}

/// Queued bytes of one connection, sent in order.
#[derive(Debug)]
pub struct SendQueue {
    headers: Vec<u8>,
    segments: Vec<Segment>,
    /// First segment not completely sent, and how much of it was.
    head: usize,
    head_sent: usize,
}

impl SendQueue {
    /// Capacity for about `pdus` PDUs before the buffers would have to grow.
    pub fn with_capacity(pdus: usize) -> Self {
        Self {
            headers: Vec::with_capacity(pdus * 160),
            segments: Vec::with_capacity(pdus * 3),
            head: 0,
            head_sent: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.segments.len()
    }

    /// Queues header bytes (merged with a directly preceding header segment).
    pub fn push_header(&mut self, bytes: &[u8]) {
        let start = self.headers.len();
        self.headers.extend_from_slice(bytes);
        let unsent = self.segments.len() > self.head;
        if let Some(Segment::Header { start: s, len }) = self.segments.last_mut() {
            if unsent && *s + *len == start {
                *len += bytes.len();
                return;
            }
        }
        self.segments.push(Segment::Header {
            start,
            len: bytes.len(),
        });
    }

    /// Queues `len` bytes of the payload buffer from `start` (bounds are checked at flush).
    pub fn push_payload(&mut self, start: usize, len: usize) {
        if len > 0 {
            self.segments.push(Segment::Payload { start, len });
        }
    }

    /// Bytes still to send.
    pub fn pending_bytes(&self) -> usize {
        self.segments[self.head..]
            .iter()
            .map(|s| match *s {
                Segment::Header { len, .. } | Segment::Payload { len, .. } => len,
            })
            .sum::<usize>()
            - self.head_sent
    }

    /// Writes as much as the socket takes. `Ok(true)`: everything went; `Ok(false)`: the
    /// socket is full (wait for EPOLLOUT).
    pub fn flush(&mut self, w: &mut impl Write, payload: &[u8]) -> io::Result<bool> {
        while !self.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n = 0;
            for (i, seg) in self.segments[self.head..].iter().take(MAX_IOV).enumerate() {
                let bytes = match *seg {
                    Segment::Header { start, len } => &self.headers[start..start + len],
                    Segment::Payload { start, len } => {
                        payload.get(start..start + len).ok_or_else(|| {
                            io::Error::new(io::ErrorKind::InvalidInput, "payload out of range")
                        })?
                    }
                };
                iov[i] = IoSlice::new(if i == 0 {
                    &bytes[self.head_sent..]
                } else {
                    bytes
                });
                n = i + 1;
            }
            let mut written = match w.write_vectored(&iov[..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            while written > 0 {
                let len = match self.segments[self.head] {
                    Segment::Header { len, .. } | Segment::Payload { len, .. } => len,
                };
                let left = len - self.head_sent;
                if written >= left {
                    written -= left;
                    self.head += 1;
                    self.head_sent = 0;
                } else {
                    self.head_sent += written;
                    written = 0;
                }
            }
        }
        // Everything went: reuse the buffers from the start (no allocation in steady state).
        self.headers.clear();
        self.segments.clear();
        self.head = 0;
        self.head_sent = 0;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `chunk` bytes per call and refuses every other call.
    struct Trickle {
        out: Vec<u8>,
        chunk: usize,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }

        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls % 2 == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut left = self.chunk;
            for b in bufs {
                let n = b.len().min(left);
                self.out.extend_from_slice(&b[..n]);
                left -= n;
                if left == 0 {
                    break;
                }
            }
            Ok(self.chunk - left)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume_in_order() {
        let payload: Vec<u8> = (0..=255).collect();
        let mut q = SendQueue::with_capacity(4);
        let mut want = Vec::new();
        for i in 0..300u16 {
            let h = [i as u8; 3];
            q.push_header(&h);
            want.extend_from_slice(&h);
            let (s, l) = (i as usize % 200, 7);
            q.push_payload(s, l);
            want.extend_from_slice(&payload[s..s + l]);
        }
        assert_eq!(q.pending_bytes(), want.len());
        let mut w = Trickle {
            out: Vec::new(),
            chunk: 11,
            calls: 0,
        };
        let mut rounds = 0;
        while !q.flush(&mut w, &payload).unwrap() {
            rounds += 1;
            assert_eq!(q.pending_bytes(), want.len() - w.out.len());
        }
        assert!(rounds > 100);
        assert_eq!(w.out, want);
        assert!(q.is_empty());
        assert_eq!(q.pending_bytes(), 0);
    }

    #[test]
    fn adjacent_headers_share_a_segment() {
        let mut q = SendQueue::with_capacity(1);
        q.push_header(b"ab");
        q.push_header(b"cd");
        q.push_payload(0, 2);
        q.push_header(b"ef");
        assert_eq!(q.segments.len(), 3);
        let mut out = Vec::new();
        assert!(q.flush(&mut out, b"XY").unwrap());
        assert_eq!(out, b"abcdXYef");
    }

    #[test]
    fn payload_out_of_range_is_an_error() {
        let mut q = SendQueue::with_capacity(1);
        q.push_payload(2, 4);
        let err = q.flush(&mut Vec::new(), b"abc").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
