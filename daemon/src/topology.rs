//! NUMA topology from sysfs and the placement rule built on it: the node of each reactor
//! (from the CPU it is pinned to) and of each port (from the NIC that holds its address),
//! which reactors serve a port, and which of those takes a new connection (the least loaded).
//!
//! Everything is read under one root (`/sys` in the daemon, a fake tree in tests). Anything
//! missing or unreadable means "no node known", which places connections as on a one-node
//! machine: a kernel without `CONFIG_NUMA`, a NIC that reports `-1`, loopback and virtual
//! interfaces (no `device` link), a wildcard address.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// A sysfs tree.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    /// The machine's own.
    pub fn system() -> Self {
        Self::new("/sys")
    }

    /// The node of `cpu`: its `devices/system/cpu/cpuN/nodeM` link, or else the node whose
    /// `cpulist` holds it.
    pub fn cpu_node(&self, cpu: u32) -> Option<u32> {
        let cpu_dir = self.root.join(format!("devices/system/cpu/cpu{cpu}"));
        if let Some(node) = node_entries(&cpu_dir).next() {
            return Some(node);
        }
        let nodes = self.root.join("devices/system/node");
        node_entries(&nodes).find(|node| {
            std::fs::read_to_string(nodes.join(format!("node{node}/cpulist")))
                .is_ok_and(|list| cpu_list_contains(&list, cpu))
        })
    }

    /// Node directories under `devices/system/node` (1 on a one-node machine, 0 without
    /// `CONFIG_NUMA`).
    pub fn node_count(&self) -> usize {
        node_entries(&self.root.join("devices/system/node")).count()
    }

    /// The node of network interface `name`'s device. A device without `numa_node` (a
    /// virtio-net device) takes its parent's (the PCI function it sits on).
    pub fn net_node(&self, name: &str) -> Option<u32> {
        self.device_node(&self.root.join("class/net").join(name).join("device"))
    }

    /// The node of RDMA device `name` (`mlx5_0`, `rxe0`).
    #[cfg(any(feature = "rdma", test))]
    pub fn rdma_node(&self, name: &str) -> Option<u32> {
        self.device_node(&self.root.join("class/infiniband").join(name).join("device"))
    }

    /// The node of the port listening on `address`: that of the interface holding it.
    pub fn address_node(&self, address: IpAddr) -> Option<u32> {
        self.net_node(&interface_of(address)?)
    }

    fn device_node(&self, device: &Path) -> Option<u32> {
        let devices = std::fs::canonicalize(self.root.join("devices")).ok()?;
        let mut dir = std::fs::canonicalize(device).ok()?;
        // The nearest ancestor inside `devices/` that reports a node decides; the first
        // `numa_node` found ends the walk even when it says -1 (the bus has no node).
        while dir.starts_with(&devices) && dir != devices {
            if let Ok(text) = std::fs::read_to_string(dir.join("numa_node")) {
                return text.trim().parse::<u32>().ok();
            }
            dir.pop();
        }
        None
    }
}

/// The entries `nodeN` of `dir`, as N.
fn node_entries(dir: &Path) -> impl Iterator<Item = u32> {
    let mut nodes: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.strip_prefix("node")?.parse().ok()
        })
        .collect();
    nodes.sort_unstable();
    nodes.into_iter()
}

/// Whether a sysfs CPU list ("0-3,8,10-11") holds `cpu`.
fn cpu_list_contains(list: &str, cpu: u32) -> bool {
    list.trim()
        .split(',')
        .filter(|part| !part.is_empty())
        .any(|part| match part.split_once('-') {
            Some((first, last)) => match (first.parse::<u32>(), last.parse::<u32>()) {
                (Ok(first), Ok(last)) => (first..=last).contains(&cpu),
                _ => false,
            },
            None => part.parse::<u32>() == Ok(cpu),
        })
}

/// The interface that holds `address`; `None` for a wildcard address or one no interface
/// has (yet).
pub fn interface_of(address: IpAddr) -> Option<String> {
    if address.is_unspecified() {
        return None;
    }
    interface_addresses()
        .into_iter()
        .find(|(_, ip)| *ip == address)
        .map(|(name, _)| name)
}

/// Every IP address of this machine's interfaces, with the interface's name.
fn interface_addresses() -> Vec<(String, IpAddr)> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    interfaces
        .filter_map(|i| {
            let ip = i.address.as_ref().and_then(|a| {
                a.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            })?;
            Some((i.interface_name, ip))
        })
        .collect()
}

/// The node of each of `count` reactors: reactor `i` is pinned to `cpus[i % cpus.len()]`
/// (`[global] cpus`); unpinned reactors have none.
pub fn reactor_nodes(sysfs: &Sysfs, cpus: &[u32], count: usize) -> Vec<Option<u32>> {
    (0..count)
        .map(|i| {
            let cpu = cpus.get(i.checked_rem(cpus.len())?)?;
            sysfs.cpu_node(*cpu)
        })
        .collect()
}

/// Which reactors take the connections of a port on `port_node`: those on that node, or all
/// of them when the node is unknown or has no reactor. `reactor_nodes[i]` is reactor `i`'s.
pub fn serving(reactor_nodes: &[Option<u32>], port_node: Option<u32>) -> Vec<bool> {
    let local: Vec<bool> = reactor_nodes
        .iter()
        .map(|node| port_node.is_some() && *node == port_node)
        .collect();
    if local.contains(&true) {
        local
    } else {
        vec![true; reactor_nodes.len()]
    }
}

/// Of the reactors with `serving[i]`, the one with the fewest connections (`loads`); ties go
/// to the first from `start` on, so equal loads still rotate. 0 when there are no reactors
/// (the accepting reactor keeps it).
pub fn least_loaded(loads: &[usize], serving: &[bool], start: usize) -> usize {
    let n = loads.len();
    if n == 0 {
        return 0;
    }
    (0..n)
        .map(|i| (start.wrapping_add(i)) % n)
        .filter(|&i| serving.get(i).copied().unwrap_or(false))
        .min_by_key(|&i| loads[i])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
