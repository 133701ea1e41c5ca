//! A bounded cursor over bytes received from the network. Decoding through it can never read
//! past what the peer actually sent (the rustls `codec::Reader` habit).

use thiserror::Error;

/// Why a wire structure could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("structure truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("{0} trailing bytes after the structure")]
    TrailingData(usize),
    #[error("field {field} has invalid value {value:#x}")]
    InvalidValue { field: &'static str, value: u64 },
}

/// Cursor over a byte slice; every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes the next `n` bytes, or reports how many were missing.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                needed: n,
                available: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn take_array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take_array()?))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// A bounded reader over the next `n` bytes, for a nested structure.
    pub fn sub(&mut self, n: usize) -> Result<Reader<'a>, DecodeError> {
        Ok(Reader::new(self.take(n)?))
    }

    /// Trailing bytes are an error for fixed-size structures.
    pub fn expect_empty(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingData(n)),
        }
    }
}

/// `bytes` as exactly `N` bytes (no copy), or the error a [`Reader`] reports for a short or
/// long input (`take_array` then `expect_empty`).
#[inline]
pub fn exact<const N: usize>(bytes: &[u8]) -> Result<&[u8; N], DecodeError> {
    bytes.try_into().map_err(|_| size_error(N, bytes.len()))
}

#[cold]
fn size_error(n: usize, len: usize) -> DecodeError {
    if len < n {
        DecodeError::Truncated {
            needed: n,
            available: len,
        }
    } else {
        DecodeError::TrailingData(len - n)
    }
}

/// Fixed-offset little-endian fields of a structure whose length the type already proves
/// (`&[u8; N]`): the decoders' fast path for the exact wire size, with no cursor and no
/// per-field length checks (the offsets are constants, so the index checks fold away).
#[inline]
pub fn u16_at<const N: usize>(b: &[u8; N], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
pub fn u32_at<const N: usize>(b: &[u8; N], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub fn u64_at<const N: usize>(b: &[u8; N], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_refuses_overrun() {
        let bytes = [1, 0, 2, 0, 0, 0, 9];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u32(), Ok(2));
        assert_eq!(
            r.u16(),
            Err(DecodeError::Truncated {
                needed: 2,
                available: 1
            })
        );
        assert_eq!(r.expect_empty(), Err(DecodeError::TrailingData(1)));
        assert_eq!(r.u8(), Ok(9));
        assert_eq!(r.expect_empty(), Ok(()));
    }

    #[test]
    fn sub_reader_is_bounded() {
        let bytes = [1, 2, 3, 4];
        let mut r = Reader::new(&bytes);
        let mut inner = r.sub(2).unwrap();
        assert_eq!(inner.u16(), Ok(0x0201));
        assert!(inner.u8().is_err());
        assert_eq!(r.remaining(), 2);
    }
}
