//! Copy Source Range Entries, descriptor format 0 (NVM Command Set 1.0 §3.3.1.1, Figure 37):
//! the data of a Copy command, one 32-byte entry per source range.

use crate::spec::nvm_bits::COPY_SOURCE_RANGE_SIZE;
use codec::{put_u16_at, put_u64_at};

/// One source range: its first LBA and its length in blocks (1..=65536; NLB on the wire is
/// 0's based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRange {
    pub slba: u64,
    pub blocks: u32,
}

const _: () = assert!(SourceRange::SIZE == 32);

impl SourceRange {
    pub const SIZE: usize = COPY_SOURCE_RANGE_SIZE;

    /// SLBA at bytes 15:08, NLB (0's based) at 17:16; the rest is reserved or unused by
    /// format 0.
    pub fn decode(e: &[u8; Self::SIZE]) -> SourceRange {
        let mut slba = [0; 8];
        slba.copy_from_slice(&e[8..16]);
        SourceRange {
            slba: u64::from_le_bytes(slba),
            blocks: u32::from(u16::from_le_bytes([e[16], e[17]])) + 1,
        }
    }

    /// The entry; `blocks` must be 1..=65536 (the host side builds these).
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut e = [0; Self::SIZE];
        put_u64_at(&mut e, 8, self.slba);
        put_u16_at(&mut e, 16, (self.blocks - 1) as u16);
        e
    }
}

/// The data of a Copy of `ranges`, (SLBA, blocks) each.
pub fn encode_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    ranges
        .iter()
        .flat_map(|&(slba, blocks)| SourceRange { slba, blocks }.encode())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_at_their_offsets() {
        let r = SourceRange {
            slba: 0x0102_0304_0506_0708,
            blocks: 65536,
        };
        let e = r.encode();
        assert_eq!(e[8..16], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(e[16..18], [0xff, 0xff]);
        assert!(e[..8].iter().chain(&e[18..]).all(|&b| b == 0));
        assert_eq!(SourceRange::decode(&e), r);
        assert_eq!(
            encode_ranges(&[(1, 1), (2, 2)]).len(),
            2 * SourceRange::SIZE
        );
    }
}
