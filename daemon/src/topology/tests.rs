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
