//! One of a ring's registered-resource tables (registered files, registered buffers): a
//! sparse kernel table of N entries, which resource (by owner identity and index) sits in
//! which entry, and what the entries cost against a budget.
//!
//! Lifetime rules (`fileid` and `fixedbuf` module comments): an entry is filled on the first
//! op that asks for its resource and emptied by the first sweep after the resource's owner
//! went, unless an op parked in the engine still holds it (then it waits for the op rather
//! than ever naming another resource). Entries are keyed by owner identity, never by
//! descriptor number or address, which the next open or mapping may reuse. An entry is only
//! ever replaced by a larger registration of the same resource (`Resource::covers`), so an op
//! pushed with an entry's index finds its resource there whenever the kernel takes the SQE.

use std::io;

use io_uring::{IoUring, Submitter};

/// [`Unit::slot`] of a unit without an entry.
pub(super) const NO_ENTRY: u32 = u32::MAX;

/// One unit of an owner: its entry's index (`NO_ENTRY`: none) and what is registered there,
/// side by side so that an op's lookup reads both at once.
/// An owner's units, by unit index.
type Units<R> = Vec<Unit<<R as Resource>::Entry>>;

#[derive(Debug, Clone, Copy)]
pub(super) struct Unit<E> {
    slot: u32,
    entry: E,
}

/// What one kind of registered resource needs from the kernel and its owners. Implemented by
/// unit types (`resources` module), so that every table is monomorphic: no dynamic call per op.
pub(super) trait Resource {
    /// Identity of an owner (a backend file, a transport's buffer memory).
    type Owner: Copy + Ord + std::fmt::Debug;
    /// What an op asks for (a descriptor; an address range).
    type Want: Copy;
    /// What an entry holds, as the engine checks it per op.
    type Entry: Copy + Default + std::fmt::Debug;

    /// Creates the kernel's sparse table of `slots` entries.
    fn create(submitter: &Submitter<'_>, slots: u32) -> io::Result<()>;
    /// Whether `entry` serves `want` as it is.
    fn covers(entry: &Self::Entry, want: &Self::Want) -> bool;
    /// The entry to register for `want`.
    fn entry_for(want: &Self::Want) -> Self::Entry;
    /// What `entry` costs against the table's budget.
    fn cost(entry: &Self::Entry) -> u64;
    /// Puts `entry` (for `want`) in kernel entry `slot`.
    fn fill(
        submitter: &Submitter<'_>,
        slot: u32,
        want: &Self::Want,
        entry: &Self::Entry,
    ) -> io::Result<()>;
    /// Empties kernel entry `slot`.
    fn empty(submitter: &Submitter<'_>, slot: u32) -> io::Result<()>;
    /// The owners' retirement count (`retire` module).
    fn retired_count() -> u64;
    /// Which of `ids` are retired, under one lock.
    fn retired_among(ids: impl Iterator<Item = Self::Owner>, f: impl FnMut(Self::Owner));

    /// A refused `fill` stops all further registrations (true), or only this one (false).
    const REFUSAL_IS_FINAL: bool;
    /// Log lines: the kernel refused the table; the table is full (entries or budget); the
    /// kernel refused a registration.
    fn log_table_refused(error: &io::Error, slots: u32);
    fn log_full(slots: usize, budget: u64);
    fn log_fill_refused(error: &io::Error, slot: u32, cost: u64, spent: u64);
    /// Logs a refused `empty`; returns whether the entry may be filled again anyway (the
    /// next fill replaces what it holds) rather than never used again.
    fn empty_failed(error: &io::Error, slot: u32) -> bool;
}

#[derive(Debug)]
pub(super) struct Table<R: Resource> {
    /// Owners with registered units, sorted by id (a few per reactor), each with its units
    /// by unit index, so that an op's lookup is a search among owners and one index.
    owners: Vec<(R::Owner, Units<R>)>,
    /// Per entry: how many ops in the engine hold it.
    holds: Vec<u32>,
    pub(super) free: Vec<u32>,
    /// The sum of the entries' costs, and its limit.
    spent: u64,
    budget: u64,
    /// `R::retired_count()` at the last sweep that left no retired owner behind.
    seen_retired: u64,
    /// The kernel took the table (false: off, or refused).
    pub(super) enabled: bool,
    /// The kernel refused a registration and `R::REFUSAL_IS_FINAL`: no new ones.
    pub(super) refused: bool,
    /// One log line each for a full table and a refused registration.
    pub(super) warned_full: bool,
    warned_fill: bool,
}

impl<R: Resource> Table<R> {
    /// A table of `slots` entries whose costs stay within `budget`; none when either is 0.
    pub(super) fn new(submitter: &Submitter<'_>, slots: u32, budget: u64) -> Self {
        let enabled = slots > 0
            && budget > 0
            && match R::create(submitter, slots) {
                Ok(()) => true,
                Err(e) => {
                    R::log_table_refused(&e, slots);
                    false
                }
            };
        let slots = if enabled { slots } else { 0 };
        Table {
            owners: Vec::new(),
            holds: vec![0; slots as usize],
            free: (0..slots).rev().collect(),
            spent: 0,
            budget,
            seen_retired: R::retired_count(),
            enabled,
            refused: false,
            warned_full: false,
            warned_fill: false,
        }
    }

    /// The entry to issue an op asking for `want` (unit `index` of `owner`) on, registering
    /// it, or registering it again larger, when needed; `None`: issue it without.
    /// (`ring`, not its submitter: building that costs instructions on every op.)
    #[inline]
    pub(super) fn get(
        &mut self,
        ring: &IoUring,
        owner: R::Owner,
        index: u32,
        want: &R::Want,
    ) -> Option<u32> {
        if !self.enabled {
            return None;
        }
        let unit = match self.owners.binary_search_by_key(&owner, |o| o.0) {
            Ok(pos) => self.owners[pos].1.get(index as usize).copied(),
            Err(_) => None,
        };
        if let Some(unit) = unit {
            if unit.slot != NO_ENTRY && R::covers(&unit.entry, want) {
                return Some(unit.slot);
            }
        }
        let held = unit.filter(|u| u.slot != NO_ENTRY);
        self.update(&ring.submitter(), owner, index, want, held)
    }

    /// An op issued on `slot` is in the engine: the entry keeps its resource until
    /// [`put`](Self::put).
    #[inline]
    pub(super) fn hold(&mut self, slot: u32) {
        self.holds[slot as usize] += 1;
    }

    #[inline]
    pub(super) fn put(&mut self, slot: u32) {
        self.holds[slot as usize] -= 1;
    }

    /// Registered units, and the sum of their costs.
    pub(super) fn registered(&self) -> (usize, u64) {
        let units = self.owners.iter().flat_map(|(_, units)| units);
        (units.filter(|u| u.slot != NO_ENTRY).count(), self.spent)
    }

    /// Each owner's units' entries (`NO_ENTRY`: none), by unit index.
    #[cfg(test)]
    pub(super) fn slots(&self) -> Vec<(R::Owner, Vec<u32>)> {
        let units = |units: &Units<R>| units.iter().map(|u| u.slot).collect();
        self.owners.iter().map(|(o, u)| (*o, units(u))).collect()
    }

    /// Registers `want` (or, when it has entry `held`, registers it again, larger).
    #[cold]
    fn update(
        &mut self,
        submitter: &Submitter<'_>,
        owner: R::Owner,
        index: u32,
        want: &R::Want,
        held: Option<Unit<R::Entry>>,
    ) -> Option<u32> {
        if self.refused {
            return None;
        }
        let entry = R::entry_for(want);
        let cost = R::cost(&entry);
        let old = held.map_or(0, |u| R::cost(&u.entry));
        let fits = |t: &Self| t.spent - old + cost <= t.budget;
        if (held.is_none() && self.free.is_empty()) || !fits(self) {
            // A gone owner's entries may be waiting for this turn's sweep (which leaves a
            // live owner's entries, `held` among them, alone).
            let retired = R::retired_count();
            if retired != self.seen_retired {
                self.sweep_retired(submitter, retired);
            }
        }
        let slot = match (held, self.free.last()) {
            (Some(held), _) => held.slot,
            (None, Some(&slot)) => slot,
            (None, None) => return self.full(),
        };
        if !fits(self) {
            return self.full();
        }
        if let Err(e) = R::fill(submitter, slot, want, &entry) {
            self.refused = R::REFUSAL_IS_FINAL;
            if !self.warned_fill {
                self.warned_fill = true;
                R::log_fill_refused(&e, slot, cost, self.spent);
            }
            return None;
        }
        self.spent = self.spent - old + cost;
        if held.is_none() {
            self.free.pop();
        }
        let pos = match self.owners.binary_search_by_key(&owner, |o| o.0) {
            Ok(pos) => pos,
            Err(pos) => {
                self.owners.insert(pos, (owner, Vec::new()));
                pos
            }
        };
        let units = &mut self.owners[pos].1;
        let index = index as usize;
        if units.len() <= index {
            let none = Unit {
                slot: NO_ENTRY,
                entry: R::Entry::default(),
            };
            units.resize(index + 1, none);
        }
        units[index] = Unit { slot, entry };
        Some(slot)
    }

    #[cold]
    fn full(&mut self) -> Option<u32> {
        if !self.warned_full {
            self.warned_full = true;
            R::log_full(self.holds.len(), self.budget);
        }
        None
    }

    /// Empties the entries of gone owners (one atomic load when none went: inlined into
    /// every `flush`, the rest out of line).
    #[inline]
    pub(super) fn sweep(&mut self, ring: &IoUring) {
        if self.owners.is_empty() {
            return;
        }
        let retired = R::retired_count();
        if retired != self.seen_retired {
            self.sweep_retired(&ring.submitter(), retired);
        }
    }

    #[cold]
    #[inline(never)]
    fn sweep_retired(&mut self, submitter: &Submitter<'_>, retired: u64) {
        let mut gone = Vec::new();
        R::retired_among(self.owners.iter().map(|o| o.0), |owner| gone.push(owner));
        let mut held = false;
        for owner in gone {
            let pos = self
                .owners
                .binary_search_by_key(&owner, |o| o.0)
                .expect("listed above");
            let units = &self.owners[pos].1;
            let registered = |u: &&Unit<R::Entry>| u.slot != NO_ENTRY;
            if units
                .iter()
                .filter(registered)
                .any(|u| self.holds[u.slot as usize] > 0)
            {
                held = true;
                continue;
            }
            let (_, units) = self.owners.remove(pos);
            for Unit { slot, entry } in units.iter().filter(registered) {
                let slot = *slot;
                // The kernel drops its reference to the resource (the file, the pinned
                // pages) once no request in flight uses the entry.
                if let Err(e) = R::empty(submitter, slot) {
                    // Still registered, but no owner's unit names it: never issued on again
                    // until, perhaps, refilled.
                    if !R::empty_failed(&e, slot) {
                        continue;
                    }
                }
                self.spent -= R::cost(entry);
                self.free.push(slot);
            }
        }
        if !held {
            self.seen_retired = retired;
        }
    }
}
