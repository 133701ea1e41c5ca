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
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A directory removed when dropped.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new() -> Self {
            // Unique per call: the tests run in parallel in one process.
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("nvmfd-sysfs-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&path).unwrap();
            FakeRoot(path)
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fake sysfs: 2 nodes × 2 CPUs (cpu0, cpu1 on node 0; cpu2, cpu3 on node 1), NICs
    /// `eth0` (node 0), `eth1` (node 1), `eth2` (-1), `eth3` (virtio on a node-1 PCI
    /// function), `lo` (virtual), RDMA device `mlx5_0` (node 1).
    fn fake_sysfs(with_cpu_links: bool) -> (FakeRoot, Sysfs) {
        let dir = FakeRoot::new();
        let root = dir.0.as_path();
        let mkdir = |p: &str| std::fs::create_dir_all(root.join(p)).unwrap();
        let write = |p: &str, text: &str| std::fs::write(root.join(p), text).unwrap();
        let link = |target: &str, at: &str| symlink(root.join(target), root.join(at)).unwrap();
        for node in 0..2 {
            mkdir(&format!("devices/system/node/node{node}"));
        }
        write("devices/system/node/node0/cpulist", "0-1\n");
        write("devices/system/node/node1/cpulist", "2,3\n");
        for cpu in 0..4 {
            mkdir(&format!("devices/system/cpu/cpu{cpu}"));
            if with_cpu_links {
                link(
                    &format!("devices/system/node/node{}", cpu / 2),
                    &format!("devices/system/cpu/cpu{cpu}/node{}", cpu / 2),
                );
            }
        }
        mkdir("class/net");
        mkdir("class/infiniband");
        for (pci, node) in [
            ("0000:01:00.0", "0"),
            ("0000:81:00.0", "1"),
            ("0000:02:00.0", "-1"),
        ] {
            mkdir(&format!("devices/pci0000:00/{pci}"));
            write(
                &format!("devices/pci0000:00/{pci}/numa_node"),
                &format!("{node}\n"),
            );
        }
        mkdir("devices/pci0000:00/0000:81:00.1/virtio3");
        write("devices/pci0000:00/0000:81:00.1/numa_node", "1\n");
        for (name, device) in [
            ("eth0", Some("devices/pci0000:00/0000:01:00.0")),
            ("eth1", Some("devices/pci0000:00/0000:81:00.0")),
            ("eth2", Some("devices/pci0000:00/0000:02:00.0")),
            ("eth3", Some("devices/pci0000:00/0000:81:00.1/virtio3")),
            ("lo", None),
        ] {
            let dir = match device {
                Some(device) => format!("{device}/net/{name}"),
                None => format!("devices/virtual/net/{name}"),
            };
            mkdir(&dir);
            if let Some(device) = device {
                link(device, &format!("{dir}/device"));
            }
            link(&dir, &format!("class/net/{name}"));
        }
        let ib = "devices/pci0000:00/0000:81:00.0/infiniband/mlx5_0";
        mkdir(ib);
        link("devices/pci0000:00/0000:81:00.0", &format!("{ib}/device"));
        link(ib, "class/infiniband/mlx5_0");
        let sysfs = Sysfs::new(root);
        (dir, sysfs)
    }

    /// The reactor a connection of a port on `node` goes to (as `reactor::pick` decides).
    fn pick(loads: &[usize], nodes: &[Option<u32>], node: Option<u32>) -> usize {
        least_loaded(loads, &serving(nodes, node), 0)
    }

    #[test]
    fn new_connections_go_to_the_least_loaded_reactor() {
        let all = [true; 4];
        assert_eq!(least_loaded(&[], &[], 3), 0);
        assert_eq!(least_loaded(&[5], &all, 7), 0);
        assert_eq!(least_loaded(&[3, 1, 2], &all, 0), 1);
        // Ties rotate from `start`.
        assert_eq!(least_loaded(&[1, 1], &all, 0), 0);
        assert_eq!(least_loaded(&[1, 1], &all, 1), 1);
        assert_eq!(least_loaded(&[2, 0, 0, 2], &all, 2), 2);
        assert_eq!(least_loaded(&[0, 2, 2, 2], &all, 1), 0);
        // Only among the serving reactors, ties rotating among them.
        let node1 = [false, false, true, true];
        assert_eq!(least_loaded(&[0, 0, 3, 1], &node1, 0), 3);
        assert_eq!(least_loaded(&[0, 0, 1, 1], &node1, 0), 2);
        assert_eq!(least_loaded(&[0, 0, 1, 1], &node1, 3), 3);
        assert_eq!(least_loaded(&[0, 0, 1, 1], &node1, 4), 2);
    }

    #[test]
    fn reactors_take_the_node_of_their_cpu() {
        for links in [true, false] {
            let (_dir, sysfs) = fake_sysfs(links);
            assert_eq!(sysfs.node_count(), 2);
            assert_eq!(
                (0..5).map(|c| sysfs.cpu_node(c)).collect::<Vec<_>>(),
                [Some(0), Some(0), Some(1), Some(1), None],
                "cpu links: {links}"
            );
            // Four reactors on cpus 0..3, and six reactors wrapping over cpus 3 and 0.
            assert_eq!(
                reactor_nodes(&sysfs, &[0, 1, 2, 3], 4),
                [Some(0), Some(0), Some(1), Some(1)]
            );
            assert_eq!(
                reactor_nodes(&sysfs, &[3, 0], 3),
                [Some(1), Some(0), Some(1)]
            );
            // Unpinned reactors have no node.
            assert_eq!(reactor_nodes(&sysfs, &[], 3), [None, None, None]);
        }
    }

    #[test]
    fn ports_take_the_node_of_their_nic() {
        let (_dir, sysfs) = fake_sysfs(true);
        assert_eq!(sysfs.net_node("eth0"), Some(0));
        assert_eq!(sysfs.net_node("eth1"), Some(1));
        assert_eq!(sysfs.net_node("eth2"), None, "numa_node -1");
        assert_eq!(
            sysfs.net_node("eth3"),
            Some(1),
            "virtio: the PCI function's node"
        );
        assert_eq!(sysfs.net_node("lo"), None, "virtual: no device");
        assert_eq!(sysfs.net_node("eth9"), None, "no such interface");
        assert_eq!(sysfs.rdma_node("mlx5_0"), Some(1));
        assert_eq!(sysfs.rdma_node("rxe0"), None);
        // A wildcard address is on every interface, so on no node.
        assert_eq!(interface_of("0.0.0.0".parse().unwrap()), None);
        assert_eq!(interface_of("::".parse().unwrap()), None);
    }

    #[test]
    fn a_port_on_node_1_places_only_on_node_1_reactors_by_load() {
        let (_dir, sysfs) = fake_sysfs(true);
        let nodes = reactor_nodes(&sysfs, &[0, 1, 2, 3], 4);
        let port = sysfs.net_node("eth1");
        assert_eq!(serving(&nodes, port), [false, false, true, true]);
        // Six connections in a row, each placed by load among reactors 2 and 3 although
        // reactors 0 and 1 stay idle.
        let mut loads = [0usize; 4];
        for _ in 0..6 {
            let r = pick(&loads, &nodes, port);
            loads[r] += 1;
        }
        assert_eq!(loads, [0, 0, 3, 3]);
        // By load, not turn: the emptier of the two takes the next one.
        let r = pick(&[0, 0, 5, 2], &nodes, port);
        assert_eq!(r, 3);
        // A port on node 0 keeps to reactors 0 and 1.
        assert_eq!(
            serving(&nodes, sysfs.net_node("eth0")),
            [true, true, false, false]
        );
    }

    #[test]
    fn unknown_node_or_no_reactor_there_means_all_reactors() {
        let (_dir, sysfs) = fake_sysfs(true);
        let nodes = reactor_nodes(&sysfs, &[0, 1, 2, 3], 4);
        // -1, loopback, an unknown interface: every reactor, by load.
        for interface in ["eth2", "lo", "eth9"] {
            let port = sysfs.net_node(interface);
            assert_eq!(serving(&nodes, port), [true; 4], "{interface}");
            assert_eq!(pick(&[3, 2, 1, 2], &nodes, port), 2);
            assert_eq!(pick(&[3, 0, 1, 2], &nodes, port), 1);
        }
        // Unpinned reactors: all of them, whatever the port's node.
        let unpinned = reactor_nodes(&sysfs, &[], 4);
        assert_eq!(serving(&unpinned, sysfs.net_node("eth1")), [true; 4]);
        assert_eq!(pick(&[1, 0, 1, 1], &unpinned, Some(1)), 1);
        // Reactors pinned to node 0 only: a node-1 port is served by all of them.
        let node0 = reactor_nodes(&sysfs, &[0, 1], 2);
        assert_eq!(serving(&node0, Some(1)), [true, true]);
    }

    #[test]
    fn cpu_lists_parse() {
        assert!(cpu_list_contains("0-3,8,10-11\n", 10));
        assert!(cpu_list_contains("0-3,8,10-11\n", 8));
        assert!(!cpu_list_contains("0-3,8,10-11\n", 9));
        assert!(!cpu_list_contains("\n", 0));
        assert!(!cpu_list_contains("x-3", 1));
    }

    /// This machine's own sysfs, whatever it is: every interface address and CPU resolves
    /// without error, and on a one-node machine (the build host has one, with 2 CPUs) every
    /// port is served by every reactor — placement is unchanged.
    #[test]
    fn the_real_sysfs_on_one_node_changes_nothing() {
        let sysfs = Sysfs::system();
        let cpus: Vec<u32> = (0..std::thread::available_parallelism().map_or(1, |n| n.get()))
            .map(|c| c as u32)
            .collect();
        let nodes = reactor_nodes(&sysfs, &cpus, cpus.len());
        eprintln!("{} node(s); reactor nodes {nodes:?}", sysfs.node_count());
        if sysfs.node_count() == 1 {
            // Every CPU of a one-node machine is found on that node.
            let only = sysfs.cpu_node(0);
            assert!(only.is_some(), "cpu0 on no node");
            assert!(nodes.iter().all(|n| *n == only), "{nodes:?}");
        }
        let addresses = interface_addresses();
        assert!(
            addresses.iter().any(|(_, a)| a.is_loopback()),
            "no loopback address"
        );
        for (interface, address) in addresses {
            assert!(interface_of(address).is_some(), "{address}: no interface");
            let port = sysfs.address_node(address);
            let serving = serving(&nodes, port);
            eprintln!("{address} ({interface}): node {port:?}, reactors {serving:?}");
            if sysfs.node_count() <= 1 {
                assert_eq!(
                    serving,
                    vec![true; nodes.len()],
                    "{address} ({interface}) on {port:?}"
                );
            } else {
                let local = nodes.iter().any(|n| n.is_some() && *n == port);
                assert!(serving
                    .iter()
                    .enumerate()
                    .all(|(r, s)| *s == (!local || nodes[r] == port)));
            }
        }
        assert_eq!(
            sysfs.address_node("127.0.0.1".parse().unwrap()),
            None,
            "loopback"
        );
    }
}
