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
mod tests;
