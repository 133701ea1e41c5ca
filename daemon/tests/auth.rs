//! In-band authentication (DH-HMAC-CHAP) against the real binary over loopback NVMe/TCP, with
//! the Rust client as the host and nvmfd-auth's host role computing its messages: a keyed host
//! is asked to authenticate every queue (AUTHREQ.ATR), gets Authentication Required before it,
//! authenticates both ways; `nvmfd ctl set-host-key` rotates the key live; `remove-host`
//! disconnects it; a key file others may read is refused by check-config. Failures are counted
//! in `ctl status` and on the metrics endpoint.

mod fixture;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use fixture::{authenticate, free_port, private_file, serve, tcp_port, Daemon, TempDir};
use nvme::auth::CONNECT_AUTHREQ_ATR;
use nvme::spec::{admin_opcode, sqe_flags};
use nvme::wire::{Sqe, Status};
use nvmfd_auth::host::{Host, HostError};
use nvmfd_auth::{FailureReason, HashId, Secret};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:auth";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-1111-4222-8333-444455556666";
const HOSTID: [u8; 16] = [0x5a; 16];
const WAIT: Duration = Duration::from_secs(10);

struct Target {
    process: Daemon,
    socket: PathBuf,
    address: SocketAddr,
    metrics: SocketAddr,
    dir: TempDir,
}

fn start(name: &str, host_key: &Secret, ctrl_key: &Secret) -> Target {
    let dir = TempDir::new(&format!("auth-{name}"));
    let socket = dir.join("control.sock");
    let key_file = dir.join("host.key");
    private_file(&key_file, &host_key.to_interchange());
    let port = free_port();
    let metrics_port = free_port();
    let config = format!(
        "[global]\nreactors = 2\ncontrol_socket = \"{socket}\"\n{ports}\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\
         [[subsystems]]\nnqn = \"{SUBNQN}\"\n\
         [[subsystems.hosts]]\nnqn = \"{HOSTNQN}\"\ndhchap_key_file = \"{key}\"\n\
         dhchap_ctrl_key = \"{ctrl}\"\ndhchap_dhgroups = [\"ffdhe2048\", \"null\"]\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"4M\"\n",
        socket = socket.display(),
        ports = tcp_port(1, port),
        key = key_file.display(),
        ctrl = &*ctrl_key.to_interchange(),
    );
    let path = dir.write_config(&config);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut process = Daemon::spawn(serve(&path));
    let address = ([127, 0, 0, 1], port).into();
    process.wait_for_listener(address, WAIT);
    let metrics = ([127, 0, 0, 1], metrics_port).into();
    process.wait_for_listener(metrics, WAIT);
    process.wait_until("control socket", WAIT, || socket.exists());
    Target {
        process,
        socket,
        address,
        metrics,
        dir,
    }
}

impl Target {
    /// The metrics endpoint's body.
    fn scrape(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).expect("connect to the metrics endpoint");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").expect("HTTP head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_owned()
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        fixture::nvmfd()
            .arg("ctl")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A connected queue; returns the client and the Connect CQE DW0.
    fn connect(&self, qid: u16, cntlid: u16) -> (Client, u32) {
        let opts = ClientOptions {
            timeout: WAIT,
            ..ClientOptions::default()
        };
        let mut c = Client::connect(self.address, opts).expect("ICReq");
        let r = fixture::connect_raw(&mut c, (qid, cntlid), (SUBNQN, HOSTNQN, HOSTID))
            .expect("Connect");
        assert_eq!(r.cqe.status, Status::SUCCESS, "Connect");
        (c, r.cqe.dw0)
    }
}

fn identify_status(c: &mut Client) -> Status {
    let sqe = Sqe {
        opcode: admin_opcode::IDENTIFY,
        flags: sqe_flags::PSDT_SGL,
        cdw10: 1,
        dptr: nvme::wire::SglDescriptor::transport_data_block(0),
        ..Sqe::default()
    };
    c.execute(sqe, DataOut::Read(4096))
        .expect("Identify")
        .cqe
        .status
}

#[test]
fn keyed_host_authenticates_every_queue_and_keys_rotate_live() {
    let hk = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let ck = Secret::generate(Some(HashId::Sha512), 64).unwrap();
    let t = start("rotate", &hk, &ck);
    let (mut admin, dw0) = t.connect(0, 0xffff);
    assert_eq!(
        dw0 & CONNECT_AUTHREQ_ATR,
        CONNECT_AUTHREQ_ATR,
        "AUTHREQ.ATR"
    );
    let cntlid = dw0 as u16;
    admin
        .enable_controller(WAIT)
        .expect("CC.EN before authentication");
    assert_eq!(
        identify_status(&mut admin),
        Status::AUTHENTICATION_REQUIRED.with_dnr()
    );
    let mut host = Host::new(hk.clone(), Some(ck.clone()), HOSTNQN, SUBNQN);
    authenticate(&mut admin, &mut host, 1).expect("bidirectional");
    assert_eq!(identify_status(&mut admin), Status::SUCCESS);

    // An I/O queue authenticates on its own before it reads.
    admin
        .set_features(0x07, 0x0000_0000)
        .expect("one I/O queue");
    let (mut io, dw0) = t.connect(1, cntlid);
    assert_eq!(dw0, u32::from(cntlid) | CONNECT_AUTHREQ_ATR);
    let read = Client::read_sqe(1, 0, 1);
    let r = io.execute(read, DataOut::Read(512)).unwrap();
    assert_eq!(r.cqe.status, Status::AUTHENTICATION_REQUIRED.with_dnr());
    let mut uni = Host::new(hk.clone(), None, HOSTNQN, SUBNQN);
    authenticate(&mut io, &mut uni, 2).expect("unidirectional");
    let r = io
        .execute(Client::read_sqe(1, 0, 1), DataOut::Read(512))
        .unwrap();
    assert_eq!(r.cqe.status, Status::SUCCESS);

    // A wrong controller key on the host: R2 does not verify, the host ends the transaction.
    let mut impostor_check = Host::new(
        hk.clone(),
        Some(Secret::generate(None, 32).unwrap()),
        HOSTNQN,
        SUBNQN,
    );
    assert!(matches!(
        authenticate(&mut admin, &mut impostor_check, 3),
        Err(HostError::ControllerResponse)
    ));
    authenticate(&mut admin, &mut host, 4).expect("again");

    // Rotate the host key live through the control socket (a new private key file).
    let new = Secret::generate(None, 48).unwrap();
    let new_file = t.dir.join("host-new.key");
    private_file(&new_file, &new.to_interchange());
    let out = t.ctl(&[
        "set-host-key",
        SUBNQN,
        HOSTNQN,
        "--key-file",
        new_file.to_str().unwrap(),
        "--ctrl-key",
        &ck.to_interchange(),
    ]);
    assert!(out.status.success(), "{out:?}");
    // Live queues keep working; the next transaction needs the new key.
    let r = io
        .execute(Client::read_sqe(1, 0, 1), DataOut::Read(512))
        .unwrap();
    assert_eq!(r.cqe.status, Status::SUCCESS);
    match authenticate(&mut io, &mut uni, 5) {
        Err(HostError::Failure1(e)) => assert_eq!(e, FailureReason::Failed as u8),
        other => panic!("old key after rotation: {other:?}"),
    }
    let mut rotated = Host::new(new.clone(), Some(ck.clone()), HOSTNQN, SUBNQN);
    authenticate(&mut io, &mut rotated, 6).expect("new key");
    authenticate(&mut admin, &mut rotated, 7).expect("new key on the admin queue");
    let status = t.ctl(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("failed authentications: 2"), "{status}");
    let scrape = t.scrape();
    assert!(
        scrape.contains("\nnvmfd_auth_failures_total 2\n"),
        "the endpoint counts the same two failures:\n{scrape}"
    );
    let log = t.process.log();
    assert!(
        log.contains("authentication failed") && log.contains(HOSTNQN) && log.contains("127.0.0.1"),
        "failures are logged with host NQN and address:\n{log}"
    );
    assert!(
        !log.contains(&*new.to_interchange()),
        "a secret reached the log"
    );

    // Removing the host disconnects its controller.
    let out = t.ctl(&["remove-host", SUBNQN, HOSTNQN]);
    assert!(out.status.success(), "{out:?}");
    admin.expect_close().expect("admin queue closed");
}

#[test]
fn check_config_refuses_a_key_file_others_can_read() {
    let dir = TempDir::new("auth-keyfile");
    let key_file = dir.join("host.key");
    private_file(
        &key_file,
        &Secret::generate(None, 32).unwrap().to_interchange(),
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.write_config(&format!(
        "{}\n[[subsystems]]\nnqn = \"{SUBNQN}\"\n[[subsystems.hosts]]\nnqn = \"{HOSTNQN}\"\n\
         dhchap_key_file = \"{}\"\n",
        tcp_port(1, 4420),
        key_file.display()
    ));
    let out = fixture::nvmfd()
        .arg("check-config")
        .arg("-c")
        .arg(&config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "key file {} is readable by group or others",
            key_file.display()
        )),
        "{text}"
    );
}

/// Connect-to-first-I/O time per DH group, with SHA-256, against a subsystem without
/// authentication as the baseline: admin queue Connect (+ authentication), CC.EN, one I/O
/// queue (Set Features, Connect + authentication), one 4 KiB read. Unidirectional, as
/// `nvme connect --dhchap-secret` without a controller key. A measurement, not a check: run
/// with a release build, `cargo test --release -p nvmfd --test auth -- --ignored --nocapture`
/// (`NVMFD_AUTH_BENCH_RUNS` sets the runs per group, 20 by default).
#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn connect_to_first_io_per_dh_group() {
    use nvmfd_auth::DhGroup;
    use std::time::Instant;

    const PLAIN_NQN: &str = "nqn.2026-12.dev.nvmfd:plain";
    let runs: usize = std::env::var("NVMFD_AUTH_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = TempDir::new("auth-bench");
    let key = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let key_file = dir.join("host.key");
    private_file(&key_file, &key.to_interchange());
    let port = free_port();
    let config = format!(
        "[global]\nreactors = 2\n{ports}\n\
         [[subsystems]]\nnqn = \"{SUBNQN}\"\n\
         [[subsystems.hosts]]\nnqn = \"{HOSTNQN}\"\ndhchap_key_file = \"{key}\"\n\
         dhchap_hashes = [\"hmac(sha256)\"]\n\
         dhchap_dhgroups = [\"null\", \"ffdhe2048\", \"ffdhe3072\", \"ffdhe4096\", \"ffdhe6144\", \"ffdhe8192\"]\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"4M\"\n\
         [[subsystems]]\nnqn = \"{PLAIN_NQN}\"\nallow_any_host = true\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"4M\"\n",
        ports = tcp_port(1, port),
        key = key_file.display(),
    );
    let path = dir.write_config(&config);
    let mut process = Daemon::spawn(serve(&path));
    let address = ([127, 0, 0, 1], port).into();
    process.wait_for_listener(address, WAIT);

    let opts = || ClientOptions {
        timeout: WAIT,
        ..ClientOptions::default()
    };
    // One sample: from the first TCP connect to the first read's data, in milliseconds.
    let once = |subnqn: &str, group: Option<DhGroup>| -> f64 {
        let host = |tid| {
            let mut h = Host::new(key.clone(), None, HOSTNQN, subnqn);
            h.hashes = vec![HashId::Sha256];
            h.dh_groups = group.into_iter().collect();
            (h, tid)
        };
        let t0 = Instant::now();
        let mut admin = Client::connect(address, opts()).expect("ICReq");
        let cntlid = admin
            .fabrics_connect(0, 31, 0xffff, subnqn, HOSTNQN, HOSTID, 30_000)
            .expect("admin Connect");
        if group.is_some() {
            let (mut h, tid) = host(1);
            authenticate(&mut admin, &mut h, tid).expect("admin queue authentication");
        }
        admin.enable_controller(WAIT).expect("CC.EN");
        admin.set_features(0x07, 0).expect("one I/O queue");
        let mut io = Client::connect(address, opts()).expect("ICReq");
        io.fabrics_connect(1, 31, cntlid, subnqn, HOSTNQN, HOSTID, 0)
            .expect("I/O Connect");
        if group.is_some() {
            let (mut h, tid) = host(2);
            authenticate(&mut io, &mut h, tid).expect("I/O queue authentication");
        }
        let data = io.read(1, 0, 8, 512).expect("4 KiB read");
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        assert_eq!(data.len(), 4096);
        ms
    };
    let cases: Vec<(String, &str, Option<DhGroup>)> =
        std::iter::once(("no authentication".to_owned(), PLAIN_NQN, None))
            .chain(
                DhGroup::ALL
                    .iter()
                    .map(|g| (format!("sha256 {}", g.name()), SUBNQN, Some(*g))),
            )
            .collect();
    println!("connect-to-first-I/O, {runs} runs each (ms)");
    println!("{:<22} {:>8} {:>8}", "", "median", "min");
    for (label, subnqn, group) in cases {
        // One warm-up run (first connection to a subsystem, page faults).
        once(subnqn, group);
        let mut samples: Vec<f64> = (0..runs).map(|_| once(subnqn, group)).collect();
        samples.sort_by(f64::total_cmp);
        println!(
            "{label:<22} {:>8.2} {:>8.2}",
            samples[samples.len() / 2],
            samples[0]
        );
    }
    process.alive().expect("nvmfd still running");
}

/// The reconnect storm against one reactor's I/O: a QD1 4 KiB reader on a subsystem without
/// authentication, alone and then while `NVMFD_STORM_CONTROLLERS` (64) host threads each
/// connect a controller (admin queue + `NVMFD_STORM_QUEUES` (4) I/O queues, every queue
/// authenticated with DH-HMAC-CHAP SHA-512 in the group) and disconnect it, in a loop, for
/// `NVMFD_STORM_SECS` (5) seconds per DH group of `NVMFD_STORM_GROUPS` (ffdhe2048 ffdhe8192).
/// The daemon has one reactor, so the reader's queue and every storm queue share it. The
/// host threads run at nice 19 so that the host's own exponentiations yield the CPUs to the
/// target (they are not what is measured). Prints the reader's p50/p99/max and the storm's
/// authenticated queues per second. `NVMFD_STORM_BIN` runs another nvmfd binary (an earlier
/// build, for a before/after comparison). A measurement, not a check:
/// `cargo test --release -p nvmfd --test auth -- --ignored --nocapture auth_storm`
/// (`scripts/bench.sh auth-storm`).
#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn auth_storm_against_a_qd1_reader() {
    use nvmfd_auth::DhGroup;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    const PLAIN_NQN: &str = "nqn.2026-12.dev.nvmfd:plain";
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let controllers: usize = env("NVMFD_STORM_CONTROLLERS", "64").parse().unwrap();
    let queues: u16 = env("NVMFD_STORM_QUEUES", "4").parse().unwrap();
    let secs: f64 = env("NVMFD_STORM_SECS", "5").parse().unwrap();
    let groups: Vec<DhGroup> = env("NVMFD_STORM_GROUPS", "ffdhe2048 ffdhe8192")
        .split_whitespace()
        .map(|n| DhGroup::from_name(n).expect("a DH group name"))
        .collect();
    let dir = TempDir::new("auth-storm");
    let key = Secret::generate(Some(HashId::Sha512), 64).unwrap();
    let key_file = dir.join("host.key");
    private_file(&key_file, &key.to_interchange());
    let port = free_port();
    let config = format!(
        "[global]\nreactors = 1\nmax_io_queues = {queues}\nlog_level = \"warn\"\n{ports}\n\
         [[subsystems]]\nnqn = \"{SUBNQN}\"\n\
         [[subsystems.hosts]]\nnqn = \"{HOSTNQN}\"\ndhchap_key_file = \"{key}\"\n\
         dhchap_hashes = [\"hmac(sha512)\"]\n\
         dhchap_dhgroups = [\"ffdhe2048\", \"ffdhe3072\", \"ffdhe4096\", \"ffdhe6144\", \"ffdhe8192\"]\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"4M\"\n\
         [[subsystems]]\nnqn = \"{PLAIN_NQN}\"\nallow_any_host = true\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"64M\"\n",
        ports = tcp_port(1, port),
        key = key_file.display(),
    );
    let path = dir.write_config(&config);
    // A fresh daemon per DH group, killed at the end of its storm: the storm's controllers
    // still in flight then fail at once instead of being waited for.
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let start = || {
        let mut command = serve(&path);
        if let Ok(bin) = std::env::var("NVMFD_STORM_BIN") {
            let mut other = std::process::Command::new(bin);
            other.args(command.get_args());
            for (k, v) in command.get_envs() {
                match v {
                    Some(v) => other.env(k, v),
                    None => other.env_remove(k),
                };
            }
            command = other;
        }
        let mut process = Daemon::spawn(command);
        process.wait_for_listener(address, WAIT);
        process
    };
    let opts = || ClientOptions {
        timeout: Duration::from_secs(60),
        ..ClientOptions::default()
    };

    // The reader: one controller, one I/O queue, QD1 4 KiB reads for `secs`; latencies in µs.
    let read_for = |secs: f64| -> Vec<f64> {
        let mut admin = Client::connect(address, opts()).expect("ICReq");
        let cntlid = admin
            .fabrics_connect(0, 31, 0xffff, PLAIN_NQN, HOSTNQN, HOSTID, 60_000)
            .expect("admin Connect");
        admin.enable_controller(WAIT).expect("CC.EN");
        admin.set_features(0x07, 0).expect("one I/O queue");
        let mut io = Client::connect(address, opts()).expect("ICReq");
        io.fabrics_connect(1, 31, cntlid, PLAIN_NQN, HOSTNQN, HOSTID, 0)
            .expect("I/O Connect");
        let mut lat = Vec::new();
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut lba = 0u64;
        while Instant::now() < end {
            let t0 = Instant::now();
            io.read(1, lba, 8, 512).expect("4 KiB read");
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
            lba = (lba + 8) % (64 << 11);
            // Keep-alive of the reader's controller (it sends no admin command otherwise).
            if lat.len() % 4096 == 0 {
                admin.set_features(0x07, 0).ok();
            }
        }
        lat
    };
    let pct = |v: &mut Vec<f64>, p: f64| -> f64 {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let report = |label: &str, mut v: Vec<f64>, extra: &str| {
        let n = v.len();
        let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
        let (p999, max) = (pct(&mut v, 0.999), pct(&mut v, 1.0));
        println!("{label:<22} {n:>8} {p50:>8.1} {p99:>8.1} {p999:>9.1} {max:>10.1}  {extra}");
        p99
    };
    // One storm controller, connected, authenticated on every queue, then dropped.
    let storm_once = |group: DhGroup, done: &AtomicU64| -> Result<(), String> {
        let host = |tid| {
            let mut h = Host::new(key.clone(), None, HOSTNQN, SUBNQN);
            h.hashes = vec![HashId::Sha512];
            h.dh_groups = vec![group];
            (h, tid)
        };
        let mut admin = Client::connect(address, opts()).map_err(|e| e.to_string())?;
        let cntlid = admin
            .fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 60_000)
            .map_err(|e| e.to_string())?;
        let (mut h, tid) = host(1);
        authenticate(&mut admin, &mut h, tid).map_err(|e| e.to_string())?;
        done.fetch_add(1, Ordering::Relaxed);
        admin.enable_controller(WAIT).map_err(|e| e.to_string())?;
        admin
            .set_features(0x07, u32::from(queues - 1) * 0x10001)
            .map_err(|e| e.to_string())?;
        let mut ios = Vec::new();
        for qid in 1..=queues {
            let mut io = Client::connect(address, opts()).map_err(|e| e.to_string())?;
            io.fabrics_connect(qid, 31, cntlid, SUBNQN, HOSTNQN, HOSTID, 0)
                .map_err(|e| e.to_string())?;
            let (mut h, tid) = host(qid + 1);
            authenticate(&mut io, &mut h, tid).map_err(|e| e.to_string())?;
            done.fetch_add(1, Ordering::Relaxed);
            ios.push(io);
        }
        Ok(())
    };

    println!(
        "one reactor; storm: {controllers} controllers x (admin + {queues} I/O queues), \
         SHA-512; {secs} s per row; latencies in us"
    );
    println!(
        "{:<22} {:>8} {:>8} {:>8} {:>9} {:>10}  storm",
        "reader (QD1 4K read)", "reads", "p50", "p99", "p99.9", "max"
    );
    for group in groups {
        let mut process = start();
        // Warm-up (page faults, first connections).
        read_for(0.5);
        // Each storm row right after its own quiet row: the machine's other load changes
        // less within a pair than across the run.
        let quiet = report("no storm", read_for(secs), "");
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let (p99, rate, fails) = std::thread::scope(|s| {
            for _ in 0..controllers {
                let (stop, done, failed) = (&stop, &done, &failed);
                let storm_once = &storm_once;
                s.spawn(move || {
                    // SAFETY: setpriority on the calling thread (who 0 = this thread on Linux).
                    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
                    while !stop.load(Ordering::Relaxed) {
                        // The fixture's helpers panic when the daemon goes away under them
                        // (at the end of the row): that ends this thread's storm.
                        let once = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            storm_once(group, done)
                        }));
                        let Ok(once) = once else {
                            break;
                        };
                        if let Err(e) = once {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("storm controller failed: {e}");
                            }
                        }
                    }
                });
            }
            // Let every storm thread start its first controller.
            std::thread::sleep(Duration::from_millis(500));
            let before = done.load(Ordering::Relaxed);
            let t0 = Instant::now();
            let lat = read_for(secs);
            let rate = (done.load(Ordering::Relaxed) - before) as f64 / t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let fails = failed.load(Ordering::Relaxed);
            process.alive().expect("nvmfd still running");
            // The storm's controllers in flight fail now, some with a panic of the fixture's
            // helpers, which says nothing worth printing.
            std::panic::set_hook(Box::new(|_| {}));
            drop(process);
            let p99 = report(
                &format!("storm {}", group.name()),
                lat,
                &format!("{rate:.1} authenticated queues/s, {fails} failed controllers"),
            );
            (p99, rate, fails)
        });
        drop(std::panic::take_hook());
        println!(
            "  {}: reader p99 {:.2}x of no storm; {rate:.1} queue authentications/s; {fails} failures",
            group.name(),
            p99 / quiet
        );
    }
}
