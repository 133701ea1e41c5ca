//! The send queue of a connection: PDU headers copied into the queue, PDU data referenced in
//! place in the command slot's buffer — or, for reads of RAM and null namespaces, in the
//! namespace's memory (`storage::Lent`) — all handed out as the iovecs of one gather
//! write (`writev`) and advanced by what the socket took. Sans-I/O: the shell writes.
//!
//! The queue is bounded by construction: every entry belongs to a command slot (at most a
//! C2HData and a CapsuleResp, or an R2T, per slot) plus one ICResp or termination request,
//! and the connection stops reading new commands when slots run out.

use std::collections::VecDeque;
use std::io::IoSlice;

use arrayvec::ArrayVec;
use storage::Lent;

use super::buffers::SlotBuffers;
use super::pdu::{EncodedHeader, DIGEST_LEN};

/// At most this many entries go into one `writev` (three iovecs each, well under IOV_MAX).
const MAX_BATCH: usize = 64;

/// Where a PDU's data is, and its length.
#[derive(Debug, Clone, Copy)]
enum Data {
    /// The first `len` bytes of the command slot's buffer.
    Buffer(u32),
    /// A namespace's memory, lent by the backend (the read's bytes, not copied). Its `Lent`
    /// is in `SendQueue::lent`, in item order, not in the item: items then have no drop
    /// glue, so taking a sent one off the queue moves nothing (with a `Lent` inside, every
    /// pop copied the whole item, header buffer included, to drop it).
    Lent(u32),
}

impl Data {
    fn len(&self) -> usize {
        match *self {
            Data::Buffer(len) | Data::Lent(len) => len as usize,
        }
    }
}

/// One PDU to send.
#[derive(Debug)]
pub struct SendItem {
    head: EncodedHeader,
    /// The data, and the command slot it belongs to (free again once it is written).
    data: Option<(u16, Data)>,
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
            data: Some((slot, Data::Buffer(len))),
            tail,
            tail_len,
            written: 0,
        }
    }

    fn total(&self) -> usize {
        self.head.len + self.data.as_ref().map_or(0, |(_, d)| d.len()) + self.tail_len
    }

    /// The unsent parts, in order; `lent` holds the bytes of a `Data::Lent` item.
    fn parts<'a>(&'a self, buffers: &'a SlotBuffers, lent: &'a [u8], out: &mut IovBatch<'a>) {
        let mut skip = self.written;
        let data: &[u8] = match self.data {
            Some((slot, Data::Buffer(len))) => &buffers.get(slot as usize)[..len as usize],
            Some((_, Data::Lent(len))) => &lent[..(len as usize).min(lent.len())],
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
    /// The `Lent` of each `Data::Lent` item, in item order (held until it is written).
    lent: VecDeque<Lent>,
    /// Zero-copy sends (`MSG_ZEROCOPY`) the kernel has not reported done: their id (the
    /// socket's count of zero-copy sends) and the slot whose data they carried. Until its
    /// notification the kernel may still read those pages.
    zc_calls: VecDeque<(u32, u16)>,
    /// Fully written items whose data went out zero-copy and is not reported done yet: the
    /// slot (not free: its buffer must not be reused) and the lent range (kept alive).
    zc_held: Vec<(u16, Option<Lent>)>,
}

/// One gather write: its length, and whether it is to go out zero-copy (then it is the
/// data of one PDU only, and nothing else).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub want: usize,
    pub zerocopy: bool,
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

    /// Appends the unsent parts of the first [`MAX_BATCH`] PDUs, in order, to `out` (one
    /// gather write's worth); returns their total length.
    /// A PDU for `slot`'s command whose data is `bytes` of a namespace's memory (no data
    /// digest: lending is off when digests are on), held until written.
    pub fn push_lent(&mut self, head: EncodedHeader, slot: u16, bytes: Lent) {
        self.items.push_back(SendItem {
            head,
            data: Some((slot, Data::Lent(bytes.len() as u32))),
            tail: [0; DIGEST_LEN],
            tail_len: 0,
            written: 0,
        });
        self.lent.push_back(bytes);
    }

    pub fn gather<'a>(&'a self, buffers: &'a SlotBuffers, out: &mut IovBatch<'a>) -> usize {
        let mut want = 0;
        let mut lent = self.lent.iter();
        for item in self.items.iter().take(MAX_BATCH) {
            let bytes = match item.data {
                // `push_lent` queues one `Lent` per lent item, in the same order.
                Some((_, Data::Lent(_))) => lent.next().map_or(&[][..], Lent::as_bytes),
                _ => &[],
            };
            item.parts(buffers, bytes, out);
            want += item.total() - item.written;
        }
        want
    }

    /// [`SendQueue::gather`], except that a PDU's data of at least `threshold` bytes (0 = never)
    /// goes in a batch of its own, to be sent zero-copy: the headers before it (copied, and
    /// reused as soon as they are written) go in a plain batch first. Only PDU data is ever
    /// sent zero-copy, since only its memory — a slot buffer or a lent range — can be kept
    /// unchanged until the kernel's notification.
    pub fn gather_batch<'a>(
        &'a self,
        buffers: &'a SlotBuffers,
        out: &mut IovBatch<'a>,
        threshold: usize,
    ) -> Batch {
        if threshold == 0 {
            let want = self.gather(buffers, out);
            return Batch {
                want,
                zerocopy: false,
            };
        }
        let mut want = 0;
        let mut lent = self.lent.iter();
        for item in self.items.iter().take(MAX_BATCH) {
            let (data, len): (&[u8], usize) = match item.data {
                Some((slot, Data::Buffer(len))) => {
                    (&buffers.get(slot as usize)[..len as usize], len as usize)
                }
                Some((_, Data::Lent(len))) => {
                    let bytes = lent.next().map_or(&[][..], Lent::as_bytes);
                    (&bytes[..(len as usize).min(bytes.len())], len as usize)
                }
                None => (&[], 0),
            };
            let head = item.head.len;
            if len >= threshold && item.written < head + len {
                if item.written >= head {
                    // The data is next on the wire: alone, zero-copy — unless headers are
                    // already in this batch, which then ends before it.
                    if out.is_empty() {
                        out.push(IoSlice::new(&data[item.written - head..]));
                        return Batch {
                            want: head + len - item.written,
                            zerocopy: true,
                        };
                    }
                    break;
                }
                // The rest of the header, then stop: the data follows in its own batch.
                out.push(IoSlice::new(&item.head.as_slice()[item.written..]));
                want += head - item.written;
                break;
            }
            let mut skip = item.written;
            for part in [item.head.as_slice(), data, &item.tail[..item.tail_len]] {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                out.push(IoSlice::new(&part[skip..]));
                skip = 0;
            }
            want += item.total() - item.written;
        }
        Batch {
            want,
            zerocopy: false,
        }
    }

    /// `n` bytes of a zero-copy batch ([`Batch::zerocopy`]) went out in the socket's
    /// zero-copy send `id`: as [`SendQueue::advance`], but the item's slot is not reported
    /// free (nor its lent range released) before [`SendQueue::zerocopy_done`] covers `id`.
    pub fn advance_zerocopy(&mut self, n: usize, id: u32, sent: impl FnMut(u16)) {
        if let Some((slot, _)) = self.items.front().and_then(|i| i.data) {
            self.zc_calls.push_back((id, slot));
        }
        self.advance(n, sent);
    }

    /// The kernel reports the zero-copy sends `lo..=hi` (wrapping) done: slots none of whose
    /// sends is outstanding any more are reported to `sent`, their lent ranges released.
    pub fn zerocopy_done(&mut self, lo: u32, hi: u32, mut sent: impl FnMut(u16)) {
        let span = hi.wrapping_sub(lo);
        self.zc_calls.retain(|&(id, _)| id.wrapping_sub(lo) > span);
        let calls = &self.zc_calls;
        self.zc_held.retain(|(slot, _)| {
            let outstanding = calls.iter().any(|&(_, s)| s == *slot);
            if !outstanding {
                sent(*slot);
            }
            outstanding
        });
    }

    /// Zero-copy sends whose notification has not arrived.
    pub fn zerocopy_outstanding(&self) -> usize {
        self.zc_calls.len()
    }

    /// `n` bytes of what [`SendQueue::gather`] returned were written. `sent` is called with
    /// the slot of every data-carrying item once it is fully written (its buffer is free
    /// again) — or, when part of its data went out zero-copy, once that is reported done.
    pub fn advance(&mut self, mut n: usize, mut sent: impl FnMut(u16)) {
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
                if let Some((slot, data)) = item.data {
                    // The lent range is released once written.
                    let lent = match data {
                        Data::Lent(_) => self.lent.pop_front(),
                        Data::Buffer(_) => None,
                    };
                    if self.zc_calls.iter().any(|&(_, s)| s == slot) {
                        // The kernel may still read it: held until its notification.
                        self.zc_held.push((slot, lent));
                    } else {
                        drop(lent);
                        sent(slot);
                    }
                }
            }
        }
    }
}

/// The iovecs of one gather write: room for [`MAX_BATCH`] PDUs of three parts each, on the
/// stack. A heap vector here cost a malloc and a free per `writev` — one per command at QD1,
/// ~300 of its ~3,900 instructions (docs/performance.md, "QD1").
pub type IovBatch<'a> = ArrayVec<IoSlice<'a>, { 3 * MAX_BATCH }>;

pub fn iovec_batch<'a>() -> IovBatch<'a> {
    IovBatch::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::pdu::MAX_HEADER_BUF;
    use std::io::{self, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// Writes what the socket takes, as the connection shell does; true when all was sent.
    fn flush(
        q: &mut SendQueue,
        tx: &TcpStream,
        buffers: &SlotBuffers,
        sent: &mut Vec<u16>,
    ) -> bool {
        while !q.is_empty() {
            let mut iov = iovec_batch();
            let want = q.gather(buffers, &mut iov);
            let n = match (&*tx).write_vectored(&iov) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => panic!("write: {e}"),
            };
            drop(iov);
            q.advance(n, |s| sent.push(s));
            if n < want {
                return false;
            }
        }
        true
    }

    fn head(fill: u8, len: usize) -> EncodedHeader {
        let mut h = EncodedHeader {
            bytes: [0; MAX_HEADER_BUF],
            len,
        };
        h.bytes[..len].fill(fill);
        h
    }

    /// With a tiny socket send buffer every flush is partial: writes must resume at the
    /// right byte, items go out in order, and each data slot is reported once, after its
    /// last byte (digest included) was written.
    #[test]
    fn partial_writes_resume_exactly() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut rx, _) = listener.accept().unwrap();
        let small: libc::c_int = 4096;
        // SAFETY: setsockopt on an open socket with a correctly sized int option value.
        let rc = unsafe {
            libc::setsockopt(
                tx.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        tx.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            rx.read_to_end(&mut all).unwrap();
            all
        });

        let mut buffers = SlotBuffers::new(40, 64 * 1024).unwrap();
        let mut q = SendQueue::default();
        let mut expected = Vec::new();
        let mut data_slots = Vec::new();
        for i in 0..40u16 {
            let hl = 8 + (i as usize * 7) % 100;
            expected.extend(std::iter::repeat_n(i as u8, hl));
            if i % 3 == 0 {
                q.push(SendItem::header_only(head(i as u8, hl)));
                continue;
            }
            let len = 100 + i as u32 * 1500;
            let buf = &mut buffers.get_mut(i as usize)[..len as usize];
            for (k, b) in buf.iter_mut().enumerate() {
                *b = (k as u32 ^ (i as u32 * 77)) as u8;
            }
            expected.extend_from_slice(buf);
            let dd = (i % 2 == 0).then_some(0xa1b2_c3d4 ^ i as u32);
            if let Some(d) = dd {
                expected.extend_from_slice(&d.to_le_bytes());
            }
            q.push(SendItem::with_data(head(i as u8, hl), i, len, dd));
            data_slots.push(i);
        }
        let mut sent = Vec::new();
        let mut partial_flushes = 0;
        while !flush(&mut q, &tx, &buffers, &mut sent) {
            partial_flushes += 1;
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        tx.shutdown(Shutdown::Write).unwrap();
        assert!(q.is_empty());
        assert!(
            partial_flushes > 10,
            "the small buffer forced partial writes"
        );
        assert_eq!(sent, data_slots);
        assert!(reader.join().unwrap() == expected, "byte stream differs");
    }
}
