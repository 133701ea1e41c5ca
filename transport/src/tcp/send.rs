//! The send queue of a connection: PDU headers copied into the queue, PDU data referenced in
//! place in the command slot's buffer, all flushed with one gather write (`writev`).
//!
//! The queue is bounded by construction: every entry belongs to a command slot (at most a
//! C2HData and a CapsuleResp, or an R2T, per slot) plus one ICResp or termination request,
//! and the connection stops reading new commands when slots run out.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::TcpStream;

use super::buffers::SlotBuffers;
use super::pdu::{EncodedHeader, DIGEST_LEN};

/// At most this many entries go into one `writev` (three iovecs each, well under IOV_MAX).
const MAX_BATCH: usize = 64;

/// One PDU to send.
#[derive(Debug)]
pub struct SendItem {
    head: EncodedHeader,
    /// Data taken from the start of this slot's buffer: (slot, length).
    data: Option<(u16, u32)>,
    tail: [u8; DIGEST_LEN],
    tail_len: usize,
    written: usize,
}

impl SendItem {
    /// A PDU that is all header (ICResp, R2T, CapsuleResp, termination request).
    pub fn header_only(head: EncodedHeader) -> Self {
        Self {
            head,
            data: None,
            tail: [0; DIGEST_LEN],
            tail_len: 0,
            written: 0,
        }
    }

    /// A PDU whose data is the first `len` bytes of `slot`'s buffer, followed by the data
    /// digest when given.
    pub fn with_data(head: EncodedHeader, slot: u16, len: u32, ddgst: Option<u32>) -> Self {
        let (tail, tail_len) = match ddgst {
            Some(d) => (d.to_le_bytes(), DIGEST_LEN),
            None => ([0; DIGEST_LEN], 0),
        };
        Self {
            head,
            data: Some((slot, len)),
            tail,
            tail_len,
            written: 0,
        }
    }

    fn total(&self) -> usize {
        self.head.len + self.data.map_or(0, |(_, l)| l as usize) + self.tail_len
    }

    /// The unsent parts, in order.
    fn parts<'a>(&'a self, buffers: &'a SlotBuffers, out: &mut Vec<IoSlice<'a>>) {
        let mut skip = self.written;
        let data: &[u8] = match self.data {
            Some((slot, len)) => &buffers.get(slot as usize)[..len as usize],
            None => &[],
        };
        for part in [self.head.as_slice(), data, &self.tail[..self.tail_len]] {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            out.push(IoSlice::new(&part[skip..]));
            skip = 0;
        }
    }
}

#[derive(Debug, Default)]
pub struct SendQueue {
    items: VecDeque<SendItem>,
}

impl SendQueue {
    pub fn push(&mut self, item: SendItem) {
        self.items.push_back(item);
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Writes as much as the socket takes with gather writes. `sent` is called with the slot
    /// of every data-carrying item once it is fully written (its buffer is free again).
    /// Returns `Ok(true)` when everything was sent.
    pub fn flush(
        &mut self,
        stream: &TcpStream,
        buffers: &SlotBuffers,
        mut sent: impl FnMut(u16),
    ) -> io::Result<bool> {
        while !self.items.is_empty() {
            let mut iov = Vec::with_capacity(3 * MAX_BATCH);
            let mut want = 0;
            for item in self.items.iter().take(MAX_BATCH) {
                item.parts(buffers, &mut iov);
                want += item.total() - item.written;
            }
            let mut n = match (&*stream).write_vectored(&iov) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            drop(iov);
            let short = n < want;
            while n > 0 {
                let Some(front) = self.items.front_mut() else {
                    break;
                };
                let left = front.total() - front.written;
                if n < left {
                    front.written += n;
                    break;
                }
                n -= left;
                if let Some(item) = self.items.pop_front() {
                    if let Some((slot, _)) = item.data {
                        sent(slot);
                    }
                }
            }
            if short {
                // The socket buffer is full; EPOLLOUT will tell when to continue.
                return Ok(false);
            }
        }
        Ok(true)
    }
}
