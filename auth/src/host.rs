//! The host side of one DH-HMAC-CHAP transaction, without I/O (NVMe Base 2.0 §8.13.5, as the
//! Linux host driver `drivers/nvme/host/auth.c` runs it): for initiators written in Rust and
//! for driving the controller side end to end in tests.
//!
//! ```text
//! negotiate() ──Send──▶ … ◀──Recv── Challenge: reply(challenge) ──Send──▶
//! … ◀──Recv── Success1: success1(msg) → Some(Success2) to Send when bidirectional
//! ```

use subtle::ConstantTimeEq;
use thiserror::Error;
use zeroize::Zeroizing;

use crate::dh::{DhError, DhGroup, KeyPair};
use crate::hash::{self, HashId, ResponseInput};
use crate::key::Secret;
use crate::wire::{
    self, Challenge, Failure, MessageKind, Negotiate, ProtocolDescriptor, Reply, Success1,
    Success2, WireError,
};

#[derive(Debug, Error)]
pub enum HostError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Dh(#[from] DhError),
    /// The controller ended the transaction (reason code explanation, §8.13.5 Figure 558).
    #[error("controller sent AUTH_Failure1 (reason code explanation {0:#04x})")]
    Failure1(u8),
    #[error("transaction id {got}, expected {expected}")]
    TransactionId { got: u16, expected: u16 },
    #[error("the controller chose hash {0:#04x} or DH group {1:#04x}, not offered")]
    NotOffered(u8, u8),
    #[error("message {0:#04x}/{1:#04x} not expected now")]
    Unexpected(u8, u8),
    /// Bidirectional: R2 does not verify (wrong controller key, or an impostor).
    #[error("the controller's response R2 does not match")]
    ControllerResponse,
}

/// The host's keys and identity, and the state of its current transaction.
pub struct Host {
    host_key: Secret,
    /// Set: ask the controller to prove itself (bidirectional).
    ctrl_key: Option<Secret>,
    host_nqn: String,
    subsys_nqn: String,
    pub hashes: Vec<HashId>,
    pub dh_groups: Vec<DhGroup>,
    tid: u16,
    pending: Option<Pending>,
}

struct Pending {
    hash: HashId,
    c2: Option<(Zeroizing<Vec<u8>>, u32)>,
    shared: Option<Zeroizing<Vec<u8>>>,
}

impl Host {
    /// A host that offers every hash and every DH group, as Linux does.
    pub fn new(
        host_key: Secret,
        ctrl_key: Option<Secret>,
        host_nqn: impl Into<String>,
        subsys_nqn: impl Into<String>,
    ) -> Self {
        Self {
            host_key,
            ctrl_key,
            host_nqn: host_nqn.into(),
            subsys_nqn: subsys_nqn.into(),
            hashes: HashId::ALL.to_vec(),
            dh_groups: DhGroup::ALL.to_vec(),
            tid: 0,
            pending: None,
        }
    }

    /// AUTH_Negotiate starting transaction `tid`.
    pub fn negotiate(&mut self, tid: u16) -> Vec<u8> {
        self.tid = tid;
        self.pending = None;
        Negotiate {
            tid,
            sc_c: wire::SC_C_NONE,
            protocols: vec![ProtocolDescriptor {
                authid: wire::AUTHID_DHCHAP,
                hash_ids: self.hashes.iter().map(|h| h.id()).collect(),
                dh_ids: self.dh_groups.iter().map(|g| g.id()).collect(),
            }],
        }
        .encode()
        .expect("at most 3 hashes and 6 groups")
    }

    /// The Reply to the controller's Challenge (or its AUTH_Failure1 as an error).
    pub fn reply(&mut self, msg: &[u8]) -> Result<Vec<u8>, HostError> {
        failure1(msg)?;
        let ch = Challenge::decode(trimmed(msg, challenge_body_len))?;
        self.check_tid(ch.tid)?;
        let (Some(hash), Some(group)) =
            (HashId::from_id(ch.hash_id), DhGroup::from_id(ch.dh_group))
        else {
            return Err(HostError::NotOffered(ch.hash_id, ch.dh_group));
        };
        if !self.hashes.contains(&hash) || !self.dh_groups.contains(&group) {
            return Err(HostError::NotOffered(ch.hash_id, ch.dh_group));
        }
        let (dh_value, shared) = match group {
            DhGroup::Null => (Vec::new(), None),
            g => {
                let kp = KeyPair::generate(g)?;
                let shared = kp.shared_secret(&ch.dh_value)?;
                (kp.public().to_vec(), Some(shared))
            }
        };
        let challenge = match &shared {
            Some(s) => hash::augmented_challenge(hash, s, &ch.challenge),
            None => Zeroizing::new(ch.challenge.clone()),
        };
        let r1 = hash::host_response(
            &self.host_key.transformed(&self.host_nqn),
            &ResponseInput {
                hash,
                challenge: &challenge,
                seqnum: ch.seqnum,
                tid: self.tid,
                sc_c: wire::SC_C_NONE,
                host_nqn: &self.host_nqn,
                subsys_nqn: &self.subsys_nqn,
            },
        );
        let c2 = match self.ctrl_key {
            Some(_) => {
                let mut c2 = Zeroizing::new(vec![0u8; hash.digest_len()]);
                let mut s2 = [0u8; 4];
                getrandom::fill(&mut c2).map_err(DhError::Random)?;
                getrandom::fill(&mut s2).map_err(DhError::Random)?;
                // S2 = 0 would mean "no bidirectional authentication".
                Some((c2, u32::from_le_bytes(s2).max(1)))
            }
            None => None,
        };
        let reply = Reply {
            tid: self.tid,
            response: r1.to_vec(),
            challenge: c2.as_ref().map(|(c, _)| c.to_vec()),
            seqnum: c2.as_ref().map_or(0, |(_, s)| *s),
            dh_value,
        }
        .encode()
        .expect("HL and DHVLEN fit");
        self.pending = Some(Pending { hash, c2, shared });
        Ok(reply)
    }

    /// Checks Success1; returns the Success2 to send when the transaction is bidirectional.
    pub fn success1(&mut self, msg: &[u8]) -> Result<Option<Vec<u8>>, HostError> {
        failure1(msg)?;
        let s = Success1::decode(trimmed(msg, success1_body_len))?;
        self.check_tid(s.tid)?;
        let Some(p) = self.pending.take() else {
            return Err(HostError::Unexpected(msg[0], msg[1]));
        };
        let Some((c2, s2)) = &p.c2 else {
            return Ok(None);
        };
        let ctrl_key = self
            .ctrl_key
            .as_ref()
            .expect("c2 only with a controller key");
        let challenge = match &p.shared {
            Some(sh) => hash::augmented_challenge(p.hash, sh, c2),
            None => c2.clone(),
        };
        let expected = hash::controller_response(
            &ctrl_key.transformed(&self.subsys_nqn),
            &ResponseInput {
                hash: p.hash,
                challenge: &challenge,
                seqnum: *s2,
                tid: self.tid,
                sc_c: wire::SC_C_NONE,
                host_nqn: &self.host_nqn,
                subsys_nqn: &self.subsys_nqn,
            },
        );
        match s.response {
            Some(r2) if bool::from(expected.as_slice().ct_eq(&r2)) => {
                Ok(Some(Success2 { tid: self.tid }.encode()))
            }
            _ => Err(HostError::ControllerResponse),
        }
    }

    /// AUTH_Failure2 ending the current transaction (for instance after R2 did not verify).
    pub fn failure2(&self, explanation: u8) -> Vec<u8> {
        Failure {
            auth_id: wire::MSG_FAILURE2,
            tid: self.tid,
            reason_code: wire::FAILURE_REASON_FAILED,
            explanation,
        }
        .encode()
    }

    fn check_tid(&self, got: u16) -> Result<(), HostError> {
        if got != self.tid {
            return Err(HostError::TransactionId {
                got,
                expected: self.tid,
            });
        }
        Ok(())
    }
}

/// The message at the start of a host buffer of AL bytes (the rest is zero fill, §6.1):
/// header plus the body length its header gives, when that fits.
fn trimmed(msg: &[u8], body_len: fn(&[u8]) -> usize) -> &[u8] {
    if msg.len() < wire::DHCHAP_HEADER_LEN {
        return msg;
    }
    let len = wire::DHCHAP_HEADER_LEN + body_len(msg);
    &msg[..len.min(msg.len())]
}

/// Challenge: HL (byte 6) bytes of C1, then DHVLEN (bytes 10–11) bytes of g^x.
fn challenge_body_len(m: &[u8]) -> usize {
    usize::from(m[6]) + usize::from(u16::from_le_bytes([m[10], m[11]]))
}

/// Success1: HL (byte 6) bytes of R2 when RVALID (byte 8) is set.
fn success1_body_len(m: &[u8]) -> usize {
    if m[8] != 0 {
        usize::from(m[6])
    } else {
        0
    }
}

/// An AUTH_Failure1 from the controller, as an error.
fn failure1(msg: &[u8]) -> Result<(), HostError> {
    let kind = MessageKind::peek(msg)?;
    if (kind.auth_type, kind.auth_id) == (wire::AUTH_TYPE_COMMON, wire::MSG_FAILURE1) {
        let f = Failure::decode(&msg[..wire::FAILURE_LEN.min(msg.len())])?;
        return Err(HostError::Failure1(f.explanation));
    }
    Ok(())
}
