//! What to submit next: the access pattern (random or sequential), the read/write mix and the
//! block address of every I/O. Deterministic for a given seed and allocation-free, so the I/O
//! loop can call it once per submission.

use std::fmt;

/// The workloads of spdk_nvme_perf / fio that the generator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    Randread,
    Randwrite,
    Read,
    Write,
    Randrw,
}

impl WorkloadKind {
    pub fn is_random(self) -> bool {
        matches!(self, Self::Randread | Self::Randwrite | Self::Randrw)
    }

    /// Percentage of reads: fixed for the pure workloads, `mix` for randrw.
    pub fn read_percent(self, mix: u8) -> u8 {
        match self {
            Self::Randread | Self::Read => 100,
            Self::Randwrite | Self::Write => 0,
            Self::Randrw => mix.min(100),
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Randread => "randread",
            Self::Randwrite => "randwrite",
            Self::Read => "read",
            Self::Write => "write",
            Self::Randrw => "randrw",
        })
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny state, passes BigCrush, and every seed (also 0)
/// gives a full-period stream — ample for picking offsets.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0) by Lemire's multiply-shift: no division, bias < n / 2^64.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// One I/O to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRequest {
    pub read: bool,
    /// Starting LBA.
    pub slba: u64,
}

/// Why a workload cannot run on a namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("I/O size {bs} is not a multiple of the {block_size}-byte block size")]
    Unaligned { bs: u32, block_size: u32 },
    #[error("the namespace ({blocks} blocks) is smaller than one {bs}-byte I/O")]
    TooSmall { blocks: u64, bs: u32 },
}

/// Everything that shapes the I/O stream of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadSpec {
    pub kind: WorkloadKind,
    /// Read percentage for randrw.
    pub mix: u8,
    /// I/O size in bytes.
    pub bs: u32,
    /// Namespace logical block size.
    pub block_size: u32,
    /// Blocks of the namespace to use (from LBA 0).
    pub blocks: u64,
    /// Number of queues sharing the range.
    pub queues: u32,
    pub seed: u64,
}

/// Generates the I/Os of one queue: block-size-aligned, `bs`-sized, inside the first
/// `blocks` blocks of the namespace.
#[derive(Debug, Clone)]
pub struct IoGenerator {
    rng: Rng,
    random: bool,
    read_percent: u8,
    blocks_per_io: u64,
    /// Number of distinct `bs`-aligned positions.
    positions: u64,
    /// Sequential: next position.
    next: u64,
}

impl IoGenerator {
    /// The generator of queue `queue` (of `spec.queues`): sequential queues start evenly
    /// spread over the range so they do not all read the same blocks; random queues get
    /// independent seeds.
    pub fn new(spec: &WorkloadSpec, queue: u32) -> Result<Self, WorkloadError> {
        let WorkloadSpec {
            kind,
            mix,
            bs,
            block_size,
            blocks,
            queues,
            seed,
        } = *spec;
        if block_size == 0 || bs == 0 || bs % block_size != 0 {
            return Err(WorkloadError::Unaligned { bs, block_size });
        }
        let blocks_per_io = (bs / block_size) as u64;
        let positions = blocks / blocks_per_io;
        if positions == 0 {
            return Err(WorkloadError::TooSmall { blocks, bs });
        }
        let queues = queues.max(1) as u64;
        Ok(Self {
            rng: Rng::new(seed ^ (queue as u64).wrapping_mul(0xa076_1d64_78bd_642f)),
            random: kind.is_random(),
            read_percent: kind.read_percent(mix),
            blocks_per_io,
            positions,
            next: (queue as u64 % queues) * positions / queues,
        })
    }

    /// Blocks per I/O (the NLB + 1 of every command).
    pub fn blocks_per_io(&self) -> u32 {
        self.blocks_per_io as u32
    }

    pub fn next_io(&mut self) -> IoRequest {
        let pos = if self.random {
            self.rng.below(self.positions)
        } else {
            let p = self.next;
            self.next = if p + 1 == self.positions { 0 } else { p + 1 };
            p
        };
        let read = match self.read_percent {
            100 => true,
            0 => false,
            pct => self.rng.below(100) < pct as u64,
        };
        IoRequest {
            read,
            slba: pos * self.blocks_per_io,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: WorkloadKind, bs: u32, block_size: u32, blocks: u64) -> WorkloadSpec {
        WorkloadSpec {
            kind,
            mix: 0,
            bs,
            block_size,
            blocks,
            queues: 1,
            seed: 42,
        }
    }

    fn generator(kind: WorkloadKind, mix: u8, queue: u32, queues: u32) -> IoGenerator {
        let s = WorkloadSpec {
            mix,
            queues,
            ..spec(kind, 4096, 512, 1 << 16)
        };
        IoGenerator::new(&s, queue).unwrap()
    }

    #[test]
    fn random_offsets_are_aligned_in_range_and_spread() {
        let mut g = generator(WorkloadKind::Randread, 0, 0, 1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20_000 {
            let io = g.next_io();
            assert!(io.read);
            assert_eq!(io.slba % 8, 0, "4 KiB of 512-byte blocks");
            assert!(io.slba + 8 <= 1 << 16);
            seen.insert(io.slba);
        }
        // 8192 positions, 20000 draws: a uniform source leaves only ~7 % unseen.
        assert!(seen.len() > 7000, "only {} distinct offsets", seen.len());
    }

    #[test]
    fn sequential_wraps_and_queues_start_apart() {
        let mut g = IoGenerator::new(&spec(WorkloadKind::Write, 8192, 4096, 10), 0).unwrap();
        let slbas: Vec<u64> = (0..7).map(|_| g.next_io().slba).collect();
        // 10 blocks of 4 KiB hold five 8 KiB positions.
        assert_eq!(slbas, [0, 2, 4, 6, 8, 0, 2]);
        let q1 = generator(WorkloadKind::Read, 0, 1, 4).next_io();
        let q3 = generator(WorkloadKind::Read, 0, 3, 4).next_io();
        assert_eq!(q1.slba, (1 << 16) / 4);
        assert_eq!(q3.slba, 3 * (1 << 16) / 4);
    }

    #[test]
    fn mix_gives_the_asked_read_share() {
        let mut g = generator(WorkloadKind::Randrw, 70, 0, 1);
        let reads = (0..100_000).filter(|_| g.next_io().read).count();
        assert!((69_000..71_000).contains(&reads), "{reads} reads of 100000");
        let mut w = generator(WorkloadKind::Randwrite, 70, 0, 1);
        assert!(
            (0..1000).all(|_| !w.next_io().read),
            "mix ignored for randwrite"
        );
    }

    #[test]
    fn same_seed_same_stream_other_queue_other_stream() {
        let a: Vec<_> = {
            let mut g = generator(WorkloadKind::Randrw, 50, 0, 2);
            (0..64).map(|_| g.next_io()).collect()
        };
        let b: Vec<_> = {
            let mut g = generator(WorkloadKind::Randrw, 50, 0, 2);
            (0..64).map(|_| g.next_io()).collect()
        };
        let c: Vec<_> = {
            let mut g = generator(WorkloadKind::Randrw, 50, 1, 2);
            (0..64).map(|_| g.next_io()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn rejects_unaligned_and_too_small() {
        assert_eq!(
            IoGenerator::new(&spec(WorkloadKind::Read, 1000, 512, 100), 0).unwrap_err(),
            WorkloadError::Unaligned {
                bs: 1000,
                block_size: 512
            }
        );
        assert_eq!(
            IoGenerator::new(&spec(WorkloadKind::Read, 4096, 4096, 0), 0).unwrap_err(),
            WorkloadError::TooSmall {
                blocks: 0,
                bs: 4096
            }
        );
    }

    #[test]
    fn below_stays_below() {
        let mut r = Rng::new(0);
        for n in [1u64, 2, 3, 1000, u64::MAX] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
    }
}
