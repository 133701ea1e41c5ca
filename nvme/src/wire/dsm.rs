//! Dataset Management Range entries (NVM Command Set 1.0 §3.2.3, Figure 40): the data of a
//! Dataset Management command, one 16-byte entry per range.

use crate::spec::nvm_bits::DSM_RANGE_SIZE;
use codec::{put_u32_at, put_u64_at};

/// One range: context attributes, length in logical blocks (a count, not 0's based; 0 names
/// no block) and starting LBA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    pub attributes: u32,
    pub blocks: u32,
    pub slba: u64,
}

const _: () = assert!(DsmRange::SIZE == 16);

impl DsmRange {
    pub const SIZE: usize = DSM_RANGE_SIZE;

    /// Context Attributes at bytes 03:00, Length in Logical Blocks at 07:04, SLBA at 15:08.
    pub fn decode(e: &[u8; Self::SIZE]) -> DsmRange {
        let mut slba = [0; 8];
        slba.copy_from_slice(&e[8..16]);
        DsmRange {
            attributes: u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
            blocks: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            slba: u64::from_le_bytes(slba),
        }
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut e = [0; Self::SIZE];
        put_u32_at(&mut e, 0, self.attributes);
        put_u32_at(&mut e, 4, self.blocks);
        put_u64_at(&mut e, 8, self.slba);
        e
    }
}

/// The data of a Dataset Management command over `(slba, blocks)` ranges, no attributes.
pub fn encode_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    ranges
        .iter()
        .flat_map(|&(slba, blocks)| {
            DsmRange {
                attributes: 0,
                blocks,
                slba,
            }
            .encode()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_at_their_offsets() {
        let r = DsmRange {
            attributes: 0x0a0b_0c0d,
            blocks: 0x1122_3344,
            slba: 0x0102_0304_0506_0708,
        };
        let e = r.encode();
        assert_eq!(e[0..4], [0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(e[4..8], [0x44, 0x33, 0x22, 0x11]);
        assert_eq!(e[8..16], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(DsmRange::decode(&e), r);
        let two = encode_ranges(&[(6, 2), (10, 1)]);
        assert_eq!(two.len(), 2 * DsmRange::SIZE);
        assert_eq!(
            DsmRange::decode(two[16..].try_into().unwrap()),
            DsmRange {
                attributes: 0,
                blocks: 1,
                slba: 10
            }
        );
    }
}
