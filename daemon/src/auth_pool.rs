//! The worker threads of in-band authentication: the Diffie-Hellman exponentiations of
//! DH-HMAC-CHAP (milliseconds each, hundreds in an emulated guest) run here, never on a
//! reactor (ARCHITECTURE.md, "In-band authentication"). The target hands each one over
//! through `nvme::auth::AuthWorkers` and gets its answer back through the reactor's
//! `ExternalCompletions`, which wakes the reactor.
//!
//! The workers run at a lower CPU priority than the reactors (nice +10): on a machine whose
//! CPUs are all busy, queues keep their latency during a reconnect storm and the storm's
//! connects wait instead (their controllers' keep-alive is held while they do).
//!
//! The queue of jobs is bounded by `[global] auth_max_transactions` (a transaction has at most
//! one job out at a time, and `nvme::auth::Transactions` admits no more transactions than
//! that), so a full queue means a bug or a race at the bound, and the job is refused rather
//! than queued without bound.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use nvme::auth::{AuthLimits, AuthOffload, AuthWorkers, Transactions};

type Job = Box<dyn FnOnce() + Send>;

/// The sending side of the pool; the workers hold the receiving side.
#[derive(Debug)]
pub struct AuthPool {
    jobs: SyncSender<Job>,
    workers: usize,
}

impl AuthWorkers for AuthPool {
    fn spawn(&self, job: Job) -> Result<(), String> {
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => format!(
                "the authentication workers' queue is full ({} workers)",
                self.workers
            ),
            TrySendError::Disconnected(_) => "the authentication workers are gone".to_owned(),
        })
    }
}

/// Starts `[global] auth_workers` threads (`nvmfd-auth-N`) and returns what the target needs.
pub fn start(global: &conf::Global) -> std::io::Result<AuthOffload> {
    let limits = AuthLimits {
        max_transactions: global.auth_max_transactions,
        max_per_address: global.auth_max_transactions_per_host,
    };
    let workers = global.auth_workers.max(1) as usize;
    let pool = spawn(workers, limits.max_transactions as usize)?;
    tracing::debug!(
        workers,
        max_transactions = limits.max_transactions,
        max_per_host = limits.max_per_address,
        "authentication workers started"
    );
    Ok(AuthOffload {
        workers: Arc::new(pool),
        transactions: Transactions::new(limits),
    })
}

fn spawn(workers: usize, capacity: usize) -> std::io::Result<AuthPool> {
    let (tx, rx) = mpsc::sync_channel::<Job>(capacity);
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..workers {
        let rx = Arc::clone(&rx);
        std::thread::Builder::new()
            .name(format!("nvmfd-auth-{i}"))
            .spawn(move || {
                lower_priority();
                work(&rx)
            })?;
    }
    Ok(AuthPool { jobs: tx, workers })
}

/// Nice value the workers add to the daemon's: CFS then gives a runnable reactor about nine
/// tenths of a CPU it shares with a worker (weights 1024 against 110).
const WORKER_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority by [`WORKER_NICE`] (Linux: `setpriority`
/// with PRIO_PROCESS and who 0 applies to the calling thread only). A refusal is logged and
/// the worker runs at the daemon's priority.
fn lower_priority() {
    // SAFETY: getpriority/setpriority take plain integers and touch no memory of ours.
    let rc = unsafe {
        let current = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, (current + WORKER_NICE).min(19))
    };
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "authentication worker: cannot lower its priority"
        );
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only to take one job, not while running it.
        let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        // A job catches its own panics (it must complete its tag); this keeps the worker.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn jobs_run_on_the_named_workers_and_a_full_queue_refuses() {
        let pool = spawn(2, 2).unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        for _ in 0..2 {
            let done = done_tx.clone();
            pool.spawn(Box::new(move || {
                let name = std::thread::current().name().unwrap().to_owned();
                // SAFETY: getpriority takes plain integers.
                let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
                done.send((name, nice)).unwrap();
            }))
            .unwrap();
        }
        // SAFETY: getpriority takes plain integers.
        let ours = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        for _ in 0..2 {
            let (name, nice) = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(name.starts_with("nvmfd-auth-"), "{name}");
            assert_eq!(
                nice,
                (ours + WORKER_NICE).min(19),
                "workers run below the reactors"
            );
        }
        // Both workers busy, the queue (2) filled: the next job is refused, not queued.
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let (gate, started) = (Arc::clone(&gate), Arc::clone(&started));
            pool.spawn(Box::new(move || {
                started.fetch_add(1, Ordering::SeqCst);
                drop(gate.lock());
            }))
            .unwrap();
        }
        while started.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        pool.spawn(Box::new(|| {})).unwrap();
        pool.spawn(Box::new(|| {})).unwrap();
        let refused = pool.spawn(Box::new(|| {})).unwrap_err();
        assert!(refused.contains("full"), "{refused}");
        drop(held);
    }
}
