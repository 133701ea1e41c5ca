//! An RBD namespace end to end: a real single-node Ceph cluster on loopback
//! (scripts/ceph-test-cluster.sh), the real `nvmfd` binary built with the `rbd` feature, and the
//! host-side NVMe/TCP client. Data written through nvmfd is read back through nvmfd and, after
//! a flush, straight from Ceph with `rbd export`; deallocate and write zeroes read back as
//! zeroes; `rbd resize` reaches the connected host as a Namespace Attribute Changed AEN, the
//! changed namespace list, and the new size in Identify Namespace.
//!
//! Compiled (and so run) only with `--features rbd`, which needs librbd-dev / librados-dev;
//! the test also needs ceph-mon / ceph-osd and ~1.3 GB of memory for the cluster:
//!   scripts/ceph-test-cluster.sh deps
//!   cargo test -p nvmfd --features rbd --test ceph_rbd -- --nocapture
#![cfg(feature = "rbd")]

mod fixture;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fixture::ceph::Cluster;
use fixture::{free_port, one_subsystem, pattern, serve, Daemon};
use nvme::wire::Sqe;
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:ceph";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-4444555566aa";
const IMAGE: &str = "rbd/nvmfd-it";
const BLOCK: u32 = 512;
const MIB: u64 = 1 << 20;

/// `len` bytes at `offset` of the image, read by Ceph's own tool (not through nvmfd).
fn export(cluster: &Cluster, offset: u64, len: usize) -> Vec<u8> {
    let file = cluster.dir.join("export.img");
    let _ = std::fs::remove_file(&file);
    cluster.rbd(&["export", "--no-progress", IMAGE, file.to_str().unwrap()]);
    let all = std::fs::read(&file).unwrap();
    all[offset as usize..offset as usize + len].to_vec()
}

/// nvmfd exporting the cluster's `IMAGE` as namespace 1 (config file in the cluster's folder).
fn start_nvmfd(cluster: &Cluster) -> (Daemon, SocketAddr) {
    let port = free_port();
    let namespace = format!(
        r#"
[[subsystems.namespaces]]
nsid = 1
rbd = "{IMAGE}"
ceph_conf = "{conf}"
ceph_client_id = "admin"
"#,
        conf = cluster.conf.display()
    );
    let global = "max_data_transfer = \"256K\"";
    let config = one_subsystem(port, global, (SUBNQN, HOSTNQN), &namespace);
    let path = cluster.dir.join("nvmfd.toml");
    std::fs::write(&path, config).unwrap();
    let mut daemon = Daemon::spawn(serve(&path));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    // Opening the image waits for the cluster.
    daemon.wait_for_listener(address, Duration::from_secs(60));
    (daemon, address)
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
        (SUBNQN, HOSTNQN, [7; 16]),
    )
    .expect("Connect")
}

fn nsze(admin: &mut Client) -> u64 {
    let id = admin.identify(0x00, 1).expect("Identify Namespace");
    u64::from_le_bytes(id[0..8].try_into().unwrap())
}

#[test]
fn rbd_namespace_io_flush_discard_and_resize_through_nvmfd() {
    let t0 = Instant::now();
    let cluster = Cluster::start("ceph-it");
    let t_cluster = t0.elapsed();
    cluster.rbd(&["create", IMAGE, "--size", "32M"]);

    let t1 = Instant::now();
    let (mut daemon, address) = start_nvmfd(&cluster);
    let t_nvmfd = t1.elapsed();

    let (mut admin, cntlid) = connect(address, 0, 0xffff);
    admin
        .enable_controller(Duration::from_secs(10))
        .expect("CC.EN");
    assert_eq!(nsze(&mut admin), 32 * MIB / u64::from(BLOCK), "NSZE");
    // Asynchronous Event Configuration (Feature 0Bh): Namespace Attribute Notices (bit 8),
    // then one outstanding Asynchronous Event Request (opcode 0Ch).
    admin.set_features(0x0b, 1 << 8).expect("Set Features AEC");
    let aer = admin
        .submit(
            Sqe {
                opcode: nvme::spec::admin_opcode::ASYNC_EVENT_REQUEST,
                ..Sqe::default()
            },
            DataOut::None,
        )
        .expect("AER");

    let (mut io, _) = connect(address, 1, cntlid);
    let t2 = Instant::now();
    // Sizes from one block to MDTS, across the 4 MiB RADOS object boundary at LBA 8192.
    let writes: Vec<(u64, Vec<u8>)> = [512usize, 4096, 65536, 262144]
        .into_iter()
        .enumerate()
        .map(|(i, len)| (8192 - 64 + i as u64 * 1024, pattern(len, i as u32)))
        .collect();
    for (slba, data) in &writes {
        io.write(1, *slba, data.clone(), BLOCK).expect("write");
        let back = io
            .read(1, *slba, (data.len() / BLOCK as usize) as u32, BLOCK)
            .expect("read");
        assert!(
            back == *data,
            "{} bytes at {slba} read back differently",
            data.len()
        );
    }
    // 32 commands in flight at once, a quarter of them FUA (write + rbd flush).
    let cids: Vec<u16> = (0..32u32)
        .map(|i| {
            let sqe = Client::write_sqe(1, 20_000 + u64::from(i) * 8, 8, i % 4 == 0);
            io.submit(sqe, DataOut::Write(pattern(4096, 100 + i)))
                .expect("submit")
        })
        .collect();
    for cid in cids {
        let done = io.wait(cid).expect("completion");
        assert!(done.cqe.status.is_success(), "{:?}", done.cqe.status);
    }
    io.flush(1).expect("flush");
    let t_io = t2.elapsed();

    // What nvmfd acknowledged is in Ceph.
    let (slba, data) = &writes[3];
    assert!(
        export(&cluster, slba * u64::from(BLOCK), data.len()) == *data,
        "rbd export differs from what was written through nvmfd"
    );
    assert!(export(&cluster, 20_000 * 512 + 31 * 4096, 4096) == pattern(4096, 131));

    // Deallocate (DSM) part of the 256 KiB write, not object-aligned: reads back as zeroes,
    // the rest stays.
    io.deallocate(1, &[(slba + 8, 100)]).expect("deallocate");
    let back = io.read(1, *slba, 512, BLOCK).expect("read");
    assert!(back[..8 * 512] == data[..8 * 512]);
    assert!(
        back[8 * 512..108 * 512].iter().all(|&b| b == 0),
        "deallocated range not zero"
    );
    assert!(back[108 * 512..] == data[108 * 512..]);
    io.write_zeroes(1, writes[2].0, 16).expect("write zeroes");
    let back = io.read(1, writes[2].0, 128, BLOCK).expect("read");
    assert!(back[..16 * 512].iter().all(|&b| b == 0));
    assert!(back[16 * 512..] == writes[2].1[16 * 512..]);

    // Resize from outside: the host learns of it without asking.
    let t3 = Instant::now();
    cluster.rbd(&["resize", "--no-progress", IMAGE, "--size", "48M"]);
    let event = admin.wait(aer).expect("AER completion");
    let t_aen = t3.elapsed();
    assert!(event.cqe.status.is_success(), "{:?}", event.cqe.status);
    // NVMe Base 2.0 Figure 151: type 2 (notice), info 0 (namespace attribute), log page 04h.
    assert_eq!(
        event.cqe.dw0 & 0x00ff_ff07,
        0x0004_0002,
        "AEN dw0 {:#x}",
        event.cqe.dw0
    );
    let changed = admin
        .get_log_page(0x04, 0xffff_ffff, 4096, 0)
        .expect("log 04h");
    assert_eq!(u32::from_le_bytes(changed[0..4].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(changed[4..8].try_into().unwrap()), 0);
    assert_eq!(
        nsze(&mut admin),
        48 * MIB / u64::from(BLOCK),
        "NSZE after resize"
    );
    // The new blocks are usable right away.
    let last = 48 * MIB / u64::from(BLOCK) - 8;
    io.write(1, last, pattern(4096, 77), BLOCK)
        .expect("write past the old end");
    assert_eq!(io.read(1, last, 8, BLOCK).unwrap(), pattern(4096, 77));

    drop(io);
    drop(admin);
    // SIGTERM: nvmfd closes the image and leaves cleanly.
    let (status, _, log) = daemon.terminate_within(Duration::from_secs(30));
    assert!(status.success(), "nvmfd exit status {status}:\n{log}");
    eprintln!(
        "ceph: cluster up {t_cluster:.1?}; nvmfd listening {t_nvmfd:.1?}; I/O phase {t_io:.1?}; \
         resize → AEN {t_aen:.1?}; total {:.1?}",
        t0.elapsed()
    );
}
