//! The controller side of one queue's DH-HMAC-CHAP exchange, without I/O (NVMe Base 2.0 §8.13.5;
//! the flow of Linux `drivers/nvme/target/fabrics-cmd-auth.c`):
//!
//! ```text
//! host                                   controller (this state machine)
//! Send  AUTH_Negotiate           ──▶  on_send: pick hash and DH group    (Idle → SendChallenge)
//! Recv                           ◀──  on_receive: Challenge C1, S1, g^x  (→ AwaitReply)
//! Send  Reply R1 [C2, S2] g^y    ──▶  on_send: check R1                  (→ SendSuccess1)
//! Recv                           ◀──  on_receive: Success1 [R2]          (→ Idle, or AwaitSuccess2)
//! Send  Success2                 ──▶  on_send                            (→ Idle)
//! ```
//!
//! Any error in a Send payload is answered by AUTH_Failure1 with its reason code explanation at the
//! following Authentication Receive; the Send command itself completes successfully (as nvmet).
//!
//! The two exponentiations of a DH transaction (the controller's key pair, after AUTH_Negotiate;
//! the shared secret, after the Reply) are not run by the state machine: [`Controller::start_send`]
//! hands them out as a [`Work`], which the caller runs on any thread ([`Work::run`]) and
//! returns with [`Controller::computed`]. The Send completes only then, so the next message of
//! the host finds the transaction ready. [`Controller::on_send`] does both on the calling thread
//! (tests and tools).
//! AUTH_Negotiate is accepted at any point and starts a new transaction, which is how a host
//! re-authenticates a live queue; the queue stays authenticated until a transaction fails.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use thiserror::Error;
use zeroize::Zeroizing;

use crate::dh::{DhError, DhGroup, KeyPair};
use crate::hash::{self, HashId, ResponseInput};
use crate::key::Secret;
use crate::wire::{
    self, Challenge, Failure, FailureReason, MessageKind, Negotiate, Reply, Success1, Success2,
    WireError,
};

/// Largest Authentication Send payload this crate accepts: an AUTH_Negotiate with 255 protocol
/// descriptors, the largest message the format can express. Bound TL with it (via
/// [`check_send`]) before allocating the buffer.
pub const MAX_SEND_LEN: u32 =
    (wire::NEGOTIATE_HEADER_LEN + 255 * wire::PROTOCOL_DESCRIPTOR_LEN) as u32;

/// The authentication settings of one host on one subsystem.
#[derive(Debug, Clone)]
pub struct Config {
    /// The host's secret (DHCHAP key): the host proves it knows it.
    pub host_key: Secret,
    /// The controller's secret: with it, a host may ask the controller to prove itself
    /// (bidirectional authentication). Without it such a request fails.
    pub ctrl_key: Option<Secret>,
    /// Hash functions allowed, most preferred first.
    pub hashes: Vec<HashId>,
    /// DH groups allowed, most preferred first.
    pub dh_groups: Vec<DhGroup>,
    pub host_nqn: String,
    pub subsys_nqn: String,
}

/// The NVMe status an Authentication Send/Receive command completes with; the caller maps it onto
/// its status codes (NVMe Base 2.0 §4.6.1.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandStatus {
    Success,
    /// Invalid Field in Command, DNR set; the field is named by the error (for the error location).
    InvalidField,
    /// Internal Error.
    InternalError,
}

/// A command field of Authentication Send/Receive that is not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CommandError {
    #[error("SECP {0:#04x} is not in-band authentication (E9h)")]
    Secp(u8),
    #[error("SPSP0 {0:#04x}, must be 01h")]
    Spsp0(u8),
    #[error("SPSP1 {0:#04x}, must be 01h")]
    Spsp1(u8),
    #[error("transfer/allocation length {0} out of range")]
    Length(u32),
}

impl CommandError {
    /// Always Invalid Field in Command with DNR (as nvmet).
    pub fn status(&self) -> CommandStatus {
        CommandStatus::InvalidField
    }
}

/// Checks SECP, SPSP0, SPSP1 and TL of an Authentication Send before anything else (NVMe Base
/// 2.0 §6.2): TL must be 1..=[`MAX_SEND_LEN`], so it can size the payload buffer.
pub fn check_send(secp: u8, spsp0: u8, spsp1: u8, tl: u32) -> Result<(), CommandError> {
    check_fields(secp, spsp0, spsp1)?;
    if tl == 0 || tl > MAX_SEND_LEN {
        return Err(CommandError::Length(tl));
    }
    Ok(())
}

/// Checks SECP, SPSP0, SPSP1 and AL of an Authentication Receive (NVMe Base 2.0 §6.1). Any
/// non-zero AL is accepted: the returned message is at most a few KiB and the caller zero-fills
/// the rest of the host's buffer, so AL must not size an allocation.
pub fn check_receive(secp: u8, spsp0: u8, spsp1: u8, al: u32) -> Result<(), CommandError> {
    check_fields(secp, spsp0, spsp1)?;
    if al == 0 {
        return Err(CommandError::Length(al));
    }
    Ok(())
}

fn check_fields(secp: u8, spsp0: u8, spsp1: u8) -> Result<(), CommandError> {
    if secp != wire::SECP_AUTH {
        return Err(CommandError::Secp(secp));
    }
    if spsp0 != wire::SPSP0_AUTH {
        return Err(CommandError::Spsp0(spsp0));
    }
    if spsp1 != wire::SPSP1_AUTH {
        return Err(CommandError::Spsp1(spsp1));
    }
    Ok(())
}

/// What was wrong with a Send payload.
#[derive(Debug, Error)]
pub enum Cause {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("message {auth_type:#04x}/{auth_id:#04x} is not expected now")]
    UnexpectedMessage { auth_type: u8, auth_id: u8 },
    #[error("transaction id {got}, expected {expected}")]
    TransactionId { got: u16, expected: u16 },
    #[error("AUTH_Negotiate offers no authentication protocol")]
    NoProtocols,
    #[error("AUTH_Negotiate offers no DH-HMAC-CHAP descriptor")]
    NoDhchap,
    #[error("secure channel concatenation {0:#04x} requested; not supported")]
    Concatenation(u8),
    #[error("none of the hash functions offered is allowed")]
    NoHash,
    #[error("none of the DH groups offered is allowed")]
    NoDhGroup,
    #[error("hash length {got}, the negotiated hash has {expected}")]
    HashLength { got: usize, expected: usize },
    #[error("a DH value of {0} bytes with the NULL DH group")]
    UnexpectedDhValue(usize),
    #[error(transparent)]
    Dh(#[from] DhError),
    #[error("the host's response does not match")]
    ResponseMismatch,
    #[error("bidirectional authentication requested but no controller key is configured")]
    NoControllerKey,
    #[error("the host's challenge C2 equals C1")]
    ReflectedChallenge,
    #[error("refused by the caller's policy before any processing")]
    Refused,
    #[error("{0}")]
    Policy(String),
}

#[derive(Debug, Error)]
pub enum SendError {
    /// The payload was refused; the next Authentication Receive returns AUTH_Failure1 with `reason`.
    #[error("AUTH_Failure1 ({reason:?}) pending: {cause}")]
    Failure1 { reason: FailureReason, cause: Cause },
    /// The host ended the transaction with AUTH_Failure2 (for instance, our R2 did not verify).
    #[error("host sent AUTH_Failure2 (reason code explanation {explanation:#04x})")]
    HostFailure { explanation: u8 },
}

#[derive(Debug, Error)]
pub enum ReceiveError {
    /// The message does not fit the host's buffer; nothing changed, the host may retry larger.
    #[error("allocation length {al}, the message needs {need}")]
    AllocationLength { al: u32, need: usize },
    /// No randomness for the challenge or the DH key; nothing changed.
    #[error("cannot build the challenge: {0}")]
    Random(String),
}

impl ReceiveError {
    pub fn status(&self) -> CommandStatus {
        match self {
            // AL is a command field too small for the message; nothing was consumed, so the host
            // may retry. (nvmet fails such a command as well, with Internal Error or a transfer
            // length error depending on the step.)
            ReceiveError::AllocationLength { .. } => CommandStatus::InvalidField,
            ReceiveError::Random(_) => CommandStatus::InternalError,
        }
    }
}

/// The parameters and values of one authentication transaction.
struct Transaction {
    tid: u16,
    sc_c: u8,
    hash: HashId,
    group: DhGroup,
    /// Set once the Challenge is built.
    sent: Option<Sent>,
    /// Set once the Reply is checked: (C2, S2) when the host asked us to authenticate.
    bidirectional: Option<(Zeroizing<Vec<u8>>, u32)>,
    shared_secret: Option<Zeroizing<Vec<u8>>>,
    /// The controller's DH key pair (not NULL group), from the Negotiate until the Reply.
    keypair: Option<KeyPair>,
}

struct Sent {
    c1: Zeroizing<Vec<u8>>,
    s1: u32,
}

/// What a DH transaction waits for: one exponentiation, to run on any thread.
pub struct Work {
    serial: u64,
    kind: WorkKind,
}

enum WorkKind {
    /// The controller's key pair (after AUTH_Negotiate).
    KeyPair(DhGroup),
    /// The shared secret with the host's value (after the Reply); the key pair is used up.
    Shared { keypair: KeyPair, peer: Vec<u8> },
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.kind {
            WorkKind::KeyPair(g) => ("key pair", *g),
            WorkKind::Shared { keypair, .. } => ("shared secret", keypair.group()),
        };
        f.debug_struct("Work")
            .field("step", &what.0)
            .field("group", &what.1)
            .finish_non_exhaustive()
    }
}

impl Work {
    /// The exponentiation (milliseconds to hundreds of milliseconds: never on a thread that
    /// serves queues).
    pub fn run(self) -> Computed {
        let result = match self.kind {
            WorkKind::KeyPair(g) => KeyPair::generate(g).map(Value::KeyPair),
            WorkKind::Shared { keypair, peer } => keypair.shared_secret(&peer).map(Value::Shared),
        };
        Computed {
            serial: self.serial,
            result,
        }
    }

    /// The DH group the work is in.
    pub fn group(&self) -> DhGroup {
        match &self.kind {
            WorkKind::KeyPair(g) => *g,
            WorkKind::Shared { keypair, .. } => keypair.group(),
        }
    }
}

/// The result of a [`Work`], for [`Controller::computed`].
pub struct Computed {
    serial: u64,
    result: Result<Value, DhError>,
}

enum Value {
    KeyPair(KeyPair),
    Shared(Zeroizing<Vec<u8>>),
}

/// The parts of a Reply checked once the shared secret is known.
struct PendingReply {
    response: Vec<u8>,
    c2: Option<Vec<u8>>,
    s2: u32,
}

/// What a [`Work`] in flight is for.
enum Awaiting {
    KeyPair,
    Shared(PendingReply),
}

enum Step {
    /// No transaction; AUTH_Negotiate starts one.
    Idle,
    /// A [`Work`] is out; [`Controller::computed`] goes on.
    Computing {
        tx: Transaction,
        serial: u64,
        awaiting: Awaiting,
    },
    /// Negotiated; the next Receive returns the Challenge.
    SendChallenge(Transaction),
    /// Challenge returned; the host sends its Reply.
    AwaitReply(Transaction),
    /// Reply verified; the next Receive returns Success1.
    SendSuccess1(Transaction),
    /// Success1 with R2 returned; the host sends Success2 (or Failure2).
    AwaitSuccess2 { tid: u16 },
    /// The next Receive returns AUTH_Failure1.
    SendFailure1 { tid: u16, reason: FailureReason },
}

/// One queue's authentication state.
pub struct Controller {
    config: Arc<Config>,
    step: Step,
    authenticated: bool,
    failed: bool,
    seqnum: u32,
    /// Numbers each [`Work`], so that a result can only complete the step that asked for it.
    serial: u64,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("host_nqn", &self.config.host_nqn)
            .field("authenticated", &self.authenticated)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Controller {
    pub fn new(config: Arc<Config>) -> Self {
        Self {
            config,
            step: Step::Idle,
            authenticated: false,
            failed: false,
            seqnum: 0,
            serial: 0,
        }
    }

    /// Whether the queue has completed an authentication transaction and none has failed since.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether the last transaction ended in failure (AUTH_Failure1 returned or AUTH_Failure2
    /// received). nvmet treats this as a fatal controller error; cleared by the next Negotiate.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// Whether a transaction is under way (the caller runs a timeout for it: nvmet uses KATO, or
    /// 120 s without one, then calls [`Controller::abandon`]).
    pub fn in_progress(&self) -> bool {
        !matches!(self.step, Step::Idle)
    }

    /// Whether a [`Work`] handed out is not back yet.
    pub fn is_computing(&self) -> bool {
        matches!(self.step, Step::Computing { .. })
    }

    /// Drops a stalled transaction; the authentication state of the queue is unchanged (a
    /// [`Work`] still out is then ignored when it comes back).
    pub fn abandon(&mut self) {
        self.step = Step::Idle;
    }

    /// The settings in force.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// New settings (a rotated key): they apply from the next transaction, so a transaction
    /// under way is dropped; the authentication state of the queue is unchanged.
    pub fn set_config(&mut self, config: Arc<Config>) {
        self.config = config;
        self.step = Step::Idle;
    }

    /// Refuses an Authentication Send payload without processing it (the caller's policy, for
    /// instance a source address that failed too often): the transaction fails as if the
    /// payload had been wrong, and the next Receive returns AUTH_Failure1 "failed".
    pub fn refuse(&mut self, payload: &[u8]) -> SendError {
        let tid = wire::peek_tid(payload).unwrap_or(0);
        self.fail(tid, FailureReason::Failed, Cause::Refused)
    }

    /// An Authentication Send payload (the whole TL bytes), with any exponentiation it needs
    /// run on the calling thread: for tests and tools; a server uses
    /// [`start_send`](Self::start_send).
    pub fn on_send(&mut self, payload: &[u8]) -> Result<(), SendError> {
        match self.start_send(payload)? {
            Some(work) => self.computed(work.run()),
            None => Ok(()),
        }
    }

    /// An Authentication Send payload (the whole TL bytes). The command completes with
    /// [`CommandStatus::Success`] whatever this returns: an error is reported to the host by the
    /// AUTH_Failure1 of the next Receive, and returned here for the log (the caller logs it).
    /// `Ok(Some(work))`: the payload is accepted so far and the transaction needs `work` run
    /// (off any thread that serves queues) and handed to [`computed`](Self::computed) before the
    /// command completes and before any other Send or Receive of this queue.
    pub fn start_send(&mut self, payload: &[u8]) -> Result<Option<Work>, SendError> {
        if let Step::Computing { tx, .. } = &self.step {
            // The caller holds further commands while a Work is out; one that does not gets
            // the transaction failed, not a second computation.
            let tid = tx.tid;
            let kind = MessageKind::peek(payload).unwrap_or(MessageKind {
                auth_type: 0,
                auth_id: 0,
            });
            let cause = Cause::UnexpectedMessage {
                auth_type: kind.auth_type,
                auth_id: kind.auth_id,
            };
            return Err(self.fail(tid, FailureReason::IncorrectMessage, cause));
        }
        self.handle_send(payload)
    }

    /// The result of the [`Work`] the last [`start_send`](Self::start_send) returned; the Send
    /// completes after this (with the same meaning of `Err` as there). A result for a step that
    /// is no longer current (abandoned, or a new transaction) is dropped: `Ok(())`.
    pub fn computed(&mut self, done: Computed) -> Result<(), SendError> {
        let (tx, awaiting) = match std::mem::replace(&mut self.step, Step::Idle) {
            Step::Computing {
                tx,
                serial,
                awaiting,
            } if serial == done.serial => (tx, awaiting),
            other => {
                self.step = other;
                return Ok(());
            }
        };
        let tid = tx.tid;
        let r = match (awaiting, done.result) {
            (Awaiting::KeyPair, Ok(Value::KeyPair(kp))) => {
                let mut tx = tx;
                tx.keypair = Some(kp);
                self.step = Step::SendChallenge(tx);
                Ok(())
            }
            (Awaiting::Shared(reply), Ok(Value::Shared(z))) => self.verify(tx, reply, Some(z)),
            (_, Err(e)) => {
                let reason = match e {
                    DhError::PeerLength { .. } => FailureReason::IncorrectPayload,
                    DhError::PeerOutOfRange => FailureReason::DhGroupUnusable,
                    _ => FailureReason::Failed,
                };
                Err((reason, e.into()))
            }
            (_, Ok(_)) => unreachable!("a Work's result is of its own kind"),
        };
        r.map_err(|(reason, cause)| self.fail(tid, reason, cause))
    }

    /// Fails the transaction under way for a reason of the caller's (its worker pool is full,
    /// the host's address has too many transactions): the next Receive returns
    /// AUTH_Failure1 "failed". Returns the error to log.
    pub fn fail_by_policy(&mut self, payload: &[u8], why: String) -> SendError {
        let tid = self
            .current_tid()
            .unwrap_or_else(|| wire::peek_tid(payload).unwrap_or(0));
        self.fail(tid, FailureReason::Failed, Cause::Policy(why))
    }

    fn next_work(&mut self, tx: Transaction, awaiting: Awaiting, kind: WorkKind) -> Work {
        self.serial = self.serial.wrapping_add(1);
        let serial = self.serial;
        self.step = Step::Computing {
            tx,
            serial,
            awaiting,
        };
        Work { serial, kind }
    }

    /// An Authentication Receive with allocation length `al`: the message to return. It may be
    /// shorter than `al`; the rest of the host buffer is zero (as nvmet).
    pub fn on_receive(&mut self, al: u32) -> Result<Vec<u8>, ReceiveError> {
        let step = std::mem::replace(&mut self.step, Step::Idle);
        let (result, next) = self.handle_receive(step, al);
        self.step = next;
        result
    }

    fn handle_send(&mut self, p: &[u8]) -> Result<Option<Work>, SendError> {
        let tid_hint = wire::peek_tid(p).unwrap_or(0);
        let kind = match MessageKind::peek(p) {
            Ok(kind) => kind,
            Err(e) => return Err(self.fail(tid_hint, FailureReason::IncorrectPayload, e.into())),
        };
        match (kind.auth_type, kind.auth_id) {
            (wire::AUTH_TYPE_COMMON, wire::MSG_NEGOTIATE) => self.negotiate(p, tid_hint),
            (wire::AUTH_TYPE_COMMON, wire::MSG_FAILURE2) => {
                self.host_failure(p, tid_hint).map(|()| None)
            }
            (wire::AUTH_TYPE_DHCHAP, wire::MSG_REPLY) => {
                let tx = match std::mem::replace(&mut self.step, Step::Idle) {
                    Step::AwaitReply(tx) => tx,
                    other => {
                        self.step = other;
                        return Err(self.unexpected(kind, tid_hint));
                    }
                };
                let tid = tx.tid;
                self.reply(tx, p)
                    .map_err(|(reason, cause)| self.fail(tid, reason, cause))
            }
            (wire::AUTH_TYPE_DHCHAP, wire::MSG_SUCCESS2) => {
                let Step::AwaitSuccess2 { tid } = self.step else {
                    return Err(self.unexpected(kind, tid_hint));
                };
                if tid_hint != tid {
                    let cause = Cause::TransactionId {
                        got: tid_hint,
                        expected: tid,
                    };
                    return Err(self.fail(tid, FailureReason::IncorrectPayload, cause));
                }
                if let Err(e) = Success2::decode(p) {
                    return Err(self.fail(tid, FailureReason::IncorrectPayload, e.into()));
                }
                self.authenticated = true;
                self.step = Step::Idle;
                tracing::debug!(host = %self.config.host_nqn, "authenticated (bidirectional)");
                Ok(None)
            }
            _ => Err(self.unexpected(kind, tid_hint)),
        }
    }

    fn current_tid(&self) -> Option<u16> {
        match &self.step {
            Step::Idle => None,
            Step::Computing { tx, .. }
            | Step::SendChallenge(tx)
            | Step::AwaitReply(tx)
            | Step::SendSuccess1(tx) => Some(tx.tid),
            Step::AwaitSuccess2 { tid } | Step::SendFailure1 { tid, .. } => Some(*tid),
        }
    }

    fn unexpected(&mut self, kind: MessageKind, tid_hint: u16) -> SendError {
        let tid = self.current_tid().unwrap_or(tid_hint);
        let cause = Cause::UnexpectedMessage {
            auth_type: kind.auth_type,
            auth_id: kind.auth_id,
        };
        self.fail(tid, FailureReason::IncorrectMessage, cause)
    }

    fn fail(&mut self, tid: u16, reason: FailureReason, cause: Cause) -> SendError {
        // A failed transaction ends the queue's authentication at once, not only when the host
        // fetches AUTH_Failure1 (it might never do so).
        self.authenticated = false;
        self.step = Step::SendFailure1 { tid, reason };
        SendError::Failure1 { reason, cause }
    }

    fn negotiate(&mut self, p: &[u8], tid: u16) -> Result<Option<Work>, SendError> {
        self.failed = false;
        let (reason, cause) = match self.select(p) {
            Ok(tx) => {
                tracing::debug!(
                    host = %self.config.host_nqn,
                    hash = tx.hash.hmac_name(),
                    dhgroup = tx.group.name(),
                    "authentication negotiated"
                );
                if tx.group == DhGroup::Null {
                    self.step = Step::SendChallenge(tx);
                    return Ok(None);
                }
                let group = tx.group;
                return Ok(Some(self.next_work(
                    tx,
                    Awaiting::KeyPair,
                    WorkKind::KeyPair(group),
                )));
            }
            Err(e) => e,
        };
        Err(self.fail(tid, reason, cause))
    }

    /// NVMe Base 2.0 §8.13.5: the controller picks one hash function and one DH group from the
    /// host's lists; here the first of the configured preference order that the host offers.
    fn select(&self, p: &[u8]) -> Result<Transaction, (FailureReason, Cause)> {
        let n = Negotiate::decode(p).map_err(|e| (FailureReason::IncorrectPayload, e.into()))?;
        if n.sc_c != wire::SC_C_NONE {
            // Secure channel concatenation (TLS PSK generation) is not implemented.
            return Err((FailureReason::ConcatMismatch, Cause::Concatenation(n.sc_c)));
        }
        if n.protocols.is_empty() {
            return Err((FailureReason::IncorrectPayload, Cause::NoProtocols));
        }
        let desc = n
            .protocols
            .iter()
            .find(|d| d.authid == wire::AUTHID_DHCHAP)
            .ok_or((FailureReason::ProtocolNotUsable, Cause::NoDhchap))?;
        let hash = *self
            .config
            .hashes
            .iter()
            .find(|h| desc.hash_ids.contains(&h.id()))
            .ok_or((FailureReason::HashUnusable, Cause::NoHash))?;
        let group = *self
            .config
            .dh_groups
            .iter()
            .find(|g| desc.dh_ids.contains(&g.id()))
            .ok_or((FailureReason::DhGroupUnusable, Cause::NoDhGroup))?;
        Ok(Transaction {
            tid: n.tid,
            sc_c: n.sc_c,
            hash,
            group,
            sent: None,
            bidirectional: None,
            shared_secret: None,
            keypair: None,
        })
    }

    fn host_failure(&mut self, p: &[u8], tid_hint: u16) -> Result<(), SendError> {
        let f = match Failure::decode(p) {
            Ok(f) => f,
            Err(e) => {
                let tid = self.current_tid().unwrap_or(tid_hint);
                return Err(self.fail(tid, FailureReason::IncorrectPayload, e.into()));
            }
        };
        self.step = Step::Idle;
        self.authenticated = false;
        self.failed = true;
        Err(SendError::HostFailure {
            explanation: f.explanation,
        })
    }

    /// NVMe Base 2.0 §8.13.5: check the Reply's form and the host's DH value; the shared
    /// secret is then a [`Work`], after which [`verify`](Self::verify) checks R1.
    fn reply(
        &mut self,
        mut tx: Transaction,
        p: &[u8],
    ) -> Result<Option<Work>, (FailureReason, Cause)> {
        let got = wire::peek_tid(p).map_err(|e| (FailureReason::IncorrectPayload, e.into()))?;
        if got != tx.tid {
            // nvmet answers a wrong T_ID with "Incorrect payload".
            let cause = Cause::TransactionId {
                got,
                expected: tx.tid,
            };
            return Err((FailureReason::IncorrectPayload, cause));
        }
        let r = Reply::decode(p).map_err(|e| (FailureReason::IncorrectPayload, e.into()))?;
        let hl = tx.hash.digest_len();
        if r.response.len() != hl {
            let cause = Cause::HashLength {
                got: r.response.len(),
                expected: hl,
            };
            return Err((FailureReason::IncorrectPayload, cause));
        }
        let reply = PendingReply {
            response: r.response,
            c2: r.challenge,
            s2: r.seqnum,
        };
        match tx.keypair.take() {
            None if !r.dh_value.is_empty() => {
                let cause = Cause::UnexpectedDhValue(r.dh_value.len());
                Err((FailureReason::IncorrectPayload, cause))
            }
            None => self.verify(tx, reply, None).map(|()| None),
            Some(keypair) => {
                // The host's value is checked here, before any work is queued for it.
                if let Err(e) = tx.group.check_peer(&r.dh_value) {
                    let reason = match e {
                        DhError::PeerLength { .. } => FailureReason::IncorrectPayload,
                        _ => FailureReason::DhGroupUnusable,
                    };
                    return Err((reason, e.into()));
                }
                let kind = WorkKind::Shared {
                    keypair,
                    peer: r.dh_value,
                };
                Ok(Some(self.next_work(tx, Awaiting::Shared(reply), kind)))
            }
        }
    }

    /// Checks R1 (with the shared secret of a DH group); notes C2/S2 if the host wants us to
    /// authenticate.
    fn verify(
        &mut self,
        mut tx: Transaction,
        r: PendingReply,
        shared: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<(), (FailureReason, Cause)> {
        let tid = tx.tid;
        let sent = tx.sent.as_ref().expect("AwaitReply follows the Challenge");
        let challenge = match &shared {
            None => sent.c1.clone(),
            Some(z) => hash::augmented_challenge(tx.hash, z, &sent.c1),
        };
        let s1 = sent.s1;
        let key = self.config.host_key.transformed(&self.config.host_nqn);
        let expected = hash::host_response(
            &key,
            &ResponseInput {
                hash: tx.hash,
                challenge: &challenge,
                seqnum: s1,
                tid,
                sc_c: tx.sc_c,
                host_nqn: &self.config.host_nqn,
                subsys_nqn: &self.config.subsys_nqn,
            },
        );
        if !bool::from(expected.as_slice().ct_eq(&r.response)) {
            return Err((FailureReason::Failed, Cause::ResponseMismatch));
        }
        // S2 = 0 means no bidirectional authentication even if C2 is present (C2 then only feeds
        // secure channel concatenation, which is not supported; nvmet ignores it too).
        if let (Some(c2), true) = (r.c2, r.s2 != 0) {
            if self.config.ctrl_key.is_none() {
                return Err((FailureReason::Failed, Cause::NoControllerKey));
            }
            if bool::from(c2.as_slice().ct_eq(&sent.c1)) {
                // A host echoing C1 would obtain our response to our own challenge.
                return Err((FailureReason::Failed, Cause::ReflectedChallenge));
            }
            tx.bidirectional = Some((Zeroizing::new(c2), r.s2));
        }
        tx.shared_secret = shared;
        self.step = Step::SendSuccess1(tx);
        Ok(())
    }

    fn handle_receive(&mut self, step: Step, al: u32) -> (Result<Vec<u8>, ReceiveError>, Step) {
        match step {
            Step::SendChallenge(tx) => self.challenge(tx, al),
            Step::SendSuccess1(tx) => self.success1(tx, al),
            Step::SendFailure1 { tid, reason } => self.failure1(tid, reason, al, step),
            Step::Idle
            | Step::AwaitReply(_)
            | Step::AwaitSuccess2 { .. }
            | Step::Computing { .. } => {
                // A Receive with nothing to return: nvmet answers AUTH_Failure1 "failed".
                let tid = match &step {
                    Step::AwaitReply(tx) | Step::Computing { tx, .. } => tx.tid,
                    Step::AwaitSuccess2 { tid } => *tid,
                    _ => 0,
                };
                tracing::debug!(host = %self.config.host_nqn, "authentication receive out of sequence");
                self.failure1(tid, FailureReason::Failed, al, step)
            }
        }
    }

    fn failure1(
        &mut self,
        tid: u16,
        reason: FailureReason,
        al: u32,
        unchanged: Step,
    ) -> (Result<Vec<u8>, ReceiveError>, Step) {
        if (al as usize) < wire::FAILURE_LEN {
            let e = ReceiveError::AllocationLength {
                al,
                need: wire::FAILURE_LEN,
            };
            return (Err(e), unchanged);
        }
        self.authenticated = false;
        self.failed = true;
        let msg = Failure {
            auth_id: wire::MSG_FAILURE1,
            tid,
            reason_code: wire::FAILURE_REASON_FAILED,
            explanation: reason as u8,
        };
        (Ok(msg.encode()), Step::Idle)
    }

    fn next_seqnum(&mut self) -> Result<u32, ReceiveError> {
        // NVMe Base 2.0 §8.13.5: S1 is never 0; start at a random value and count up (as the
        // kernel's nvme_auth_get_seqnum).
        if self.seqnum == 0 {
            let mut b = [0u8; 4];
            getrandom::fill(&mut b).map_err(|e| ReceiveError::Random(e.to_string()))?;
            self.seqnum = u32::from_le_bytes(b);
        } else {
            self.seqnum = self.seqnum.wrapping_add(1);
        }
        if self.seqnum == 0 {
            self.seqnum = 1;
        }
        Ok(self.seqnum)
    }

    fn challenge(&mut self, mut tx: Transaction, al: u32) -> (Result<Vec<u8>, ReceiveError>, Step) {
        let hl = tx.hash.digest_len();
        let need = wire::DHCHAP_HEADER_LEN + hl + tx.group.key_size();
        if (al as usize) < need {
            return (
                Err(ReceiveError::AllocationLength { al, need }),
                Step::SendChallenge(tx),
            );
        }
        let built = (|| {
            let mut c1 = Zeroizing::new(vec![0u8; hl]);
            getrandom::fill(&mut c1).map_err(|e| ReceiveError::Random(e.to_string()))?;
            let s1 = self.next_seqnum()?;
            Ok(Sent { c1, s1 })
        })();
        let sent = match built {
            Ok(sent) => sent,
            Err(e) => return (Err(e), Step::SendChallenge(tx)),
        };
        let msg = Challenge {
            tid: tx.tid,
            hash_id: tx.hash.id(),
            dh_group: tx.group.id(),
            seqnum: sent.s1,
            challenge: sent.c1.to_vec(),
            dh_value: tx
                .keypair
                .as_ref()
                .map_or_else(Vec::new, |k| k.public().to_vec()),
        };
        debug_assert_eq!(msg.encoded_len(), need);
        let bytes = msg.encode().expect("HL and DHVLEN fit their fields");
        tx.sent = Some(sent);
        (Ok(bytes), Step::AwaitReply(tx))
    }

    fn success1(&mut self, tx: Transaction, al: u32) -> (Result<Vec<u8>, ReceiveError>, Step) {
        let hl = tx.hash.digest_len();
        let need = wire::DHCHAP_HEADER_LEN + if tx.bidirectional.is_some() { hl } else { 0 };
        if (al as usize) < need {
            return (
                Err(ReceiveError::AllocationLength { al, need }),
                Step::SendSuccess1(tx),
            );
        }
        let response = tx.bidirectional.as_ref().map(|(c2, s2)| {
            // Checked when the Reply was accepted.
            let ctrl_key = self.config.ctrl_key.as_ref().expect("controller key");
            let challenge = match &tx.shared_secret {
                Some(shared) => hash::augmented_challenge(tx.hash, shared, c2),
                None => c2.clone(),
            };
            let key = ctrl_key.transformed(&self.config.subsys_nqn);
            hash::controller_response(
                &key,
                &ResponseInput {
                    hash: tx.hash,
                    challenge: &challenge,
                    seqnum: *s2,
                    tid: tx.tid,
                    sc_c: tx.sc_c,
                    host_nqn: &self.config.host_nqn,
                    subsys_nqn: &self.config.subsys_nqn,
                },
            )
            .to_vec()
        });
        let msg = Success1 {
            tid: tx.tid,
            hash_len: hl as u8,
            response,
        };
        debug_assert_eq!(msg.encoded_len(), need);
        let bytes = msg.encode().expect("R2 has the hash length");
        if tx.bidirectional.is_some() {
            (Ok(bytes), Step::AwaitSuccess2 { tid: tx.tid })
        } else {
            self.authenticated = true;
            tracing::debug!(host = %self.config.host_nqn, "authenticated");
            (Ok(bytes), Step::Idle)
        }
    }
}
