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
mod tests;
