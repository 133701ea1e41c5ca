//! Deterministic test data shared by the tests of every crate and the fuzz targets.

use crate::{BlockOp, IoSubmit};

/// `len` bytes that depend on `seed` and on the position (xorshift64): a misplaced, stale or
/// torn block never matches the data written.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The submitter for tests whose namespaces complete inside `start` (RAM, null): a submitted op
/// means the setup is not what the test thinks, so it panics naming the tag.
#[derive(Debug, Default)]
pub struct InlineOnly;

impl IoSubmit for InlineOnly {
    fn submit(&mut self, _op: BlockOp, tag: u64) {
        panic!("an inline namespace submitted an op (tag {tag:#x})");
    }

    fn submit_group(&mut self, _ops: &[BlockOp], tag: u64) {
        panic!("an inline namespace submitted ops (tag {tag:#x})");
    }
}
