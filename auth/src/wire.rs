//! The in-band authentication constants and the AUTH message layouts (NVMe Base 2.0 §8.13.5;
//! the same layouts as `struct nvmf_auth_dhchap_*_data` in Linux `include/linux/nvme.h`).
//!
//! Every message has one `decode`/`encode` pair here, in the codec dialect (`codec::Reader`,
//! `codec::Writer`). Decoding never trusts a length field: each one is checked against the bytes
//! the host actually sent, and a payload longer than its fields say is refused too, so a message
//! has exactly one valid encoding. Encoders size the message first and the writer asserts that
//! the fields fill it.

use codec::{coded_enum, DecodeError, Reader, Writer};
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

/// AUTH_Failure reason code: "Authentication failure" (the only one defined).
pub const FAILURE_REASON_FAILED: u8 = 0x01;

coded_enum! {
    /// AUTH_Failure reason code explanations (NVMe Base 2.0 §8.13.5).
    pub enum FailureReason: u8, from_u8 {
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
}

/// The header every AUTH message starts with: AUTH_Type, AUTH_Id, 2 reserved, T_ID.
const MESSAGE_HEADER_LEN: usize = 6;
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

// AUTHID, reserved, HALEN, DHLEN, then the two identifier lists.
const _: () = assert!(PROTOCOL_DESCRIPTOR_LEN == 4 + MAX_HASH_IDS + MAX_DH_IDS);
const _: () = assert!(NEGOTIATE_HEADER_LEN == MESSAGE_HEADER_LEN + 2);
const _: () = assert!(FAILURE_LEN == MESSAGE_HEADER_LEN + 2);

/// Why a payload could not be decoded (every one maps to the "Incorrect payload" reason):
/// which message, and what was wrong with its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what}: {source}")]
pub struct WireError {
    pub what: &'static str,
    pub source: DecodeError,
}

/// Decodes all of `payload` with `read`: bytes left over are an error (one valid encoding).
fn decode_all<T>(
    what: &'static str,
    payload: &[u8],
    read: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<T, WireError> {
    let mut r = Reader::new(payload);
    read(&mut r)
        .and_then(|v| r.expect_empty().map(|()| v))
        .map_err(|source| WireError { what, source })
}

/// A field whose value is not defined for it.
fn invalid(field: &'static str, value: impl Into<u64>) -> DecodeError {
    DecodeError::InvalidValue {
        field,
        value: value.into(),
    }
}

/// Reads the common header: (AUTH_Type, AUTH_Id, T_ID).
fn read_header(r: &mut Reader<'_>) -> Result<(u8, u8, u16), DecodeError> {
    let (auth_type, auth_id) = (r.u8()?, r.u8()?);
    r.take(2)?;
    Ok((auth_type, auth_id, r.u16()?))
}

fn write_header(w: &mut Writer<'_>, auth_type: u8, auth_id: u8, tid: u16) {
    w.u8(auth_type);
    w.u8(auth_id);
    w.zeros(2);
    w.u16(tid);
}

/// The 16-byte header of the DH-HMAC-CHAP messages: T_ID, HL, a reserved byte, two bytes whose
/// meaning depends on the message (Challenge: HashID, DHgID; Reply: CVALID, reserved;
/// Success1: RVALID, reserved), DHVLEN and the sequence number (Success1 and Success2 reserve
/// what they do not use, written as zero).
#[derive(Debug, Clone, Copy, Default)]
struct DhchapHeader {
    tid: u16,
    hl: u8,
    b8: u8,
    b9: u8,
    dhvlen: u16,
    seqnum: u32,
}

impl DhchapHeader {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let (_, _, tid) = read_header(r)?;
        let hl = r.u8()?;
        r.take(1)?;
        Ok(Self {
            tid,
            hl,
            b8: r.u8()?,
            b9: r.u8()?,
            dhvlen: r.u16()?,
            seqnum: r.u32()?,
        })
    }

    fn write(&self, w: &mut Writer<'_>, auth_id: u8) {
        write_header(w, AUTH_TYPE_DHCHAP, auth_id, self.tid);
        w.u8(self.hl);
        w.zeros(1);
        w.u8(self.b8);
        w.u8(self.b9);
        w.u16(self.dhvlen);
        w.u32(self.seqnum);
    }
}

const _: () = assert!(DHCHAP_HEADER_LEN == MESSAGE_HEADER_LEN + 10);

/// The first two bytes every AUTH message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageKind {
    pub auth_type: u8,
    pub auth_id: u8,
}

impl MessageKind {
    pub fn peek(payload: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(payload);
        (|| {
            Ok(Self {
                auth_type: r.u8()?,
                auth_id: r.u8()?,
            })
        })()
        .map_err(|source| WireError {
            what: "AUTH message",
            source,
        })
    }
}

/// Transaction identifier (T_ID) at bytes 4..6 of every AUTH message.
pub fn peek_tid(payload: &[u8]) -> Result<u16, WireError> {
    let mut r = Reader::new(payload);
    read_header(&mut r)
        .map(|(_, _, tid)| tid)
        .map_err(|source| WireError {
            what: "AUTH message",
            source,
        })
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

impl ProtocolDescriptor {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let authid = r.u8()?;
        r.take(1)?;
        let (halen, dhlen) = (r.u8()?, r.u8()?);
        let (hash_ids, dh_ids) = (r.take(MAX_HASH_IDS)?, r.take(MAX_DH_IDS)?);
        Ok(Self {
            authid,
            hash_ids: hash_ids
                .get(..usize::from(halen))
                .ok_or(invalid("HALEN", halen))?
                .to_vec(),
            dh_ids: dh_ids
                .get(..usize::from(dhlen))
                .ok_or(invalid("DHLEN", dhlen))?
                .to_vec(),
        })
    }

    fn write(&self, w: &mut Writer<'_>) {
        w.u8(self.authid);
        w.zeros(1);
        w.u8(self.hash_ids.len() as u8);
        w.u8(self.dh_ids.len() as u8);
        w.bytes(&self.hash_ids);
        w.zeros(MAX_HASH_IDS - self.hash_ids.len());
        w.bytes(&self.dh_ids);
        w.zeros(MAX_DH_IDS - self.dh_ids.len());
    }
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
        decode_all(Self::WHAT, p, |r| {
            let (_, _, tid) = read_header(r)?;
            let (sc_c, napd) = (r.u8()?, usize::from(r.u8()?));
            // NAPD descriptors, exactly: bounded by what was sent before anything is kept.
            let mut descriptors = r.sub(napd * PROTOCOL_DESCRIPTOR_LEN)?;
            let protocols = (0..napd)
                .map(|_| ProtocolDescriptor::read(&mut descriptors))
                .collect::<Result<_, _>>()?;
            Ok(Self {
                tid,
                sc_c,
                protocols,
            })
        })
    }

    /// Encodes the message; `None` when a field does not fit its wire width.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let napd = u8::try_from(self.protocols.len()).ok()?;
        if self
            .protocols
            .iter()
            .any(|d| d.hash_ids.len() > MAX_HASH_IDS || d.dh_ids.len() > MAX_DH_IDS)
        {
            return None;
        }
        let len = NEGOTIATE_HEADER_LEN + self.protocols.len() * PROTOCOL_DESCRIPTOR_LEN;
        Some(Writer::to_vec(len, |w| {
            write_header(w, AUTH_TYPE_COMMON, MSG_NEGOTIATE, self.tid);
            w.u8(self.sc_c);
            w.u8(napd);
            for d in &self.protocols {
                d.write(w);
            }
        }))
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
        decode_all(Self::WHAT, p, |r| {
            let h = DhchapHeader::read(r)?;
            Ok(Self {
                tid: h.tid,
                hash_id: h.b8,
                dh_group: h.b9,
                seqnum: h.seqnum,
                challenge: r.take(usize::from(h.hl))?.to_vec(),
                dh_value: r.take(usize::from(h.dhvlen))?.to_vec(),
            })
        })
    }

    /// Encoded size, checked by the caller against the host's allocation length.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + self.challenge.len() + self.dh_value.len()
    }

    pub fn encode(&self) -> Option<Vec<u8>> {
        let hl = u8::try_from(self.challenge.len()).ok()?;
        let dhvlen = u16::try_from(self.dh_value.len()).ok()?;
        Some(Writer::to_vec(self.encoded_len(), |w| {
            let h = DhchapHeader {
                tid: self.tid,
                hl,
                b8: self.hash_id,
                b9: self.dh_group,
                dhvlen,
                seqnum: self.seqnum,
            };
            h.write(w, MSG_CHALLENGE);
            w.bytes(&self.challenge);
            w.bytes(&self.dh_value);
        }))
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
        decode_all(Self::WHAT, p, |r| {
            let h = DhchapHeader::read(r)?;
            let hl = usize::from(h.hl);
            let response = r.take(hl)?.to_vec();
            let c2 = r.take(hl)?;
            let challenge = match h.b8 {
                0 => None,
                1 => Some(c2.to_vec()),
                v => return Err(invalid("CVALID", v)),
            };
            Ok(Self {
                tid: h.tid,
                response,
                challenge,
                seqnum: h.seqnum,
                dh_value: r.take(usize::from(h.dhvlen))?.to_vec(),
            })
        })
    }

    pub fn encode(&self) -> Option<Vec<u8>> {
        let hl = u8::try_from(self.response.len()).ok()?;
        if self
            .challenge
            .as_ref()
            .is_some_and(|c| c.len() != self.response.len())
        {
            return None;
        }
        let dhvlen = u16::try_from(self.dh_value.len()).ok()?;
        let len = DHCHAP_HEADER_LEN + 2 * self.response.len() + self.dh_value.len();
        Some(Writer::to_vec(len, |w| {
            let h = DhchapHeader {
                tid: self.tid,
                hl,
                b8: u8::from(self.challenge.is_some()),
                b9: 0,
                dhvlen,
                seqnum: self.seqnum,
            };
            h.write(w, MSG_REPLY);
            w.bytes(&self.response);
            match &self.challenge {
                Some(c) => w.bytes(c),
                None => w.zeros(self.response.len()),
            }
            w.bytes(&self.dh_value);
        }))
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
        decode_all(Self::WHAT, p, |r| {
            let h = DhchapHeader::read(r)?;
            let response = match h.b8 {
                0 => None,
                1 => Some(r.take(usize::from(h.hl))?.to_vec()),
                v => return Err(invalid("RVALID", v)),
            };
            Ok(Self {
                tid: h.tid,
                hash_len: h.hl,
                response,
            })
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
        Some(Writer::to_vec(self.encoded_len(), |w| {
            let h = DhchapHeader {
                tid: self.tid,
                hl: self.hash_len,
                b8: u8::from(self.response.is_some()),
                ..DhchapHeader::default()
            };
            h.write(w, MSG_SUCCESS1);
            if let Some(r) = &self.response {
                w.bytes(r);
            }
        }))
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
        decode_all(Self::WHAT, p, |r| {
            let h = DhchapHeader::read(r)?;
            Ok(Self { tid: h.tid })
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        Writer::to_vec(DHCHAP_HEADER_LEN, |w| {
            let h = DhchapHeader {
                tid: self.tid,
                ..DhchapHeader::default()
            };
            h.write(w, MSG_SUCCESS2);
        })
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
        decode_all(Self::WHAT, p, |r| {
            let (_, auth_id, tid) = read_header(r)?;
            Ok(Self {
                auth_id,
                tid,
                reason_code: r.u8()?,
                explanation: r.u8()?,
            })
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        Writer::to_vec(FAILURE_LEN, |w| {
            write_header(w, AUTH_TYPE_COMMON, self.auth_id, self.tid);
            w.u8(self.reason_code);
            w.u8(self.explanation);
        })
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

    /// Every message, cut at every byte or with a byte added, is refused with a typed error that
    /// names it; a descriptor list longer than its 30 slots is refused by field.
    #[test]
    fn every_cut_and_every_extension_is_refused_by_name() {
        type Decode = fn(&[u8]) -> Result<(), WireError>;
        let n = Negotiate {
            tid: 1,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor {
                authid: AUTHID_DHCHAP,
                hash_ids: vec![1, 2],
                dh_ids: vec![0],
            }],
        };
        let c = Challenge {
            tid: 1,
            hash_id: 1,
            dh_group: 1,
            seqnum: 2,
            challenge: vec![5; 32],
            dh_value: vec![6; 256],
        };
        let f = Failure {
            auth_id: MSG_FAILURE2,
            tid: 1,
            reason_code: 1,
            explanation: 1,
        };
        let cases: [(Vec<u8>, &str, Decode); 4] = [
            (n.encode().unwrap(), Negotiate::WHAT, |p| {
                Negotiate::decode(p).map(drop)
            }),
            (c.encode().unwrap(), Challenge::WHAT, |p| {
                Challenge::decode(p).map(drop)
            }),
            (Success2 { tid: 1 }.encode(), Success2::WHAT, |p| {
                Success2::decode(p).map(drop)
            }),
            (f.encode(), Failure::WHAT, |p| Failure::decode(p).map(drop)),
        ];
        for (bytes, what, decode) in cases {
            assert_eq!(decode(&bytes), Ok(()));
            for cut in 0..bytes.len() {
                let e = decode(&bytes[..cut]).unwrap_err();
                assert_eq!(e.what, what);
                assert!(matches!(e.source, DecodeError::Truncated { .. }), "{e}");
            }
            let mut long = bytes.clone();
            long.push(0);
            let e = decode(&long).unwrap_err();
            assert_eq!((e.what, e.source), (what, DecodeError::TrailingData(1)));
        }
        let mut b = n.encode().unwrap();
        b[NEGOTIATE_HEADER_LEN + 2] = 31;
        assert_eq!(
            Negotiate::decode(&b).unwrap_err().source,
            DecodeError::InvalidValue {
                field: "HALEN",
                value: 31
            }
        );
    }
}
