//! The machine's core-to-core round trip: two threads, one pinned to each CPU, pass a counter
//! back and forth through one cache line. On a virtual machine the hypervisor may move the
//! virtual CPUs between physical cores (or caches) from one second to the next, and every
//! loopback benchmark between two pinned threads — target and load generator, echo peer and
//! client — runs at the speed of that hand-over. `scripts/bench.sh ab` measures it before and
//! after every run, so a round that ran on a slower placement is seen as such instead of
//! being read as the target's variance.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::pin::{pin_to, PinError};

/// Why the probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Pin(#[from] PinError),
    #[error("the answering thread failed")]
    Thread,
}

/// Mean time of one round trip of a cache line between CPU `a` (this thread, pinned for the
/// call) and CPU `b`, measured for `time` (at least one round trip).
pub fn core_round_trip(a: usize, b: usize, time: Duration) -> Result<Duration, ProbeError> {
    // Odd values are the caller's, even ones the answer: each side waits for its turn.
    let line = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let answer = {
        let (line, stop) = (Arc::clone(&line), Arc::clone(&stop));
        thread::spawn(move || -> Result<(), ProbeError> {
            pin_to(b)?;
            let mut expect = 1;
            while !stop.load(Ordering::Relaxed) {
                if line.load(Ordering::Acquire) == expect {
                    line.store(expect + 1, Ordering::Release);
                    expect += 2;
                } else {
                    std::hint::spin_loop();
                }
            }
            Ok(())
        })
    };
    let measured = pin_to(a).map(|()| {
        let start = Instant::now();
        let mut trips: u32 = 0;
        let mut value = 0;
        loop {
            line.store(value + 1, Ordering::Release);
            // The answering thread may have failed to pin: give up after a second without
            // an answer instead of spinning for ever. The clock is read only once a trip
            // takes 65,536 spins, so the trips that answer promptly are not slowed by it.
            let mut waiting_since: Option<Instant> = None;
            let mut spins: u32 = 0;
            while line.load(Ordering::Acquire) != value + 2 {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins % 65_536 == 0
                    && waiting_since.get_or_insert_with(Instant::now).elapsed()
                        > Duration::from_secs(1)
                {
                    return None;
                }
            }
            value += 2;
            trips += 1;
            // The clock is read once per 256 trips: it costs as much as a trip.
            if trips % 256 == 0 {
                let elapsed = start.elapsed();
                if elapsed >= time {
                    return Some(elapsed / trips);
                }
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let answered = answer.join().map_err(|_| ProbeError::Thread)?;
    let measured = measured?;
    answered?;
    measured.ok_or(ProbeError::Thread)
}

#[cfg(test)]
mod tests;
