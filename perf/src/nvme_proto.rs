//! NVMe/TCP on an I/O queue, host side: Read/Write capsules (in-capsule write data when it
//! fits the controller's IOCCSZ, else R2T → H2CData), C2HData and response capsules parsed
//! by the project's receive state machine. Command ids are slot indices, so a completion
//! finds its slot without a search or a map.

use std::sync::Arc;
use std::time::Instant;

use nvme::wire::SglDescriptor;
use transport::tcp::pdu::{digest, encode_header, DataHeader, Digests, PduHeader, R2t};
use transport::tcp::recv::{Discard, Event, Receiver};

use crate::command::io_sqe;
use crate::engine::{Completion, EngineError, Protocol};
use crate::sendq::SendQueue;
use crate::setup::IoQueueConn;
use crate::workload::IoRequest;

#[derive(Debug, Clone, Copy)]
struct Slot {
    busy: bool,
    read: bool,
    /// A data digest mismatch was seen on its C2HData.
    data_error: bool,
    start: Instant,
}

/// The C2HData PDU whose data is being received.
#[derive(Debug, Clone, Copy)]
struct DataInFlight {
    cid: u16,
    /// LAST_PDU and SUCCESS: no response capsule follows (NVMe/TCP 1.0 §3.6.2.9).
    completes: bool,
}

/// What one queue needs to know to build commands.
#[derive(Debug, Clone, Copy)]
pub struct QueueParams {
    pub nsid: u32,
    pub bs: u32,
    /// Blocks per I/O.
    pub nlb: u32,
    pub qd: u32,
    /// Largest write sent in-capsule (IOCCSZ-derived).
    pub in_capsule_limit: u32,
}

/// What the ICReq/ICResp exchange settled for a connection.
#[derive(Debug)]
pub struct Link {
    /// Receive state machine, established with the digests.
    pub rx: Receiver,
    pub digests: Digests,
    /// Controller PDU data alignment in bytes.
    pub cpda: usize,
    pub maxh2cdata: u32,
}

pub struct NvmeQueue {
    rx: Receiver,
    digests: Digests,
    cpda: usize,
    maxh2cdata: u32,
    params: QueueParams,
    slots: Vec<Slot>,
    free: Vec<u16>,
    payload: Arc<[u8]>,
    /// DDGST of the whole payload, for in-capsule writes (always the same bytes).
    payload_digest: u32,
    data: Option<DataInFlight>,
}

impl NvmeQueue {
    /// `payload` holds at least `params.bs` bytes; writes send its first `bs` bytes.
    pub fn new(
        conn: IoQueueConn,
        params: QueueParams,
        payload: Arc<[u8]>,
    ) -> (Self, crate::socket::Socket) {
        let link = Link {
            rx: conn.rx,
            digests: conn.digests,
            cpda: conn.cpda,
            maxh2cdata: conn.maxh2cdata,
        };
        (Self::from_link(link, params, payload), conn.stream)
    }

    /// The queue state without the socket (the I/O loop owns that).
    pub fn from_link(link: Link, params: QueueParams, payload: Arc<[u8]>) -> Self {
        let qd = params.qd.clamp(1, u16::MAX as u32);
        let now = Instant::now();
        Self {
            rx: link.rx,
            digests: link.digests,
            cpda: link.cpda,
            maxh2cdata: link.maxh2cdata,
            params,
            slots: vec![
                Slot {
                    busy: false,
                    read: false,
                    data_error: false,
                    start: now,
                };
                qd as usize
            ],
            // Popped from the end: cid 0 goes first.
            free: (0..qd as u16).rev().collect(),
            payload_digest: digest(&payload[..params.bs as usize]),
            payload,
            data: None,
        }
    }

    fn complete(
        &mut self,
        cid: u16,
        ok: bool,
        done: &mut Vec<Completion>,
    ) -> Result<(), EngineError> {
        let slot = self
            .slots
            .get_mut(cid as usize)
            .filter(|s| s.busy)
            .ok_or(EngineError::UnknownCid(cid))?;
        slot.busy = false;
        self.free.push(cid);
        done.push(Completion {
            read: slot.read,
            start: slot.start,
            ok: ok && !slot.data_error,
        });
        Ok(())
    }

    /// The slot of an outstanding command, checked for the expected direction.
    fn slot(&mut self, cid: u16, read: bool) -> Result<&mut Slot, EngineError> {
        self.slots
            .get_mut(cid as usize)
            .filter(|s| s.busy && s.read == read)
            .ok_or(EngineError::UnknownCid(cid))
    }

    /// Answers an R2T with H2CData PDUs of at most MAXH2CDATA each (NVMe/TCP 1.0 §3.6.2.8).
    fn answer_r2t(&mut self, r2t: R2t, out: &mut SendQueue) -> Result<(), EngineError> {
        self.slot(r2t.cccid, false)?;
        let end = r2t.r2to as u64 + r2t.r2tl as u64;
        if r2t.r2tl == 0 || end > self.params.bs as u64 {
            return Err(EngineError::OutOfRange {
                what: "R2T",
                cid: r2t.cccid,
                offset: r2t.r2to,
                len: r2t.r2tl,
            });
        }
        let end = end as u32;
        let mut off = r2t.r2to;
        while off < end {
            let n = (end - off).min(self.maxh2cdata);
            let h = PduHeader::H2CData {
                hdr: DataHeader {
                    cccid: r2t.cccid,
                    ttag: r2t.ttag,
                    datao: off,
                    datal: n,
                },
                last: off + n == end,
            };
            out.push_header(encode_header(&h, self.digests, n, self.cpda).as_slice());
            out.push_payload(off as usize, n as usize);
            if self.digests.data {
                let d = if off == 0 && n == self.params.bs {
                    self.payload_digest
                } else {
                    digest(&self.payload[off as usize..(off + n) as usize])
                };
                out.push_header(&d.to_le_bytes());
            }
            off += n;
        }
        Ok(())
    }
}

impl Protocol for NvmeQueue {
    fn can_submit(&self) -> bool {
        !self.free.is_empty()
    }

    fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn submit(&mut self, io: IoRequest, now: Instant, out: &mut SendQueue) {
        let Some(cid) = self.free.pop() else {
            return;
        };
        self.slots[cid as usize] = Slot {
            busy: true,
            read: io.read,
            data_error: false,
            start: now,
        };
        let p = self.params;
        let mut sqe = io_sqe(p.nsid, p.nlb, cid, io);
        let in_capsule = !io.read && p.bs <= p.in_capsule_limit;
        // NVMe/TCP 1.0 §3.3.4: in-capsule data is described by an offset data block SGL,
        // data moved by R2T/H2CData or C2HData by a transport data block SGL.
        sqe.dptr = if in_capsule {
            SglDescriptor::in_capsule(0, p.bs)
        } else {
            SglDescriptor::transport_data_block(p.bs)
        };
        let data_len = if in_capsule { p.bs } else { 0 };
        let header = encode_header(
            &PduHeader::CapsuleCmd(sqe),
            self.digests,
            data_len,
            self.cpda,
        );
        out.push_header(header.as_slice());
        if in_capsule {
            out.push_payload(0, p.bs as usize);
            if self.digests.data {
                out.push_header(&self.payload_digest.to_le_bytes());
            }
        }
    }

    fn on_bytes(
        &mut self,
        bytes: &[u8],
        out: &mut SendQueue,
        done: &mut Vec<Completion>,
    ) -> Result<(), EngineError> {
        let mut pos = 0;
        while pos < bytes.len() {
            let (used, ev) = self.rx.feed(&bytes[pos..], &mut Discard)?;
            pos += used;
            let Some(ev) = ev else {
                if used == 0 {
                    return Err(EngineError::Protocol("receiver made no progress"));
                }
                continue;
            };
            match ev {
                Event::Pdu { header, data_len } => match header {
                    PduHeader::CapsuleResp(cqe) => {
                        self.complete(cqe.cid, cqe.status.is_success(), done)?
                    }
                    PduHeader::C2HData { hdr, last, success } => {
                        self.slot(hdr.cccid, true)?;
                        if data_len == 0 {
                            // §3.6.2.9: a C2HData PDU carries data (DATAL > 0).
                            return Err(EngineError::Protocol("C2HData without data"));
                        }
                        if hdr.datao as u64 + data_len as u64 > self.params.bs as u64 {
                            return Err(EngineError::OutOfRange {
                                what: "C2HData",
                                cid: hdr.cccid,
                                offset: hdr.datao,
                                len: hdr.datal,
                            });
                        }
                        self.data = Some(DataInFlight {
                            cid: hdr.cccid,
                            completes: last && success,
                        });
                    }
                    PduHeader::R2T(r2t) => self.answer_r2t(r2t, out)?,
                    PduHeader::C2HTermReq(t) => {
                        return Err(EngineError::Terminated {
                            fes: t.fes,
                            fei: t.fei,
                        })
                    }
                    other => return Err(EngineError::UnexpectedPdu(other.pdu_type())),
                },
                Event::DataComplete { digest_ok } => {
                    let d = self
                        .data
                        .take()
                        .ok_or(EngineError::Protocol("data without a C2HData header"))?;
                    if !digest_ok {
                        self.slot(d.cid, true)?.data_error = true;
                    }
                    if d.completes {
                        self.complete(d.cid, true, done)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
