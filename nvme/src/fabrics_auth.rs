//! Fabrics Authentication Send (fctype 05h, NVMe Base 2.0 §6.2) and Authentication Receive
//! (fctype 06h, §6.1), and the Connect hook that asks a keyed host to authenticate (AUTHREQ),
//! driving one [`nvmfd_auth::Controller`] per queue (state in `auth`); the shape of Linux
//! `drivers/nvme/target/fabrics-cmd-auth.c`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use nvmfd_auth::wire::{AUTH_TYPE_COMMON, MSG_NEGOTIATE};
use nvmfd_auth::{check_receive, check_send, CommandError, CommandStatus, ReceiveError};

use crate::auth::{FailureLimiter, QueueAuth, CONNECT_AUTHREQ_ATR};
use crate::command::Completion;
use crate::controller::Controller;
use crate::peer::PeerInfo;
use crate::spec::fctype;
use crate::subsystem::Subsystem;
use crate::target::Target;
use crate::wire::{Sqe, Status};

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
}

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

/// Authentication Send (fctype 05h) or Receive (06h) on a connected queue.
pub(crate) fn execute(cx: &mut AuthContext, sqe: &Sqe, data: &mut [u8]) -> Completion {
    if sqe.fctype() == fctype::AUTHENTICATION_SEND {
        send(cx, sqe, data)
    } else {
        receive(cx, sqe, data)
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
fn who(cx: &AuthContext) -> String {
    format!(
        "host {} from {} to {} qid {}",
        cx.ctrl.hostnqn, cx.peer.remote, cx.subsys.nqn, cx.qid
    )
}

/// Authentication Send (NVMe Base 2.0 §6.2). The command succeeds whenever its fields are
/// right; a refused payload is answered by AUTH_Failure1 at the next Receive (as nvmet).
fn send(cx: &mut AuthContext, sqe: &Sqe, data: &[u8]) -> Completion {
    let cmd = AuthCommand::from_sqe(sqe);
    if cx.auth.is_none() {
        tracing::warn!(who = %who(cx), "Authentication Send on a queue without authentication");
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
    }
    if let Err(e) = check_send(cmd.secp, cmd.spsp0, cmd.spsp1, cmd.length) {
        tracing::warn!(who = %who(cx), "Authentication Send refused: {e}");
        return command_error(e);
    }
    // The payload is exactly TL bytes (nvmet: nvmet_check_transfer_len).
    if data.len() != cmd.length as usize {
        tracing::warn!(who = %who(cx), tl = cmd.length, len = data.len(),
            "Authentication Send: data length differs from TL");
        return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
    }
    let remote = cx.peer.remote.ip();
    let now = Instant::now();
    let limiter = Arc::clone(cx.target.auth_failures());
    let who = who(cx);
    let Some(auth) = cx.auth.as_mut() else {
        return Completion::fail(Status::INVALID_FIELD).at(OFFSET_SECP);
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
