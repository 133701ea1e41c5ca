//! The connection state machine driven in memory: a scripted dispatch core, a recorder in
//! place of the QP, and completions fed by hand (quinn-proto style, deterministic).

use super::*;
use crate::rdma::pool::PoolParams;
use crate::rdma::verbs::WcOpcode;
use storage::BlockOp;

const OP_FLUSH: u8 = 0x00;
const OP_WRITE: u8 = 0x01;
const OP_READ: u8 = 0x02;
const OP_AER: u8 = 0x0c;
const OP_BAD: u8 = 0xee;
/// cdw13 bit 0 in the test double: "complete through a backend op" (Outcome::Submitted).
const ASYNC: u32 = 1;

#[derive(Default)]
struct ScriptedCore {
    written: Vec<Vec<u8>>,
    prepared: Vec<(u16, u32)>,
    poll_out: Vec<Response>,
    /// CIDs the next poll's Aborts ask for, and the answers given.
    abort_asked: Vec<u16>,
    abort_answers: Vec<(u16, bool)>,
    /// Commands the core reported waiting for a pool data buffer.
    pool_waits: u32,
    /// Whether the core asks for command times, and the latencies and backend latencies
    /// reported: (opcode, nsid, ns).
    timing: bool,
    latencies: Vec<(u8, u32, u64)>,
    backend_latencies: Vec<(u8, u32, u64)>,
}

fn response(sqe: &Sqe, status: Status, data_len: u32) -> Response {
    Response {
        cqe: Cqe {
            cid: sqe.cid,
            status,
            ..Cqe::default()
        },
        data_len,
    }
}

impl Dispatch for ScriptedCore {
    fn prepare(&mut self, sqe: &Sqe, data_len: u32) -> Result<Direction, Status> {
        self.prepared.push((sqe.cid, data_len));
        match sqe.opcode {
            OP_WRITE => Ok(Direction::HostToController),
            OP_READ => Ok(Direction::ControllerToHost),
            OP_FLUSH | OP_AER => Ok(Direction::None),
            _ => Err(Status::INVALID_OPCODE.with_dnr()),
        }
    }

    fn execute(&mut self, sqe: &Sqe, data: &mut [u8], tag: u64, io: &mut dyn IoSubmit) -> Outcome {
        if sqe.opcode == OP_AER {
            return Outcome::Held;
        }
        if sqe.opcode == OP_READ {
            for (i, b) in data.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
        }
        if sqe.opcode == OP_WRITE {
            self.written.push(data.to_vec());
        }
        if sqe.cdw13 & ASYNC != 0 {
            io.submit(
                BlockOp {
                    fd: -1,
                    file: None,
                    kind: storage::BlockOpKind::Flush,
                    offset: 0,
                    buf: data.as_mut_ptr(),
                    len: data.len() as u32,
                },
                tag,
            );
            return Outcome::Submitted;
        }
        Outcome::Complete(response(sqe, Status::SUCCESS, data.len() as u32))
    }

    fn finish(&mut self, sqe: &Sqe, result: i32) -> Option<Response> {
        Some(if result < 0 {
            response(sqe, Status::DATA_TRANSFER_ERROR, 0)
        } else {
            response(sqe, Status::SUCCESS, result as u32)
        })
    }

    fn poll(&mut self, _now: Instant) -> PollResult {
        PollResult {
            completions: std::mem::take(&mut self.poll_out),
            terminate: None,
        }
    }

    fn reject(&mut self, sqe: &Sqe, status: Status) -> Response {
        response(sqe, status, 0)
    }

    fn take_abort_requests(&mut self) -> Vec<u16> {
        std::mem::take(&mut self.abort_asked)
    }

    fn answer_abort(&mut self, cid: u16, aborted: bool) {
        self.abort_answers.push((cid, aborted));
    }

    fn abort_waiting(&mut self, sqe: &Sqe) -> Option<Response> {
        Some(response(sqe, Status::ABORT_REQUESTED, 0))
    }
    fn timing(&self) -> bool {
        self.timing
    }
    fn observe_latency(&mut self, opcode: u8, nsid: u32, latency_ns: u64) {
        self.latencies.push((opcode, nsid, latency_ns));
    }
    fn observe_backend(&mut self, opcode: u8, nsid: u32, latency_ns: u64) {
        self.backend_latencies.push((opcode, nsid, latency_ns));
    }
    fn pool_wait(&mut self) {
        self.pool_waits += 1;
    }
    // No QoS limit holds a command of the double.
    fn may_run(&self, _sqe: &Sqe, _now: Instant) -> bool {
        true
    }
    fn next_wake(&self) -> Option<Instant> {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posted {
    Recv(u64),
    Send(u64, SendOp, LocalBuf),
}

#[derive(Default)]
struct Recorder {
    posted: Vec<Posted>,
    fail: bool,
}

impl Recorder {
    fn take(&mut self) -> Vec<Posted> {
        std::mem::take(&mut self.posted)
    }
}

impl WorkPoster for Recorder {
    fn post_recv(&mut self, wr_id: u64, _buf: LocalBuf) -> Result<(), VerbsError> {
        self.posted.push(Posted::Recv(wr_id));
        Ok(())
    }
    fn post_send(&mut self, wr_id: u64, op: SendOp, buf: LocalBuf) -> Result<(), VerbsError> {
        if self.fail {
            return Err(VerbsError::Call {
                call: "ibv_post_send",
                source: std::io::Error::from_raw_os_error(libc::ENOMEM),
            });
        }
        self.posted.push(Posted::Send(wr_id, op, buf));
        Ok(())
    }
}

#[derive(Default)]
struct Ring {
    tags: Vec<u64>,
}

impl IoSubmit for Ring {
    fn submit(&mut self, _op: BlockOp, tag: u64) {
        self.tags.push(tag);
    }

    fn submit_group(&mut self, _ops: &[BlockOp], tag: u64) {
        self.tags.push(tag);
    }
}

const TOKEN: u32 = 7;
const MDTS: u32 = 64 * 1024;
const ICD: u32 = 8192;

struct Harness {
    conn: ConnCore<ScriptedCore>,
    qp: Recorder,
    io: Ring,
}

/// One device's pools: 8 capsules, 16 responses, `data_buffers` data buffers.
fn pools(data_buffers: u32) -> DevicePools {
    DevicePools::unregistered(&PoolParams {
        in_capsule_data_size: ICD,
        max_data_transfer: MDTS,
        capsule_buffers: 8,
        response_buffers: 16,
        data_buffers,
    })
    .unwrap()
}

fn harness(data_buffers: u32, ord: u8) -> Harness {
    let pools = pools(data_buffers);
    let shape = ConnShape {
        depth: 4,
        contexts: 8,
        ord,
        in_capsule_data_size: ICD,
        max_data_transfer: MDTS,
    };
    let conn = ConnCore::new(ScriptedCore::default(), TOKEN, shape, pools).unwrap();
    let mut h = Harness {
        conn,
        qp: Recorder::default(),
        io: Ring::default(),
    };
    assert_eq!(h.conn.post_initial_receives(&mut h.qp), ConnStatus::Open);
    let initial = h.qp.take();
    assert_eq!(
        initial,
        (0..4)
            .map(|i| Posted::Recv(wr_id::RECV | i))
            .collect::<Vec<_>>()
    );
    h
}

fn keyed(len: u32, rkey: u32, invalidate: bool) -> SglDescriptor {
    SglDescriptor {
        address: 0x1000_0000,
        length: len,
        key: rkey,
        sgl_type: if invalidate {
            SglType::KeyedDataBlockInvalidate
        } else {
            SglType::KeyedDataBlock
        },
    }
}

fn sqe(opcode: u8, cid: u16, dptr: SglDescriptor) -> Sqe {
    Sqe {
        opcode,
        flags: 0x40,
        cid,
        nsid: 1,
        dptr,
        ..Sqe::default()
    }
}

fn ok(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: 0,
        opcode,
        byte_len: 0,
    }
}

impl Harness {
    /// The host's SEND of a command capsule landing in receive buffer `recv`.
    fn capsule(&mut self, recv: u32, sqe: &Sqe, data: &[u8]) -> ConnStatus {
        let mut buf = self.conn.recv_buf(recv);
        buf[..64].copy_from_slice(&sqe.encode());
        buf[64..64 + data.len()].copy_from_slice(data);
        drop(buf);
        let wc = WorkCompletion {
            wr_id: wr_id::RECV | u64::from(recv),
            status: 0,
            opcode: WcOpcode::Recv,
            byte_len: 64 + data.len() as u32,
        };
        self.complete(&[wc])
    }

    fn complete(&mut self, wcs: &[WorkCompletion]) -> ConnStatus {
        self.conn.on_completions(wcs, &mut self.qp, &mut self.io)
    }

    fn sent_cqe(&self, buf: &LocalBuf) -> Cqe {
        self.conn
            .sent_response(buf)
            .expect("SEND from a response buffer")
    }
}

#[test]
fn read_posts_rdma_write_then_send_and_frees_the_context() {
    let mut h = harness(2, 4);
    h.capsule(0, &sqe(OP_READ, 0x21, keyed(8192, 0xabc, false)), &[]);
    let posted = h.qp.take();
    assert_eq!(posted.len(), 3, "{posted:?}");
    assert_eq!(
        posted[0],
        Posted::Recv(wr_id::RECV),
        "receive reposted at once"
    );
    let Posted::Send(write_id, write_op, write_buf) = posted[1] else {
        panic!("expected RDMA WRITE, got {:?}", posted[1]);
    };
    assert_eq!(
        write_op,
        SendOp::RdmaWrite {
            remote_addr: 0x1000_0000,
            rkey: 0xabc
        }
    );
    assert_eq!(write_buf.len, 8192);
    assert_eq!(write_buf.addr % 4096, 0, "data buffers are page aligned");
    let Posted::Send(send_id, send_op, send_buf) = posted[2] else {
        panic!("expected SEND");
    };
    assert_eq!(send_op, SendOp::Send { invalidate: None });
    assert_eq!(send_buf.len, 16);
    let cqe = h.sent_cqe(&send_buf);
    assert_eq!((cqe.cid, cqe.status), (0x21, Status::SUCCESS));
    assert_eq!(h.conn.pools.data.available(), 1);
    h.complete(&[ok(write_id, WcOpcode::RdmaWrite)]);
    assert_eq!(
        h.conn.pools.data.available(),
        1,
        "held until the SEND completes"
    );
    h.complete(&[ok(send_id, WcOpcode::Send)]);
    assert_eq!(h.conn.pools.data.available(), 2);
    assert_eq!(h.conn.free_ctxs.len(), 8);
}

#[test]
fn write_reads_host_data_before_executing() {
    let mut h = harness(2, 4);
    h.capsule(1, &sqe(OP_WRITE, 5, keyed(4096, 0x77, false)), &[]);
    let posted = h.qp.take();
    assert_eq!(posted[0], Posted::Recv(wr_id::RECV | 1));
    let Posted::Send(read_id, op, local) = posted[1] else {
        panic!("expected RDMA READ");
    };
    assert_eq!(
        op,
        SendOp::RdmaRead {
            remote_addr: 0x1000_0000,
            rkey: 0x77
        }
    );
    assert_eq!(local.len, 4096);
    assert!(
        h.conn.dispatch.written.is_empty(),
        "not executed before the data is in"
    );
    // The HCA fills the buffer, then the READ completes.
    let ctx = (read_id & 0xffff_ffff) as u32;
    h.conn.data_of(ctx).unwrap()[..4096].fill(0x5a);
    h.complete(&[ok(read_id, WcOpcode::RdmaRead)]);
    assert_eq!(h.conn.dispatch.written, vec![vec![0x5a; 4096]]);
    let posted = h.qp.take();
    assert!(matches!(
        posted[..],
        [Posted::Send(_, SendOp::Send { invalidate: None }, _)]
    ));
}

#[test]
fn invalidate_subtype_answers_with_send_with_inv() {
    let mut h = harness(2, 4);
    h.capsule(0, &sqe(OP_READ, 9, keyed(512, 0xdead, true)), &[]);
    let posted = h.qp.take();
    assert!(matches!(
        posted.last(),
        Some(Posted::Send(
            _,
            SendOp::Send {
                invalidate: Some(0xdead)
            },
            _
        ))
    ));
    // A zero-length keyed SGL moves nothing and invalidates nothing (as nvmet).
    h.capsule(1, &sqe(OP_FLUSH, 10, keyed(0, 0xbeef, true)), &[]);
    let posted = h.qp.take();
    assert!(matches!(
        posted.last(),
        Some(Posted::Send(_, SendOp::Send { invalidate: None }, _))
    ));
}

#[test]
fn in_capsule_write_is_copied_out_and_executed_without_rdma_read() {
    let mut h = harness(2, 4);
    let payload: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
    h.capsule(
        2,
        &sqe(OP_WRITE, 3, SglDescriptor::in_capsule(0, 1024)),
        &payload,
    );
    assert_eq!(h.conn.dispatch.written, vec![payload]);
    let posted = h.qp.take();
    assert_eq!(posted[0], Posted::Recv(wr_id::RECV | 2));
    assert!(matches!(posted[1], Posted::Send(_, SendOp::Send { .. }, _)));
    assert_eq!(posted.len(), 2);
}

#[test]
fn sgl_errors_are_rejected_without_moving_data() {
    let mut h = harness(2, 4);
    let cases = [
        // Transport SGL data block is NVMe/TCP's, not valid on RDMA.
        (
            SglDescriptor::transport_data_block(4096),
            Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(),
            0,
        ),
        // In-capsule range beyond the advertised in-capsule size.
        (
            SglDescriptor::in_capsule(4096, ICD),
            Status::SGL_OFFSET_INVALID.with_dnr(),
            0,
        ),
        // In-capsule range the capsule does not actually carry.
        (
            SglDescriptor::in_capsule(0, 2048),
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
            100,
        ),
        // Keyed length above MDTS: refused before any buffer is chosen.
        (
            keyed(MDTS + 1, 1, false),
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
            0,
        ),
    ];
    for (i, (dptr, status, carried)) in cases.into_iter().enumerate() {
        h.capsule(0, &sqe(OP_WRITE, i as u16, dptr), &vec![0; carried]);
        let posted = h.qp.take();
        assert_eq!(posted.len(), 2, "case {i}: {posted:?}");
        let Posted::Send(id, SendOp::Send { invalidate: None }, buf) = posted[1] else {
            panic!("case {i}: expected a plain SEND");
        };
        let cqe = h.sent_cqe(&buf);
        assert_eq!((cqe.cid, cqe.status), (i as u16, status), "case {i}");
        h.complete(&[ok(id, WcOpcode::Send)]);
    }
    assert!(
        h.conn.dispatch.prepared.is_empty(),
        "SGL errors never reach the core"
    );
    // In-capsule data on a read is refused after prepare (direction known).
    h.capsule(
        0,
        &sqe(OP_READ, 50, SglDescriptor::in_capsule(0, 64)),
        &[0; 64],
    );
    let posted = h.qp.take();
    let Posted::Send(_, _, buf) = posted[1] else {
        panic!()
    };
    assert_eq!(h.sent_cqe(&buf).status, Status::INVALID_FIELD.with_dnr());
    // Core-level refusal (prepare error) is answered too.
    h.capsule(1, &sqe(OP_BAD, 51, keyed(0, 0, false)), &[]);
    let posted = h.qp.take();
    let Posted::Send(_, _, buf) = posted[1] else {
        panic!()
    };
    assert_eq!(h.sent_cqe(&buf).status, Status::INVALID_OPCODE.with_dnr());
}

/// The CQEs of the SENDs in `posted`.
fn sent_cqes(h: &Harness, posted: &[Posted]) -> Vec<Cqe> {
    posted
        .iter()
        .filter_map(|p| match p {
            Posted::Send(_, SendOp::Send { .. }, buf) => Some(h.sent_cqe(buf)),
            _ => None,
        })
        .collect()
}

#[test]
fn abort_completes_writes_waiting_for_a_buffer_or_their_read_once() {
    // One data buffer, ORD 1: cid 1 reads its data, cid 2 waits for the buffer.
    let mut h = harness(1, 1);
    h.capsule(0, &sqe(OP_WRITE, 1, keyed(4096, 1, false)), &[]);
    h.capsule(1, &sqe(OP_WRITE, 2, keyed(4096, 2, false)), &[]);
    assert_eq!(
        h.conn.dispatch.pool_waits, 1,
        "cid 2 waits for the one buffer"
    );
    let read_id =
        h.qp.take()
            .into_iter()
            .find_map(|p| match p {
                Posted::Send(id, SendOp::RdmaRead { .. }, _) => Some(id),
                _ => None,
            })
            .expect("cid 1 reads");
    h.conn.dispatch.abort_asked = vec![2, 1, 9];
    h.conn.on_tick(Instant::now(), &mut h.qp, &mut h.io);
    // cid 2 is completed at once; cid 9 is unknown; cid 1 waits for its READ.
    assert_eq!(h.conn.dispatch.abort_answers, vec![(2, true), (9, false)]);
    let posted = h.qp.take();
    let cqes = sent_cqes(&h, &posted);
    assert_eq!(cqes.len(), 1, "{posted:?}");
    assert_eq!((cqes[0].cid, cqes[0].status), (2, Status::ABORT_REQUESTED));
    h.complete(&[ok(read_id, WcOpcode::RdmaRead)]);
    assert!(h.conn.dispatch.written.is_empty(), "cid 1 never executes");
    assert_eq!(h.conn.dispatch.abort_answers[2], (1, true));
    let posted = h.qp.take();
    let cqes = sent_cqes(&h, &posted);
    assert_eq!(cqes.len(), 1, "{posted:?}");
    assert_eq!((cqes[0].cid, cqes[0].status), (1, Status::ABORT_REQUESTED));
    // Both SENDs complete: every context and the data buffer are free again.
    let sends: Vec<_> = h
        .conn
        .ctxs
        .iter()
        .enumerate()
        .filter(|(_, c)| c.state == CtxState::Responding)
        .map(|(i, _)| ok(wr_id::SEND | i as u64, WcOpcode::Send))
        .collect();
    assert_eq!(sends.len(), 2);
    h.complete(&sends);
    assert_eq!(h.conn.free_ctxs.len(), 8);
    assert_eq!(h.conn.pools.data.available(), 1);
}

#[test]
fn ord_bounds_outstanding_rdma_reads() {
    let mut h = harness(4, 1);
    h.capsule(0, &sqe(OP_WRITE, 1, keyed(4096, 1, false)), &[]);
    h.capsule(1, &sqe(OP_WRITE, 2, keyed(4096, 2, false)), &[]);
    let reads: Vec<_> =
        h.qp.take()
            .into_iter()
            .filter_map(|p| match p {
                Posted::Send(id, SendOp::RdmaRead { rkey, .. }, _) => Some((id, rkey)),
                _ => None,
            })
            .collect();
    assert_eq!(reads.len(), 1, "ORD 1 allows a single READ in flight");
    h.complete(&[ok(reads[0].0, WcOpcode::RdmaRead)]);
    let posted = h.qp.take();
    assert!(posted
        .iter()
        .any(|p| matches!(p, Posted::Send(_, SendOp::RdmaRead { rkey: 2, .. }, _))));
}

#[test]
fn data_buffer_exhaustion_parks_commands_in_order() {
    let mut h = harness(1, 4);
    h.capsule(0, &sqe(OP_READ, 1, keyed(4096, 1, false)), &[]);
    h.capsule(1, &sqe(OP_READ, 2, keyed(4096, 2, false)), &[]);
    h.capsule(2, &sqe(OP_READ, 3, keyed(4096, 3, false)), &[]);
    let posted = h.qp.take();
    let writes: Vec<u32> = posted
        .iter()
        .filter_map(|p| match p {
            Posted::Send(_, SendOp::RdmaWrite { rkey, .. }, _) => Some(*rkey),
            _ => None,
        })
        .collect();
    assert_eq!(writes, vec![1], "one buffer: one command runs, two wait");
    assert_eq!(h.conn.wait_data.len(), 2);
    let done: Vec<WorkCompletion> = posted
        .iter()
        .filter_map(|p| match p {
            Posted::Send(id, SendOp::RdmaWrite { .. }, _) => Some(ok(*id, WcOpcode::RdmaWrite)),
            Posted::Send(id, SendOp::Send { .. }, _) => Some(ok(*id, WcOpcode::Send)),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 2);
    // The buffer stays with the first command until both its WRITE and SEND completed.
    h.complete(&done[..1]);
    assert_eq!(h.conn.wait_data.len(), 2);
    h.complete(&done[1..]);
    let writes: Vec<u32> =
        h.qp.take()
            .iter()
            .filter_map(|p| match p {
                Posted::Send(_, SendOp::RdmaWrite { rkey, .. }, _) => Some(*rkey),
                _ => None,
            })
            .collect();
    assert_eq!(writes, vec![2], "the oldest waiter goes next");
    assert_eq!(h.conn.status(), ConnStatus::Open);
}

#[test]
fn submitted_io_completes_through_the_tag() {
    let mut h = harness(2, 4);
    let mut cmd = sqe(OP_READ, 44, keyed(4096, 9, false));
    cmd.cdw13 = ASYNC;
    h.capsule(0, &cmd, &[]);
    assert_eq!(h.io.tags.len(), 1);
    let tag = h.io.tags[0];
    assert_eq!(tag >> 32, u64::from(TOKEN));
    assert_eq!(h.conn.inflight_ops(), 1);
    h.qp.take();
    h.conn.on_io_complete(tag, 4096, &mut h.qp, &mut h.io);
    assert_eq!(h.conn.inflight_ops(), 0);
    let posted = h.qp.take();
    assert!(matches!(
        posted[..],
        [
            Posted::Send(
                _,
                SendOp::RdmaWrite { rkey: 9, .. },
                LocalBuf { len: 4096, .. }
            ),
            Posted::Send(_, SendOp::Send { .. }, _)
        ]
    ));
    // A stale or foreign tag is ignored, not trusted.
    h.conn.on_io_complete(tag, 0, &mut h.qp, &mut h.io);
    h.conn
        .on_io_complete(u64::from(TOKEN + 1) << 32, 0, &mut h.qp, &mut h.io);
    assert!(h.qp.take().is_empty());
}

#[test]
fn held_aer_is_answered_from_poll() {
    let mut h = harness(2, 4);
    let aer = sqe(OP_AER, 0x100, keyed(0, 0, false));
    h.capsule(3, &aer, &[]);
    assert_eq!(h.qp.take(), vec![Posted::Recv(wr_id::RECV | 3)]);
    h.conn
        .dispatch
        .poll_out
        .push(response(&aer, Status::SUCCESS, 0));
    h.conn.on_tick(Instant::now(), &mut h.qp, &mut h.io);
    let posted = h.qp.take();
    let [Posted::Send(_, SendOp::Send { .. }, buf)] = posted[..] else {
        panic!("{posted:?}");
    };
    assert_eq!(h.sent_cqe(&buf).cid, 0x100);
}

#[test]
fn more_capsules_than_contexts_wait_for_a_context() {
    let mut h = harness(8, 4);
    // Eight commands whose responses are never acknowledged occupy every context...
    for cid in 0..8u16 {
        h.capsule(
            u32::from(cid % 4),
            &sqe(OP_FLUSH, cid, keyed(0, 0, false)),
            &[],
        );
    }
    assert!(h.conn.free_ctxs.is_empty());
    let sends: Vec<u64> =
        h.qp.take()
            .iter()
            .filter_map(|p| match p {
                Posted::Send(id, _, _) => Some(*id),
                _ => None,
            })
            .collect();
    assert_eq!(sends.len(), 8);
    // ...so the ninth waits (its receive buffer is not reposted), then runs once one frees.
    h.capsule(0, &sqe(OP_FLUSH, 8, keyed(0, 0, false)), &[]);
    assert!(h.qp.take().is_empty());
    h.complete(&[ok(sends[0], WcOpcode::Send)]);
    let posted = h.qp.take();
    assert_eq!(posted[0], Posted::Recv(wr_id::RECV));
    let Posted::Send(_, _, buf) = posted[1] else {
        panic!()
    };
    assert_eq!(h.sent_cqe(&buf).cid, 8);
}

#[test]
fn short_capsule_and_failed_completions_close_the_connection() {
    let mut h = harness(2, 4);
    let wc = WorkCompletion {
        wr_id: wr_id::RECV,
        status: 0,
        opcode: WcOpcode::Recv,
        byte_len: 63,
    };
    assert_eq!(h.complete(&[wc]), ConnStatus::Closed);
    assert_eq!(h.conn.close_reason(), Some(&ConnError::ShortCapsule(63)));

    let mut h = harness(2, 4);
    let mut cmd = sqe(OP_WRITE, 1, keyed(4096, 1, false));
    cmd.cdw13 = ASYNC;
    h.capsule(0, &cmd, &[]);
    let read = match h.qp.take()[1] {
        Posted::Send(id, SendOp::RdmaRead { .. }, _) => id,
        other => panic!("{other:?}"),
    };
    h.complete(&[ok(read, WcOpcode::RdmaRead)]);
    assert_eq!(h.conn.inflight_ops(), 1);
    // Flush error on a receive after the host went away.
    let flushed = WorkCompletion {
        wr_id: wr_id::RECV | 1,
        status: 5,
        opcode: WcOpcode::Other(0),
        byte_len: 0,
    };
    assert_eq!(h.complete(&[flushed]), ConnStatus::Closed);
    // The backend op still owns its buffer until it completes; then nothing is sent.
    assert_eq!(h.conn.inflight_ops(), 1);
    assert_eq!(h.conn.pools.data.available(), 1);
    h.qp.take();
    let tag = h.io.tags[0];
    h.conn.on_io_complete(tag, 4096, &mut h.qp, &mut h.io);
    assert_eq!(h.conn.inflight_ops(), 0);
    assert_eq!(h.conn.pools.data.available(), 2);
    assert!(h.qp.take().is_empty());
}

#[test]
fn unknown_completion_ids_and_post_failures_are_fatal() {
    let mut h = harness(2, 4);
    assert_eq!(
        h.complete(&[ok(0xff << 56, WcOpcode::Send)]),
        ConnStatus::Closed
    );

    let mut h = harness(2, 4);
    h.qp.fail = true;
    assert_eq!(
        h.capsule(0, &sqe(OP_FLUSH, 1, keyed(0, 0, false)), &[]),
        ConnStatus::Closed
    );
    assert!(matches!(h.conn.close_reason(), Some(ConnError::Post(_))));
    assert_eq!(h.conn.free_ctxs.len(), 8, "the context is not leaked");
}

#[test]
fn connection_is_refused_when_pools_cannot_hold_it() {
    let pools = DevicePools::unregistered(&PoolParams {
        in_capsule_data_size: ICD,
        max_data_transfer: MDTS,
        capsule_buffers: 6,
        response_buffers: 16,
        data_buffers: 1,
    })
    .unwrap();
    let shape = ConnShape {
        depth: 4,
        contexts: 8,
        ord: 1,
        in_capsule_data_size: ICD,
        max_data_transfer: MDTS,
    };
    let first = ConnCore::new(ScriptedCore::default(), 1, shape, pools.clone());
    assert!(first.is_some());
    assert!(ConnCore::new(ScriptedCore::default(), 2, shape, pools.clone()).is_none());
    drop(first);
    assert!(ConnCore::new(ScriptedCore::default(), 3, shape, pools).is_some());
}

/// Two connections on one device SRQ of 8 buffers (more than either's depth of 4), plus the
/// SRQ's initial posts.
fn srq_harnesses(data_buffers: u32) -> (SrqBuffers, Vec<u64>, Harness, Harness) {
    let pools = pools(data_buffers);
    let srq = SrqBuffers::new(pools.capsules.take_many(8).unwrap());
    let mut initial = Vec::new();
    srq.post_all(&mut |id, buf| {
        assert_eq!(buf.len, 64 + ICD);
        initial.push(id);
        Ok(())
    })
    .unwrap();
    let shape = ConnShape {
        depth: 4,
        contexts: 4,
        ord: 4,
        in_capsule_data_size: ICD,
        max_data_transfer: MDTS,
    };
    let make = |token| {
        let conn =
            ConnCore::with_srq(ScriptedCore::default(), token, shape, pools.clone(), &srq).unwrap();
        assert!(conn.uses_srq());
        let mut h = Harness {
            conn,
            qp: Recorder::default(),
            io: Ring::default(),
        };
        assert_eq!(h.conn.post_initial_receives(&mut h.qp), ConnStatus::Open);
        assert!(
            h.qp.take().is_empty(),
            "the SRQ was filled once, not per QP"
        );
        h
    };
    let a = make(TOKEN);
    let b = make(TOKEN + 1);
    // The connections took no capsules: the SRQ holds them all (contexts: 4 × 2 responses).
    assert_eq!(pools.capsules.available(), 0);
    assert_eq!(pools.responses.available(), 8);
    (srq, initial, a, b)
}

#[test]
fn srq_buffers_are_shared_by_index_and_reposted_by_the_receiving_connection() {
    let (srq, initial, mut a, mut b) = srq_harnesses(2);
    assert_eq!(srq.len(), 8);
    assert_eq!(initial, (0..8).map(|i| wr_id::RECV | i).collect::<Vec<_>>());
    // Buffer 6 is beyond either connection's depth: the index space is the SRQ's.
    a.capsule(6, &sqe(OP_READ, 1, keyed(4096, 1, false)), &[]);
    assert_eq!(a.qp.take()[0], Posted::Recv(wr_id::RECV | 6));
    b.capsule(
        7,
        &sqe(
            OP_WRITE,
            2,
            SglDescriptor {
                address: 0,
                length: 512,
                key: 0,
                sgl_type: SglType::DataBlockOffset,
            },
        ),
        &[0x3c; 512],
    );
    assert_eq!(b.conn.dispatch.written, vec![vec![0x3c; 512]]);
    assert_eq!(b.qp.take()[0], Posted::Recv(wr_id::RECV | 7));
    assert!(
        a.qp.take().is_empty(),
        "only the receiving connection reposts"
    );
    // An index past the SRQ is still refused.
    assert_eq!(
        a.complete(&[WorkCompletion {
            wr_id: wr_id::RECV | 8,
            status: 0,
            opcode: WcOpcode::Recv,
            byte_len: 64,
        }]),
        ConnStatus::Closed
    );
}

#[test]
fn a_closing_srq_connection_hands_every_held_buffer_back_to_the_srq() {
    let (_srq, _, mut a, _b) = srq_harnesses(1);
    // The only data buffer goes to a READ whose SEND is not yet complete...
    a.capsule(0, &sqe(OP_READ, 1, keyed(4096, 1, false)), &[]);
    // ...so an in-capsule write keeps its SRQ buffer (3) while it waits for one.
    let in_capsule = SglDescriptor {
        address: 0,
        length: 512,
        key: 0,
        sgl_type: SglType::DataBlockOffset,
    };
    a.capsule(3, &sqe(OP_WRITE, 2, in_capsule), &[1; 512]);
    a.qp.take();
    assert_eq!(a.conn.wait_data.len(), 1);
    // Four contexts: two more commands fill them, a fifth capsule (buffer 5) waits.
    a.capsule(1, &sqe(OP_READ, 3, keyed(4096, 3, false)), &[]);
    a.capsule(2, &sqe(OP_READ, 4, keyed(4096, 4, false)), &[]);
    a.capsule(5, &sqe(OP_FLUSH, 5, keyed(0, 0, false)), &[]);
    let reposted: Vec<Posted> =
        a.qp.take()
            .into_iter()
            .filter(|p| matches!(p, Posted::Recv(_)))
            .collect();
    assert_eq!(
        reposted,
        [Posted::Recv(wr_id::RECV | 1), Posted::Recv(wr_id::RECV | 2)],
        "buffer 5 waits for a context"
    );
    // The host goes away: the held buffers 5 and 3 return to the SRQ at once.
    a.conn.close(ConnError::Disconnected);
    a.conn.return_receives(&mut a.qp);
    let mut back = a.qp.take();
    back.sort_by_key(|p| match p {
        Posted::Recv(id) => *id,
        Posted::Send(id, ..) => *id,
    });
    assert_eq!(
        back,
        [Posted::Recv(wr_id::RECV | 3), Posted::Recv(wr_id::RECV | 5)]
    );
    a.conn.return_receives(&mut a.qp);
    assert!(a.qp.take().is_empty(), "returned once");
    // A capsule that still lands, or a receive that fails, after the close is handed back
    // too (its SRQ entry was consumed), and nothing runs.
    a.capsule(4, &sqe(OP_FLUSH, 6, keyed(0, 0, false)), &[]);
    a.complete(&[WorkCompletion {
        wr_id: wr_id::RECV | 6,
        status: 5,
        opcode: WcOpcode::Other(0),
        byte_len: 0,
    }]);
    assert_eq!(
        a.qp.take(),
        [Posted::Recv(wr_id::RECV | 4), Posted::Recv(wr_id::RECV | 6)]
    );
}

#[test]
fn an_own_receive_ring_is_not_reposted_after_close() {
    let mut h = harness(2, 4);
    assert!(!h.conn.uses_srq());
    h.conn.close(ConnError::Disconnected);
    h.capsule(2, &sqe(OP_FLUSH, 1, keyed(0, 0, false)), &[]);
    h.conn.return_receives(&mut h.qp);
    assert!(h.qp.take().is_empty());
}

/// The times the shell gives become each command's latency (receive completion to response
/// posted) and backend latency (op submitted to completed); without timing nothing is timed.
#[test]
fn latencies_run_from_the_times_the_shell_gives() {
    use std::time::Duration;
    let mut h = harness(2, 4);
    h.conn.dispatch.timing = true;
    assert!(h.conn.timing());
    let t0 = Instant::now();
    h.conn.set_time(t0);
    let mut cmd = sqe(OP_READ, 44, keyed(4096, 9, false));
    cmd.cdw13 = ASYNC;
    h.capsule(0, &cmd, &[]);
    let tag = h.io.tags[0];
    h.conn.set_time(t0 + Duration::from_micros(30));
    h.conn.on_io_complete(tag, 4096, &mut h.qp, &mut h.io);
    assert_eq!(h.conn.dispatch.backend_latencies, [(OP_READ, 1, 30_000)]);
    assert!(h.conn.has_timed());
    h.conn.handed_over(t0 + Duration::from_micros(36));
    assert!(!h.conn.has_timed());
    assert_eq!(h.conn.dispatch.latencies, [(OP_READ, 1, 36_000)]);

    // A core that does not time gets no times from its shell: nothing is measured.
    let mut h = harness(2, 4);
    h.capsule(0, &sqe(OP_FLUSH, 45, keyed(0, 0, false)), &[]);
    assert!(!h.conn.has_timed());
}
