//! The real binary end to end with the host-side NVMe/TCP client: admin queue, Identify, an
//! I/O queue on another reactor, writes and reads on RAM and file namespaces (the file path
//! goes through the reactor's io_uring and completion routing), the discovery log, and a
//! SIGTERM while connections are open.

mod fixture;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fixture::{free_port, one_subsystem, pattern, serve, Daemon, TempDir};
use nvme::spec::{cns, lid, nvm_bits, nvm_opcode, Status, CNTLID_DYNAMIC, DISCOVERY_NQN};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:io";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-444455556666";
const BLOCK: u32 = 512;

/// nvmfd with a RAM namespace 1 and a file namespace 2 (created in `dir`), two reactors.
fn start(dir: &TempDir) -> (Daemon, SocketAddr) {
    let port = free_port();
    let namespaces = format!(
        r#"
[[subsystems.namespaces]]
nsid = 1
ram_size = "16M"

[[subsystems.namespaces]]
nsid = 2
path = "{image}"
size = "8M"
"#,
        image = dir.join("ns2.img").display()
    );
    let global = "max_data_transfer = \"256K\"";
    let config = one_subsystem(port, global, (SUBNQN, HOSTNQN), &namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    (daemon, address)
}

fn connect(address: SocketAddr, qid: u16, cntlid: u16, subnqn: &str) -> (Client, u16) {
    fixture::connect(
        address,
        ClientOptions::default(),
        (qid, cntlid, 30_000),
        (subnqn, HOSTNQN, [7; 16]),
    )
    .expect("Connect")
}

#[test]
fn admin_io_and_discovery_through_the_daemon() {
    let dir = TempDir::new("io");
    let (mut daemon, address) = start(&dir);

    let (mut admin, cntlid) = connect(address, 0, CNTLID_DYNAMIC, SUBNQN);
    admin
        .enable_controller(Duration::from_secs(5))
        .expect("CC.EN");
    let id = admin
        .identify(cns::CONTROLLER, 0)
        .expect("Identify Controller");
    assert_eq!(&id[768..768 + SUBNQN.len()], SUBNQN.as_bytes(), "SUBNQN");
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), cntlid, "CNTLID");
    let ns2 = admin
        .identify(cns::NAMESPACE, 2)
        .expect("Identify Namespace 2");
    assert_eq!(
        u64::from_le_bytes(ns2[0..8].try_into().unwrap()),
        (8 << 20) / u64::from(BLOCK)
    );

    // The I/O queue is a second TCP connection: round-robin puts it on the other reactor.
    let (mut io, _) = connect(address, 1, cntlid, SUBNQN);
    for nsid in [1u32, 2] {
        for (i, len) in [512usize, 4096, 65536, 262144].into_iter().enumerate() {
            let data = pattern(len, nsid * 10 + i as u32);
            let slba = (i as u64) * 1024;
            io.write(nsid, slba, data.clone(), BLOCK).expect("write");
            let back = io
                .read(nsid, slba, (len / BLOCK as usize) as u32, BLOCK)
                .expect("read");
            assert!(
                back == data,
                "nsid {nsid}: {len} bytes read back differently"
            );
        }
    }
    // Several commands in flight at once on the file namespace.
    let cids: Vec<u16> = (0..16u32)
        .map(|i| {
            io.submit(
                Client::write_sqe(2, u64::from(i) * 8, 8, false),
                DataOut::Write(pattern(4096, 500 + i)),
            )
            .expect("submit")
        })
        .collect();
    for cid in cids {
        let done = io.wait(cid).expect("completion");
        assert!(done.cqe.status.is_success(), "{:?}", done.cqe.status);
    }
    for i in 0..16u32 {
        assert_eq!(
            io.read(2, u64::from(i) * 8, 8, BLOCK).unwrap(),
            pattern(4096, 500 + i)
        );
    }
    io.flush(2).expect("flush");

    // 30 pipelined 256 KiB reads (7.5 MiB) are more than the socket buffers hold: the target
    // must park on EAGAIN, resume on EPOLLOUT and complete every one without a stall.
    let expected = pattern(262_144, 13);
    let started = Instant::now();
    let cids: Vec<u16> = (0..30u32)
        .map(|_| {
            // nsid 1, slba 3072: the 256 KiB block written above with seed 13.
            io.submit(Client::read_sqe(1, 3072, 512), DataOut::Read(262_144))
                .expect("submit read")
        })
        .collect();
    for (i, cid) in cids.into_iter().enumerate() {
        let done = io.wait(cid).expect("read completion");
        assert!(done.cqe.status.is_success(), "{:?}", done.cqe.status);
        assert!(
            done.data == expected,
            "pipelined read {i} returned other data"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "pipelined reads took {:?}",
        started.elapsed()
    );

    // A host not on the allow list is refused.
    let mut stranger = Client::connect(address, ClientOptions::default()).unwrap();
    let refused = stranger.fabrics_connect(
        0,
        31,
        0xffff,
        SUBNQN,
        "nqn.2014-08.org.nvmexpress:uuid:99999999-1111-4222-8333-444455556666",
        [9; 16],
        30_000,
    );
    assert!(refused.is_err(), "unlisted host connected");

    // Discovery reports the subsystem at the address the host used (never 0.0.0.0).
    let (mut discovery, _) = connect(address, 0, CNTLID_DYNAMIC, DISCOVERY_NQN);
    discovery
        .enable_controller(Duration::from_secs(5))
        .expect("CC.EN (discovery)");
    let log = discovery
        .get_log_page(lid::DISCOVERY, 0, 4096, 0)
        .expect("discovery log");
    let numrec = u64::from_le_bytes(log[8..16].try_into().unwrap());
    assert!(numrec >= 1, "numrec {numrec}");
    let entries: Vec<&[u8]> = log[1024..].chunks(1024).take(numrec as usize).collect();
    let ours = entries
        .iter()
        .find(|e| e[256..256 + SUBNQN.len()] == *SUBNQN.as_bytes())
        .expect("our subsystem in the discovery log");
    assert_eq!(ours[0], 3, "TRTYPE tcp");
    let service = address.port().to_string();
    assert_eq!(&ours[32..32 + service.len()], service.as_bytes(), "TRSVCID");
    assert_eq!(&ours[512..512 + 9], b"127.0.0.1", "TRADDR");

    // SIGTERM with three connections open: clean exit, in time.
    let (status, _, stderr) = daemon.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        io.read(1, 0, 1, BLOCK).is_err(),
        "connection still served after exit"
    );
}

/// Deallocate, Write Zeroes and Compare on a file namespace, with the daemon under
/// `strace -f` for the system calls that wait for storage: none may appear in any nvmfd
/// thread (the io_uring workers that do the work are kernel threads and make no system
/// calls), while `io_uring_enter` does (the positive control: strace is attached and sees the
/// reactors). Without strace the commands are still checked, and the trace part is skipped
/// with a note.
#[test]
fn zeroing_and_compare_make_no_blocking_call_in_the_daemon() {
    let dir = TempDir::new("noblock");
    let (daemon, address) = start(&dir);
    let trace_file = dir.join("strace.out");
    let strace = std::process::Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&trace_file)
        .args([
            "-e",
            "trace=fallocate,ioctl,pread64,preadv,preadv2,pwrite64,pwritev,pwritev2,fsync,\
             fdatasync,sync_file_range,io_uring_enter",
            "-p",
        ])
        .arg(daemon.pid().to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut strace = match strace {
        Ok(child) => Some(child),
        Err(e) => {
            eprintln!("    strace not available ({e}): only the commands are checked");
            None
        }
    };
    let (mut admin, cntlid) = connect(address, 0, 0xffff, SUBNQN);
    admin.enable_controller(Duration::from_secs(5)).unwrap();
    let (mut io, _) = connect(address, 1, cntlid, SUBNQN);
    let traced = |what: &str| {
        std::fs::read_to_string(&trace_file)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    };
    if strace.is_some() {
        // Wait until strace sees the reactor entering its ring for a file write.
        let deadline = Instant::now() + Duration::from_secs(20);
        while traced("io_uring_enter") == 0 {
            assert!(Instant::now() < deadline, "strace never saw io_uring_enter");
            io.write(2, 4000, pattern(4096, 1), BLOCK).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let data = pattern(65536, 9);
    io.write(2, 1000, data.clone(), BLOCK).unwrap();
    let status = |io: &mut Client, sqe: nvme::wire::Sqe, out: DataOut| {
        io.execute(sqe, out).unwrap().cqe.status
    };
    let ok = Status::SUCCESS;
    // Compare: equal, then one byte off.
    let compare = nvme::wire::Sqe {
        opcode: nvm_opcode::COMPARE,
        ..Client::read_sqe(2, 1000, 128)
    };
    assert_eq!(status(&mut io, compare, DataOut::Write(data.clone())), ok);
    let mut off = data.clone();
    off[4097] ^= 1;
    assert_eq!(
        status(&mut io, compare, DataOut::Write(off)),
        Status::COMPARE_FAILURE.with_dnr()
    );
    // Write Zeroes (blocks 1000..1008) and with DEAC (1008..1016).
    for (slba, deac) in [(1000u64, 0u32), (1008, nvm_bits::DEAC)] {
        let wz = nvme::wire::Sqe {
            opcode: nvm_opcode::WRITE_ZEROES,
            cdw12: 7 | deac,
            ..Client::read_sqe(2, slba, 1)
        };
        assert_eq!(status(&mut io, wz, DataOut::None), ok);
    }
    // Dataset Management deallocate of two ranges: 1024..1040 and 1100..1128.
    let ranges = nvme::wire::dsm::encode_ranges(&[(1024, 16), (1100, 28)]);
    let dsm = nvme::wire::Sqe {
        opcode: nvm_opcode::DATASET_MANAGEMENT,
        nsid: 2,
        cdw10: 1,
        cdw11: nvm_bits::DSM_AD,
        ..Default::default()
    };
    assert_eq!(status(&mut io, dsm, DataOut::Write(ranges)), ok);
    let back = io.read(2, 1000, 128, BLOCK).unwrap();
    let zero = |from: u64, to: u64| {
        back[((from - 1000) * 512) as usize..((to - 1000) * 512) as usize]
            .iter()
            .all(|&b| b == 0)
    };
    assert!(zero(1000, 1016) && zero(1024, 1040) && zero(1100, 1128));
    let kept = ((1016 - 1000) * 512) as usize..((1024 - 1000) * 512) as usize;
    assert!(
        back[kept.clone()] == data[kept],
        "blocks between the ranges kept"
    );
    if let Some(child) = strace.as_mut() {
        // Detach (SIGTERM makes strace detach cleanly and flush its output).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = child.wait();
        let trace = std::fs::read_to_string(&trace_file).unwrap();
        // Sockets are made non-blocking with ioctl(FIONBIO) on accept: only the block
        // device ioctls (BLKDISCARD, BLKZEROOUT, …) count.
        let blocking: Vec<&str> = trace
            .lines()
            .filter(|l| !l.contains("io_uring_enter"))
            .filter(|l| !l.contains("ioctl(") || l.contains("BLK"))
            .collect();
        assert!(
            blocking.is_empty(),
            "storage system calls in the daemon:\n{}",
            blocking.join("\n")
        );
        assert!(traced("io_uring_enter") > 0);
        eprintln!(
            "    strace: {} io_uring_enter, no fallocate/ioctl/pread/pwrite/fsync",
            traced("io_uring_enter")
        );
    }
    drop(daemon);
}

/// A subsystem named as nvmet and blktests name them (`testnqn`: not an NVMe Base 2.0 §4.5
/// NQN) is served, with a warning in the log, and I/O works through it.
#[test]
fn serves_a_subsystem_named_like_nvmet_test_tools_do() {
    let dir = TempDir::new("io-testnqn");
    let port = free_port();
    let namespaces = "\n[[subsystems.namespaces]]\nnsid = 1\nram_size = \"1M\"\n";
    let config = one_subsystem(port, "", ("testnqn", HOSTNQN), namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    daemon
        .wait_log(
            &["WARN", "subsystems[0].nqn: testnqn: not a well-formed NQN"],
            Duration::from_secs(5),
        )
        .unwrap();

    let (mut admin, cntlid) = connect(address, 0, 0xffff, "testnqn");
    admin
        .enable_controller(Duration::from_secs(5))
        .expect("CC.EN");
    let id = admin.identify(0x01, 0).expect("Identify Controller");
    assert_eq!(&id[768..768 + 8], b"testnqn\0", "SUBNQN");
    let (mut io, _) = connect(address, 1, cntlid, "testnqn");
    let data = pattern(4096, 3);
    io.write(1, 8, data.clone(), BLOCK).expect("write");
    assert_eq!(io.read(1, 8, 8, BLOCK).expect("read"), data);
    daemon.terminate();
}
