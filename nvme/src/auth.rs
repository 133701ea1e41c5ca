//! In-band authentication on fabrics queues (NVMe Base 2.0 §8.13, from TP 8006), the shape of
//! Linux `drivers/nvme/target/fabrics-cmd-auth.c`: Authentication Send (fctype 05h, §6.2) and
//! Authentication Receive (fctype 06h, §6.1) drive one [`nvmfd_auth::Controller`] per queue,
//! Connect tells the host to authenticate (AUTHREQ.ATR), and until the queue has authenticated
//! every command but the fabrics ones completes with Authentication Required.
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

use nvmfd_auth::wire::{AUTH_TYPE_COMMON, MSG_NEGOTIATE};
use nvmfd_auth::{check_receive, check_send, CommandError, CommandStatus, ReceiveError};
pub use nvmfd_auth::{DhGroup, HashId, Secret};

use crate::queue::{Completion, Queue};
use crate::subsystem::Subsystem;
use crate::wire::{Sqe, Status};

/// Connect response DW0 AUTHREQ.ATR, "authentication transaction required" (NVMe Base 2.0
/// §6.3, Figure 552; Linux `NVME_CONNECT_AUTHREQ_ATR`): the host must authenticate this queue.
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;

/// Byte offsets of the Authentication Send/Receive fields in the SQE (NVMe Base 2.0 Figures
/// 540 and 544): CDW10 holds SPSP0, SPSP1 and SECP, CDW11 holds TL (Send) or AL (Receive).
const OFFSET_SPSP0: u16 = 41;
const OFFSET_SPSP1: u16 = 42;
const OFFSET_SECP: u16 = 43;
const OFFSET_LENGTH: u16 = 44;

/// The fields of an Authentication Send/Receive command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AuthCommand {
    secp: u8,
    spsp0: u8,
    spsp1: u8,
    /// TL (Send) or AL (Receive).
    length: u32,
}

impl AuthCommand {
    fn from_sqe(sqe: &Sqe) -> Self {
        let [_, spsp0, spsp1, secp] = sqe.cdw10.to_le_bytes();
        Self {
            secp,
            spsp0,
            spsp1,
            length: sqe.cdw11,
        }
    }
}

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
    fn config(&self, host_nqn: &str, subsys_nqn: &str) -> Arc<nvmfd_auth::Config> {
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
    ctrl: nvmfd_auth::Controller,
    /// The settings `ctrl` runs with, to notice a rotated key.
    settings: HostAuth,
    subsys: Arc<Subsystem>,
}

impl std::fmt::Debug for QueueAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueAuth")
            .field("ctrl", &self.ctrl)
            .finish_non_exhaustive()
    }
}

impl QueueAuth {
    pub(crate) fn is_authenticated(&self) -> bool {
        self.ctrl.is_authenticated()
    }
}

/// At a successful Connect: sets up the queue's authentication when `hostnqn` has a key on
/// `subsys`, and returns the AUTHREQ bits for the Connect response DW0.
pub(crate) fn attach(queue: &mut Queue, subsys: &Arc<Subsystem>, hostnqn: &str) -> u32 {
    let settings = subsys.settings();
    let Some(host) = settings.host_auth.get(hostnqn) else {
        queue.auth = None;
        return 0;
    };
    queue.auth = Some(QueueAuth {
        ctrl: nvmfd_auth::Controller::new(host.config(hostnqn, &subsys.nqn)),
        settings: host.clone(),
        subsys: Arc::clone(subsys),
    });
    CONNECT_AUTHREQ_ATR
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

fn command_error(e: CommandError) -> Completion {
    let at = match e {
        CommandError::Secp(_) => OFFSET_SECP,
        CommandError::Spsp0(_) => OFFSET_SPSP0,
        CommandError::Spsp1(_) => OFFSET_SPSP1,
        CommandError::Length(_) => OFFSET_LENGTH,
    };
    status(e.status()).at(at)
}

fn status(s: CommandStatus) -> Completion {
    match s {
        CommandStatus::Success => Completion::ok(),
        CommandStatus::InvalidField => Completion::fail(Status::INVALID_FIELD),
        CommandStatus::InternalError => Completion::err(Status::INTERNAL_ERROR),
    }
}

/// Who a log line is about.
struct Who<'a> {
    queue: &'a Queue,
}

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.queue;
        let host = q.controller().map_or("", |c| c.hostnqn.as_str());
        let sub = q.controller().map_or("", |c| c.subsys.nqn.as_str());
        write!(
            f,
            "host {host} from {} to {sub} qid {}",
            q.peer.remote,
            q.qid().unwrap_or(0)
        )
    }
}

/// Authentication Send (NVMe Base 2.0 §6.2). The command succeeds whenever its fields are
/// right; a refused payload is answered by AUTH_Failure1 at the next Receive (as nvmet).
pub(crate) fn send(queue: &mut Queue, sqe: &Sqe, data: &[u8]) -> Completion {
    let cmd = AuthCommand::from_sqe(sqe);
    if queue.auth.is_none() {
        tracing::warn!(who = %Who { queue }, "Authentication Send on a queue without authentication");
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    }
    if let Err(e) = check_send(cmd.secp, cmd.spsp0, cmd.spsp1, cmd.length) {
        tracing::warn!(who = %Who { queue }, "Authentication Send refused: {e}");
        return command_error(e);
    }
    // The payload is exactly TL bytes (nvmet: nvmet_check_transfer_len).
    if data.len() != cmd.length as usize {
        tracing::warn!(who = %Who { queue }, tl = cmd.length, len = data.len(),
            "Authentication Send: data length differs from TL");
        return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
    }
    let remote = queue.peer.remote.ip();
    let now = Instant::now();
    let limiter = Arc::clone(queue.target.auth_failures());
    let hostnqn = queue
        .controller()
        .map(|c| c.hostnqn.clone())
        .unwrap_or_default();
    let who = Who { queue }.to_string();
    let Some(auth) = queue.auth.as_mut() else {
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    };
    let negotiate = data.len() >= 2 && data[0] == AUTH_TYPE_COMMON && data[1] == MSG_NEGOTIATE;
    if negotiate {
        // A key rotated since the last transaction applies from this one.
        if let Some(current) = auth.subsys.settings().host_auth.get(&hostnqn) {
            if *current != auth.settings {
                auth.ctrl
                    .set_config(current.config(&hostnqn, &auth.subsys.nqn));
                auth.settings = current.clone();
            }
        }
        if limiter.throttled(remote, now) {
            let e = auth.ctrl.refuse(data);
            tracing::debug!(%who, "authentication refused: {e} (too many failures from this address)");
            return Completion::ok();
        }
    }
    // Every refused payload and every AUTH_Failure2 ends a transaction in failure.
    if let Err(e) = auth.ctrl.on_send(data) {
        note_failure(&limiter, remote, now, &who, &e.to_string());
    }
    Completion::ok()
}

/// Authentication Receive (NVMe Base 2.0 §6.1): the next message of the transaction at the
/// start of the host's buffer, the rest zero-filled.
pub(crate) fn receive(queue: &mut Queue, sqe: &Sqe, data: &mut [u8]) -> Completion {
    let cmd = AuthCommand::from_sqe(sqe);
    if queue.auth.is_none() {
        tracing::warn!(who = %Who { queue }, "Authentication Receive on a queue without authentication");
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    }
    if let Err(e) = check_receive(cmd.secp, cmd.spsp0, cmd.spsp1, cmd.length) {
        tracing::warn!(who = %Who { queue }, "Authentication Receive refused: {e}");
        return command_error(e);
    }
    if data.len() != cmd.length as usize {
        tracing::warn!(who = %Who { queue }, al = cmd.length, len = data.len(),
            "Authentication Receive: data length differs from AL");
        return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
    }
    let remote = queue.peer.remote.ip();
    let limiter = Arc::clone(queue.target.auth_failures());
    let who = Who { queue }.to_string();
    let Some(auth) = queue.auth.as_mut() else {
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    };
    let was_failed = auth.ctrl.has_failed();
    let pending_failure = !auth.ctrl.in_progress();
    match auth.ctrl.on_receive(cmd.length) {
        Ok(msg) => {
            // `check_receive` and the length check above: msg.len() <= AL == data.len().
            data[..msg.len()].copy_from_slice(&msg);
            data[msg.len()..].fill(0);
            if auth.ctrl.has_failed() && !was_failed && pending_failure {
                // A Receive with no transaction under way fails it (nvmet answers
                // AUTH_Failure1 "failed"); other failures were counted at their Send.
                note_failure(
                    &limiter,
                    remote,
                    Instant::now(),
                    &who,
                    "Authentication Receive out of sequence",
                );
            }
            Completion::data(data.len())
        }
        Err(e) => {
            tracing::warn!(%who, "Authentication Receive: {e}");
            match e {
                ReceiveError::AllocationLength { .. } => status(e.status()).at(OFFSET_LENGTH),
                ReceiveError::Random(_) => status(e.status()),
            }
        }
    }
}

fn note_failure(limiter: &FailureLimiter, remote: IpAddr, now: Instant, who: &str, why: &str) {
    let recent = limiter.record(remote, now);
    if recent == FailureLimiter::MAX_FAILURES {
        tracing::warn!(
            failures = limiter.total(),
            "authentication failed: {who}: {why}; {recent} failures from {remote} within {:?}: \
             its attempts are refused for that long",
            FailureLimiter::WINDOW
        );
    } else if recent < FailureLimiter::MAX_FAILURES {
        tracing::warn!(
            failures = limiter.total(),
            "authentication failed: {who}: {why}"
        );
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

    #[test]
    fn auth_command_fields() {
        let mut b = [0u8; 64];
        b[0] = 0x7f;
        b[4] = 0x05;
        b[41] = 0x01;
        b[42] = 0x02;
        b[43] = 0xe9;
        b[44..48].copy_from_slice(&0x1234u32.to_le_bytes());
        let c = AuthCommand::from_sqe(&Sqe::from_bytes(&b));
        assert_eq!(
            c,
            AuthCommand {
                secp: 0xe9,
                spsp0: 1,
                spsp1: 2,
                length: 0x1234
            }
        );
    }
}
