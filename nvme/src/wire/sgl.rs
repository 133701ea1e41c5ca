//! SGL descriptors (NVMe Base 2.0 §4.3.2, Figure 114–123). NVMe/TCP uses Transport Data Block
//! (5h, subtype Ah) and Data Block with Offset (0h, subtype 1h) for in-capsule data; NVMe/RDMA
//! uses Keyed Data Block (4h) and the same offset form.

use codec::{u64_at, DecodeError, Reader};

/// Descriptor type (bits 7:4 of byte 15) with its subtype (bits 3:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglType {
    /// Type 0h, subtype 0h: data block at a host memory address.
    DataBlockAddress,
    /// Type 0h, subtype 1h: data block at an offset into the capsule's in-capsule data.
    DataBlockOffset,
    /// Type 4h, subtype 0h: keyed data block (RDMA).
    KeyedDataBlock,
    /// Type 4h, subtype Fh: keyed data block, invalidate the remote key when done.
    KeyedDataBlockInvalidate,
    /// Type 5h, subtype Ah: transport data block (NVMe/TCP: data moves by R2T/H2C or C2H PDUs).
    TransportDataBlock,
    /// Anything else; the raw type and subtype are kept for the error log.
    Other { sgl_type: u8, subtype: u8 },
}

impl SglType {
    pub fn from_byte(b: u8) -> Self {
        match (b >> 4, b & 0xf) {
            (0x0, 0x0) => Self::DataBlockAddress,
            (0x0, 0x1) => Self::DataBlockOffset,
            (0x4, 0x0) => Self::KeyedDataBlock,
            (0x4, 0xf) => Self::KeyedDataBlockInvalidate,
            (0x5, 0xa) => Self::TransportDataBlock,
            (sgl_type, subtype) => Self::Other { sgl_type, subtype },
        }
    }

    pub fn to_byte(self) -> u8 {
        match self {
            Self::DataBlockAddress => 0x00,
            Self::DataBlockOffset => 0x01,
            Self::KeyedDataBlock => 0x40,
            Self::KeyedDataBlockInvalidate => 0x4f,
            Self::TransportDataBlock => 0x5a,
            Self::Other { sgl_type, subtype } => (sgl_type << 4) | (subtype & 0xf),
        }
    }

    pub fn is_keyed(self) -> bool {
        matches!(self, Self::KeyedDataBlock | Self::KeyedDataBlockInvalidate)
    }
}

/// One 16-byte SGL descriptor. For keyed descriptors `length` is 24 bits and `key` is valid;
/// for the others `length` is 32 bits and `key` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SglDescriptor {
    pub address: u64,
    pub length: u32,
    pub key: u32,
    pub sgl_type: SglType,
}

impl Default for SglDescriptor {
    fn default() -> Self {
        Self {
            address: 0,
            length: 0,
            key: 0,
            sgl_type: SglType::DataBlockAddress,
        }
    }
}

impl SglDescriptor {
    pub const SIZE: usize = 16;

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let array = r.take_array::<{ Self::SIZE }>()?;
        r.expect_empty()?;
        Ok(Self::from_bytes(&array))
    }

    /// The descriptor in 16 bytes (every bit pattern decodes; the type says what it means).
    #[inline]
    pub fn from_bytes(b: &[u8; Self::SIZE]) -> Self {
        let address = u64_at(b, 0);
        let rest = [b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]];
        let sgl_type = SglType::from_byte(rest[7]);
        let (length, key) = if sgl_type.is_keyed() {
            (
                u32::from_le_bytes([rest[0], rest[1], rest[2], 0]),
                u32::from_le_bytes([rest[3], rest[4], rest[5], rest[6]]),
            )
        } else {
            (u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]), 0)
        };
        Self {
            address,
            length,
            key,
            sgl_type,
        }
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..8].copy_from_slice(&self.address.to_le_bytes());
        if self.sgl_type.is_keyed() {
            out[8..11].copy_from_slice(&self.length.to_le_bytes()[..3]);
            out[11..15].copy_from_slice(&self.key.to_le_bytes());
        } else {
            out[8..12].copy_from_slice(&self.length.to_le_bytes());
        }
        out[15] = self.sgl_type.to_byte();
        out
    }

    /// The NVMe/TCP descriptor for data moved by R2T/H2CData or C2HData (address 0).
    pub fn transport_data_block(length: u32) -> Self {
        Self {
            address: 0,
            length,
            key: 0,
            sgl_type: SglType::TransportDataBlock,
        }
    }

    /// The descriptor for in-capsule data at `offset` bytes into the capsule data.
    pub fn in_capsule(offset: u64, length: u32) -> Self {
        Self {
            address: offset,
            length,
            key: 0,
            sgl_type: SglType::DataBlockOffset,
        }
    }
}

const _: () = assert!(SglDescriptor::SIZE == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_round_trip_uses_24_bit_length() {
        let d = SglDescriptor {
            address: 0x1122_3344_5566_7788,
            length: 0x00ab_cdef,
            key: 0xdead_beef,
            sgl_type: SglType::KeyedDataBlockInvalidate,
        };
        let bytes = d.encode();
        assert_eq!(bytes[15], 0x4f);
        assert_eq!(SglDescriptor::decode(&bytes), Ok(d));
    }

    #[test]
    fn tcp_descriptors_round_trip() {
        for d in [
            SglDescriptor::transport_data_block(4096),
            SglDescriptor::in_capsule(0, 512),
        ] {
            assert_eq!(SglDescriptor::decode(&d.encode()), Ok(d));
        }
        assert_eq!(SglDescriptor::transport_data_block(0).encode()[15], 0x5a);
    }

    #[test]
    fn unknown_types_are_kept() {
        let mut bytes = [0u8; 16];
        bytes[15] = 0x23;
        let d = SglDescriptor::decode(&bytes).unwrap();
        assert_eq!(
            d.sgl_type,
            SglType::Other {
                sgl_type: 2,
                subtype: 3
            }
        );
        assert_eq!(d.encode(), bytes);
    }
}
