//! Asymmetric Namespace Access (NVMe Base 2.0 §8.1.3): ANA groups, the state of each group as
//! seen through each port, and the ANA log page (0Ch) built from them.
//!
//! Groups are target-wide, as in the Linux target: every namespace belongs to exactly one group
//! (group 1 unless configured otherwise) and every port reports its own state for each group.
//! Two nvmfd processes exporting the same subsystem on different ports are thereby two paths
//! with independent states (a "gateway" each).
//!
//! The table is immutable once built; a reload builds the next one from the previous and
//! publishes it to every subsystem (I/O queues pick it up with their namespace table).

use std::collections::{BTreeMap, BTreeSet};

use crate::namespace::NamespaceTable;
use crate::wire::log::{AnaGroupDescriptor, AnaLog};
use crate::wire::Status;

/// Highest ANA group ID and number of group IDs (Identify ANAGRPMAX / NANAGRPID). The Linux
/// host sizes its log buffer as 16 + NANAGRPID × 32 + MNAN × 4 and turns ANA off when that
/// exceeds MDTS, so this stays small: 16 + 128 × 32 + 1024 × 4 ≈ 8 KiB.
pub const MAX_ANA_GROUP: u32 = 128;
/// The group of namespaces that name none.
pub const DEFAULT_ANA_GROUP: u32 = 1;
/// ANA Transition Time in seconds (Identify ANATT): a group configured in the change state is
/// expected to leave it within this time (the Linux host resets the controller after twice
/// this).
pub const ANATT_SECONDS: u8 = 10;

/// ANA states (NVMe Base 2.0 §8.1.3.1–8.1.3.5, log page encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

impl AnaState {
    pub const ALL: [AnaState; 5] = [
        Self::Optimized,
        Self::NonOptimized,
        Self::Inaccessible,
        Self::PersistentLoss,
        Self::Change,
    ];

    /// The value in an ANA group descriptor.
    pub fn code(self) -> u8 {
        match self {
            Self::Optimized => 0x01,
            Self::NonOptimized => 0x02,
            Self::Inaccessible => 0x03,
            Self::PersistentLoss => 0x04,
            Self::Change => 0x0f,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The name the Linux host and nvme-cli print ("optimized", "non-optimized", …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Optimized => "optimized",
            Self::NonOptimized => "non-optimized",
            Self::Inaccessible => "inaccessible",
            Self::PersistentLoss => "persistent-loss",
            Self::Change => "change",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Status of an I/O command to a namespace of a group in this state (NVMe Base 2.0
    /// §8.1.3.3–8.1.3.5): `None` means the command runs.
    pub fn io_status(self) -> Option<Status> {
        match self {
            Self::Optimized | Self::NonOptimized => None,
            Self::Inaccessible => Some(Status::ANA_INACCESSIBLE),
            Self::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
            Self::Change => Some(Status::ANA_TRANSITION),
        }
    }
}

/// One configured ANA group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroupConfig {
    /// 1..=MAX_ANA_GROUP.
    pub id: u32,
    /// The group's state on every port not listed in `port_states`.
    pub state: AnaState,
    /// Per-port overrides, by port id.
    pub port_states: BTreeMap<u16, AnaState>,
}

impl AnaGroupConfig {
    fn default_group() -> Self {
        Self {
            id: DEFAULT_ANA_GROUP,
            state: AnaState::Optimized,
            port_states: BTreeMap::new(),
        }
    }

    fn state_on(&self, port_id: u16) -> AnaState {
        self.port_states
            .get(&port_id)
            .copied()
            .unwrap_or(self.state)
    }
}

/// Settings that let several targets (or several ports of one) serve one subsystem as paths
/// of a multipath host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipathConfig {
    /// Controller IDs this target hands out. Gateways exporting the same subsystem NQN use
    /// disjoint ranges: the host refuses a second path with a controller ID it already knows.
    pub cntlid_min: u16,
    pub cntlid_max: u16,
    /// Configured ANA groups. Group 1 exists even when not listed (optimized on every port).
    pub ana_groups: Vec<AnaGroupConfig>,
}

impl Default for MultipathConfig {
    fn default() -> Self {
        Self {
            cntlid_min: 1,
            cntlid_max: crate::spec::MAX_CNTLID,
            ana_groups: Vec::new(),
        }
    }
}

/// Why a multipath configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnaError {
    #[error("ANA group {0} is out of range (1..={MAX_ANA_GROUP})")]
    GroupOutOfRange(u32),
    #[error("ANA group {0} is configured twice")]
    DuplicateGroup(u32),
    #[error("ANA group {group}: unknown port id {port}")]
    UnknownPort { group: u32, port: u16 },
    #[error("controller ID range {min}..={max} is empty or outside 1..=65519")]
    CntlidRange { min: u16, max: u16 },
}

/// A group's state on one port, and when (table change count) it last changed there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    state: AnaState,
    changed_at: u64,
}

/// The target's ANA state: every group, its state on every configured port, change counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaTable {
    /// Bumped whenever any group's state on any port, or any group's membership, changes
    /// (the log page header CHGCNT).
    chgcnt: u64,
    groups: BTreeMap<u32, AnaGroupConfig>,
    /// (port id, group id) → state, for the configured ports.
    entries: BTreeMap<(u16, u32), Entry>,
}

impl Default for AnaTable {
    /// Group 1 only, optimized everywhere.
    fn default() -> Self {
        Self {
            chgcnt: 0,
            groups: [(DEFAULT_ANA_GROUP, AnaGroupConfig::default_group())].into(),
            entries: BTreeMap::new(),
        }
    }
}

impl AnaTable {
    /// Builds the table for `groups` on `ports` (port ids). With `previous`, entries whose
    /// state changed — and every entry of a group in `membership_changed` — get a new change
    /// count; unchanged ones keep theirs.
    pub fn build(
        groups: &[AnaGroupConfig],
        ports: &[u16],
        previous: Option<&AnaTable>,
        membership_changed: &BTreeSet<u32>,
    ) -> Result<AnaTable, AnaError> {
        let mut by_id = BTreeMap::new();
        for g in groups {
            if g.id == 0 || g.id > MAX_ANA_GROUP {
                return Err(AnaError::GroupOutOfRange(g.id));
            }
            if let Some(&port) = g.port_states.keys().find(|p| !ports.contains(p)) {
                return Err(AnaError::UnknownPort { group: g.id, port });
            }
            if by_id.insert(g.id, g.clone()).is_some() {
                return Err(AnaError::DuplicateGroup(g.id));
            }
        }
        by_id
            .entry(DEFAULT_ANA_GROUP)
            .or_insert_with(AnaGroupConfig::default_group);
        let old_chgcnt = previous.map_or(0, |p| p.chgcnt);
        let next = old_chgcnt + 1;
        let mut changed = false;
        let mut entries = BTreeMap::new();
        for &port in ports {
            for (&id, g) in &by_id {
                let state = g.state_on(port);
                let old = previous.and_then(|p| p.entries.get(&(port, id)));
                let entry = match old {
                    Some(o) if o.state == state && !membership_changed.contains(&id) => *o,
                    _ => {
                        changed = true;
                        Entry {
                            state,
                            changed_at: next,
                        }
                    }
                };
                entries.insert((port, id), entry);
            }
        }
        // Groups or ports that disappeared are a change too (their descriptors vanish).
        if let Some(p) = previous {
            changed |= p.entries.keys().any(|k| !entries.contains_key(k));
        }
        Ok(AnaTable {
            chgcnt: if changed || previous.is_none() {
                next
            } else {
                old_chgcnt
            },
            groups: by_id,
            entries,
        })
    }

    pub fn chgcnt(&self) -> u64 {
        self.chgcnt
    }

    pub fn has_group(&self, id: u32) -> bool {
        self.groups.contains_key(&id)
    }

    pub fn group_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups.keys().copied()
    }

    /// The state of group `id` seen through port `port_id` (ports outside the configuration,
    /// which only tests create, get the group's default state).
    pub fn state(&self, port_id: u16, id: u32) -> Option<AnaState> {
        match self.entries.get(&(port_id, id)) {
            Some(e) => Some(e.state),
            None => self.groups.get(&id).map(|g| g.state_on(port_id)),
        }
    }

    /// Whether the log page of a controller on `port_id` differs from what `previous` gave
    /// it: a state, a change count (membership), or the set of groups.
    pub fn changed_on(&self, previous: &AnaTable, port_id: u16) -> bool {
        let range = (port_id, 0)..=(port_id, u32::MAX);
        !self
            .entries
            .range(range.clone())
            .eq(previous.entries.range(range))
            || self.groups.keys().ne(previous.groups.keys())
    }

    /// States of every group on one port, indexed by group ID, for the I/O path.
    pub fn port_view(&self, port_id: u16) -> PortAnaView {
        let mut states = [None; MAX_ANA_GROUP as usize + 1];
        for id in self.group_ids() {
            states[id as usize] = self.state(port_id, id);
        }
        PortAnaView { states }
    }

    /// The ANA log page for a controller on `port_id` of a subsystem with `namespaces`
    /// (NVMe Base 2.0 §5.16.1.13). Every group is described, even one without namespaces in
    /// this subsystem (as the Linux target does); `groups_only` (RGO) leaves out NSID lists.
    pub fn log_page(&self, port_id: u16, namespaces: &NamespaceTable, groups_only: bool) -> AnaLog {
        let mut groups: BTreeMap<u32, AnaGroupDescriptor> = self
            .groups
            .keys()
            .map(|&id| {
                let (state, chgcnt) = match self.entries.get(&(port_id, id)) {
                    Some(e) => (e.state, e.changed_at),
                    None => (self.groups[&id].state_on(port_id), self.chgcnt),
                };
                let d = AnaGroupDescriptor {
                    grpid: id,
                    chgcnt,
                    state: state.code(),
                    nsids: Vec::new(),
                };
                (id, d)
            })
            .collect();
        if !groups_only {
            // The namespace table iterates in ascending NSID order, so each list is sorted.
            for ns in namespaces.iter() {
                if let Some(d) = groups.get_mut(&ns.anagrpid) {
                    d.nsids.push(ns.nsid);
                }
            }
        }
        AnaLog {
            chgcnt: self.chgcnt,
            groups: groups.into_values().collect(),
        }
    }
}

/// Group states of one port, indexed by group ID (`None`: no such group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAnaView {
    states: [Option<AnaState>; MAX_ANA_GROUP as usize + 1],
}

impl PortAnaView {
    /// Status for an I/O command to a namespace of group `id` (`None`: it may run). A
    /// namespace always names a configured group (checked when the target is built); an
    /// unknown one is refused like an inaccessible group rather than served unchecked.
    pub fn io_status(&self, id: u32) -> Option<Status> {
        match self.states.get(id as usize).copied().flatten() {
            Some(state) => state.io_status(),
            None => Some(Status::ANA_INACCESSIBLE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(id: u32, state: AnaState, ports: &[(u16, AnaState)]) -> AnaGroupConfig {
        AnaGroupConfig {
            id,
            state,
            port_states: ports.iter().copied().collect(),
        }
    }

    #[test]
    fn state_codes_and_names() {
        for s in AnaState::ALL {
            assert_eq!(AnaState::from_code(s.code()), Some(s));
            assert_eq!(AnaState::from_name(s.name()), Some(s));
        }
        assert_eq!(AnaState::Change.code(), 0x0f);
        assert_eq!(AnaState::from_code(0), None);
        assert_eq!(AnaState::from_code(5), None);
    }

    #[test]
    fn io_status_per_state() {
        assert_eq!(AnaState::Optimized.io_status(), None);
        assert_eq!(AnaState::NonOptimized.io_status(), None);
        let s = AnaState::Inaccessible.io_status().unwrap();
        assert_eq!((s.sct, s.sc, s.dnr), (3, 0x02, false));
        let s = AnaState::PersistentLoss.io_status().unwrap();
        assert_eq!((s.sct, s.sc, s.dnr), (3, 0x01, false));
        let s = AnaState::Change.io_status().unwrap();
        assert_eq!((s.sct, s.sc, s.dnr), (3, 0x03, false));
    }

    #[test]
    fn default_group_and_port_overrides() {
        let t = AnaTable::build(
            &[group(
                2,
                AnaState::Inaccessible,
                &[(1, AnaState::Optimized)],
            )],
            &[1, 2],
            None,
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(t.group_ids().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(t.state(1, 1), Some(AnaState::Optimized));
        assert_eq!(t.state(1, 2), Some(AnaState::Optimized));
        assert_eq!(t.state(2, 2), Some(AnaState::Inaccessible));
        assert_eq!(t.state(1, 3), None);
        let v = t.port_view(2);
        assert_eq!(v.io_status(1), None);
        assert_eq!(v.io_status(2), Some(Status::ANA_INACCESSIBLE));
        assert_eq!(v.io_status(3), Some(Status::ANA_INACCESSIBLE));
        assert_eq!(v.io_status(u32::MAX), Some(Status::ANA_INACCESSIBLE));
    }

    #[test]
    fn invalid_groups_are_refused() {
        let none = BTreeSet::new();
        let err = |g: &[AnaGroupConfig]| AnaTable::build(g, &[1], None, &none).unwrap_err();
        assert_eq!(
            err(&[group(0, AnaState::Optimized, &[])]),
            AnaError::GroupOutOfRange(0)
        );
        assert_eq!(
            err(&[group(MAX_ANA_GROUP + 1, AnaState::Optimized, &[])]),
            AnaError::GroupOutOfRange(MAX_ANA_GROUP + 1)
        );
        assert_eq!(
            err(&[
                group(3, AnaState::Optimized, &[]),
                group(3, AnaState::Change, &[])
            ]),
            AnaError::DuplicateGroup(3)
        );
        assert_eq!(
            err(&[group(3, AnaState::Optimized, &[(9, AnaState::Change)])]),
            AnaError::UnknownPort { group: 3, port: 9 }
        );
    }

    #[test]
    fn change_counts_track_what_changed() {
        let none = BTreeSet::new();
        let g2 = |on_port_2| group(2, AnaState::Optimized, &[(2, on_port_2)]);
        let t1 = AnaTable::build(&[g2(AnaState::Optimized)], &[1, 2], None, &none).unwrap();
        assert_eq!(t1.chgcnt(), 1);
        // Same configuration: nothing changes, not even the count.
        let same = AnaTable::build(&[g2(AnaState::Optimized)], &[1, 2], Some(&t1), &none).unwrap();
        assert_eq!(same, t1);
        // Group 2 goes inaccessible on port 2 only.
        let t2 = AnaTable::build(&[g2(AnaState::Inaccessible)], &[1, 2], Some(&t1), &none).unwrap();
        assert_eq!(t2.chgcnt(), 2);
        assert!(t2.changed_on(&t1, 2));
        assert!(!t2.changed_on(&t1, 1), "port 1 sees no change");
        // A namespace moved into group 1: every port's group 1 descriptor changed.
        let moved: BTreeSet<u32> = [1].into();
        let t3 =
            AnaTable::build(&[g2(AnaState::Inaccessible)], &[1, 2], Some(&t2), &moved).unwrap();
        assert_eq!(t3.chgcnt(), 3);
        assert!(t3.changed_on(&t2, 1) && t3.changed_on(&t2, 2));
        // Removing group 2 is a change as well.
        let t4 = AnaTable::build(&[], &[1, 2], Some(&t3), &none).unwrap();
        assert_eq!(t4.chgcnt(), 4);
        assert!(!t4.has_group(2));
        assert!(t4.changed_on(&t3, 1) && t4.changed_on(&t3, 2));
    }
}
