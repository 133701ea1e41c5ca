//! Per-host namespace visibility: a namespace may be shown to some hosts of its subsystem
//! only. For a host that is not listed the NSID is inactive (NVMe Base 2.0 §3.2.1.4: an
//! allocated NSID not attached to the controller): absent from the Active Namespace ID list,
//! a zero-filled Identify Namespace, Invalid Namespace or Format for I/O. Keyed on the host
//! NQN, so a host connected through TCP and RDMA sees the same namespaces on both.
//!
//! Queues never consult this per command: each controller's queues cache the table as its
//! host sees it ([`Visibility::view`]), rebuilt only when the subsystem's generation moves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::namespace::NamespaceTable;

/// Which hosts see which namespaces. An NSID without an entry is shown to every host the
/// subsystem admits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Visibility {
    restricted: BTreeMap<u32, BTreeSet<String>>,
}

impl Visibility {
    /// Shows `nsid` only to `hosts` (an empty set hides it from every host).
    pub fn restrict(&mut self, nsid: u32, hosts: impl IntoIterator<Item = String>) {
        self.restricted.insert(nsid, hosts.into_iter().collect());
    }

    /// Whether every namespace is shown to every host.
    pub fn is_unrestricted(&self) -> bool {
        self.restricted.is_empty()
    }

    /// Whether `hostnqn` sees namespace `nsid` (if it exists).
    pub fn sees(&self, hostnqn: &str, nsid: u32) -> bool {
        self.restricted
            .get(&nsid)
            .is_none_or(|hosts| hosts.contains(hostnqn))
    }

    /// NSIDs whose host list differs between `self` and `new` (restricted in one only, or
    /// to other hosts).
    pub fn restrictions_changed(&self, new: &Visibility) -> Vec<u32> {
        let nsids: BTreeSet<u32> = self
            .restricted
            .keys()
            .chain(new.restricted.keys())
            .copied()
            .collect();
        nsids
            .into_iter()
            .filter(|nsid| self.restricted.get(nsid) != new.restricted.get(nsid))
            .collect()
    }

    /// `table` as `hostnqn` sees it: the same `Arc` when nothing in it is hidden from that
    /// host, else a table of the namespaces it sees (sharing the opened namespaces).
    pub fn view(&self, table: &Arc<NamespaceTable>, hostnqn: &str) -> Arc<NamespaceTable> {
        let hides = |nsid: u32| !self.sees(hostnqn, nsid);
        if !self
            .restricted
            .keys()
            .any(|&nsid| table.get(nsid).is_some() && hides(nsid))
        {
            return Arc::clone(table);
        }
        Arc::new(NamespaceTable::new(
            table.iter().filter(|ns| !hides(ns.nsid)).cloned(),
        ))
    }

    /// The NSIDs whose attachment to `hostnqn`'s controllers a republication changes (to
    /// report in the Changed Namespace List, NVMe Base 2.0 §5.16.1.5): those that appear or
    /// disappear from its view, and those in `replaced` (reopened with a new configuration)
    /// that it saw before or sees now.
    pub fn changed_for(
        hostnqn: &str,
        before: (&NamespaceTable, &Visibility),
        after: (&NamespaceTable, &Visibility),
        replaced: &[u32],
    ) -> BTreeSet<u32> {
        let seen = |(table, vis): (&NamespaceTable, &Visibility)| -> BTreeSet<u32> {
            table
                .iter()
                .map(|ns| ns.nsid)
                .filter(|&nsid| vis.sees(hostnqn, nsid))
                .collect()
        };
        let (old, new) = (seen(before), seen(after));
        let mut changed: BTreeSet<u32> = old.symmetric_difference(&new).copied().collect();
        changed.extend(
            replaced
                .iter()
                .filter(|nsid| old.contains(nsid) || new.contains(nsid)),
        );
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::{BackendConfig, Namespace, NamespaceConfig};
    use storage::ram::RamBackend;

    const A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000000";
    const B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000000";

    fn table(nsids: &[u32]) -> Arc<NamespaceTable> {
        Arc::new(NamespaceTable::new(nsids.iter().map(|&nsid| {
            let config = NamespaceConfig::new(nsid, BackendConfig::Ram { size: 1 << 20 }, 512);
            let backend = Arc::new(RamBackend::new(1 << 20, 512).unwrap());
            Arc::new(Namespace::new(config, backend, "nqn.test").unwrap())
        })))
    }

    fn nsids(t: &NamespaceTable) -> Vec<u32> {
        t.iter().map(|ns| ns.nsid).collect()
    }

    #[test]
    fn unlisted_hosts_do_not_see_a_restricted_namespace() {
        let t = table(&[1, 2]);
        let mut vis = Visibility::default();
        vis.restrict(2, [A.to_owned()]);
        assert!(vis.sees(A, 2) && vis.sees(B, 1) && !vis.sees(B, 2));
        assert!(
            Arc::ptr_eq(&vis.view(&t, A), &t),
            "nothing hidden: shared table"
        );
        assert_eq!(nsids(&vis.view(&t, B)), [1]);
        // A restriction on an NSID the table lacks hides nothing.
        let mut other = Visibility::default();
        other.restrict(7, []);
        assert!(Arc::ptr_eq(&other.view(&t, B), &t));
        // Hidden from everyone.
        let mut none = Visibility::default();
        none.restrict(1, []);
        assert_eq!(nsids(&none.view(&t, A)), [2]);
    }

    #[test]
    fn changes_are_reported_to_the_hosts_whose_view_moved() {
        let t = table(&[1, 2]);
        let mut before = Visibility::default();
        before.restrict(2, [A.to_owned()]);
        let mut after = Visibility::default();
        after.restrict(2, [A.to_owned(), B.to_owned()]);
        let changed = |host, b: &Visibility, a: &Visibility, replaced: &[u32]| {
            Visibility::changed_for(host, (&t, b), (&t, a), replaced)
        };
        assert_eq!(changed(B, &before, &after, &[]), BTreeSet::from([2]));
        assert!(changed(A, &before, &after, &[]).is_empty());
        // Hiding it again: B hears of it, A does not.
        assert_eq!(changed(B, &after, &before, &[]), BTreeSet::from([2]));
        assert!(changed(A, &after, &before, &[]).is_empty());
        // A namespace reopened is news only to the hosts that see it.
        assert_eq!(changed(A, &before, &before, &[2]), BTreeSet::from([2]));
        assert!(changed(B, &before, &before, &[2]).is_empty());
        // Added and removed namespaces, filtered the same way.
        let grown = table(&[1, 2, 3]);
        let mut hide3 = before.clone();
        hide3.restrict(3, [A.to_owned()]);
        let added = |host| Visibility::changed_for(host, (&t, &before), (&grown, &hide3), &[]);
        assert_eq!(added(A), BTreeSet::from([3]));
        assert!(added(B).is_empty());
    }
}
