//! Namespaces: the configuration of one namespace and the opened, immutable view of it that
//! every queue of every controller shares.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::reservation::Reservations;
use crate::write_lock::WriteLocks;
use storage::Backend;
pub use storage::BackendConfig;

/// One namespace as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub nsid: u32,
    pub backend: BackendConfig,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    pub read_only: bool,
    /// Stable identifiers; derived from the subsystem NQN and NSID when absent.
    pub uuid: Option<[u8; 16]>,
    pub nguid: Option<[u8; 16]>,
    /// ANA group (NVMe Base 2.0 §8.1.3); the default ANA group unless configured.
    pub ana_group: u32,
}

/// An opened namespace. Immutable once built: a changed configuration builds a new one and
/// publishes a new [`NamespaceTable`].
#[derive(Debug)]
pub struct Namespace {
    pub nsid: u32,
    pub backend: Arc<dyn Backend>,
    pub block_size: u32,
    /// log2(block_size), for LBA ↔ byte conversion without division on the I/O path.
    pub lba_shift: u32,
    /// Capacity in logical blocks.
    pub blocks: u64,
    pub read_only: bool,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    /// ANA group ID (Identify Namespace ANAGRPID).
    pub anagrpid: u32,
    /// The configuration this namespace was opened from (to detect changes on reload).
    pub config: NamespaceConfig,
    /// Read/write counters (SMART, the control socket): the target's `health::Health` store
    /// hands every opening of one (subsystem, NSID) the same ones, so reconnects, reloads,
    /// resizes and (with a state directory) restarts keep counting on.
    pub stats: Arc<NamespaceStats>,
    /// Write exclusion for fused Compare and Write; shared by every republished view of the
    /// same backend (a resize or reload that keeps it keeps this too).
    pub writes: Arc<WriteLocks>,
    /// Registrants and reservation (NVMe Base 2.0 §8.19), kept like `stats`: in memory, for
    /// as long as this opened namespace.
    pub reservations: Reservations,
}

/// Per-namespace I/O counters. Several reactors update the same namespace, so these are
/// `fetch_add`s (Relaxed: they are statistics, ordered with nothing); one per command.
#[derive(Debug, Default)]
pub struct NamespaceStats {
    read_commands: AtomicU64,
    write_commands: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

/// A consistent-enough copy of [`NamespaceStats`] (each field read once).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceStatsSnapshot {
    pub read_commands: u64,
    pub write_commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl NamespaceStatsSnapshot {
    pub fn add(&mut self, o: &NamespaceStatsSnapshot) {
        self.read_commands += o.read_commands;
        self.write_commands += o.write_commands;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
    }
}

impl NamespaceStats {
    /// A Read command was started (successful or not, as the SMART Host Read Commands count).
    pub fn read_started(&self) {
        self.read_commands.fetch_add(1, Ordering::Relaxed);
    }

    pub fn write_started(&self) {
        self.write_commands.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes of a Read that completed successfully.
    pub fn read_done(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn write_done(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Adds counts saved by an earlier run (`health::Health::restore`).
    pub fn add(&self, saved: &NamespaceStatsSnapshot) {
        self.read_commands
            .fetch_add(saved.read_commands, Ordering::Relaxed);
        self.write_commands
            .fetch_add(saved.write_commands, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(saved.bytes_read, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(saved.bytes_written, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> NamespaceStatsSnapshot {
        NamespaceStatsSnapshot {
            read_commands: self.read_commands.load(Ordering::Relaxed),
            write_commands: self.write_commands.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }
}

impl Namespace {
    /// Wraps an opened backend. `subsys_nqn` seeds the default UUID/NGUID.
    pub fn new(
        config: NamespaceConfig,
        backend: Arc<dyn Backend>,
        subsys_nqn: &str,
    ) -> Result<Self, NamespaceError> {
        if config.nsid == 0 || config.nsid == u32::MAX {
            return Err(NamespaceError::InvalidNsid(config.nsid));
        }
        if config.block_size != 512 && config.block_size != 4096 {
            return Err(NamespaceError::InvalidBlockSize(config.block_size));
        }
        let lba_shift = config.block_size.trailing_zeros();
        let blocks = backend.capacity() >> lba_shift;
        if blocks == 0 {
            return Err(NamespaceError::Empty(config.nsid));
        }
        Ok(Self {
            nsid: config.nsid,
            backend,
            block_size: config.block_size,
            lba_shift,
            blocks,
            read_only: config.read_only,
            uuid: config
                .uuid
                .unwrap_or_else(|| derived_uuid(subsys_nqn, config.nsid)),
            nguid: config
                .nguid
                .unwrap_or_else(|| derived_nguid(subsys_nqn, config.nsid)),
            anagrpid: config.ana_group,
            config,
            stats: Arc::default(),
            writes: Arc::default(),
            reservations: Reservations::default(),
        })
    }
}

/// Why a namespace could not be set up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamespaceError {
    #[error("NSID {0} is not usable (1..=0xfffffffe)")]
    InvalidNsid(u32),
    #[error("block size {0} is not supported (512 or 4096)")]
    InvalidBlockSize(u32),
    #[error("namespace {0} has a capacity of less than one block")]
    Empty(u32),
}

/// The active namespaces of a subsystem, by NSID. Published as an `Arc` and replaced as a
/// whole, so I/O queues read it without locks (they re-check a generation counter).
#[derive(Debug, Default)]
pub struct NamespaceTable {
    by_nsid: BTreeMap<u32, Arc<Namespace>>,
    /// Indexed by NSID when the highest one is at most [`DENSE_NSIDS`] (the usual case): the
    /// per-command lookup is then an index, not a tree search (~20 instructions per I/O).
    /// Empty otherwise, and lookups go to `by_nsid`.
    dense: Vec<Option<Arc<Namespace>>>,
}

/// Highest NSID for which a table keeps the indexed copy (1 KiB of pointers per 128 NSIDs).
const DENSE_NSIDS: u32 = 1024;

impl NamespaceTable {
    pub fn new(namespaces: impl IntoIterator<Item = Arc<Namespace>>) -> Self {
        let by_nsid: BTreeMap<u32, Arc<Namespace>> =
            namespaces.into_iter().map(|ns| (ns.nsid, ns)).collect();
        let max = by_nsid.keys().next_back().copied().unwrap_or(0);
        let mut dense = Vec::new();
        if max <= DENSE_NSIDS {
            dense.resize(max as usize + 1, None);
            for (&nsid, ns) in &by_nsid {
                dense[nsid as usize] = Some(Arc::clone(ns));
            }
        }
        Self { by_nsid, dense }
    }

    #[inline]
    pub fn get(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        match self.dense.get(nsid as usize) {
            Some(slot) => slot.as_ref(),
            // Past the indexed range: absent when the index covers the table (its highest
            // NSID is the last slot), else in the tree.
            None if self.dense.is_empty() && !self.by_nsid.is_empty() => self.by_nsid.get(&nsid),
            None => None,
        }
    }

    /// Active NSIDs greater than `after`, ascending (Identify CNS 02h).
    pub fn nsids_after(&self, after: u32) -> impl Iterator<Item = u32> + '_ {
        self.by_nsid
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .map(|(&nsid, _)| nsid)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.by_nsid.values()
    }

    pub fn len(&self) -> usize {
        self.by_nsid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_nsid.is_empty()
    }

    /// Highest active NSID (Identify Controller NN), 0 when empty.
    pub fn max_nsid(&self) -> u32 {
        self.by_nsid.keys().next_back().copied().unwrap_or(0)
    }
}

/// 64-bit FNV-1a: a fixed, documented hash, so derived identifiers stay the same across
/// nvmfd versions and Rust releases (hosts key multipath and udev names on them).
fn fnv1a64(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = seed;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn derived_128(domain: &[u8], subsys_nqn: &str, nsid: u32) -> [u8; 16] {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    let parts: [&[u8]; 3] = [domain, subsys_nqn.as_bytes(), &nsid.to_le_bytes()];
    let hi = fnv1a64(FNV_OFFSET, &parts);
    let lo = fnv1a64(hi ^ FNV_OFFSET.rotate_left(17), &parts);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hi.to_be_bytes());
    out[8..].copy_from_slice(&lo.to_be_bytes());
    out
}

/// Default namespace UUID: an RFC 9562 version 8 (vendor-specific) UUID from the NQN + NSID.
pub fn derived_uuid(subsys_nqn: &str, nsid: u32) -> [u8; 16] {
    let mut u = derived_128(b"nvmfd-uuid", subsys_nqn, nsid);
    u[6] = (u[6] & 0x0f) | 0x80;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Default NGUID from the NQN + NSID (never all zero, which would mean "not reported").
pub fn derived_nguid(subsys_nqn: &str, nsid: u32) -> [u8; 16] {
    let mut g = derived_128(b"nvmfd-nguid", subsys_nqn, nsid);
    if g == [0; 16] {
        g[15] = 1;
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::ram::RamBackend;

    fn table(nsids: &[u32]) -> NamespaceTable {
        NamespaceTable::new(nsids.iter().map(|&nsid| {
            let config = NamespaceConfig::new(nsid, BackendConfig::Ram { size: 4096 }, 512);
            let backend = Arc::new(RamBackend::new(4096, 512).unwrap());
            Arc::new(Namespace::new(config, backend, "nqn.test").unwrap())
        }))
    }

    fn found(t: &NamespaceTable, nsids: impl IntoIterator<Item = u32>) -> Vec<u32> {
        nsids
            .into_iter()
            .filter(|&n| t.get(n).is_some_and(|ns| ns.nsid == n))
            .collect()
    }

    #[test]
    fn lookups_agree_with_the_namespaces_in_both_table_forms() {
        let probe = || [0, 1, 2, 3, 4, 1024, 1025, 5000, 5001, u32::MAX];
        // Indexed (highest NSID within DENSE_NSIDS), including its last slot.
        assert_eq!(found(&table(&[1, 3, 1024]), probe()), vec![1, 3, 1024]);
        // Past the index's range: the tree.
        assert_eq!(found(&table(&[2, 5000]), probe()), vec![2, 5000]);
        assert_eq!(found(&table(&[]), probe()), Vec::<u32>::new());
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let a = derived_nguid("nqn.2026-12.dev.nvmfd:ram0", 1);
        assert_eq!(a, derived_nguid("nqn.2026-12.dev.nvmfd:ram0", 1));
        assert_ne!(a, derived_nguid("nqn.2026-12.dev.nvmfd:ram0", 2));
        assert_ne!(a, derived_nguid("nqn.2026-12.dev.nvmfd:ram1", 1));
        let u = derived_uuid("nqn.x", 1);
        assert_eq!(u[6] >> 4, 8, "version 8");
        assert_eq!(u[8] >> 6, 0b10, "RFC variant");
        assert_ne!(u, derived_nguid("nqn.x", 1));
        // Pinned value: changing the derivation would rename every host's device links.
        assert_eq!(
            fnv1a64(0xcbf2_9ce4_8422_2325, &[b"a"]),
            0xaf63_dc4c_8601_ec8c
        );
    }
}
