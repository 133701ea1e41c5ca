//! In-band authentication state (NVMe Base 2.0 §8.13, from TP 8006): each host's keys, the
//! per-queue DH-HMAC-CHAP state and the gate it puts on commands, and the count of failures per
//! source address. The Authentication Send/Receive handlers and the Connect hook are in
//! `fabrics_auth` (the shape of Linux `drivers/nvme/target/fabrics-cmd-auth.c`).
//!
//! Every queue (admin and each I/O queue) of a host that has a key authenticates on its own.
//! A host may re-authenticate a live queue at any time (the Linux host does so when its key
//! changes); a key rotated on the target applies from the next transaction. Failed transactions
//! are logged with the host NQN and address and counted, and a source address that fails too
//! often has its next attempts refused without any cryptography for a while
//! ([`FailureLimiter`]): the FFDHE exponentiations are the expensive part a guesser would make
//! the target pay for.
//!
//! Those exponentiations never run on the thread that serves the queue: once the target is
//! given an [`AuthOffload`] (the daemon's worker pool and its bounds), each one is a job on a
//! worker, the Authentication Send waits for it as a submitted command (completed through the
//! reactor's `ExternalCompletions`, like a backend op), further authentication commands of the
//! queue wait as blocked ones, and the controller's keep-alive timer does not run down while
//! the target computes for it. [`Transactions`] bounds the transactions under way, per source
//! address and in total; past a bound a new transaction is refused at once (AUTH_Failure1
//! "failed", one log line). Without an offload (tests, tools) the work runs inline.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmfd_auth::controller::Computed;

pub use nvmfd_auth::{DhGroup, HashId, Secret};

use crate::wire::Status;

/// Connect response DW0 AUTHREQ.ATR, "authentication transaction required" (NVMe Base 2.0
/// §6.3, Figure 552; Linux `NVME_CONNECT_AUTHREQ_ATR`): the host must authenticate this queue.
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;

/// One host's DH-HMAC-CHAP settings on one subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAuth {
    pub host_key: Secret,
    /// With it the host may ask the controller to prove itself (bidirectional).
    pub ctrl_key: Option<Secret>,
    /// Most preferred first.
    pub hashes: Vec<HashId>,
    pub dh_groups: Vec<DhGroup>,
}

impl HostAuth {
    pub(crate) fn config(&self, host_nqn: &str, subsys_nqn: &str) -> Arc<nvmfd_auth::Config> {
        Arc::new(nvmfd_auth::Config {
            host_key: self.host_key.clone(),
            ctrl_key: self.ctrl_key.clone(),
            hashes: self.hashes.clone(),
            dh_groups: self.dh_groups.clone(),
            host_nqn: host_nqn.to_owned(),
            subsys_nqn: subsys_nqn.to_owned(),
        })
    }
}

/// The authentication state of one queue whose host has a key.
pub(crate) struct QueueAuth {
    pub(crate) ctrl: nvmfd_auth::Controller,
    /// The settings `ctrl` runs with, to notice a rotated key.
    pub(crate) settings: HostAuth,
    /// The place of the transaction under way among [`Transactions`] (with an offload).
    pub(crate) ticket: Option<Ticket>,
    /// When the transaction under way last moved: the host's last message, or the answer of
    /// a worker (its timeout runs from there, see `fabrics_auth::tick`).
    pub(crate) last_step: Option<Instant>,
    /// The Authentication Send (CID) waiting for a worker, and where its result lands.
    pub(crate) computing: Option<(u16, ResultSlot)>,
}

/// Where a worker leaves the result of a [`nvmfd_auth::controller::Work`].
pub(crate) type ResultSlot = Arc<Mutex<Option<Computed>>>;

impl std::fmt::Debug for QueueAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueAuth")
            .field("ctrl", &self.ctrl)
            .finish_non_exhaustive()
    }
}

impl QueueAuth {
    pub(crate) fn new(settings: &HostAuth, host_nqn: &str, subsys_nqn: &str) -> Self {
        Self {
            ctrl: nvmfd_auth::Controller::new(settings.config(host_nqn, subsys_nqn)),
            settings: settings.clone(),
            ticket: None,
            last_step: None,
            computing: None,
        }
    }

    /// After a step of the transaction at `now`: the bookkeeping of one that is over ends (its
    /// place, its timer); one under way restarts its timer.
    pub(crate) fn settle(&mut self, now: Instant) {
        if self.ctrl.in_progress() {
            self.last_step = Some(now);
        } else {
            self.ticket = None;
            self.last_step = None;
        }
    }

    pub(crate) fn is_authenticated(&self) -> bool {
        self.ctrl.is_authenticated()
    }
}

/// For commands other than fabrics commands (NVMe Base 2.0 §8.13.1; nvmet's
/// `nvmet_check_auth_status`): a queue that must authenticate and has not completed a
/// transaction answers Authentication Required (SCT 1h, SC 91h) with DNR.
pub(crate) fn gate(auth: Option<&QueueAuth>) -> Result<(), Status> {
    match auth {
        Some(a) if !a.is_authenticated() => Err(Status::AUTHENTICATION_REQUIRED.with_dnr()),
        _ => Ok(()),
    }
}

/// Where authentication work runs: worker threads of the daemon (`nvme` starts none).
pub trait AuthWorkers: Send + Sync + std::fmt::Debug {
    /// Queues `job` to run on a worker. `Err(why)`: it was not queued (the pool is full or
    /// gone); the job was dropped without running.
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) -> Result<(), String>;
}

/// How many authentication transactions may be under way at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthLimits {
    /// On the whole target.
    pub max_transactions: u32,
    /// From one source address (one host, or the hosts behind one NAT address).
    pub max_per_address: u32,
}

/// What the target is given to keep authentication work off its reactors.
#[derive(Debug, Clone)]
pub struct AuthOffload {
    pub workers: Arc<dyn AuthWorkers>,
    pub transactions: Arc<Transactions>,
}

/// The authentication transactions under way (AUTH_Negotiate accepted, not yet ended), per
/// source address and in total; each holds a [`Ticket`].
#[derive(Debug)]
pub struct Transactions {
    limits: AuthLimits,
    /// Per address with at least one; the total is the sum.
    under_way: Mutex<(u32, HashMap<IpAddr, u32>)>,
}

/// Why a transaction was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} authentication transactions under way on the target (auth_max_transactions)")]
    Total(u32),
    #[error(
        "{0} authentication transactions under way from this address \
         (auth_max_transactions_per_host)"
    )]
    Address(u32),
}

impl Transactions {
    pub fn new(limits: AuthLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            under_way: Mutex::new((0, HashMap::new())),
        })
    }

    /// A place for a new transaction from `addr`, held until the ticket is dropped.
    pub fn admit(self: &Arc<Self>, addr: IpAddr) -> Result<Ticket, Refusal> {
        let mut g = self.under_way.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per) = &mut *g;
        if *total >= self.limits.max_transactions {
            return Err(Refusal::Total(*total));
        }
        let n = per.entry(addr).or_insert(0);
        if *n >= self.limits.max_per_address {
            return Err(Refusal::Address(*n));
        }
        *n += 1;
        *total += 1;
        Ok(Ticket {
            owner: Arc::clone(self),
            addr,
        })
    }

    /// Transactions under way: in total, and from `addr`.
    pub fn under_way(&self, addr: IpAddr) -> (u32, u32) {
        let g = self.under_way.lock().unwrap_or_else(|e| e.into_inner());
        (g.0, g.1.get(&addr).copied().unwrap_or(0))
    }
}

/// One transaction's place in [`Transactions`].
#[derive(Debug)]
pub struct Ticket {
    owner: Arc<Transactions>,
    addr: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut g = self
            .owner
            .under_way
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (total, per) = &mut *g;
        *total -= 1;
        if let Some(n) = per.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.addr);
            }
        }
    }
}

/// Failed authentications, counted target-wide and per source address; an address with
/// [`FailureLimiter::MAX_FAILURES`] failures within [`FailureLimiter::WINDOW`] has its
/// AUTH_Negotiate refused until the window ends.
#[derive(Debug, Default)]
pub struct FailureLimiter {
    total: AtomicU64,
    /// Per address: the start of its window and the failures in it.
    recent: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl FailureLimiter {
    pub const MAX_FAILURES: u32 = 5;
    pub const WINDOW: Duration = Duration::from_secs(60);
    /// Addresses tracked at most; beyond, expired windows are dropped first, and a new address
    /// is not tracked when all are live (memory stays bounded under a spoofed-address flood).
    const MAX_ADDRESSES: usize = 4096;

    /// Failed authentications since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Records a failure from `addr`; returns the failures in its current window.
    pub fn record(&self, addr: IpAddr, now: Instant) -> u32 {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= Self::MAX_ADDRESSES && !recent.contains_key(&addr) {
            recent.retain(|_, (start, _)| now.duration_since(*start) < Self::WINDOW);
            if recent.len() >= Self::MAX_ADDRESSES {
                return 1;
            }
        }
        let entry = recent.entry(addr).or_insert((now, 0));
        if now.duration_since(entry.0) >= Self::WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        entry.1
    }

    /// Whether `addr` has used up its failures for the current window.
    pub fn throttled(&self, addr: IpAddr, now: Instant) -> bool {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.get(&addr).is_some_and(|(start, n)| {
            now.duration_since(*start) < Self::WINDOW && *n >= Self::MAX_FAILURES
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_are_bounded_per_address_and_in_total() {
        let t = Transactions::new(AuthLimits {
            max_transactions: 3,
            max_per_address: 2,
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        let a1 = t.admit(a).unwrap();
        let _a2 = t.admit(a).unwrap();
        assert_eq!(t.admit(a).unwrap_err(), Refusal::Address(2));
        let _b1 = t.admit(b).unwrap();
        assert_eq!(t.admit(c).unwrap_err(), Refusal::Total(3));
        assert_eq!(t.under_way(a), (3, 2));
        drop(a1);
        assert_eq!(t.under_way(a), (2, 1));
        let _c1 = t.admit(c).unwrap();
        assert_eq!(t.under_way(c), (3, 1));
    }

    #[test]
    fn limiter_counts_per_address_and_forgets_after_the_window() {
        let l = FailureLimiter::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        for i in 1..=FailureLimiter::MAX_FAILURES {
            assert!(!l.throttled(a, t0));
            assert_eq!(l.record(a, t0), i);
        }
        assert!(l.throttled(a, t0));
        assert!(!l.throttled(b, t0), "per address");
        assert!(l.throttled(a, t0 + FailureLimiter::WINDOW - Duration::from_millis(1)));
        let later = t0 + FailureLimiter::WINDOW;
        assert!(!l.throttled(a, later));
        assert_eq!(l.record(a, later), 1, "a new window");
        assert_eq!(l.total(), u64::from(FailureLimiter::MAX_FAILURES) + 1);
    }
}
