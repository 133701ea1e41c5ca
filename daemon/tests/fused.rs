//! Fused Compare and Write through the real binary and the host-side client: compare-and-swap
//! increments of a counter from two controllers race ordinary writes from other connections
//! on the same LBAs (file namespace: every write goes through a reactor's io_uring). A lost
//! update (a fused Write landing over a write that completed after its Compare) or a torn
//! block fails the test; so does an increment lost between two pairs.

mod fixture;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fixture::{free_port, one_subsystem, serve, Daemon, TempDir};
use nvme::spec::{cns, nvm_opcode, sqe_flags, CNTLID_DYNAMIC};
use nvme::wire::Status;
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:fused";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-444455557777";
const BLOCK: usize = 512;
/// Blocks 0..4: the counter; 4..6 and 6..8: one ordinary writer each. Every part holds one
/// u64 repeated, so a torn write shows.
const REGION_BLOCKS: u32 = 8;
/// Successful increments to reach: `FUSED_ITERATIONS` from the environment (issue 15 asks for a
/// run of 100000: about 5 minutes of a debug build on two busy cores), else a few seconds' worth.
fn target() -> u64 {
    std::env::var("FUSED_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

fn start(dir: &TempDir) -> (Daemon, SocketAddr) {
    let port = free_port();
    let namespaces = format!(
        "[[subsystems.namespaces]]\nnsid = 1\npath = \"{}\"\nsize = \"1M\"\n",
        dir.join("ns1.img").display()
    );
    let config = one_subsystem(port, "", (SUBNQN, HOSTNQN), &namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    (daemon, address)
}

fn connect(address: SocketAddr, qid: u16, cntlid: u16) -> (Client, u16) {
    fixture::connect(
        address,
        ClientOptions::default(),
        (qid, cntlid, 30_000),
        (SUBNQN, HOSTNQN, [9; 16]),
    )
    .expect("Connect")
}

fn controller(address: SocketAddr) -> (Client, u16) {
    let (mut admin, cntlid) = connect(address, 0, CNTLID_DYNAMIC);
    admin
        .enable_controller(Duration::from_secs(5))
        .expect("CC.EN");
    (admin, cntlid)
}

/// The u64 a part of the region holds; panics on a torn part.
fn value(part: &[u8], what: &str) -> u64 {
    let v = u64::from_le_bytes(part[..8].try_into().unwrap());
    for (i, c) in part.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(c.try_into().unwrap());
        assert_eq!(w, v, "torn {what}: word {i} is {w:#x}, word 0 {v:#x}");
    }
    v
}

fn fill(part: &mut [u8], v: u64) {
    for c in part.chunks_exact_mut(8) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// Compare-and-swap increments until `stop`; returns (increments, miscompares).
fn incrementer(mut q: Client, stop: &AtomicBool, total: &AtomicU64, target: u64) -> (u64, u64) {
    let (mut done, mut lost_races) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        let cur = q.read(1, 0, REGION_BLOCKS, BLOCK as u32).expect("Read");
        let v = value(&cur[..4 * BLOCK], "counter");
        value(&cur[4 * BLOCK..6 * BLOCK], "writer 1 blocks");
        value(&cur[6 * BLOCK..], "writer 2 blocks");
        let mut new = cur.clone();
        fill(&mut new[..4 * BLOCK], v + 1);
        let mut c = Client::write_sqe(1, 0, REGION_BLOCKS, false);
        c.opcode = nvm_opcode::COMPARE;
        c.flags |= sqe_flags::FUSE_FIRST;
        let mut w = Client::write_sqe(1, 0, REGION_BLOCKS, false);
        w.flags |= sqe_flags::FUSE_SECOND;
        let cc = q.submit(c, DataOut::Write(cur)).expect("Compare");
        let wc = q.submit(w, DataOut::Write(new)).expect("Write");
        let (cs, ws) = (
            q.wait(cc).expect("Compare completion").cqe.status,
            q.wait(wc).expect("Write completion").cqe.status,
        );
        match (cs, ws) {
            (Status::SUCCESS, Status::SUCCESS) => {
                done += 1;
                if total.fetch_add(1, Ordering::Relaxed) + 1 >= target {
                    stop.store(true, Ordering::Relaxed);
                }
            }
            (c, Status::ABORTED_FAILED_FUSED) if c == Status::COMPARE_FAILURE.with_dnr() => {
                lost_races += 1
            }
            other => panic!("fused pair completed with {other:?}"),
        }
    }
    (done, lost_races)
}

/// Ordinary writes of its own two blocks, each read back: a fused Write that compared
/// against the previous token and landed after this write would bring that token back.
/// Writers 1 and 2 write inside the pairs' range, writer 3 right after it (blocks 8..10).
fn writer(mut q: Client, id: u64, stop: &AtomicBool) -> u64 {
    let first = 4 + 2 * (id as u32 - 1);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let token = id << 48 | n;
        let mut data = vec![0u8; 2 * BLOCK];
        fill(&mut data, token);
        q.write(1, first as u64, data, BLOCK as u32).expect("Write");
        let back = q.read(1, first as u64, 2, BLOCK as u32).expect("Read");
        let seen = value(&back, "writer blocks");
        assert_eq!(seen, token, "writer {id}: write {n} lost (read {seen:#x})");
    }
    n
}

#[test]
fn fused_compare_and_write_races_ordinary_writes() {
    let dir = TempDir::new("fused");
    let (mut daemon, address) = start(&dir);
    let (mut admin1, c1) = controller(address);
    let (_admin2, c2) = controller(address);
    let id = admin1.identify(cns::CONTROLLER, 0).expect("Identify");
    assert_eq!(u16::from_le_bytes([id[522], id[523]]) & 1, 1, "FUSES bit 0");

    let target = target();
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut incs = Vec::new();
    for (qid, cntlid) in [(1, c1), (1, c2)] {
        let q = connect(address, qid, cntlid).0;
        let (stop, total) = (Arc::clone(&stop), Arc::clone(&total));
        incs.push(thread::spawn(move || incrementer(q, &stop, &total, target)));
    }
    let mut writers = Vec::new();
    for (id, qid, cntlid) in [(1u64, 2, c1), (2, 2, c2), (3, 3, c2)] {
        let q = connect(address, qid, cntlid).0;
        let stop = Arc::clone(&stop);
        writers.push(thread::spawn(move || writer(q, id, &stop)));
    }
    let inc: Vec<(u64, u64)> = incs.into_iter().map(|h| h.join().unwrap()).collect();
    let writes: Vec<u64> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = started.elapsed();

    let (mut q, _) = connect(address, 3, c1);
    let end = q.read(1, 0, REGION_BLOCKS, BLOCK as u32).expect("Read");
    let counter = value(&end[..4 * BLOCK], "counter");
    let succeeded: u64 = inc.iter().map(|i| i.0).sum();
    let miscompares: u64 = inc.iter().map(|i| i.1).sum();
    eprintln!(
        "fused race: {succeeded} increments ({miscompares} miscompares) and {writes:?} ordinary \
         writes in {elapsed:?}"
    );
    assert_eq!(counter, succeeded, "every increment counted exactly once");
    assert!(succeeded >= target && writes.iter().all(|&w| w > 0));
    daemon.terminate();
}
