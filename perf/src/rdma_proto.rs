//! NVMe/RDMA on one queue, host side, sans-I/O (NVMe RDMA Transport 1.0b §2, §3.4).
//!
//! Command capsules go out as SENDs from one registered buffer per command slot; response
//! capsules (a bare CQE: responses carry no data on RDMA) arrive in pre-posted receives; data
//! moves by the controller's RDMA WRITE (reads) or RDMA READ (writes) against keyed SGL data
//! blocks naming registered host memory, or, for a write within the controller's in-capsule
//! size, in the capsule after the SQE. Work requests go out through `WorkPoster` (the QP, or
//! a recorder in the tests); nothing here calls verbs.
//!
//! A command is finished when both its response and its SEND completion are in: the two
//! arrive on different work queues in no defined order, and the capsule buffer must not be
//! rewritten before the HCA is done with it (the Linux host waits for both the same way).
//! Command ids are slot indices.

use std::time::Instant;

use nvme::spec::sqe_flags::PSDT_SGL;
use nvme::wire::{Cqe, SglDescriptor, SglType, Sqe};
use transport::rdma::core::WorkPoster;
use transport::rdma::pool::PoolBuffer;
use transport::rdma::verbs::{LocalBuf, SendOp, VerbsError, WorkCompletion};

/// Work request ids: kind in the upper half, index in the lower. Failed completions carry no
/// valid opcode, so the id alone must say what completed.
mod wr_id {
    pub const SEND: u64 = 1 << 32;
    pub const RECV: u64 = 2 << 32;
    pub const KIND_MASK: u64 = 0xffff_ffff << 32;

    pub fn split(id: u64) -> (u64, u32) {
        (id & KIND_MASK, id as u32)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue buffers: {0}")]
    Layout(&'static str),
    #[error("no free command slot")]
    NoSlot,
    #[error("{what} of {len} bytes does not fit the {room}-byte buffer")]
    TooLarge {
        what: &'static str,
        len: usize,
        room: usize,
    },
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    #[error("work completion {wr_id:#x} failed with status {status}")]
    CompletionFailed { wr_id: u64, status: u32 },
    #[error("unexpected work completion id {0:#x}")]
    UnknownCompletion(u64),
    #[error("response capsule of {0} bytes (NVMe RDMA 1.0b §3.4: a CQE, 16 bytes)")]
    BadResponseLength(u32),
    #[error("response for command id {0:#x}, which is not outstanding")]
    UnknownCid(u16),
    #[error("no completion within {0:?}")]
    Timeout(std::time::Duration),
}

/// The registered memory of one queue.
pub struct QueueBuffers {
    /// One per command slot: the SQE (64 bytes), then room for in-capsule data.
    pub capsules: Vec<PoolBuffer>,
    /// The posted receives (as many as the host receive queue size given at connect), each
    /// at least a CQE.
    pub responses: Vec<PoolBuffer>,
    /// One per command slot: where reads land and `Transfer::Write` data is copied to
    /// (remote-registered).
    pub data: Vec<PoolBuffer>,
    /// The write payload of `Transfer::Payload` (remote-registered; the controller only
    /// reads it).
    pub payload: Option<PoolBuffer>,
}

/// Data a command moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer<'a> {
    None,
    /// Controller to host: this many bytes into the slot's data buffer.
    Read(u32),
    /// Host to controller: these bytes, copied to the slot's data buffer first.
    Write(&'a [u8]),
    /// Host to controller: the first bytes of the payload, in-capsule when the queue carries
    /// that much in its capsules, else from the payload buffer.
    Payload(u32),
}

/// A finished command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub cid: u16,
    pub cqe: Cqe,
    pub read: bool,
    /// When it was submitted.
    pub start: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    busy: bool,
    /// The SEND of its capsule has completed.
    sent: bool,
    response: Option<Cqe>,
    read: bool,
    start: Instant,
}

/// The host side of one NVMe/RDMA queue.
pub struct HostQueue {
    bufs: QueueBuffers,
    /// Payload bytes every capsule carries after its SQE (0: writes are keyed).
    in_capsule: u32,
    slots: Vec<Slot>,
    free: Vec<u16>,
}

fn local(b: &PoolBuffer, len: usize) -> LocalBuf {
    LocalBuf {
        addr: b.addr(),
        len: len as u32,
        lkey: b.lkey(),
    }
}

/// A keyed SGL data block for the first `len` bytes of `b` (NVMe Base 2.0 §4.3.2.1.4:
/// subtype 0h, the key is not invalidated: the host keeps its registration for the run).
fn keyed(b: &PoolBuffer, len: u32) -> SglDescriptor {
    SglDescriptor {
        address: b.addr(),
        length: len,
        key: b.rkey(),
        sgl_type: SglType::KeyedDataBlock,
    }
}

impl HostQueue {
    /// `in_capsule` payload bytes are copied behind the SQE of every capsule once, here: the
    /// payload never changes, so an in-capsule write only rewrites its SQE.
    pub fn new(mut bufs: QueueBuffers, in_capsule: u32) -> Result<Self, QueueError> {
        let n = bufs.capsules.len();
        if n == 0 || n > u16::MAX as usize + 1 || bufs.data.len() != n {
            return Err(QueueError::Layout(
                "one capsule and one data buffer per slot, 1 to 65536 slots",
            ));
        }
        if bufs.responses.is_empty() || bufs.responses.iter().any(|b| b.len() < Cqe::SIZE) {
            return Err(QueueError::Layout("response buffers hold a CQE"));
        }
        let ic = in_capsule as usize;
        if bufs.capsules.iter().any(|b| b.len() < Sqe::SIZE + ic) {
            return Err(QueueError::Layout(
                "capsules hold the SQE and the in-capsule data",
            ));
        }
        if ic > 0 {
            let payload = match &bufs.payload {
                Some(p) if p.len() >= ic => &p.as_slice()[..ic],
                _ => return Err(QueueError::Layout("in-capsule data needs the payload")),
            };
            for c in bufs.capsules.iter_mut() {
                c.as_mut_slice()[Sqe::SIZE..Sqe::SIZE + ic].copy_from_slice(payload);
            }
        }
        let now = Instant::now();
        Ok(Self {
            bufs,
            in_capsule,
            slots: vec![
                Slot {
                    busy: false,
                    sent: false,
                    response: None,
                    read: false,
                    start: now,
                };
                n
            ],
            // Popped from the end: cid 0 goes first.
            free: (0..n as u32).rev().map(|c| c as u16).collect(),
        })
    }

    /// Posts every receive; done once, before connecting (the controller may answer as soon
    /// as the connection is established).
    pub fn post_receives(&self, qp: &mut dyn WorkPoster) -> Result<(), QueueError> {
        for idx in 0..self.bufs.responses.len() {
            self.repost(qp, idx as u32)?;
        }
        Ok(())
    }

    fn repost(&self, qp: &mut dyn WorkPoster, idx: u32) -> Result<(), QueueError> {
        let b = &self.bufs.responses[idx as usize];
        qp.post_recv(wr_id::RECV | u64::from(idx), local(b, b.len()))?;
        Ok(())
    }

    pub fn can_submit(&self) -> bool {
        !self.free.is_empty()
    }

    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Sends `sqe` (its CID, PSDT and DPTR are set here) and returns its CID.
    pub fn submit(
        &mut self,
        mut sqe: Sqe,
        transfer: Transfer<'_>,
        now: Instant,
        qp: &mut dyn WorkPoster,
    ) -> Result<u16, QueueError> {
        let cid = *self.free.last().ok_or(QueueError::NoSlot)?;
        let i = cid as usize;
        let data_room = self.bufs.data[i].len();
        let too_large = |what, len: usize, room| QueueError::TooLarge { what, len, room };
        let mut capsule_len = Sqe::SIZE;
        sqe.dptr = match transfer {
            // NVMe RDMA 1.0b §2.3 / Linux `nvme_rdma_set_sg_null`: a keyed block of length 0.
            Transfer::None => SglDescriptor {
                address: 0,
                length: 0,
                key: 0,
                sgl_type: SglType::KeyedDataBlock,
            },
            Transfer::Read(len) => {
                if len as usize > data_room {
                    return Err(too_large("read", len as usize, data_room));
                }
                keyed(&self.bufs.data[i], len)
            }
            Transfer::Write(bytes) => {
                if bytes.len() > data_room {
                    return Err(too_large("write", bytes.len(), data_room));
                }
                self.bufs.data[i].as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
                keyed(&self.bufs.data[i], bytes.len() as u32)
            }
            Transfer::Payload(len) if len > 0 && len <= self.in_capsule => {
                capsule_len += len as usize;
                SglDescriptor::in_capsule(0, len)
            }
            Transfer::Payload(len) => match &self.bufs.payload {
                Some(p) if len as usize <= p.len() => keyed(p, len),
                p => {
                    let room = p.as_ref().map_or(0, |p| p.len());
                    return Err(too_large("payload write", len as usize, room));
                }
            },
        };
        sqe.cid = cid;
        sqe.flags = PSDT_SGL;
        let capsule = &mut self.bufs.capsules[i];
        capsule.as_mut_slice()[..Sqe::SIZE].copy_from_slice(&sqe.encode());
        let send = local(capsule, capsule_len);
        qp.post_send(
            wr_id::SEND | u64::from(cid),
            SendOp::Send { invalidate: None },
            send,
        )?;
        self.free.pop();
        self.slots[i] = Slot {
            busy: true,
            sent: false,
            response: None,
            read: matches!(transfer, Transfer::Read(_)),
            start: now,
        };
        Ok(cid)
    }

    /// Consumes polled work completions; finished commands go to `done`. Any failed or
    /// unexpected completion, and any response the queue cannot match, is fatal.
    pub fn on_completions(
        &mut self,
        wcs: &[WorkCompletion],
        qp: &mut dyn WorkPoster,
        done: &mut Vec<Finished>,
    ) -> Result<(), QueueError> {
        for wc in wcs {
            let (kind, idx) = wr_id::split(wc.wr_id);
            if !wc.is_success() {
                return Err(QueueError::CompletionFailed {
                    wr_id: wc.wr_id,
                    status: wc.status,
                });
            }
            match kind {
                wr_id::SEND => {
                    let slot = self
                        .slots
                        .get_mut(idx as usize)
                        .filter(|s| s.busy && !s.sent)
                        .ok_or(QueueError::UnknownCompletion(wc.wr_id))?;
                    slot.sent = true;
                    self.finish(idx as u16, done);
                }
                wr_id::RECV if (idx as usize) < self.bufs.responses.len() => {
                    if wc.byte_len as usize != Cqe::SIZE {
                        return Err(QueueError::BadResponseLength(wc.byte_len));
                    }
                    let cqe =
                        Cqe::decode(&self.bufs.responses[idx as usize].as_slice()[..Cqe::SIZE])
                            .map_err(|_| QueueError::BadResponseLength(wc.byte_len))?;
                    self.repost(qp, idx)?;
                    let slot = self
                        .slots
                        .get_mut(cqe.cid as usize)
                        .filter(|s| s.busy && s.response.is_none())
                        .ok_or(QueueError::UnknownCid(cqe.cid))?;
                    slot.response = Some(cqe);
                    self.finish(cqe.cid, done);
                }
                _ => return Err(QueueError::UnknownCompletion(wc.wr_id)),
            }
        }
        Ok(())
    }

    fn finish(&mut self, cid: u16, done: &mut Vec<Finished>) {
        let slot = &mut self.slots[cid as usize];
        let (true, Some(cqe)) = (slot.sent, slot.response) else {
            return;
        };
        slot.busy = false;
        self.free.push(cid);
        done.push(Finished {
            cid,
            cqe,
            read: slot.read,
            start: slot.start,
        });
    }

    /// The first `len` bytes of a slot's data buffer: what a finished read returned (valid
    /// until the slot is used again).
    pub fn data(&self, cid: u16, len: u32) -> &[u8] {
        let b = self.bufs.data[cid as usize].as_slice();
        &b[..(len as usize).min(b.len())]
    }

    #[cfg(test)]
    fn response_mut(&mut self, idx: u32) -> &mut [u8] {
        self.bufs.responses[idx as usize].as_mut_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::spec::Status;
    use transport::rdma::pool::{BufferPool, PoolGeometry};
    use transport::rdma::verbs::WcOpcode;

    #[derive(Default)]
    struct Recorder {
        recvs: Vec<(u64, LocalBuf)>,
        sends: Vec<(u64, SendOp, LocalBuf)>,
    }

    impl WorkPoster for Recorder {
        fn post_recv(&mut self, wr_id: u64, buf: LocalBuf) -> Result<(), VerbsError> {
            self.recvs.push((wr_id, buf));
            Ok(())
        }
        fn post_send(&mut self, wr_id: u64, op: SendOp, buf: LocalBuf) -> Result<(), VerbsError> {
            self.sends.push((wr_id, op, buf));
            Ok(())
        }
    }

    fn pool(size: usize, align: usize, count: usize) -> BufferPool {
        BufferPool::unregistered(PoolGeometry {
            buffer_size: size,
            align,
            count,
        })
        .unwrap()
    }

    const PAYLOAD: &[u8] = b"0123456789abcdef";

    /// `slots` slots, 4 receives, 4 KiB data buffers, a 4 KiB payload starting with PAYLOAD.
    fn queue(slots: usize, in_capsule: u32) -> HostQueue {
        let capsules = pool(Sqe::SIZE + in_capsule as usize, 64, slots);
        let responses = pool(Cqe::SIZE, 16, 4);
        let data = pool(4096, 4096, slots + 1);
        let mut payload = data.take().unwrap();
        payload.as_mut_slice()[..PAYLOAD.len()].copy_from_slice(PAYLOAD);
        HostQueue::new(
            QueueBuffers {
                capsules: capsules.take_many(slots).unwrap(),
                responses: responses.take_many(4).unwrap(),
                data: data.take_many(slots).unwrap(),
                payload: Some(payload),
            },
            in_capsule,
        )
        .unwrap()
    }

    fn wc(wr_id: u64, byte_len: u32, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: 0,
            opcode,
            byte_len,
        }
    }

    /// Puts a response for `cid` in receive `idx` and returns its completion.
    fn response(q: &mut HostQueue, idx: u32, cid: u16, status: Status) -> WorkCompletion {
        let cqe = Cqe {
            cid,
            status,
            dw0: 7,
            ..Cqe::default()
        };
        q.response_mut(idx)[..Cqe::SIZE].copy_from_slice(&cqe.encode());
        wc(
            wr_id::RECV | u64::from(idx),
            Cqe::SIZE as u32,
            WcOpcode::Recv,
        )
    }

    fn sent_sqe(q: &HostQueue, cid: u16) -> Sqe {
        Sqe::decode(&q.bufs.capsules[cid as usize].as_slice()[..Sqe::SIZE]).unwrap()
    }

    #[test]
    fn receives_are_posted_once_each() {
        let q = queue(2, 0);
        let mut r = Recorder::default();
        q.post_receives(&mut r).unwrap();
        assert_eq!(r.recvs.len(), 4);
        for (i, (id, buf)) in r.recvs.iter().enumerate() {
            assert_eq!(*id, wr_id::RECV | i as u64);
            assert_eq!(buf.len as usize, Cqe::SIZE);
            assert_eq!(buf.addr, q.bufs.responses[i].addr());
        }
    }

    #[test]
    fn read_is_keyed_and_finishes_after_response_and_send_in_either_order() {
        for response_first in [false, true] {
            let mut q = queue(2, 0);
            let mut r = Recorder::default();
            let t = Instant::now();
            let cid = q
                .submit(
                    crate::command::io_sqe(
                        1,
                        8,
                        0,
                        crate::workload::IoRequest {
                            read: true,
                            slba: 16,
                        },
                    ),
                    Transfer::Read(4096),
                    t,
                    &mut r,
                )
                .unwrap();
            assert_eq!(cid, 0);
            let (id, op, buf) = r.sends[0];
            assert_eq!(id, wr_id::SEND);
            assert_eq!(op, SendOp::Send { invalidate: None });
            assert_eq!(buf.len as usize, Sqe::SIZE, "no in-capsule data for a read");
            let sqe = sent_sqe(&q, 0);
            assert_eq!((sqe.cid, sqe.psdt(), sqe.cdw10), (0, 1, 16));
            assert_eq!(sqe.dptr.sgl_type, SglType::KeyedDataBlock);
            assert_eq!(sqe.dptr.address, q.bufs.data[0].addr());
            assert_eq!(sqe.dptr.length, 4096);
            let resp = response(&mut q, 2, 0, Status::SUCCESS);
            let send = wc(wr_id::SEND, 0, WcOpcode::Send);
            let order = if response_first {
                [resp, send]
            } else {
                [send, resp]
            };
            let mut done = Vec::new();
            q.on_completions(&order[..1], &mut r, &mut done).unwrap();
            assert!(done.is_empty(), "half a completion finishes nothing");
            assert_eq!(q.outstanding(), 1);
            q.on_completions(&order[1..], &mut r, &mut done).unwrap();
            assert_eq!(done.len(), 1);
            assert!(done[0].read && done[0].cqe.status.is_success());
            assert_eq!((done[0].cid, done[0].cqe.dw0, done[0].start), (0, 7, t));
            assert_eq!(q.outstanding(), 0);
            // The receive went back to the queue.
            assert_eq!(r.recvs.last().unwrap().0, wr_id::RECV | 2);
        }
    }

    #[test]
    fn payload_write_in_capsule_or_keyed() {
        let io = crate::workload::IoRequest {
            read: false,
            slba: 0,
        };
        let mut r = Recorder::default();
        let mut q = queue(1, 16);
        q.submit(
            crate::command::io_sqe(1, 1, 0, io),
            Transfer::Payload(16),
            Instant::now(),
            &mut r,
        )
        .unwrap();
        let sqe = sent_sqe(&q, 0);
        assert_eq!(sqe.dptr, SglDescriptor::in_capsule(0, 16));
        assert_eq!(r.sends[0].2.len as usize, Sqe::SIZE + 16);
        assert_eq!(&q.bufs.capsules[0].as_slice()[Sqe::SIZE..], PAYLOAD);
        assert!(!q.can_submit(), "one slot");
        assert!(matches!(
            q.submit(sqe, Transfer::None, Instant::now(), &mut r),
            Err(QueueError::NoSlot)
        ));

        // Larger than the capsules carry: keyed, from the payload buffer.
        let mut q = queue(1, 16);
        q.submit(
            crate::command::io_sqe(1, 8, 0, io),
            Transfer::Payload(4096),
            Instant::now(),
            &mut r,
        )
        .unwrap();
        let sqe = sent_sqe(&q, 0);
        assert_eq!(sqe.dptr.sgl_type, SglType::KeyedDataBlock);
        assert_eq!(sqe.dptr.address, q.bufs.payload.as_ref().unwrap().addr());
        assert_eq!(sqe.dptr.length, 4096);
        assert_eq!(r.sends[1].2.len as usize, Sqe::SIZE);
    }

    #[test]
    fn admin_write_is_copied_and_keyed_and_none_is_a_null_block() {
        let mut q = queue(2, 0);
        let mut r = Recorder::default();
        let cid = q
            .submit(
                Sqe::default(),
                Transfer::Write(&[9; 1024]),
                Instant::now(),
                &mut r,
            )
            .unwrap();
        let sqe = sent_sqe(&q, cid);
        assert_eq!(sqe.dptr.length, 1024);
        assert_eq!(sqe.dptr.address, q.bufs.data[0].addr());
        assert!(q.data(cid, 1024).iter().all(|&b| b == 9));
        let cid = q
            .submit(Sqe::default(), Transfer::None, Instant::now(), &mut r)
            .unwrap();
        let sqe = sent_sqe(&q, cid);
        assert_eq!(sqe.dptr.sgl_type, SglType::KeyedDataBlock);
        assert_eq!((sqe.dptr.address, sqe.dptr.length, sqe.dptr.key), (0, 0, 0));
        assert!(matches!(
            q.submit(Sqe::default(), Transfer::Read(4097), Instant::now(), &mut r),
            Err(QueueError::NoSlot)
        ));
    }

    #[test]
    fn oversized_transfers_are_refused_without_using_a_slot() {
        let mut q = queue(1, 0);
        let mut r = Recorder::default();
        for t in [
            Transfer::Read(4097),
            Transfer::Write(&[0; 5000]),
            Transfer::Payload(8192),
        ] {
            assert!(matches!(
                q.submit(Sqe::default(), t, Instant::now(), &mut r),
                Err(QueueError::TooLarge { .. })
            ));
        }
        assert!(r.sends.is_empty());
        assert!(q.can_submit());
    }

    #[test]
    fn bad_completions_are_fatal() {
        let mut r = Recorder::default();
        let mut done = Vec::new();
        let mut q = queue(2, 0);
        q.submit(Sqe::default(), Transfer::None, Instant::now(), &mut r)
            .unwrap();
        // A response for a command id that is not outstanding.
        let stray = response(&mut q, 0, 1, Status::SUCCESS);
        assert!(matches!(
            q.on_completions(&[stray], &mut r, &mut done),
            Err(QueueError::UnknownCid(1))
        ));
        // A second response for the same command.
        let mut q = queue(2, 0);
        q.submit(Sqe::default(), Transfer::None, Instant::now(), &mut r)
            .unwrap();
        let a = response(&mut q, 0, 0, Status::SUCCESS);
        let b = response(&mut q, 1, 0, Status::SUCCESS);
        assert!(matches!(
            q.on_completions(&[a, b], &mut r, &mut done),
            Err(QueueError::UnknownCid(0))
        ));
        // A response capsule that is not exactly a CQE.
        let mut q = queue(2, 0);
        let mut short = response(&mut q, 0, 0, Status::SUCCESS);
        short.byte_len = 15;
        assert!(matches!(
            q.on_completions(&[short], &mut r, &mut done),
            Err(QueueError::BadResponseLength(15))
        ));
        // Failed, unknown and duplicate work completions.
        let mut q = queue(2, 0);
        let mut failed = wc(wr_id::SEND, 0, WcOpcode::Other(0));
        failed.status = 5;
        assert!(matches!(
            q.on_completions(&[failed], &mut r, &mut done),
            Err(QueueError::CompletionFailed { status: 5, .. })
        ));
        for id in [wr_id::SEND, wr_id::RECV | 4, 3 << 32] {
            assert!(matches!(
                q.on_completions(&[wc(id, 0, WcOpcode::Send)], &mut r, &mut done),
                Err(QueueError::UnknownCompletion(_))
            ));
        }
        assert!(done.is_empty());
    }

    #[test]
    fn error_status_is_reported_not_fatal() {
        let mut q = queue(1, 0);
        let mut r = Recorder::default();
        q.submit(Sqe::default(), Transfer::Read(512), Instant::now(), &mut r)
            .unwrap();
        let resp = response(&mut q, 3, 0, Status::INTERNAL_ERROR);
        let mut done = Vec::new();
        q.on_completions(
            &[wc(wr_id::SEND, 0, WcOpcode::Send), resp],
            &mut r,
            &mut done,
        )
        .unwrap();
        assert_eq!(done[0].cqe.status, Status::INTERNAL_ERROR);
        assert!(q.can_submit());
    }

    #[test]
    fn layout_is_checked() {
        let slots = pool(Sqe::SIZE, 64, 2);
        let resp = pool(Cqe::SIZE, 16, 1);
        let data = pool(4096, 4096, 1);
        // In-capsule data without room in the capsules.
        assert!(matches!(
            HostQueue::new(
                QueueBuffers {
                    capsules: slots.take_many(1).unwrap(),
                    responses: resp.take_many(1).unwrap(),
                    data: data.take_many(1).unwrap(),
                    payload: None,
                },
                512,
            ),
            Err(QueueError::Layout(_))
        ));
        // Two capsules, no data buffers.
        assert!(matches!(
            HostQueue::new(
                QueueBuffers {
                    capsules: slots.take_many(2).unwrap(),
                    responses: resp.take_many(1).unwrap(),
                    data: Vec::new(),
                    payload: None,
                },
                0,
            ),
            Err(QueueError::Layout(_))
        ));
    }
}
