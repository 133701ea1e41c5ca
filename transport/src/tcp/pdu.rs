//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, §3.6): one encode/decode pair per PDU
//! header, the header and data digests, and the common-header validation both ends share.
//!
//! A PDU is `header (hlen bytes) [HDGST] [PAD up to PDO] [DATA] [DDGST]`; `plen` counts all of
//! it. Headers are fixed-size per type, so every decoder checks `hlen` against its type and the
//! receive path never sizes a buffer from an unchecked wire length.

use codec::{coded_enum, put_u16_at, put_u32_at, u16_at, u32_at, DecodeError, Reader, Writer};
use nvme::wire::{Cqe, Sqe};
use thiserror::Error;

/// Common header length (§3.6.1, Figure 12).
pub const COMMON_HEADER_LEN: usize = 8;
/// ICReq / ICResp are 128 bytes, no digests, no data (§3.6.2.2, §3.6.2.3).
pub const IC_PDU_LEN: usize = 128;
/// H2CTermReq / C2HTermReq fixed header (§3.6.2.4, §3.6.2.5).
pub const TERM_HEADER_LEN: usize = 24;
/// A termination request carries at most 128 bytes of the offending PDU header.
pub const TERM_MAX_DATA: usize = 128;
/// Termination request PDU length bounds (Linux: NVME_TCP_{MIN,MAX}_C2HTERM_PLEN).
pub const TERM_MAX_PLEN: usize = TERM_HEADER_LEN + TERM_MAX_DATA;
/// CapsuleCmd header: common header + 64-byte SQE (§3.6.2.6).
pub const CAPSULE_CMD_HEADER_LEN: usize = COMMON_HEADER_LEN + Sqe::SIZE;
/// CapsuleResp: common header + 16-byte CQE (§3.6.2.7).
pub const CAPSULE_RESP_LEN: usize = COMMON_HEADER_LEN + Cqe::SIZE;
/// H2CData / C2HData header (§3.6.2.8, §3.6.2.9).
pub const DATA_HEADER_LEN: usize = 24;
/// R2T (§3.6.2.10).
pub const R2T_LEN: usize = 24;
/// HDGST and DDGST are CRC32C values (§3.6.1.2).
pub const DIGEST_LEN: usize = 4;
/// Largest header (plus digest) any PDU has; the receive path buffers at most this much
/// before the data phase (TermReq: its data is part of the "header" buffer, no digest).
pub const MAX_HEADER_BUF: usize = TERM_MAX_PLEN;
/// The smallest MAXH2CDATA a controller may advertise (§3.6.2.3; Linux rejects less).
pub const MIN_MAXH2CDATA: u32 = 4096;

const _: () = assert!(CAPSULE_CMD_HEADER_LEN == 72);
const _: () = assert!(CAPSULE_RESP_LEN == 24);
const _: () = assert!(TERM_MAX_PLEN == 152);
const _: () =
    assert!(MAX_HEADER_BUF >= IC_PDU_LEN && MAX_HEADER_BUF >= CAPSULE_CMD_HEADER_LEN + DIGEST_LEN);

coded_enum! {
    /// PDU types (§3.6.1, Figure 13). Bit 0 is the direction: even = host to controller.
    pub enum PduType: u8, from_u8 {
        IcReq = 0x00,
        IcResp = 0x01,
        H2CTermReq = 0x02,
        C2HTermReq = 0x03,
        CapsuleCmd = 0x04,
        CapsuleResp = 0x05,
        H2CData = 0x06,
        C2HData = 0x07,
        R2T = 0x09,
    }
}

impl PduType {
    /// Which side sends this PDU type.
    pub fn sender(self) -> Role {
        match self {
            Self::IcReq | Self::H2CTermReq | Self::CapsuleCmd | Self::H2CData => Role::Host,
            _ => Role::Controller,
        }
    }

    /// The fixed header length for this type (HLEN, §3.6.2.x).
    pub fn header_len(self) -> usize {
        match self {
            Self::IcReq | Self::IcResp => IC_PDU_LEN,
            Self::H2CTermReq | Self::C2HTermReq => TERM_HEADER_LEN,
            Self::CapsuleCmd => CAPSULE_CMD_HEADER_LEN,
            Self::CapsuleResp => CAPSULE_RESP_LEN,
            Self::H2CData | Self::C2HData => DATA_HEADER_LEN,
            Self::R2T => R2T_LEN,
        }
    }

    /// Flags this type may carry (§3.6.1: bits not defined for a type are reserved).
    fn valid_flags(self) -> u8 {
        match self {
            Self::IcReq | Self::IcResp | Self::H2CTermReq | Self::C2HTermReq => 0,
            Self::CapsuleCmd => flags::HDGSTF | flags::DDGSTF,
            Self::CapsuleResp | Self::R2T => flags::HDGSTF,
            Self::H2CData => flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU,
            Self::C2HData => flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU | flags::SUCCESS,
        }
    }

    /// Whether a data section may follow the header.
    fn carries_data(self) -> bool {
        matches!(self, Self::CapsuleCmd | Self::H2CData | Self::C2HData)
    }
}

/// The two ends of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Host,
    Controller,
}

/// Common-header flag bits (§3.6.1, Figure 12; data PDU flags §3.6.2.8/9).
pub mod flags {
    /// A header digest follows the header.
    pub const HDGSTF: u8 = 0x01;
    /// A data digest follows the data.
    pub const DDGSTF: u8 = 0x02;
    /// Last data PDU of a command (C2HData) or of an R2T (H2CData).
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData only: the command succeeded and no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// DGST field bits of ICReq/ICResp (§3.6.2.2, Figure 15).
pub mod dgst {
    pub const HEADER: u8 = 0x01;
    pub const DATA: u8 = 0x02;
}

/// Which digests are in effect on a connection (negotiated by ICReq/ICResp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    pub fn from_dgst(b: u8) -> Self {
        Self {
            header: b & dgst::HEADER != 0,
            data: b & dgst::DATA != 0,
        }
    }

    pub fn to_dgst(self) -> u8 {
        (self.header as u8 * dgst::HEADER) | (self.data as u8 * dgst::DATA)
    }

    pub fn header_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }

    pub fn data_len(self) -> usize {
        if self.data {
            DIGEST_LEN
        } else {
            0
        }
    }
}

coded_enum! {
    /// Fatal Error Status of a termination request (§3.6.2.4, Figure 21).
    pub enum Fes: u16, from_u16 {
        InvalidPduHeaderField = 0x01,
        PduSequenceError = 0x02,
        HeaderDigestError = 0x03,
        DataTransferOutOfRange = 0x04,
        DataTransferLimitExceeded = 0x05,
        UnsupportedParameter = 0x06,
    }
}

/// Why a PDU was refused. `fes()`/`fei()` give what to report in a termination request;
/// `fes() == None` means the connection closes without one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PduError {
    #[error("PDU type {0:#04x} is unknown or not sent by this peer")]
    InvalidType(u8),
    #[error("PDU type {pdu_type:?} is not allowed now ({why})")]
    UnexpectedType {
        pdu_type: PduType,
        why: &'static str,
    },
    #[error("flags {flags:#04x} invalid for {pdu_type:?}")]
    InvalidFlags { pdu_type: PduType, flags: u8 },
    #[error("HLEN {hlen} invalid for {pdu_type:?}")]
    InvalidHlen { pdu_type: PduType, hlen: u8 },
    #[error("PDO {pdo} invalid for {pdu_type:?} (header {full_hlen} bytes, PLEN {plen})")]
    InvalidPdo {
        pdu_type: PduType,
        pdo: u8,
        full_hlen: usize,
        plen: u32,
    },
    #[error("PLEN {plen} invalid for {pdu_type:?}")]
    InvalidPlen { pdu_type: PduType, plen: u32 },
    #[error("termination request with invalid PLEN {0}")]
    InvalidTermReqLength(u32),
    #[error("{pdu_type:?} data length {len} exceeds the limit {limit}")]
    DataLimitExceeded {
        pdu_type: PduType,
        len: u32,
        limit: u32,
    },
    #[error("header digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    HeaderDigest { received: u32, computed: u32 },
    #[error("data digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    DataDigest { received: u32, computed: u32 },
    #[error("field {field} (byte {offset}) has invalid value {value:#x}")]
    InvalidField {
        field: &'static str,
        offset: u32,
        value: u64,
    },
    #[error("PDU truncated: {0}")]
    Decode(#[from] DecodeError),
}

impl PduError {
    /// The FES to report, or `None` when the connection just closes (§3.6.2.4: a malformed
    /// termination request is not answered).
    pub fn fes(&self) -> Option<Fes> {
        Some(match self {
            Self::InvalidTermReqLength(_) => return None,
            Self::HeaderDigest { .. } => Fes::HeaderDigestError,
            Self::DataLimitExceeded { .. } => Fes::DataTransferLimitExceeded,
            // NVMe/TCP 1.0 §3.6.2.4 FES 02h "PDU Sequence Error": a PDU before ICReq, or a
            // second ICReq (SPDK's target reports these the same way).
            Self::UnexpectedType { .. } => Fes::PduSequenceError,
            _ => Fes::InvalidPduHeaderField,
        })
    }

    /// Field Error Information: the byte offset of the offending header field for FES
    /// "Invalid PDU Header Field" (§3.6.2.4, Figure 22), 0 otherwise.
    pub fn fei(&self) -> u32 {
        match self {
            Self::InvalidType(_) | Self::UnexpectedType { .. } => 0,
            Self::InvalidFlags { .. } => 1,
            Self::InvalidHlen { .. } => 2,
            Self::InvalidPdo { .. } => 3,
            Self::InvalidPlen { .. } => 4,
            Self::InvalidField { offset, .. } => *offset,
            _ => 0,
        }
    }
}

/// CRC32C as NVMe/TCP uses it (§3.6.1.2): initial value all ones, final complement; this is
/// exactly the standard CRC-32C that the `crc32c` crate computes. Sent little-endian.
pub fn digest(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continues a running digest over data that arrives in pieces (`crc32c_append` resumes
/// from a finished CRC, so chunks compose to the digest of the whole).
pub fn digest_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// The 8-byte common header (§3.6.1, Figure 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let array = r.take_array::<COMMON_HEADER_LEN>()?;
        r.expect_empty()?;
        Ok(Self::from_bytes(&array))
    }

    /// The common header in its 8 bytes (the receive path's in-place parse).
    pub fn from_bytes(b: &[u8; COMMON_HEADER_LEN]) -> Self {
        Self {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32_at(b, 4),
        }
    }

    pub fn encode(&self) -> [u8; COMMON_HEADER_LEN] {
        let mut out = [0u8; COMMON_HEADER_LEN];
        out[0] = self.pdu_type;
        out[1] = self.flags;
        out[2] = self.hlen;
        out[3] = self.pdo;
        put_u32_at(&mut out, 4, self.plen);
        out
    }
}

/// Where the parts of a PDU lie, derived from a validated common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PduLayout {
    pub pdu_type: PduType,
    pub flags: u8,
    /// Header bytes to buffer: HLEN plus HDGST (for termination requests: all of PLEN).
    pub header_bytes: usize,
    /// Pad bytes between the header digest and the data (PDO − header end).
    pub pad: usize,
    /// Data bytes (without the data digest).
    pub data_len: u32,
    /// A data digest follows the data.
    pub data_digest: bool,
}

/// Limits the receiving side enforces before it accepts any data (bounds come first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvLimits {
    /// Largest in-capsule data accepted in a CapsuleCmd.
    pub max_capsule_data: u32,
    /// Largest DATAL of an H2CData (MAXH2CDATA) or C2HData PDU.
    pub max_data_pdu: u32,
}

impl CommonHeader {
    /// Validates the common header of a PDU received by `receiver` with `digests` in effect,
    /// field by field in wire order (the lowest offending field is reported, as the spec's
    /// FEI wants), and returns the PDU's layout. `pda` is the data alignment in bytes this
    /// receiver advertised ((CPDA or HPDA + 1) × 4).
    pub fn validate(
        &self,
        receiver: Role,
        digests: Digests,
        pda: usize,
        limits: RecvLimits,
    ) -> Result<PduLayout, PduError> {
        let pdu_type = PduType::from_u8(self.pdu_type)
            .filter(|t| t.sender() != receiver)
            .ok_or(PduError::InvalidType(self.pdu_type))?;
        let plen = self.plen;
        if matches!(pdu_type, PduType::H2CTermReq | PduType::C2HTermReq)
            && !(TERM_HEADER_LEN as u32..=TERM_MAX_PLEN as u32).contains(&plen)
        {
            return Err(PduError::InvalidTermReqLength(plen));
        }

        let valid = pdu_type.valid_flags();
        let invalid_flags = PduError::InvalidFlags {
            pdu_type,
            flags: self.flags,
        };
        if self.flags & !valid != 0 {
            return Err(invalid_flags);
        }
        // §3.6.1.2: HDGSTF must be set on every PDU that can carry a header digest exactly
        // when header digests were negotiated (the Linux host refuses otherwise too).
        let hdgst = valid & flags::HDGSTF != 0 && digests.header;
        if (self.flags & flags::HDGSTF != 0) != hdgst {
            return Err(invalid_flags);
        }
        if self.flags & flags::DDGSTF != 0 && !digests.data {
            return Err(invalid_flags);
        }
        if pdu_type == PduType::C2HData
            && self.flags & (flags::SUCCESS | flags::LAST_PDU) == flags::SUCCESS
        {
            // §3.6.2.9: SUCCESS is only valid on the last C2HData PDU.
            return Err(invalid_flags);
        }

        if self.hlen as usize != pdu_type.header_len() {
            return Err(PduError::InvalidHlen {
                pdu_type,
                hlen: self.hlen,
            });
        }

        if matches!(pdu_type, PduType::H2CTermReq | PduType::C2HTermReq) {
            if self.pdo != 0 {
                return Err(PduError::InvalidPdo {
                    pdu_type,
                    pdo: self.pdo,
                    full_hlen: TERM_HEADER_LEN,
                    plen,
                });
            }
            return Ok(PduLayout {
                pdu_type,
                flags: self.flags,
                header_bytes: plen as usize,
                pad: 0,
                data_len: 0,
                data_digest: false,
            });
        }

        let full_hlen = self.hlen as usize + if hdgst { DIGEST_LEN } else { 0 };
        let has_data = pdu_type.carries_data() && plen as usize > full_hlen;
        let pdo = self.pdo as usize;
        let pdo_ok = if has_data {
            pdo >= full_hlen && pdo as u32 <= plen && pdo.is_multiple_of(pda.max(4))
        } else {
            // Linux sends PDO 0 on a capsule without data; a PDO pointing at the end of
            // the PDU says the same.
            pdo == 0 || pdo == full_hlen
        };
        if !pdo_ok {
            return Err(PduError::InvalidPdo {
                pdu_type,
                pdo: self.pdo,
                full_hlen,
                plen,
            });
        }

        let bad_plen = PduError::InvalidPlen { pdu_type, plen };
        if !has_data {
            if plen as usize != full_hlen {
                return Err(bad_plen);
            }
            return Ok(PduLayout {
                pdu_type,
                flags: self.flags,
                header_bytes: full_hlen,
                pad: 0,
                data_len: 0,
                data_digest: false,
            });
        }

        let data_digest = self.flags & flags::DDGSTF != 0;
        if digests.data != data_digest {
            // Data digests negotiated: every PDU with data carries one (§3.6.1.2).
            return Err(invalid_flags);
        }
        let ddgst = if data_digest { DIGEST_LEN as u32 } else { 0 };
        let data_len = (plen - pdo as u32)
            .checked_sub(ddgst)
            .filter(|&n| n > 0)
            .ok_or(bad_plen)?;
        let limit = match pdu_type {
            PduType::CapsuleCmd => limits.max_capsule_data,
            _ => limits.max_data_pdu,
        };
        if data_len > limit {
            return Err(PduError::DataLimitExceeded {
                pdu_type,
                len: data_len,
                limit,
            });
        }
        Ok(PduLayout {
            pdu_type,
            flags: self.flags,
            header_bytes: full_hlen,
            pad: pdo - full_hlen,
            data_len,
            data_digest,
        })
    }
}

/// ICReq (§3.6.2.2, Figure 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment, 0's based dwords (0..=31).
    pub hpda: u8,
    /// HDGST_ENABLE / DDGST_ENABLE bits.
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// ICResp (§3.6.2.3, Figure 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, 0's based dwords.
    pub cpda: u8,
    pub dgst: u8,
    /// Largest H2CData DATAL the controller accepts.
    pub maxh2cdata: u32,
}

fn ic_encode(pdu_type: PduType, pfv: u16, pda: u8, dgst: u8, word: u32) -> [u8; IC_PDU_LEN] {
    let mut out = [0u8; IC_PDU_LEN];
    let ch = CommonHeader {
        pdu_type: pdu_type as u8,
        flags: 0,
        hlen: IC_PDU_LEN as u8,
        pdo: 0,
        plen: IC_PDU_LEN as u32,
    };
    out[..COMMON_HEADER_LEN].copy_from_slice(&ch.encode());
    put_u16_at(&mut out, 8, pfv);
    out[10] = pda;
    out[11] = dgst;
    put_u32_at(&mut out, 12, word);
    out
}

/// Decodes the type-specific part of an IC PDU: (pfv, pda, dgst, maxr2t|maxh2cdata).
fn ic_decode(header: &[u8]) -> Result<(u16, u8, u8, u32), DecodeError> {
    let mut r = Reader::new(header);
    r.take(COMMON_HEADER_LEN)?;
    let fields = (r.u16()?, r.u8()?, r.u8()?, r.u32()?);
    r.take(IC_PDU_LEN - 16)?;
    r.expect_empty()?;
    Ok(fields)
}

impl IcReq {
    pub fn encode(&self) -> [u8; IC_PDU_LEN] {
        ic_encode(PduType::IcReq, self.pfv, self.hpda, self.dgst, self.maxr2t)
    }

    /// `header` is the whole 128-byte PDU.
    pub fn decode(header: &[u8]) -> Result<Self, DecodeError> {
        let (pfv, hpda, dgst, maxr2t) = ic_decode(header)?;
        Ok(Self {
            pfv,
            hpda,
            dgst,
            maxr2t,
        })
    }
}

impl IcResp {
    pub fn encode(&self) -> [u8; IC_PDU_LEN] {
        ic_encode(
            PduType::IcResp,
            self.pfv,
            self.cpda,
            self.dgst,
            self.maxh2cdata,
        )
    }

    pub fn decode(header: &[u8]) -> Result<Self, DecodeError> {
        let (pfv, cpda, dgst, maxh2cdata) = ic_decode(header)?;
        Ok(Self {
            pfv,
            cpda,
            dgst,
            maxh2cdata,
        })
    }
}

/// H2CTermReq / C2HTermReq (§3.6.2.4/5, Figure 20): FES, FEI and up to 128 bytes of the PDU
/// header that caused the error. Never carries digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    pub fei: u32,
    pub data: Vec<u8>,
}

impl TermReq {
    /// Builds a termination request, truncating `offending_header` to the 128 bytes allowed.
    pub fn new(fes: Fes, fei: u32, offending_header: &[u8]) -> Self {
        let n = offending_header.len().min(TERM_MAX_DATA);
        Self {
            fes: fes as u16,
            fei,
            data: offending_header[..n].to_vec(),
        }
    }

    /// Encodes as `pdu_type` (H2CTermReq or C2HTermReq). `data` longer than 128 bytes is cut.
    pub fn encode(&self, pdu_type: PduType) -> Vec<u8> {
        let data = &self.data[..self.data.len().min(TERM_MAX_DATA)];
        let plen = TERM_HEADER_LEN + data.len();
        Writer::to_vec(plen, |w| {
            let ch = CommonHeader {
                pdu_type: pdu_type as u8,
                flags: 0,
                hlen: TERM_HEADER_LEN as u8,
                pdo: 0,
                plen: plen as u32,
            };
            w.bytes(&ch.encode());
            w.u16(self.fes);
            w.u32(self.fei);
            w.pad_to(TERM_HEADER_LEN);
            w.bytes(data);
        })
    }

    /// `pdu` is the whole termination request (PLEN bytes, already bounded to 152).
    pub fn decode(pdu: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(pdu);
        r.take(COMMON_HEADER_LEN)?;
        let fes = r.u16()?;
        let fei = r.u32()?;
        r.take(10)?;
        let rest = r.remaining();
        if rest > TERM_MAX_DATA {
            return Err(DecodeError::TrailingData(rest - TERM_MAX_DATA));
        }
        let data = r.take(rest)?.to_vec();
        Ok(Self { fes, fei, data })
    }
}

/// H2CData and C2HData header fields (§3.6.2.8/9, Figure 26/28). For C2HData `ttag` is
/// reserved (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataHeader {
    pub cccid: u16,
    pub ttag: u16,
    pub datao: u32,
    pub datal: u32,
}

/// R2T fields (§3.6.2.10, Figure 30).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

/// Byte offsets inside data/R2T headers, for FEI.
pub mod offsets {
    pub const CCCID: u32 = 8;
    pub const TTAG: u32 = 10;
    pub const DATAO: u32 = 12;
    pub const DATAL: u32 = 16;
}

/// The four fields of an R2T / H2CData / C2HData header (bytes 8..20; 20..24 reserved).
fn four_fields(header: &[u8]) -> Result<(u16, u16, u32, u32), DecodeError> {
    let mut r = Reader::new(header);
    let b = r.take_array::<DATA_HEADER_LEN>()?;
    r.expect_empty()?;
    Ok((
        u16_at(&b, offsets::CCCID as usize),
        u16_at(&b, offsets::TTAG as usize),
        u32_at(&b, offsets::DATAO as usize),
        u32_at(&b, offsets::DATAL as usize),
    ))
}

impl DataHeader {
    /// `header` is HLEN (24) bytes, digest excluded.
    pub fn decode(header: &[u8]) -> Result<Self, DecodeError> {
        let (cccid, ttag, datao, datal) = four_fields(header)?;
        Ok(Self {
            cccid,
            ttag,
            datao,
            datal,
        })
    }

    fn encode_fields(&self, out: &mut [u8; MAX_HEADER_BUF]) {
        put_u16_at(out, offsets::CCCID as usize, self.cccid);
        put_u16_at(out, offsets::TTAG as usize, self.ttag);
        put_u32_at(out, offsets::DATAO as usize, self.datao);
        put_u32_at(out, offsets::DATAL as usize, self.datal);
    }
}

impl R2t {
    pub fn decode(header: &[u8]) -> Result<Self, DecodeError> {
        let (cccid, ttag, r2to, r2tl) = four_fields(header)?;
        Ok(Self {
            cccid,
            ttag,
            r2to,
            r2tl,
        })
    }
}

/// A decoded PDU header (the data, if any, is handled separately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PduHeader {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    CapsuleCmd(Sqe),
    CapsuleResp(Cqe),
    /// `last`: LAST_PDU flag.
    H2CData {
        hdr: DataHeader,
        last: bool,
    },
    /// `last`: LAST_PDU; `success`: SUCCESS (no CapsuleResp follows).
    C2HData {
        hdr: DataHeader,
        last: bool,
        success: bool,
    },
    R2T(R2t),
}

impl PduHeader {
    pub fn pdu_type(&self) -> PduType {
        match self {
            Self::IcReq(_) => PduType::IcReq,
            Self::IcResp(_) => PduType::IcResp,
            Self::H2CTermReq(_) => PduType::H2CTermReq,
            Self::C2HTermReq(_) => PduType::C2HTermReq,
            Self::CapsuleCmd(_) => PduType::CapsuleCmd,
            Self::CapsuleResp(_) => PduType::CapsuleResp,
            Self::H2CData { .. } => PduType::H2CData,
            Self::C2HData { .. } => PduType::C2HData,
            Self::R2T(_) => PduType::R2T,
        }
    }

    /// Decodes the header bytes of a PDU whose common header `layout` was validated;
    /// `header` is HLEN bytes (digest excluded), or all of PLEN for termination requests.
    /// Also checks the fields whose meaning depends on the rest of the PDU (DATAL).
    pub fn decode(layout: &PduLayout, header: &[u8]) -> Result<Self, PduError> {
        Ok(match layout.pdu_type {
            PduType::IcReq => Self::IcReq(IcReq::decode(header)?),
            PduType::IcResp => Self::IcResp(IcResp::decode(header)?),
            PduType::H2CTermReq => Self::H2CTermReq(TermReq::decode(header)?),
            PduType::C2HTermReq => Self::C2HTermReq(TermReq::decode(header)?),
            PduType::CapsuleCmd => Self::CapsuleCmd(Sqe::decode(after_common(header)?)?),
            PduType::CapsuleResp => Self::CapsuleResp(Cqe::decode(after_common(header)?)?),
            PduType::H2CData | PduType::C2HData => {
                let hdr = DataHeader::decode(header)?;
                // §3.6.2.8: DATAL is exactly the data carried by this PDU, and not 0.
                if hdr.datal != layout.data_len || hdr.datal == 0 {
                    return Err(PduError::InvalidField {
                        field: "DATAL",
                        offset: offsets::DATAL,
                        value: hdr.datal as u64,
                    });
                }
                let last = layout.flags & flags::LAST_PDU != 0;
                if layout.pdu_type == PduType::H2CData {
                    Self::H2CData { hdr, last }
                } else {
                    Self::C2HData {
                        hdr,
                        last,
                        success: layout.flags & flags::SUCCESS != 0,
                    }
                }
            }
            PduType::R2T => Self::R2T(R2t::decode(header)?),
        })
    }
}

fn after_common(header: &[u8]) -> Result<&[u8], DecodeError> {
    header
        .get(COMMON_HEADER_LEN..)
        .ok_or(DecodeError::Truncated {
            needed: COMMON_HEADER_LEN,
            available: header.len(),
        })
}

/// Encodes PDU headers for sending: the header (with HDGST when enabled), and the numbers
/// the caller needs to append pad, data and DDGST.
#[derive(Debug, Clone)]
pub struct EncodedHeader {
    /// Header + header digest + pad: bytes to send before the data.
    pub bytes: [u8; MAX_HEADER_BUF],
    pub len: usize,
}

impl EncodedHeader {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Builds the header bytes (common header, type-specific fields, HDGST, pad up to PDO) of a
/// PDU with `data_len` bytes of data. `pda` is the peer's required data alignment in bytes
/// (4 when it asked for none). Termination requests go through [`TermReq::encode`].
pub fn encode_header(
    header: &PduHeader,
    digests: Digests,
    data_len: u32,
    pda: usize,
) -> EncodedHeader {
    let pdu_type = header.pdu_type();
    let hlen = pdu_type.header_len();
    let mut out = EncodedHeader {
        bytes: [0u8; MAX_HEADER_BUF],
        len: 0,
    };
    let mut fl = 0u8;
    match header {
        PduHeader::IcReq(ic) => {
            out.bytes[..IC_PDU_LEN].copy_from_slice(&ic.encode());
            out.len = IC_PDU_LEN;
            return out;
        }
        PduHeader::IcResp(ic) => {
            out.bytes[..IC_PDU_LEN].copy_from_slice(&ic.encode());
            out.len = IC_PDU_LEN;
            return out;
        }
        PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) => {
            let v = t.encode(pdu_type);
            out.bytes[..v.len()].copy_from_slice(&v);
            out.len = v.len();
            return out;
        }
        PduHeader::CapsuleCmd(sqe) => out.bytes[8..72].copy_from_slice(&sqe.encode()),
        PduHeader::CapsuleResp(cqe) => out.bytes[8..24].copy_from_slice(&cqe.encode()),
        PduHeader::H2CData { hdr, last } => {
            hdr.encode_fields(&mut out.bytes);
            if *last {
                fl |= flags::LAST_PDU;
            }
        }
        PduHeader::C2HData { hdr, last, success } => {
            hdr.encode_fields(&mut out.bytes);
            if *last {
                fl |= flags::LAST_PDU;
            }
            if *success {
                fl |= flags::SUCCESS;
            }
        }
        PduHeader::R2T(r) => {
            let h = DataHeader {
                cccid: r.cccid,
                ttag: r.ttag,
                datao: r.r2to,
                datal: r.r2tl,
            };
            h.encode_fields(&mut out.bytes);
        }
    }
    let hdgst = digests.header_len();
    if hdgst > 0 {
        fl |= flags::HDGSTF;
    }
    let full = hlen + hdgst;
    let (pdo, ddgst) = if data_len > 0 {
        if digests.data {
            fl |= flags::DDGSTF;
        }
        (full.next_multiple_of(pda.max(4)), digests.data_len())
    } else {
        (0, 0)
    };
    let header_end = pdo.max(full);
    let ch = CommonHeader {
        pdu_type: pdu_type as u8,
        flags: fl,
        hlen: hlen as u8,
        pdo: pdo as u8,
        plen: (header_end + data_len as usize + ddgst) as u32,
    };
    out.bytes[..COMMON_HEADER_LEN].copy_from_slice(&ch.encode());
    if hdgst > 0 {
        let d = digest(&out.bytes[..hlen]);
        put_u32_at(&mut out.bytes, hlen, d);
    }
    // Pad bytes are already zero.
    out.len = header_end;
    out
}

/// Encodes a whole PDU into one buffer (client and tests; the target's send path gathers
/// header and data without copying).
pub fn encode_pdu(header: &PduHeader, data: &[u8], digests: Digests, pda: usize) -> Vec<u8> {
    let h = encode_header(header, digests, data.len() as u32, pda);
    let mut out = Vec::with_capacity(h.len + data.len() + DIGEST_LEN);
    out.extend_from_slice(h.as_slice());
    out.extend_from_slice(data);
    if !data.is_empty() && digests.data {
        out.extend_from_slice(&digest(data).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests;
