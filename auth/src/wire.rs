//! The in-band authentication constants and the AUTH message layouts (NVMe Base 2.0 §8.13.5;
//! the same layouts as `struct nvmf_auth_dhchap_*_data` in Linux `include/linux/nvme.h`).
//!
//! Every message has one `decode`/`encode` pair here. Decoding never trusts a length field: each one
//! is checked against the bytes the host actually sent, and a payload longer than its fields say is
//! refused too, so a message has exactly one valid encoding.

use thiserror::Error;

/// SECP of Authentication Send/Receive for in-band authentication (NVMe Base 2.0 §6.2, §6.1).
pub const SECP_AUTH: u8 = 0xe9;
/// SPSP0 and SPSP1 of Authentication Send/Receive for in-band authentication.
pub const SPSP0_AUTH: u8 = 0x01;
pub const SPSP1_AUTH: u8 = 0x01;

/// AUTH_Type: messages common to every authentication protocol (Negotiate, Failure1/2).
pub const AUTH_TYPE_COMMON: u8 = 0x00;
/// AUTH_Type: DH-HMAC-CHAP protocol messages.
pub const AUTH_TYPE_DHCHAP: u8 = 0x01;

/// AUTH_Id values (NVMe Base 2.0 §8.13.5, Figure "Authentication message identifiers").
pub const MSG_NEGOTIATE: u8 = 0x00;
pub const MSG_CHALLENGE: u8 = 0x01;
pub const MSG_REPLY: u8 = 0x02;
pub const MSG_SUCCESS1: u8 = 0x03;
pub const MSG_SUCCESS2: u8 = 0x04;
pub const MSG_FAILURE2: u8 = 0xf0;
pub const MSG_FAILURE1: u8 = 0xf1;

/// Authentication protocol identifier of DH-HMAC-CHAP in an AUTH_Negotiate protocol descriptor.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// SC_C (secure channel concatenation): none.
pub const SC_C_NONE: u8 = 0x00;

/// Hash function identifiers (HashID; NVMe Base 2.0 §8.13.5).
pub const HASH_SHA256: u8 = 0x01;
pub const HASH_SHA384: u8 = 0x02;
pub const HASH_SHA512: u8 = 0x03;

/// DH group identifiers (DHgID; NVMe Base 2.0 §8.13.5).
pub const DHGROUP_NULL: u8 = 0x00;
pub const DHGROUP_FFDHE2048: u8 = 0x01;
pub const DHGROUP_FFDHE3072: u8 = 0x02;
pub const DHGROUP_FFDHE4096: u8 = 0x03;
pub const DHGROUP_FFDHE6144: u8 = 0x04;
pub const DHGROUP_FFDHE8192: u8 = 0x05;

/// AUTH_Failure reason code: "Authentication failure" (the only one defined).
pub const FAILURE_REASON_FAILED: u8 = 0x01;

/// AUTH_Failure reason code explanations (NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FailureReason {
    /// Authentication failed (wrong response, missing key).
    Failed = 0x01,
    /// Authentication protocol not usable.
    ProtocolNotUsable = 0x02,
    /// Secure channel concatenation mismatch.
    ConcatMismatch = 0x03,
    /// Hash function not usable.
    HashUnusable = 0x04,
    /// DH group not usable.
    DhGroupUnusable = 0x05,
    /// Incorrect payload.
    IncorrectPayload = 0x06,
    /// Incorrect protocol message.
    IncorrectMessage = 0x07,
}

impl FailureReason {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => Self::Failed,
            0x02 => Self::ProtocolNotUsable,
            0x03 => Self::ConcatMismatch,
            0x04 => Self::HashUnusable,
            0x05 => Self::DhGroupUnusable,
            0x06 => Self::IncorrectPayload,
            0x07 => Self::IncorrectMessage,
            _ => return None,
        })
    }
}

/// Size of the common AUTH_Negotiate header (before the protocol descriptors).
pub const NEGOTIATE_HEADER_LEN: usize = 8;
/// Size of one AUTH_Negotiate protocol descriptor.
pub const PROTOCOL_DESCRIPTOR_LEN: usize = 64;
/// Hash identifiers a DH-HMAC-CHAP descriptor can carry (idlist[0..30]).
pub const MAX_HASH_IDS: usize = 30;
/// DH group identifiers a DH-HMAC-CHAP descriptor can carry (idlist[30..60]).
pub const MAX_DH_IDS: usize = 30;
/// Header size of DH-HMAC-CHAP_Challenge, _Reply, _Success1 and _Success2.
pub const DHCHAP_HEADER_LEN: usize = 16;
/// Size of AUTH_Failure1 and AUTH_Failure2.
pub const FAILURE_LEN: usize = 8;

/// Why a payload could not be decoded; every variant maps to the "Incorrect payload" reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("{what}: {len} bytes, need at least {need}")]
    Short {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("{what}: {len} bytes, the length fields say {expected}")]
    LengthMismatch {
        what: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("{what}: {field} is {value}, at most {max}")]
    FieldTooLarge {
        what: &'static str,
        field: &'static str,
        value: usize,
        max: usize,
    },
    #[error("{what}: {field} is {value:#x}, not a defined value")]
    BadValue {
        what: &'static str,
        field: &'static str,
        value: u8,
    },
}

/// The first four bytes every AUTH message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageKind {
    pub auth_type: u8,
    pub auth_id: u8,
}

impl MessageKind {
    pub fn peek(payload: &[u8]) -> Result<Self, WireError> {
        match payload {
            [auth_type, auth_id, ..] => Ok(Self {
                auth_type: *auth_type,
                auth_id: *auth_id,
            }),
            _ => Err(WireError::Short {
                what: "AUTH message",
                len: payload.len(),
                need: 2,
            }),
        }
    }
}

/// Transaction identifier (T_ID) at bytes 4..6 of every AUTH message.
pub fn peek_tid(payload: &[u8]) -> Result<u16, WireError> {
    match payload {
        [_, _, _, _, lo, hi, ..] => Ok(u16::from_le_bytes([*lo, *hi])),
        _ => Err(WireError::Short {
            what: "AUTH message",
            len: payload.len(),
            need: 6,
        }),
    }
}

fn need(what: &'static str, payload: &[u8], need: usize) -> Result<(), WireError> {
    if payload.len() < need {
        return Err(WireError::Short {
            what,
            len: payload.len(),
            need,
        });
    }
    Ok(())
}

fn exact(what: &'static str, payload: &[u8], expected: usize) -> Result<(), WireError> {
    if payload.len() != expected {
        return Err(WireError::LengthMismatch {
            what,
            len: payload.len(),
            expected,
        });
    }
    Ok(())
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn header(out: &mut Vec<u8>, auth_type: u8, auth_id: u8, tid: u16) {
    out.extend_from_slice(&[auth_type, auth_id, 0, 0]);
    out.extend_from_slice(&tid.to_le_bytes());
}

/// One AUTH_Negotiate protocol descriptor (64 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolDescriptor {
    pub authid: u8,
    /// Offered hash identifiers (HALEN of them, at most 30).
    pub hash_ids: Vec<u8>,
    /// Offered DH group identifiers (DHLEN of them, at most 30).
    pub dh_ids: Vec<u8>,
}

/// AUTH_Negotiate (host to controller; NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub tid: u16,
    pub sc_c: u8,
    pub protocols: Vec<ProtocolDescriptor>,
}

impl Negotiate {
    const WHAT: &'static str = "AUTH_Negotiate";

    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        need(Self::WHAT, p, NEGOTIATE_HEADER_LEN)?;
        let napd = usize::from(p[7]);
        exact(
            Self::WHAT,
            p,
            NEGOTIATE_HEADER_LEN + napd * PROTOCOL_DESCRIPTOR_LEN,
        )?;
        let protocols = p[NEGOTIATE_HEADER_LEN..]
            .chunks_exact(PROTOCOL_DESCRIPTOR_LEN)
            .map(|d| {
                let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                if halen > MAX_HASH_IDS {
                    return Err(WireError::FieldTooLarge {
                        what: Self::WHAT,
                        field: "HALEN",
                        value: halen,
                        max: MAX_HASH_IDS,
                    });
                }
                if dhlen > MAX_DH_IDS {
                    return Err(WireError::FieldTooLarge {
                        what: Self::WHAT,
                        field: "DHLEN",
                        value: dhlen,
                        max: MAX_DH_IDS,
                    });
                }
                let ids = &d[4..];
                Ok(ProtocolDescriptor {
                    authid: d[0],
                    hash_ids: ids[..halen].to_vec(),
                    dh_ids: ids[MAX_HASH_IDS..MAX_HASH_IDS + dhlen].to_vec(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            tid: le16(p, 4),
            sc_c: p[6],
            protocols,
        })
    }

    /// Encodes the message; `None` when a field does not fit its wire width.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let napd = u8::try_from(self.protocols.len()).ok()?;
        let mut out = Vec::with_capacity(NEGOTIATE_HEADER_LEN + self.protocols.len() * 64);
        header(&mut out, AUTH_TYPE_COMMON, MSG_NEGOTIATE, self.tid);
        out.extend_from_slice(&[self.sc_c, napd]);
        for d in &self.protocols {
            if d.hash_ids.len() > MAX_HASH_IDS || d.dh_ids.len() > MAX_DH_IDS {
                return None;
            }
            let mut desc = [0u8; PROTOCOL_DESCRIPTOR_LEN];
            desc[0] = d.authid;
            desc[2] = d.hash_ids.len() as u8;
            desc[3] = d.dh_ids.len() as u8;
            desc[4..4 + d.hash_ids.len()].copy_from_slice(&d.hash_ids);
            desc[4 + MAX_HASH_IDS..4 + MAX_HASH_IDS + d.dh_ids.len()].copy_from_slice(&d.dh_ids);
            out.extend_from_slice(&desc);
        }
        debug_assert_eq!(out.len(), NEGOTIATE_HEADER_LEN + self.protocols.len() * 64);
        Some(out)
    }
}

/// DH-HMAC-CHAP_Challenge (controller to host; NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub tid: u16,
    pub hash_id: u8,
    pub dh_group: u8,
    pub seqnum: u32,
    /// C1, HL bytes.
    pub challenge: Vec<u8>,
    /// The controller's DH public value g^x mod p (DHVLEN bytes; empty for the NULL group).
    pub dh_value: Vec<u8>,
}

impl Challenge {
    const WHAT: &'static str = "DH-HMAC-CHAP_Challenge";

    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        need(Self::WHAT, p, DHCHAP_HEADER_LEN)?;
        let hl = usize::from(p[6]);
        let dhvlen = usize::from(le16(p, 10));
        exact(Self::WHAT, p, DHCHAP_HEADER_LEN + hl + dhvlen)?;
        let body = &p[DHCHAP_HEADER_LEN..];
        Ok(Self {
            tid: le16(p, 4),
            hash_id: p[8],
            dh_group: p[9],
            seqnum: le32(p, 12),
            challenge: body[..hl].to_vec(),
            dh_value: body[hl..].to_vec(),
        })
    }

    /// Encoded size, checked by the caller against the host's allocation length.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + self.challenge.len() + self.dh_value.len()
    }

    pub fn encode(&self) -> Option<Vec<u8>> {
        let hl = u8::try_from(self.challenge.len()).ok()?;
        let dhvlen = u16::try_from(self.dh_value.len()).ok()?;
        let mut out = Vec::with_capacity(self.encoded_len());
        header(&mut out, AUTH_TYPE_DHCHAP, MSG_CHALLENGE, self.tid);
        out.extend_from_slice(&[hl, 0, self.hash_id, self.dh_group]);
        out.extend_from_slice(&dhvlen.to_le_bytes());
        out.extend_from_slice(&self.seqnum.to_le_bytes());
        debug_assert_eq!(out.len(), DHCHAP_HEADER_LEN);
        out.extend_from_slice(&self.challenge);
        out.extend_from_slice(&self.dh_value);
        Some(out)
    }
}

/// DH-HMAC-CHAP_Reply (host to controller; NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub tid: u16,
    /// The host's response R1 (HL bytes).
    pub response: Vec<u8>,
    /// C2, present when CVALID is set (bidirectional authentication); HL bytes on the wire either way.
    pub challenge: Option<Vec<u8>>,
    /// S2: 0 when the host does not ask the controller to authenticate itself.
    pub seqnum: u32,
    /// The host's DH public value g^y mod p (DHVLEN bytes; empty for the NULL group).
    pub dh_value: Vec<u8>,
}

impl Reply {
    const WHAT: &'static str = "DH-HMAC-CHAP_Reply";

    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        need(Self::WHAT, p, DHCHAP_HEADER_LEN)?;
        let hl = usize::from(p[6]);
        let cvalid = p[8];
        let dhvlen = usize::from(le16(p, 10));
        exact(Self::WHAT, p, DHCHAP_HEADER_LEN + 2 * hl + dhvlen)?;
        let body = &p[DHCHAP_HEADER_LEN..];
        let challenge = match cvalid {
            0 => None,
            1 => Some(body[hl..2 * hl].to_vec()),
            value => {
                return Err(WireError::BadValue {
                    what: Self::WHAT,
                    field: "CVALID",
                    value,
                })
            }
        };
        Ok(Self {
            tid: le16(p, 4),
            response: body[..hl].to_vec(),
            challenge,
            seqnum: le32(p, 12),
            dh_value: body[2 * hl..].to_vec(),
        })
    }

    pub fn encode(&self) -> Option<Vec<u8>> {
        let hl = self.response.len();
        if self.challenge.as_ref().is_some_and(|c| c.len() != hl) {
            return None;
        }
        let dhvlen = u16::try_from(self.dh_value.len()).ok()?;
        let mut out = Vec::with_capacity(DHCHAP_HEADER_LEN + 2 * hl + self.dh_value.len());
        header(&mut out, AUTH_TYPE_DHCHAP, MSG_REPLY, self.tid);
        out.extend_from_slice(&[
            u8::try_from(hl).ok()?,
            0,
            u8::from(self.challenge.is_some()),
            0,
        ]);
        out.extend_from_slice(&dhvlen.to_le_bytes());
        out.extend_from_slice(&self.seqnum.to_le_bytes());
        debug_assert_eq!(out.len(), DHCHAP_HEADER_LEN);
        out.extend_from_slice(&self.response);
        match &self.challenge {
            Some(c) => out.extend_from_slice(c),
            None => out.resize(out.len() + hl, 0),
        }
        out.extend_from_slice(&self.dh_value);
        Some(out)
    }
}

/// DH-HMAC-CHAP_Success1 (controller to host; NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    pub tid: u16,
    /// HL: the hash length, set even when no response follows (the Linux host checks it).
    pub hash_len: u8,
    /// R2, when the host asked for bidirectional authentication (RVALID).
    pub response: Option<Vec<u8>>,
}

impl Success1 {
    const WHAT: &'static str = "DH-HMAC-CHAP_Success1";

    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + self.response.as_ref().map_or(0, Vec::len)
    }

    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        need(Self::WHAT, p, DHCHAP_HEADER_LEN)?;
        let hl = p[6];
        let response = match p[8] {
            0 => {
                exact(Self::WHAT, p, DHCHAP_HEADER_LEN)?;
                None
            }
            1 => {
                exact(Self::WHAT, p, DHCHAP_HEADER_LEN + usize::from(hl))?;
                Some(p[DHCHAP_HEADER_LEN..].to_vec())
            }
            value => {
                return Err(WireError::BadValue {
                    what: Self::WHAT,
                    field: "RVALID",
                    value,
                })
            }
        };
        Ok(Self {
            tid: le16(p, 4),
            hash_len: hl,
            response,
        })
    }

    pub fn encode(&self) -> Option<Vec<u8>> {
        if self
            .response
            .as_ref()
            .is_some_and(|r| r.len() != usize::from(self.hash_len))
        {
            return None;
        }
        let mut out = Vec::with_capacity(self.encoded_len());
        header(&mut out, AUTH_TYPE_DHCHAP, MSG_SUCCESS1, self.tid);
        out.extend_from_slice(&[self.hash_len, 0, u8::from(self.response.is_some())]);
        out.resize(DHCHAP_HEADER_LEN, 0);
        if let Some(r) = &self.response {
            out.extend_from_slice(r);
        }
        Some(out)
    }
}

/// DH-HMAC-CHAP_Success2 (host to controller; NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Success2 {
    pub tid: u16,
}

impl Success2 {
    const WHAT: &'static str = "DH-HMAC-CHAP_Success2";

    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        exact(Self::WHAT, p, DHCHAP_HEADER_LEN)?;
        Ok(Self { tid: le16(p, 4) })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(DHCHAP_HEADER_LEN);
        header(&mut out, AUTH_TYPE_DHCHAP, MSG_SUCCESS2, self.tid);
        out.resize(DHCHAP_HEADER_LEN, 0);
        out
    }
}

/// AUTH_Failure1 (controller to host) and AUTH_Failure2 (host to controller) share one layout
/// (NVMe Base 2.0 §8.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// [`MSG_FAILURE1`] or [`MSG_FAILURE2`].
    pub auth_id: u8,
    pub tid: u16,
    pub reason_code: u8,
    /// Reason code explanation, kept raw: a host may send one this crate does not know.
    pub explanation: u8,
}

impl Failure {
    const WHAT: &'static str = "AUTH_Failure";

    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        exact(Self::WHAT, p, FAILURE_LEN)?;
        Ok(Self {
            auth_id: p[1],
            tid: le16(p, 4),
            reason_code: p[6],
            explanation: p[7],
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FAILURE_LEN);
        header(&mut out, AUTH_TYPE_COMMON, self.auth_id, self.tid);
        out.extend_from_slice(&[self.reason_code, self.explanation]);
        debug_assert_eq!(out.len(), FAILURE_LEN);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_sizes() {
        let n = Negotiate {
            tid: 0x1234,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor {
                authid: AUTHID_DHCHAP,
                hash_ids: vec![1, 2, 3],
                dh_ids: vec![0, 1, 2, 3, 4, 5],
            }],
        };
        let b = n.encode().unwrap();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..8], &[0, 0, 0, 0, 0x34, 0x12, 0, 1]);
        assert_eq!(&b[8..15], &[1, 0, 3, 6, 1, 2, 3]);
        assert_eq!(&b[8 + 4 + 30..8 + 4 + 36], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(Negotiate::decode(&b).unwrap(), n);

        let c = Challenge {
            tid: 1,
            hash_id: 1,
            dh_group: 0,
            seqnum: 5,
            challenge: vec![7; 32],
            dh_value: vec![],
        };
        assert_eq!(Challenge::decode(&c.encode().unwrap()).unwrap(), c);
        let r = Reply {
            tid: 1,
            response: vec![1; 48],
            challenge: None,
            seqnum: 0,
            dh_value: vec![3; 256],
        };
        let rb = r.encode().unwrap();
        assert_eq!(rb.len(), 16 + 96 + 256);
        assert_eq!(Reply::decode(&rb).unwrap(), r);
        for s in [
            Success1 {
                tid: 9,
                hash_len: 64,
                response: None,
            },
            Success1 {
                tid: 9,
                hash_len: 64,
                response: Some(vec![4; 64]),
            },
        ] {
            let b = s.encode().unwrap();
            assert_eq!(b.len(), s.encoded_len());
            assert_eq!(Success1::decode(&b).unwrap(), s);
        }
        let s2 = Success2 { tid: 3 };
        assert_eq!(Success2::decode(&s2.encode()).unwrap(), s2);
        let f = Failure {
            auth_id: MSG_FAILURE1,
            tid: 3,
            reason_code: FAILURE_REASON_FAILED,
            explanation: FailureReason::HashUnusable as u8,
        };
        assert_eq!(f.encode(), [0, 0xf1, 0, 0, 3, 0, 1, 4]);
        assert_eq!(Failure::decode(&f.encode()).unwrap(), f);
    }

    #[test]
    fn encoders_refuse_what_does_not_fit() {
        let too_many = ProtocolDescriptor {
            authid: 1,
            hash_ids: vec![1; 31],
            dh_ids: vec![],
        };
        let n = Negotiate {
            tid: 0,
            sc_c: 0,
            protocols: vec![too_many],
        };
        assert_eq!(n.encode(), None);
        let c = Challenge {
            tid: 0,
            hash_id: 1,
            dh_group: 0,
            seqnum: 1,
            challenge: vec![0; 256],
            dh_value: vec![],
        };
        assert_eq!(c.encode(), None);
        let r = Reply {
            tid: 0,
            response: vec![0; 32],
            challenge: Some(vec![0; 31]),
            seqnum: 1,
            dh_value: vec![],
        };
        assert_eq!(r.encode(), None);
    }

    #[test]
    fn every_prefix_of_a_message_is_refused() {
        let r = Reply {
            tid: 1,
            response: vec![1; 32],
            challenge: Some(vec![2; 32]),
            seqnum: 9,
            dh_value: vec![3; 256],
        }
        .encode()
        .unwrap();
        for n in 0..r.len() {
            assert!(Reply::decode(&r[..n]).is_err(), "{n}");
        }
        let s = Success1 {
            tid: 1,
            hash_len: 32,
            response: Some(vec![1; 32]),
        }
        .encode()
        .unwrap();
        for n in 0..s.len() {
            assert!(Success1::decode(&s[..n]).is_err(), "{n}");
        }
        assert!(FailureReason::from_u8(0).is_none() && FailureReason::from_u8(8).is_none());
        assert_eq!(
            FailureReason::from_u8(7),
            Some(FailureReason::IncorrectMessage)
        );
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Every message as the encoder before the codec rewrite wrote it, byte for byte (the same
    /// layouts as Linux `struct nvmf_auth_dhchap_*_data`), and decoded back.
    #[test]
    fn bytes_of_every_message() {
        let n = Negotiate {
            tid: 0x1234,
            sc_c: 0,
            protocols: vec![
                ProtocolDescriptor {
                    authid: 1,
                    hash_ids: vec![1, 2, 3],
                    dh_ids: vec![0, 1, 5],
                },
                ProtocolDescriptor {
                    authid: 9,
                    hash_ids: vec![],
                    dh_ids: vec![],
                },
            ],
        };
        let b = n.encode().unwrap();
        let mut d1 = format!("01000303010203{}", "00".repeat(27));
        d1 += &format!("000105{}", "00".repeat(27));
        let want = format!("0000000034120002{d1}09{}", "00".repeat(63));
        assert_eq!(hex(&b), want);
        assert_eq!(Negotiate::decode(&b).unwrap(), n);

        let c = Challenge {
            tid: 0x0102,
            hash_id: 2,
            dh_group: 3,
            seqnum: 0x0a0b_0c0d,
            challenge: vec![0x11; 4],
            dh_value: vec![0x22; 3],
        };
        let b = c.encode().unwrap();
        assert_eq!(hex(&b), "0101000002010400020303000d0c0b0a11111111222222");
        assert_eq!(Challenge::decode(&b).unwrap(), c);

        let r = Reply {
            tid: 0x0102,
            response: vec![0x11; 4],
            challenge: Some(vec![0x33; 4]),
            seqnum: 0x0a0b_0c0d,
            dh_value: vec![0x22; 3],
        };
        let b = r.encode().unwrap();
        assert_eq!(
            hex(&b),
            "0102000002010400010003000d0c0b0a1111111133333333222222"
        );
        assert_eq!(Reply::decode(&b).unwrap(), r);
        let r = Reply {
            tid: 0x0102,
            response: vec![0x11; 4],
            challenge: None,
            seqnum: 0,
            dh_value: vec![],
        };
        let b = r.encode().unwrap();
        assert_eq!(hex(&b), "010200000201040000000000000000001111111100000000");
        assert_eq!(Reply::decode(&b).unwrap(), r);

        let s = Success1 {
            tid: 0x0102,
            hash_len: 4,
            response: Some(vec![0x44; 4]),
        };
        let b = s.encode().unwrap();
        assert_eq!(hex(&b), "0103000002010400010000000000000044444444");
        assert_eq!(Success1::decode(&b).unwrap(), s);
        let s = Success1 {
            tid: 0x0102,
            hash_len: 48,
            response: None,
        };
        let b = s.encode().unwrap();
        assert_eq!(hex(&b), "01030000020130000000000000000000");
        assert_eq!(Success1::decode(&b).unwrap(), s);

        let s2 = Success2 { tid: 0x0102 };
        assert_eq!(hex(&s2.encode()), "01040000020100000000000000000000");
        let f = Failure {
            auth_id: MSG_FAILURE2,
            tid: 0x0102,
            reason_code: 1,
            explanation: 6,
        };
        assert_eq!(hex(&f.encode()), "00f0000002010106");
        assert_eq!(Failure::decode(&f.encode()).unwrap(), f);
    }
}
