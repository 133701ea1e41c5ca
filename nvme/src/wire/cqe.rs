//! Completion queue entry (NVMe Base 2.0 §4.6, Figure 89), carried in a response capsule.

use crate::spec::Status;
use codec::{put_u16_at, put_u32_at, DecodeError, Reader};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command specific DW0 (e.g. the cntlid for Connect, the value for Get Features).
    pub dw0: u32,
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    /// Status field; the phase tag is meaningless on fabrics and always encoded 0.
    pub status: Status,
}

impl Cqe {
    pub const SIZE: usize = 16;

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let cqe = Cqe {
            dw0: r.u32()?,
            dw1: r.u32()?,
            sqhd: r.u16()?,
            sqid: r.u16()?,
            cid: r.u16()?,
            status: Status::from_field(r.u16()?),
        };
        r.expect_empty()?;
        Ok(cqe)
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        put_u32_at(&mut out, 0, self.dw0);
        put_u32_at(&mut out, 4, self.dw1);
        put_u16_at(&mut out, 8, self.sqhd);
        put_u16_at(&mut out, 10, self.sqid);
        put_u16_at(&mut out, 12, self.cid);
        put_u16_at(&mut out, 14, self.status.to_field());
        out
    }
}

const _: () = assert!(Cqe::SIZE == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_status() {
        let cqe = Cqe {
            dw0: 0xabcd,
            dw1: 1,
            sqhd: 7,
            sqid: 2,
            cid: 99,
            status: Status::INVALID_FIELD.with_dnr(),
        };
        let bytes = cqe.encode();
        assert_eq!(Cqe::decode(&bytes), Ok(cqe));
        // SC 0x02 lands in bits 8:1 and DNR in bit 15 of DW3[31:16].
        assert_eq!(u16::from_le_bytes([bytes[14], bytes[15]]), 0x8004);
    }

    #[test]
    fn rejects_short_input() {
        assert!(Cqe::decode(&[0u8; 15]).is_err());
    }
}
