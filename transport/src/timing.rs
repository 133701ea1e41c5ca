//! Command timing of a connection core (sans-I/O): the shell gives the times — when the input
//! or completions it hands over were read, and when the responses they produced were handed
//! to the socket or queue pair — and the core keeps them per command as nanoseconds since the
//! first time given (one conversion per batch, not one per command), and reports each
//! command's latency and backend latency to the dispatch core (`Dispatch::observe_latency`,
//! `Dispatch::observe_backend`). Nothing here reads a clock.

use std::time::Instant;

use nvme::wire::Sqe;

use crate::dispatch::Dispatch;

#[derive(Debug, Default)]
pub(crate) struct Timing {
    epoch: Option<Instant>,
    /// The time of the input or completions being handled (`set`), once the shell times.
    now: Option<u64>,
    /// Responses produced since the last [`Timing::handed_over`]: (opcode, nsid, arrival).
    responded: Vec<(u8, u32, u64)>,
}

impl Timing {
    fn nanos(&mut self, t: Instant) -> u64 {
        let epoch = *self.epoch.get_or_insert(t);
        t.saturating_duration_since(epoch).as_nanos() as u64
    }

    /// The time of what is handled next.
    pub(crate) fn set(&mut self, now: Instant) {
        self.now = Some(self.nanos(now));
    }

    /// The time of the processing under way (`None` when the shell does not time): a capsule
    /// completed now arrived then; an op submitted now was submitted then.
    #[inline]
    pub(crate) fn now(&self) -> Option<u64> {
        self.now
    }

    /// A later time of the processing under way (the shell's periodic work), when timing.
    pub(crate) fn advance(&mut self, now: Instant) {
        if self.now.is_some() {
            self.set(now);
        }
    }

    /// A response was produced for `sqe`, whose capsule arrived at `arrived` (when timed).
    #[inline]
    pub(crate) fn responded(&mut self, sqe: &Sqe, arrived: Option<u64>) {
        if let Some(arrived) = arrived {
            self.responded.push((sqe.opcode, sqe.nsid, arrived));
        }
    }

    pub(crate) fn has_responded(&self) -> bool {
        !self.responded.is_empty()
    }

    /// The responses produced since the last call were handed over at `at`.
    pub(crate) fn handed_over(&mut self, at: Instant, dispatch: &mut impl Dispatch) {
        let at = self.nanos(at);
        for (opcode, nsid, arrived) in self.responded.drain(..) {
            dispatch.observe_latency(opcode, nsid, at.saturating_sub(arrived));
        }
    }

    /// The backend op of `sqe`, submitted at `submitted` (when timed), completed now.
    #[inline]
    pub(crate) fn backend_done(
        &self,
        sqe: &Sqe,
        submitted: Option<u64>,
        dispatch: &mut impl Dispatch,
    ) {
        if let (Some(submitted), Some(now)) = (submitted, self.now) {
            dispatch.observe_backend(sqe.opcode, sqe.nsid, now.saturating_sub(submitted));
        }
    }
}
