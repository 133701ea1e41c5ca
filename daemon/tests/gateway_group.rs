//! A gateway group end to end: a real single-node Ceph cluster on loopback, three real
//! `nvmfd` processes (gateways a, b, c on their own ports) serving one subsystem with one
//! RBD-backed namespace per ANA group (1, 2, 3, preferred by a, b, c), and the host-side
//! NVMe/TCP client.
//!
//! In turn: all three contend at start (each group ends up with its preferred gateway, one
//! owner each); a is frozen (SIGSTOP) and must be fenced (blocklisted) before b or c reports
//! its group Optimized; a write sent to a the moment it is continued must not reach the image;
//! a exits (fenced) and, restarted, gets its group back after the hold-down without fencing
//! anyone; c is killed (SIGKILL) and its group moves. Throughout, no group is ever reported
//! Optimized by two gateways whose RADOS clients are not blocklisted.
//!
//! Compiled (and so run) only with `--features rbd`; needs the Ceph packages
//! (`scripts/ceph-test-cluster.sh deps`):
//!   cargo test -p nvmfd --features rbd --test gateway_group -- --nocapture
#![cfg(feature = "rbd")]

mod fixture;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fixture::ceph::Cluster;
use fixture::{free_port, nvmfd, pattern, serve, Daemon};
use nvme::wire::Status;
use transport::client::{Client, ClientError, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:gwgroup";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-4444555566bb";
const BLOCK: u32 = 512;
const LEASE_MS: u64 = 3000;
const RENEW_MS: u64 = 500;
const HOLD_MS: u64 = 4000;
// Takeover bounds below: the lease, two rounds, and room for the blocklist round trip and the
// `ctl` polling on a loaded 2-core CI machine (a correctness bound, not a performance figure).

struct Gateway {
    id: &'static str,
    port: u16,
    config: PathBuf,
    socket: PathBuf,
    daemon: Option<Daemon>,
}

impl Gateway {
    fn address(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    fn start(&mut self) {
        let mut daemon = Daemon::spawn(serve(&self.config));
        daemon.wait_for_listener(self.address(), Duration::from_secs(60));
        self.daemon = Some(daemon);
    }

    /// `nvmfd ctl gateways --json`, or `None` when it does not answer (stopped, exited).
    fn view(&self) -> Option<serde_json::Value> {
        let out = nvmfd()
            .arg("ctl")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--json")
            .arg("gateways")
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(v.get("result").cloned().unwrap_or(v))
    }
}

fn config_text(
    cluster: &Cluster,
    id: &str,
    port: u16,
    cntlids: (u32, u32),
    socket: &std::path::Path,
) -> String {
    let mut namespaces = String::new();
    for g in 1..=3 {
        namespaces.push_str(&format!(
            "\n[[subsystems.namespaces]]\nnsid = {g}\nrbd = \"rbd/gw{g}\"\nana_group = {g}\n\
             uuid = \"{g}{g}{g}{g}{g}{g}{g}{g}-0000-4000-8000-00000000000{g}\"\n"
        ));
    }
    format!(
        r#"[global]
reactors = 1
cntlid_min = {lo}
cntlid_max = {hi}
control_socket = "{socket}"
log_level = "info"

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = {port}

[[ana_groups]]
id = 2
[[ana_groups]]
id = 3

[[subsystems]]
nqn = "{SUBNQN}"
allowed_hosts = ["{HOSTNQN}"]
{namespaces}
[gateway_group]
name = "it"
gateway = "{id}"
pool = "rbd"
namespace = "nvmfd-gw-it"
ceph_conf = "{conf}"
lease_ms = {LEASE_MS}
renew_ms = {RENEW_MS}
failback_hold_ms = {HOLD_MS}
handover_drain_ms = 500
members = [{{ id = "a", prefers = [1] }}, {{ id = "b", prefers = [2] }}, {{ id = "c", prefers = [3] }}]
"#,
        lo = cntlids.0,
        hi = cntlids.1,
        socket = socket.display(),
        conf = cluster.conf.display(),
    )
}

/// Each live gateway's view, by id.
fn views(gateways: &[Gateway]) -> BTreeMap<&'static str, serde_json::Value> {
    gateways
        .iter()
        .filter_map(|g| g.view().map(|v| (g.id, v)))
        .collect()
}

/// (group → gateways reporting it Optimized), from views that answered.
fn optimized(views: &BTreeMap<&'static str, serde_json::Value>) -> BTreeMap<u64, Vec<String>> {
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (id, v) in views {
        for g in v["groups"].as_array().unwrap() {
            if g["state"] == "optimized" {
                out.entry(g["group"].as_u64().unwrap())
                    .or_default()
                    .push((*id).to_owned());
            }
        }
    }
    out
}

fn blocklist(cluster: &Cluster) -> String {
    String::from_utf8_lossy(&cluster.tool("ceph", &["osd", "blocklist", "ls"])).into_owned()
}

/// The safety property, as far as the gateways answer: at most one gateway per group reports
/// Optimized while its client is not blocklisted.
fn check_one_writer(cluster: &Cluster, views: &BTreeMap<&'static str, serde_json::Value>) {
    let blocked = blocklist(cluster);
    for (group, ids) in optimized(views) {
        let writers: Vec<&String> = ids
            .iter()
            .filter(|id| {
                let addr = views[id.as_str()]["addr"].as_str().unwrap();
                // `ceph osd blocklist ls` prints the address without the msgr "v1:" prefix.
                !blocked.contains(addr.trim_start_matches("v1:"))
            })
            .collect();
        assert!(
            writers.len() <= 1,
            "group {group} has two writers: {writers:?}"
        );
    }
}

/// Polls until `done` holds for the views (checking the safety property each time).
fn wait_views(
    cluster: &Cluster,
    gateways: &[Gateway],
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&BTreeMap<&'static str, serde_json::Value>) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let v = views(gateways);
        check_one_writer(cluster, &v);
        if done(&v) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out waiting for {what}: {v:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn owner_is(v: &BTreeMap<&'static str, serde_json::Value>, group: u64, id: &str) -> bool {
    optimized(v)
        .get(&group)
        .is_some_and(|ids| ids == &[id.to_owned()])
}

fn connect(address: SocketAddr, qid: u16, cntlid: u16) -> (Client, u16) {
    let opts = ClientOptions {
        timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    fixture::connect(
        address,
        opts,
        (qid, cntlid, 60_000),
        (SUBNQN, HOSTNQN, [9; 16]),
    )
    .expect("Connect")
}

fn io_queue(address: SocketAddr) -> (Client, Client) {
    let (mut admin, cntlid) = connect(address, 0, 0xffff);
    admin
        .enable_controller(Duration::from_secs(10))
        .expect("CC.EN");
    let (io, _) = connect(address, 1, cntlid);
    (admin, io)
}

fn status_of(r: Result<(), ClientError>) -> Option<Status> {
    match r {
        Ok(()) => None,
        Err(ClientError::Status(s)) => Some(s),
        Err(e) => panic!("unexpected client error: {e}"),
    }
}

#[test]
fn gateway_group_failover_fencing_and_failback_with_three_gateways() {
    let cluster = Cluster::start("gw-it");
    for g in 1..=3 {
        // No exclusive-lock: ANA already gives each image one writer, and the group's own
        // blocklist fences the old one (see docs/gateway-groups.md).
        let image = format!("rbd/gw{g}");
        cluster.rbd(&[
            "create",
            &image,
            "--size",
            "16M",
            "--image-feature",
            "layering",
        ]);
    }
    let mut gateways: Vec<Gateway> = ["a", "b", "c"]
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let port = free_port();
            let socket = cluster.dir.join(format!("{id}.sock"));
            let config = cluster.dir.join(format!("{id}.toml"));
            let lo = 1 + i as u32 * 1000;
            std::fs::write(
                &config,
                config_text(&cluster, id, port, (lo, lo + 999), &socket),
            )
            .unwrap();
            Gateway {
                id,
                port,
                config,
                socket,
                daemon: None,
            }
        })
        .collect();
    // All three at once: they contend for every group.
    for g in &mut gateways {
        g.start();
    }
    let t = wait_views(
        &cluster,
        &gateways,
        "each group on its preferred gateway",
        Duration::from_secs(30),
        |v| v.len() == 3 && owner_is(v, 1, "a") && owner_is(v, 2, "b") && owner_is(v, 3, "c"),
    );
    eprintln!("gateway-group: start: each group owned by its preferred gateway after {t:.1?}");
    assert!(
        !blocklist(&cluster).contains("127.0.0.1"),
        "nobody fenced at a cold start"
    );

    // I/O: the owner serves its group, the others answer ANA Inaccessible.
    let (_admin_a, mut io_a) = io_queue(gateways[0].address());
    io_a.write(1, 0, pattern(4096, 1), BLOCK)
        .expect("write through the owner");
    let refused = status_of(io_a.write(2, 0, pattern(4096, 2), BLOCK));
    assert_eq!(
        refused,
        Some(Status::ANA_INACCESSIBLE),
        "a does not own group 2"
    );

    // Freeze a: b or c must fence it, then own group 1.
    let a_addr = gateways[0].view().unwrap()["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    gateways[0]
        .daemon
        .as_ref()
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGSTOP);
    let rest = &gateways[1..];
    let moved = wait_views(
        &cluster,
        rest,
        "group 1 taken from the frozen a",
        Duration::from_secs(20),
        |v| optimized(v).get(&1).is_some_and(|ids| ids.len() == 1),
    );
    eprintln!(
        "gateway-group: SIGSTOP a: group 1 owned elsewhere after {moved:.1?} (lease {LEASE_MS} ms)"
    );
    assert!(
        moved <= Duration::from_millis(LEASE_MS + 2 * RENEW_MS + 5000),
        "{moved:?}"
    );
    assert!(
        blocklist(&cluster).contains(a_addr.trim_start_matches("v1:")),
        "a fenced before the takeover"
    );
    let new_owner = optimized(&views(rest))[&1][0].clone();
    let owner_index = gateways.iter().position(|g| g.id == new_owner).unwrap();
    let (_admin_b, mut io_b) = io_queue(gateways[owner_index].address());
    io_b.write(1, 64, pattern(4096, 10), BLOCK)
        .expect("write through the new owner");

    // Continue a and write at once on its old queue: nothing may reach the image.
    let cid = io_a
        .submit(
            Client::write_sqe(1, 64, 8, false),
            DataOut::Write(pattern(4096, 11)),
        )
        .expect("submit");
    gateways[0]
        .daemon
        .as_ref()
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGCONT);
    match io_a.wait(cid) {
        Ok(done) => assert!(
            !done.cqe.status.is_success(),
            "a write through the fenced gateway succeeded"
        ),
        Err(e) => eprintln!("gateway-group: write through the continued a: {e}"),
    }
    let (status, fenced_log) = gateways[0]
        .daemon
        .take()
        .unwrap()
        .wait_exit(Duration::from_secs(20));
    assert!(!status.success(), "a fenced gateway exits with a failure");
    assert!(fenced_log.contains("blocklisted"), "{fenced_log}");
    let back = io_b
        .read(1, 64, 8, BLOCK)
        .expect("read through the new owner");
    assert!(
        back == pattern(4096, 10),
        "the fenced gateway's write reached the image"
    );
    eprintln!("gateway-group: continued a exited as fenced; its write did not reach the image");

    // Restart a: failback after the hold-down, handed over without fencing.
    let fenced_before = blocklist(&cluster).lines().count();
    gateways[0].start();
    let failback = wait_views(
        &cluster,
        &gateways,
        "failback of group 1 to a",
        Duration::from_secs(30),
        |v| owner_is(v, 1, "a"),
    );
    eprintln!("gateway-group: restarted a owns group 1 again after {failback:.1?} (hold-down {HOLD_MS} ms)");
    assert!(failback >= Duration::from_millis(HOLD_MS), "{failback:?}");
    assert_eq!(
        blocklist(&cluster).lines().count(),
        fenced_before,
        "a handback fences nobody"
    );

    // Kill c: its group moves, c fenced first.
    let c_addr = gateways[2].view().unwrap()["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    gateways[2]
        .daemon
        .take()
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGKILL);
    let moved = wait_views(
        &cluster,
        &gateways[..2],
        "group 3 taken from the killed c",
        Duration::from_secs(20),
        |v| optimized(v).get(&3).is_some_and(|ids| ids.len() == 1),
    );
    eprintln!("gateway-group: SIGKILL c: group 3 owned elsewhere after {moved:.1?}");
    assert!(
        moved <= Duration::from_millis(LEASE_MS + 2 * RENEW_MS + 5000),
        "{moved:?}"
    );
    assert!(blocklist(&cluster).contains(c_addr.trim_start_matches("v1:")));

    // A clean stop hands groups back at once.
    let (status, _, log) = gateways[0].daemon.as_mut().unwrap().terminate();
    assert!(status.success(), "{log}");
    assert!(log.contains("ANA group handed back"), "{log}");
}
