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
mod tests {
    use super::*;
    use nvme::spec::nvm_opcode;
    use nvme::wire::{Cqe, SglType, Sqe, Status};
    use transport::tcp::pdu::{encode_pdu, RecvLimits, Role, TermReq};
    use transport::tcp::recv::DataSink;

    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    fn queue(digests: Digests, bs: u32, qd: u32, in_capsule: u32, maxh2cdata: u32) -> NvmeQueue {
        let mut rx = Receiver::new(
            Role::Host,
            RecvLimits {
                max_capsule_data: 0,
                max_data_pdu: bs.max(4096),
            },
        );
        rx.establish(digests, 4);
        let link = Link {
            rx,
            digests,
            cpda: 4,
            maxh2cdata,
        };
        let params = QueueParams {
            nsid: 1,
            bs,
            nlb: bs / 512,
            qd,
            in_capsule_limit: in_capsule,
        };
        NvmeQueue::from_link(link, params, crate::run::payload(bs))
    }

    struct Collect(Vec<u8>);

    impl DataSink for Collect {
        fn write(&mut self, _offset: u32, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
    }

    /// What a controller would make of the queued bytes: (header, data, data digest ok).
    fn controller_view(
        q: &mut SendQueue,
        digests: Digests,
        bs: u32,
    ) -> Vec<(PduHeader, Vec<u8>, bool)> {
        let mut bytes = Vec::new();
        assert!(q.flush(&mut bytes, &crate::run::payload(bs)).unwrap());
        let mut rx = Receiver::new(
            Role::Controller,
            RecvLimits {
                max_capsule_data: 1 << 20,
                max_data_pdu: 1 << 20,
            },
        );
        rx.establish(digests, 4);
        let mut out = Vec::new();
        let mut pending: Option<PduHeader> = None;
        let mut data = Collect(Vec::new());
        let mut pos = 0;
        while pos < bytes.len() {
            let (used, ev) = rx.feed(&bytes[pos..], &mut data).unwrap();
            pos += used;
            match ev {
                Some(Event::Pdu {
                    header,
                    data_len: 0,
                }) => out.push((header, Vec::new(), true)),
                Some(Event::Pdu { header, .. }) => pending = Some(header),
                Some(Event::DataComplete { digest_ok }) => out.push((
                    pending.take().unwrap(),
                    std::mem::take(&mut data.0),
                    digest_ok,
                )),
                None => {}
            }
        }
        out
    }

    fn c2h(cid: u16, len: u32, success: bool, digests: Digests) -> Vec<u8> {
        let h = PduHeader::C2HData {
            hdr: DataHeader {
                cccid: cid,
                ttag: 0,
                datao: 0,
                datal: len,
            },
            last: true,
            success,
        };
        encode_pdu(&h, &vec![0xa5; len as usize], digests, 4)
    }

    fn resp(cid: u16, status: Status, digests: Digests) -> Vec<u8> {
        let cqe = Cqe {
            cid,
            status,
            ..Cqe::default()
        };
        encode_pdu(&PduHeader::CapsuleResp(cqe), &[], digests, 4)
    }

    fn sqe_of(pdu: &(PduHeader, Vec<u8>, bool)) -> Sqe {
        match pdu.0 {
            PduHeader::CapsuleCmd(sqe) => sqe,
            ref other => panic!("expected a capsule, got {other:?}"),
        }
    }

    #[test]
    fn read_capsule_then_c2hdata_and_response_split_anywhere() {
        let mut stream = c2h(0, 4096, false, BOTH);
        stream.extend(resp(0, Status::SUCCESS, BOTH));
        for split in 0..=stream.len() {
            let mut q = queue(BOTH, 4096, 4, 8192, 65536);
            let mut out = SendQueue::with_capacity(4);
            q.submit(
                IoRequest {
                    read: true,
                    slba: 0x1_0000_0010,
                },
                Instant::now(),
                &mut out,
            );
            if split == 0 {
                let pdus = controller_view(&mut out, BOTH, 4096);
                assert_eq!(pdus.len(), 1);
                let sqe = sqe_of(&pdus[0]);
                assert_eq!((sqe.opcode, sqe.cid, sqe.nsid), (nvm_opcode::READ, 0, 1));
                assert_eq!((sqe.cdw10, sqe.cdw11, sqe.cdw12), (0x10, 1, 7));
                assert_eq!(sqe.psdt(), 1);
                assert_eq!(sqe.dptr, SglDescriptor::transport_data_block(4096));
                assert!(pdus[0].1.is_empty());
            }
            let mut done = Vec::new();
            q.on_bytes(&stream[..split], &mut out, &mut done).unwrap();
            q.on_bytes(&stream[split..], &mut out, &mut done).unwrap();
            assert_eq!(done.len(), 1, "split at {split}");
            assert!(done[0].read && done[0].ok);
            assert_eq!(q.outstanding(), 0);
        }
    }

    #[test]
    fn success_flag_completes_without_a_response() {
        let mut q = queue(Digests::default(), 4096, 2, 8192, 65536);
        let mut out = SendQueue::with_capacity(2);
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
                read: true,
                slba: 8,
            },
            t,
            &mut out,
        );
        assert!(!q.can_submit(), "queue depth 2 reached");
        let mut done = Vec::new();
        q.on_bytes(&c2h(1, 4096, true, Digests::default()), &mut out, &mut done)
            .unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(q.outstanding(), 1);
        assert!(q.can_submit());
    }

    #[test]
    fn in_capsule_write_carries_the_payload() {
        let mut q = queue(BOTH, 4096, 2, 8192, 65536);
        let mut out = SendQueue::with_capacity(2);
        q.submit(
            IoRequest {
                read: false,
                slba: 24,
            },
            Instant::now(),
            &mut out,
        );
        let pdus = controller_view(&mut out, BOTH, 4096);
        assert_eq!(pdus.len(), 1);
        let sqe = sqe_of(&pdus[0]);
        assert_eq!(sqe.opcode, nvm_opcode::WRITE);
        assert_eq!(sqe.dptr.sgl_type, SglType::DataBlockOffset);
        assert_eq!(sqe.dptr.length, 4096);
        assert!(pdus[0].1 == crate::run::payload(4096)[..]);
        assert!(pdus[0].2, "data digest");
        let mut done = Vec::new();
        q.on_bytes(&resp(0, Status::SUCCESS, BOTH), &mut out, &mut done)
            .unwrap();
        assert!(!done[0].read && done[0].ok);
    }

    #[test]
    fn large_write_answers_r2t_in_maxh2cdata_chunks() {
        let bs = 32768;
        let mut q = queue(BOTH, bs, 2, 8192, 8192);
        let mut out = SendQueue::with_capacity(2);
        q.submit(
            IoRequest {
                read: false,
                slba: 0,
            },
            Instant::now(),
            &mut out,
        );
        let pdus = controller_view(&mut out, BOTH, bs);
        let sqe = sqe_of(&pdus[0]);
        assert_eq!(sqe.dptr, SglDescriptor::transport_data_block(bs));
        assert!(pdus[0].1.is_empty(), "no in-capsule data beyond IOCCSZ");
        let r2t = PduHeader::R2T(R2t {
            cccid: 0,
            ttag: 9,
            r2to: 0,
            r2tl: bs,
        });
        let mut done = Vec::new();
        q.on_bytes(&encode_pdu(&r2t, &[], BOTH, 4), &mut out, &mut done)
            .unwrap();
        let h2c = controller_view(&mut out, BOTH, bs);
        assert_eq!(h2c.len(), 4);
        let mut all = Vec::new();
        for (i, (h, data, digest_ok)) in h2c.iter().enumerate() {
            match *h {
                PduHeader::H2CData { hdr, last } => {
                    assert_eq!((hdr.cccid, hdr.ttag), (0, 9));
                    assert_eq!((hdr.datao, hdr.datal), (i as u32 * 8192, 8192));
                    assert_eq!(last, i == 3);
                }
                ref other => panic!("{other:?}"),
            }
            assert!(digest_ok);
            all.extend_from_slice(data);
        }
        assert!(all == crate::run::payload(bs)[..]);
        q.on_bytes(&resp(0, Status::SUCCESS, BOTH), &mut out, &mut done)
            .unwrap();
        assert_eq!(done.len(), 1);
    }

    #[test]
    fn failures_are_counted_or_fatal() {
        let d = Digests::default();
        let mut q = queue(d, 4096, 4, 8192, 65536);
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
                slba: 0,
            },
            t,
            &mut out,
        );
        let mut done = Vec::new();
        q.on_bytes(&resp(1, Status::INTERNAL_ERROR, d), &mut out, &mut done)
            .unwrap();
        assert!(!done[0].ok, "error status");
        assert!(matches!(
            q.on_bytes(&resp(3, Status::SUCCESS, d), &mut out, &mut done),
            Err(EngineError::UnknownCid(3))
        ));

        // A data digest mismatch fails the command, not the connection.
        let mut q = queue(BOTH, 4096, 4, 8192, 65536);
        q.submit(
            IoRequest {
                read: true,
                slba: 0,
            },
            t,
            &mut out,
        );
        let mut bad = c2h(0, 4096, false, BOTH);
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        bad.extend(resp(0, Status::SUCCESS, BOTH));
        let mut done = Vec::new();
        q.on_bytes(&bad, &mut out, &mut done).unwrap();
        assert_eq!(done.len(), 1);
        assert!(!done[0].ok);

        // An R2T beyond the command's data and a termination request end the connection.
        let mut q = queue(d, 4096, 4, 0, 65536);
        q.submit(
            IoRequest {
                read: false,
                slba: 0,
            },
            t,
            &mut out,
        );
        let r2t = PduHeader::R2T(R2t {
            cccid: 0,
            ttag: 1,
            r2to: 4000,
            r2tl: 200,
        });
        assert!(matches!(
            q.on_bytes(&encode_pdu(&r2t, &[], d, 4), &mut out, &mut done),
            Err(EngineError::OutOfRange { what: "R2T", .. })
        ));
        let mut q = queue(d, 4096, 4, 0, 65536);
        let term = TermReq::new(transport::tcp::pdu::Fes::PduSequenceError, 0, &[1, 2, 3]);
        let bytes = term.encode(transport::tcp::pdu::PduType::C2HTermReq);
        assert!(matches!(
            q.on_bytes(&bytes, &mut out, &mut done),
            Err(EngineError::Terminated { fes: 2, .. })
        ));
    }
}
