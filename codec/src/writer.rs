//! The encoding half of the dialect: a cursor over a buffer sized for the structure up front
//! ([`Writer`]), and fixed-offset fields for structures whose size the type proves
//! ([`put_u16_at`] …, the mirror of [`crate::u16_at`]).
//!
//! The encoder computes a structure's size before writing it, and [`Writer::finish`] asserts
//! that the fields filled exactly that size: a layout whose fields and size disagree is a bug
//! found by the first test that encodes it, not a short or padded message on the wire.

/// Cursor over a buffer the encoder sized; every write is bounds-checked (writing past the
/// size the encoder computed is a bug and panics, as slice indexing does).
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Encodes a structure of exactly `len` bytes into a new vector: `fill` writes every
    /// field, and the bytes written must add up to `len`.
    pub fn to_vec(len: usize, fill: impl FnOnce(&mut Writer<'_>)) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let mut w = Writer::new(&mut out);
        fill(&mut w);
        w.finish();
        out
    }

    /// Bytes written so far (the offset of the next field).
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes, to be written by the caller.
    pub fn slot(&mut self, n: usize) -> &mut [u8] {
        let at = self.pos;
        assert!(
            n <= self.remaining(),
            "encoder overran its size: {n} bytes at offset {at} of {}",
            self.buf.len()
        );
        self.pos += n;
        &mut self.buf[at..at + n]
    }

    pub fn bytes(&mut self, b: &[u8]) {
        self.slot(b.len()).copy_from_slice(b);
    }

    /// Reserved bytes: zero on the wire.
    pub fn zeros(&mut self, n: usize) {
        self.slot(n).fill(0);
    }

    pub fn u8(&mut self, v: u8) {
        self.slot(1)[0] = v;
    }

    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }

    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// Zero-fills up to offset `at` (the reserved bytes before the next field or the end).
    pub fn pad_to(&mut self, at: usize) {
        assert!(
            at >= self.pos,
            "encoder is past offset {at} already ({})",
            self.pos
        );
        self.zeros(at - self.pos);
    }

    /// Asserts that the fields filled the buffer exactly.
    pub fn finish(self) {
        assert_eq!(
            self.pos,
            self.buf.len(),
            "encoder wrote {} of the {} bytes it sized",
            self.pos,
            self.buf.len()
        );
    }
}

/// Fixed-offset little-endian fields of a structure whose length the type proves
/// (`&mut [u8; N]`): the offsets are constants, so the index checks fold away.
#[inline]
pub fn put_u16_at<const N: usize>(b: &mut [u8; N], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put_u32_at<const N: usize>(b: &mut [u8; N], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put_u64_at<const N: usize>(b: &mut [u8; N], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{u16_at, u32_at, u64_at, Reader};

    #[test]
    fn writes_little_endian_in_order() {
        let v = Writer::to_vec(16, |w| {
            w.u8(1);
            w.u16(0x0302);
            w.u32(0x0706_0504);
            w.zeros(1);
            w.pad_to(8);
            w.u64(0x100f_0e0d_0c0b_0a09);
        });
        assert_eq!(v, [1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 13, 14, 15, 16]);
        let mut r = Reader::new(&v);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(0x0302));
    }

    #[test]
    #[should_panic(expected = "overran")]
    fn overrun_is_a_bug() {
        Writer::to_vec(2, |w| w.u32(0));
    }

    #[test]
    #[should_panic(expected = "wrote 1 of the 2")]
    fn short_structure_is_a_bug() {
        Writer::to_vec(2, |w| w.u8(0));
    }

    #[test]
    fn fixed_offsets_round_trip() {
        let mut b = [0u8; 16];
        put_u16_at(&mut b, 0, 0xbeef);
        put_u32_at(&mut b, 2, 0xdead_beef);
        put_u64_at(&mut b, 8, u64::MAX - 1);
        assert_eq!(
            (u16_at(&b, 0), u32_at(&b, 2), u64_at(&b, 8)),
            (0xbeef, 0xdead_beef, u64::MAX - 1)
        );
        assert_eq!(b[6..8], [0, 0]);
    }
}
