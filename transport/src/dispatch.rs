//! What the RDMA connection core (`rdma::core::ConnCore`) and the command timing
//! (`timing`) need of the NVMe dispatch core (ARCHITECTURE.md, dispatch contract): implemented
//! by `nvme::queue::Queue`, and by the RDMA core's scripted test double. The TCP core uses
//! `Queue` itself (its tests drive a real one), including what only it needs: the queue's
//! shape from Connect (`qid`, `sq_entries`, `flow_control_disabled`) and reads sent from the
//! backend's memory (`lend_reads`, `take_lent`).

use std::time::Instant;

use nvme::queue::{Direction, Outcome, PollResult, Queue, Response};
use nvme::wire::{Sqe, Status};
use storage::IoSubmit;

/// The command path of a queue (`Queue::prepare` → `execute` → `finish`, `poll`, `reject`),
/// Aborts (`take_abort_requests` / `answer_abort`, `abort_waiting`), QoS waits (`may_run`,
/// `next_wake`) and the metrics' hooks; each method is the `Queue` method of that name.
pub trait Dispatch {
    fn prepare(&mut self, sqe: &Sqe, data_len: u32) -> Result<Direction, Status>;
    fn execute(&mut self, sqe: &Sqe, data: &mut [u8], tag: u64, io: &mut dyn IoSubmit) -> Outcome;
    /// `None`: the command is not done; the core runs it again.
    fn finish(&mut self, sqe: &Sqe, result: i32) -> Option<Response>;
    fn poll(&mut self, now: Instant) -> PollResult;
    fn reject(&mut self, sqe: &Sqe, status: Status) -> Response;
    fn take_abort_requests(&mut self) -> Vec<u16>;
    fn answer_abort(&mut self, cid: u16, aborted: bool);
    fn abort_waiting(&mut self, sqe: &Sqe) -> Option<Response>;
    fn may_run(&self, sqe: &Sqe, now: Instant) -> bool;
    fn next_wake(&self) -> Option<Instant>;
    /// `Queue::note_pool_wait`.
    fn pool_wait(&mut self);
    fn timing(&self) -> bool;
    fn observe_latency(&mut self, opcode: u8, nsid: u32, latency_ns: u64);
    fn observe_backend(&mut self, opcode: u8, nsid: u32, latency_ns: u64);
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
    fn take_abort_requests(&mut self) -> Vec<u16> {
        Queue::take_abort_requests(self)
    }
    fn answer_abort(&mut self, cid: u16, aborted: bool) {
        Queue::answer_abort(self, cid, aborted)
    }
    fn abort_waiting(&mut self, sqe: &Sqe) -> Option<Response> {
        Queue::abort_waiting(self, sqe)
    }
    fn may_run(&self, sqe: &Sqe, now: Instant) -> bool {
        Queue::may_run(self, sqe, now)
    }
    fn next_wake(&self) -> Option<Instant> {
        Queue::next_wake(self)
    }
    fn pool_wait(&mut self) {
        Queue::note_pool_wait(self)
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
