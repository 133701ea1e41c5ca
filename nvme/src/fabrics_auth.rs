//! Fabrics Authentication Send (fctype 05h, NVMe Base 2.0 §6.2) and Authentication Receive
//! (fctype 06h, §6.1), and the Connect hook that asks a keyed host to authenticate (AUTHREQ),
//! driving one [`nvmfd_auth::Controller`] per queue (state in `auth`); the shape of Linux
//! `drivers/nvme/target/fabrics-cmd-auth.c`.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmfd_auth::controller::Work;
use nvmfd_auth::wire::{AUTH_TYPE_COMMON, MSG_NEGOTIATE};
use nvmfd_auth::{check_receive, check_send, CommandError, CommandStatus, ReceiveError};

use crate::auth::{FailureLimiter, QueueAuth, CONNECT_AUTHREQ_ATR};
use crate::command::{Completion, Exec};
use crate::controller::Controller;
use crate::peer::PeerInfo;
use crate::spec::fctype;
use crate::subsystem::Subsystem;
use crate::target::Target;
use crate::wire::{Sqe, Status};
use storage::ExternalCompletions;

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

/// What Authentication Send/Receive need to know about the queue they arrive on.
pub(crate) struct AuthContext<'a> {
    pub target: &'a Target,
    pub peer: &'a PeerInfo,
    pub ctrl: &'a Controller,
    pub subsys: &'a Subsystem,
    pub qid: u16,
    /// The queue's authentication state (`None`: its host has no key).
    pub auth: &'a mut Option<QueueAuth>,
    /// Where a worker's result for this command is announced, and the command's tag (the
    /// reactor's `ExternalCompletions`); `None`: the submitter has none, work runs inline.
    pub done: Option<(&'a Arc<ExternalCompletions>, u64)>,
}

/// How long a transaction may stay under way without the host going on (NVMe Base 2.0
/// §8.13.5 leaves it to the controller; nvmet uses KATO, or 120 s without one).
const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(120);

/// At a successful Connect: the queue's authentication state when `hostnqn` has a key on
/// `subsys`, and the AUTHREQ bits for the Connect response DW0.
pub(crate) fn attach(subsys: &Subsystem, hostnqn: &str) -> (Option<QueueAuth>, u32) {
    let settings = subsys.settings();
    match settings.host_auth.get(hostnqn) {
        Some(host) => (
            Some(QueueAuth::new(host, hostnqn, &subsys.nqn)),
            CONNECT_AUTHREQ_ATR,
        ),
        None => (None, 0),
    }
}

/// Authentication Send (fctype 05h) or Receive (06h) on a connected queue. While a worker
/// computes for the queue's transaction, both wait (`Exec::Blocked`): the host sends one at a
/// time, and one that does not is served in order.
pub(crate) fn execute(cx: &mut AuthContext, sqe: &Sqe, data: &mut [u8]) -> Exec {
    if cx.auth.as_ref().is_some_and(|a| a.computing.is_some()) {
        return Exec::Blocked;
    }
    if sqe.fctype() == fctype::AUTHENTICATION_SEND {
        send(cx, sqe, data)
    } else {
        receive(cx, sqe, data).into()
    }
}

/// Whether `cid` is the Authentication Send waiting for a worker on this queue.
pub(crate) fn is_computing(auth: &Option<QueueAuth>, cid: u16) -> bool {
    auth.as_ref()
        .and_then(|a| a.computing.as_ref())
        .is_some_and(|(c, _)| *c == cid)
}

/// The worker's result for the Authentication Send `is_computing` named: the transaction goes
/// on, and the command completes (successfully, as every Send whose fields are right).
pub(crate) fn finish(cx: &mut AuthContext) -> Completion {
    let limiter = Arc::clone(cx.target.auth_failures());
    let remote = cx.peer.remote.ip();
    let who = who(cx);
    let Some(auth) = cx.auth.as_mut() else {
        return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
    };
    let Some((_, slot)) = auth.computing.take() else {
        return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
    };
    let computed = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    let result = match computed {
        Some(c) => auth.ctrl.computed(c),
        // The job panicked before it left a result.
        None => Err(auth
            .ctrl
            .fail_by_policy(&[], "the authentication worker failed".to_owned())),
    };
    if let Err(e) = result {
        note_failure(&limiter, remote, Instant::now(), &who, &e.to_string());
    }
    auth.settle(Instant::now());
    Completion::ok()
}

/// From the queue's `poll`: a transaction the host left waiting for its next message for longer
/// than its timeout (KATO, or 120 s without one; nvmet restarts its timer at each step too) is
/// dropped and its place freed; while a worker computes for
/// it, the controller counts as active (its keep-alive must not expire on the target's time).
pub(crate) fn tick(cx: &mut AuthContext, now: Instant) {
    let Some(auth) = cx.auth.as_mut() else {
        return;
    };
    if auth.computing.is_some() {
        cx.ctrl.note_activity();
        return;
    }
    let Some(last_step) = auth.last_step else {
        return;
    };
    let kato = cx.ctrl.lock().kato_ms;
    let timeout = match kato {
        0 => DEFAULT_TRANSACTION_TIMEOUT,
        ms => Duration::from_millis(u64::from(ms)),
    };
    if now.saturating_duration_since(last_step) < timeout {
        return;
    }
    auth.ctrl.abandon();
    auth.settle(now);
    let limiter = Arc::clone(cx.target.auth_failures());
    let why = format!("transaction timed out after {timeout:?}");
    note_failure(&limiter, cx.peer.remote.ip(), now, &who(cx), &why);
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
fn who(cx: &AuthContext) -> String {
    format!(
        "host {} from {} to {} qid {}",
        cx.ctrl.hostnqn, cx.peer.remote, cx.subsys.nqn, cx.qid
    )
}

/// Authentication Send (NVMe Base 2.0 §6.2). The command succeeds whenever its fields are
/// right; a refused payload is answered by AUTH_Failure1 at the next Receive (as nvmet).
fn send(cx: &mut AuthContext, sqe: &Sqe, data: &[u8]) -> Exec {
    let cmd = AuthCommand::from_sqe(sqe);
    if cx.auth.is_none() {
        tracing::warn!(who = %who(cx), "Authentication Send on a queue without authentication");
        return Completion::fail(Status::INVALID_FIELD)
            .at(OFFSET_SECP)
            .into();
    }
    if let Err(e) = check_send(cmd.secp, cmd.spsp0, cmd.spsp1, cmd.length) {
        tracing::warn!(who = %who(cx), "Authentication Send refused: {e}");
        return command_error(e).into();
    }
    // The payload is exactly TL bytes (nvmet: nvmet_check_transfer_len).
    if data.len() != cmd.length as usize {
        tracing::warn!(who = %who(cx), tl = cmd.length, len = data.len(),
            "Authentication Send: data length differs from TL");
        return Completion::fail(Status::DATA_SGL_LENGTH_INVALID).into();
    }
    let remote = cx.peer.remote.ip();
    let now = Instant::now();
    let limiter = Arc::clone(cx.target.auth_failures());
    let offload = cx.target.auth_offload().cloned();
    let who = who(cx);
    let Some(auth) = cx.auth.as_mut() else {
        return Completion::fail(Status::INVALID_FIELD)
            .at(OFFSET_SECP)
            .into();
    };
    let negotiate = data.len() >= 2 && data[0] == AUTH_TYPE_COMMON && data[1] == MSG_NEGOTIATE;
    if negotiate {
        // A key rotated since the last transaction applies from this one.
        if let Some(current) = cx.subsys.settings().host_auth.get(&cx.ctrl.hostnqn) {
            if *current != auth.settings {
                auth.ctrl
                    .set_config(current.config(&cx.ctrl.hostnqn, &cx.subsys.nqn));
                auth.settings = current.clone();
            }
        }
        if limiter.throttled(remote, now) {
            let e = auth.ctrl.refuse(data);
            auth.settle(now);
            tracing::debug!(%who, "authentication refused: {e} (too many failures from this address)");
            return Completion::ok().into();
        }
        // A new transaction takes a place among those under way (a re-negotiation in the
        // middle of one keeps its place).
        if let (Some(o), None) = (&offload, &auth.ticket) {
            match o.transactions.admit(remote) {
                Ok(t) => auth.ticket = Some(t),
                Err(refusal) => {
                    let e = auth.ctrl.fail_by_policy(data, refusal.to_string());
                    auth.settle(now);
                    tracing::warn!("authentication refused: {who}: {e}");
                    return Completion::ok().into();
                }
            }
        }
    }
    // Every refused payload and every AUTH_Failure2 ends a transaction in failure.
    let exec = match auth.ctrl.start_send(data) {
        Err(e) => {
            note_failure(&limiter, remote, now, &who, &e.to_string());
            Completion::ok().into()
        }
        Ok(None) => Completion::ok().into(),
        Ok(Some(work)) => match (&offload, cx.done) {
            (Some(o), Some((done, tag))) => match spawn(o, done, tag, work) {
                Ok(slot) => {
                    auth.computing = Some((sqe.cid, slot));
                    return Exec::Submitted;
                }
                Err(why) => {
                    let e = auth.ctrl.fail_by_policy(data, why);
                    tracing::warn!("authentication refused: {who}: {e}");
                    Completion::ok().into()
                }
            },
            // No worker pool (tests, tools): on this thread. A thread that forbids
            // exponentiations (a reactor) gets the transaction failed instead.
            _ => {
                if let Err(e) = auth.ctrl.computed(work.run()) {
                    note_failure(&limiter, remote, now, &who, &e.to_string());
                }
                Completion::ok().into()
            }
        },
    };
    auth.settle(now);
    exec
}

/// Queues `work` on the offload's workers; its result lands in the returned slot and `tag`
/// completes (result 0) through `done` once it is there.
fn spawn(
    offload: &crate::auth::AuthOffload,
    done: &Arc<ExternalCompletions>,
    tag: u64,
    work: Work,
) -> Result<crate::auth::ResultSlot, String> {
    let slot: crate::auth::ResultSlot = Arc::new(Mutex::new(None));
    let out = Arc::clone(&slot);
    let done_by = Arc::clone(done);
    done.begin();
    let job = Box::new(move || {
        // A panic leaves the slot empty; the tag completes all the same (`finish` fails the
        // transaction).
        if let Ok(c) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.run())) {
            *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
        }
        done_by.complete(tag, 0);
    });
    offload.workers.spawn(job).inspect_err(|_| done.abandon())?;
    Ok(slot)
}

/// Authentication Receive (NVMe Base 2.0 §6.1): the next message of the transaction at the
/// start of the host's buffer, the rest zero-filled.
fn receive(cx: &mut AuthContext, sqe: &Sqe, data: &mut [u8]) -> Completion {
    let cmd = AuthCommand::from_sqe(sqe);
    if cx.auth.is_none() {
        tracing::warn!(who = %who(cx), "Authentication Receive on a queue without authentication");
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    }
    if let Err(e) = check_receive(cmd.secp, cmd.spsp0, cmd.spsp1, cmd.length) {
        tracing::warn!(who = %who(cx), "Authentication Receive refused: {e}");
        return command_error(e);
    }
    if data.len() != cmd.length as usize {
        tracing::warn!(who = %who(cx), al = cmd.length, len = data.len(),
            "Authentication Receive: data length differs from AL");
        return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
    }
    let remote = cx.peer.remote.ip();
    let limiter = Arc::clone(cx.target.auth_failures());
    let who = who(cx);
    let Some(auth) = cx.auth.as_mut() else {
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    };
    let was_failed = auth.ctrl.has_failed();
    let pending_failure = !auth.ctrl.in_progress();
    let received = auth.ctrl.on_receive(cmd.length);
    auth.settle(Instant::now());
    match received {
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

#[cfg(test)]
mod tests {
    use super::*;

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
