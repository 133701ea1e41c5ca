//! What a transport's sans-I/O connection core needs from the NVMe dispatch core
//! (ARCHITECTURE.md, dispatch contract): implemented by `nvme::queue::Queue`, and by test doubles.
//! Both the TCP core (`tcp::core`) and the RDMA core (`rdma::core`) are generic over it.

use std::time::Instant;

use nvme::queue::{Direction, Outcome, PollResult, Queue, Response};
use nvme::wire::{Sqe, Status};
use storage::{IoSubmit, Lent};

pub trait Dispatch {
    fn prepare(&mut self, sqe: &Sqe, data_len: u32) -> Result<Direction, Status>;
    fn execute(&mut self, sqe: &Sqe, data: &mut [u8], tag: u64, io: &mut dyn IoSubmit) -> Outcome;
    /// `None`: the command is not done; the core runs it again (see `Queue::finish`).
    fn finish(&mut self, sqe: &Sqe, result: i32) -> Option<Response>;
    fn poll(&mut self, now: Instant) -> PollResult;
    fn reject(&mut self, sqe: &Sqe, status: Status) -> Response;
    /// `Some` after a successful Fabrics Connect.
    fn qid(&self) -> Option<u16>;
    /// Connect SQSIZE + 1 (0 before Connect).
    fn sq_entries(&self) -> u16;
    /// Connect CATTR bit 2: the host disabled SQ flow control.
    fn flow_control_disabled(&self) -> bool;
    /// CIDs that Aborts ask for (see `Queue::take_abort_requests`); each is answered with
    /// `answer_abort`.
    fn take_abort_requests(&mut self) -> Vec<u16>;
    fn answer_abort(&mut self, cid: u16, aborted: bool);
    /// Completes a command that has not started with Abort Requested (`None`: it cannot be
    /// aborted; see `Queue::abort_waiting`).
    fn abort_waiting(&mut self, sqe: &Sqe) -> Option<Response>;
    /// A command waits for a data buffer of a pool shared with other queues (counted for
    /// the metrics: `Queue::note_pool_wait`).
    fn pool_wait(&mut self);
    /// Whether running the blocked command `sqe` again at `now` can change anything (see
    /// `Queue::may_run`: not while it waits for a QoS limit's time).
    fn may_run(&self, _sqe: &Sqe, _now: Instant) -> bool {
        true
    }
    /// When the first command waiting for a QoS limit may start (see `Queue::next_wake`).
    fn next_wake(&self) -> Option<Instant> {
        None
    }
    /// See `Queue::lend_reads`; cores that cannot send from backend memory never call it.
    fn lend_reads(&mut self, _on: bool) {}
    /// See `Queue::take_lent`.
    fn take_lent(&mut self) -> Option<Lent> {
        None
    }
    /// See `Queue::timing`: whether the core wants the latencies below (a double that counts
    /// nothing never makes its transport read a clock).
    fn timing(&self) -> bool {
        false
    }
    /// See `Queue::observe_latency`.
    fn observe_latency(&mut self, _opcode: u8, _nsid: u32, _latency_ns: u64) {}
    /// See `Queue::observe_backend`.
    fn observe_backend(&mut self, _opcode: u8, _nsid: u32, _latency_ns: u64) {}
}

impl Dispatch for Queue {
    fn prepare(&mut self, sqe: &Sqe, data_len: u32) -> Result<Direction, Status> {
        Queue::prepare(self, sqe, data_len)
    }
    fn execute(&mut self, sqe: &Sqe, data: &mut [u8], tag: u64, io: &mut dyn IoSubmit) -> Outcome {
        Queue::execute(self, sqe, data, tag, io)
    }
    fn finish(&mut self, sqe: &Sqe, result: i32) -> Option<Response> {
        Queue::finish(self, sqe, result)
    }
    fn poll(&mut self, now: Instant) -> PollResult {
        Queue::poll(self, now)
    }
    fn reject(&mut self, sqe: &Sqe, status: Status) -> Response {
        Queue::reject(self, sqe, status)
    }
    fn qid(&self) -> Option<u16> {
        Queue::qid(self)
    }
    fn sq_entries(&self) -> u16 {
        Queue::sq_entries(self)
    }
    fn flow_control_disabled(&self) -> bool {
        Queue::flow_control_disabled(self)
    }
    fn take_abort_requests(&mut self) -> Vec<u16> {
        Queue::take_abort_requests(self)
    }
    fn answer_abort(&mut self, cid: u16, aborted: bool) {
        Queue::answer_abort(self, cid, aborted)
    }
    fn abort_waiting(&mut self, sqe: &Sqe) -> Option<Response> {
        Queue::abort_waiting(self, sqe)
    }
    fn pool_wait(&mut self) {
        self.note_pool_wait();
    }
    fn may_run(&self, sqe: &Sqe, now: Instant) -> bool {
        Queue::may_run(self, sqe, now)
    }
    fn next_wake(&self) -> Option<Instant> {
        Queue::next_wake(self)
    }
    fn lend_reads(&mut self, on: bool) {
        Queue::lend_reads(self, on)
    }
    fn take_lent(&mut self) -> Option<Lent> {
        Queue::take_lent(self)
    }
    fn timing(&self) -> bool {
        Queue::timing(self)
    }
    fn observe_latency(&mut self, opcode: u8, nsid: u32, latency_ns: u64) {
        Queue::observe_latency(self, opcode, nsid, latency_ns)
    }
    fn observe_backend(&mut self, opcode: u8, nsid: u32, latency_ns: u64) {
        Queue::observe_backend(self, opcode, nsid, latency_ns)
    }
}
