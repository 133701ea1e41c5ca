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

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
}

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
