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
