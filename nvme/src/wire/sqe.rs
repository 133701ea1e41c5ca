//! Submission queue entry (NVMe Base 2.0 §4.2, Figure 88). In NVMe-oF the SQE travels inside a
//! command capsule; the data pointer is always an SGL descriptor (NVMe-oF 1.1 §2.2: PSDT = 01b).

use super::sgl::SglDescriptor;
use crate::spec::{sqe_flags, FABRICS_OPCODE};
use codec::{exact, u16_at, u32_at, u64_at, DecodeError};

/// A 64-byte submission queue entry, fields in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sqe {
    pub opcode: u8,
    /// FUSE (bits 1:0) and PSDT (bits 7:6).
    pub flags: u8,
    pub cid: u16,
    /// For Fabrics commands byte 0 of this field is `fctype`.
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub mptr: u64,
    pub dptr: SglDescriptor,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

impl Sqe {
    pub const SIZE: usize = 64;

    /// Decodes an SQE from exactly 64 bytes, in place (`codec::exact` says how any other
    /// length is short or long).
    #[inline]
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self::from_bytes(exact::<{ Self::SIZE }>(bytes)?))
    }

    /// The SQE in 64 bytes (infallible: every bit pattern is an SQE; meaning is checked later).
    #[inline]
    pub fn from_bytes(b: &[u8; Self::SIZE]) -> Self {
        let mut dptr = [0u8; SglDescriptor::SIZE];
        dptr.copy_from_slice(&b[24..40]);
        Sqe {
            opcode: b[0],
            flags: b[1],
            cid: u16_at(b, 2),
            nsid: u32_at(b, 4),
            cdw2: u32_at(b, 8),
            cdw3: u32_at(b, 12),
            mptr: u64_at(b, 16),
            dptr: SglDescriptor::from_bytes(&dptr),
            cdw10: u32_at(b, 40),
            cdw11: u32_at(b, 44),
            cdw12: u32_at(b, 48),
            cdw13: u32_at(b, 52),
            cdw14: u32_at(b, 56),
            cdw15: u32_at(b, 60),
        }
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0] = self.opcode;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.cid.to_le_bytes());
        out[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        out[8..12].copy_from_slice(&self.cdw2.to_le_bytes());
        out[12..16].copy_from_slice(&self.cdw3.to_le_bytes());
        out[16..24].copy_from_slice(&self.mptr.to_le_bytes());
        out[24..40].copy_from_slice(&self.dptr.encode());
        for (i, dw) in [
            self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
        ]
        .iter()
        .enumerate()
        {
            out[40 + 4 * i..44 + 4 * i].copy_from_slice(&dw.to_le_bytes());
        }
        out
    }

    pub fn is_fabrics(&self) -> bool {
        self.opcode == FABRICS_OPCODE
    }

    /// Fabrics command type (NVMe-oF 1.1 §6, Figure 22), meaningful only when `is_fabrics()`.
    pub fn fctype(&self) -> u8 {
        self.nsid as u8
    }

    /// PSDT (bits 7:6 of CDW0 byte 1); NVMe-oF requires 01b (SGL, metadata contiguous).
    pub fn psdt(&self) -> u8 {
        self.flags >> sqe_flags::PSDT_SHIFT
    }

    /// FUSE (bits 1:0); nvmfd supports no fused operations.
    pub fn fuse(&self) -> u8 {
        self.flags & sqe_flags::FUSE_MASK
    }
}

const _: () = assert!(Sqe::SIZE == 64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let sqe = Sqe {
            opcode: 0x02,
            flags: crate::spec::sqe_flags::PSDT_SGL,
            cid: 0x1234,
            nsid: 1,
            cdw2: 2,
            cdw3: 3,
            mptr: 0xdead_beef,
            dptr: SglDescriptor::decode(&[7; 16]).unwrap(),
            cdw10: 10,
            cdw11: 11,
            cdw12: 12,
            cdw13: 13,
            cdw14: 14,
            cdw15: 15,
        };
        let bytes = sqe.encode();
        assert_eq!(Sqe::decode(&bytes), Ok(sqe));
        assert_eq!(Sqe::from_bytes(&bytes), sqe);
        assert_eq!(sqe.psdt(), 1);
        assert_eq!(bytes[40], 10);
    }

    #[test]
    fn rejects_wrong_length() {
        assert!(matches!(
            Sqe::decode(&[0u8; 63]),
            Err(DecodeError::Truncated { .. })
        ));
        assert_eq!(Sqe::decode(&[0u8; 65]), Err(DecodeError::TrailingData(1)));
    }

    #[test]
    fn fabrics_fctype_is_byte_four() {
        let mut bytes = [0u8; 64];
        bytes[0] = FABRICS_OPCODE;
        bytes[4] = 0x01;
        let sqe = Sqe::decode(&bytes).unwrap();
        assert!(sqe.is_fabrics());
        assert_eq!(sqe.fctype(), 0x01);
    }
}
