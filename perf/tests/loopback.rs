//! The generator against an in-process NVMe/TCP target (the transport's `TcpConnection` and
//! the core's `Target` with a RAM namespace, driven by a small poll(2) loop) and against the
//! raw echo peer, over 127.0.0.1.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::queue::{PeerInfo, TransportKind};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig};
use nvme::testing::InlineOnly;
use nvmfd_perf::args::Args;
use nvmfd_perf::run::{self, RunError};
use nvmfd_perf::setup::SetupError;
use transport::client::{Client, ClientOptions};
use transport::conn::{ConnStatus, Connection};
use transport::tcp::{TcpConnection, TcpParams};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:perf-test";
const BLOCK: u32 = 512;
const RAM_BYTES: u64 = 32 << 20;

struct TestTarget {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for TestTarget {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("target thread");
        }
    }
}

fn start_target(max_io_queues: u16, params: TcpParams) -> TestTarget {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = TargetConfig {
        ports: vec![PortConfig {
            id: 1,
            transport: TransportKind::Tcp,
            address: addr.ip(),
            service: addr.port(),
            secure_channel: Default::default(),
        }],
        subsystems: vec![SubsystemConfig::open_to_any_host(
            SUBNQN,
            "perf-test",
            vec![NamespaceConfig::new(
                1,
                BackendConfig::Ram { size: RAM_BYTES },
                BLOCK,
            )],
        )],
        limits: Limits {
            max_queue_size: 64,
            max_io_queues,
            max_data_transfer: params.max_data_transfer,
            in_capsule_data_size: params.in_capsule_data_size,
            kato_default_ms: 120_000,
        },
        // Referrals, multipath: none.
        ..TargetConfig::default()
    };
    let target = Target::with_opener(config, &storage::open).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let thread = std::thread::spawn(move || serve(listener, target, params, stop2));
    TestTarget {
        addr,
        stop,
        thread: Some(thread),
    }
}

/// One thread, poll(2) over the listener and every connection (connection contract driving rules).
fn serve(listener: TcpListener, target: Arc<Target>, params: TcpParams, stop: Arc<AtomicBool>) {
    listener.set_nonblocking(true).unwrap();
    let mut conns: Vec<TcpConnection> = Vec::new();
    let mut io = InlineOnly;
    let mut next_token = 1u32;
    let mut last_tick = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        fds.extend(conns.iter().map(|c| libc::pollfd {
            fd: c.fd().as_raw_fd(),
            events: libc::POLLIN | if c.wants_write() { libc::POLLOUT } else { 0 },
            revents: 0,
        }));
        // SAFETY: `fds` is a valid, exclusively borrowed pollfd array for the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
        if fds[0].revents != 0 {
            while let Ok((stream, remote)) = listener.accept() {
                stream.set_nonblocking(true).unwrap();
                stream.set_nodelay(true).unwrap();
                let peer = PeerInfo {
                    transport: TransportKind::Tcp,
                    port_id: 1,
                    local: stream.local_addr().unwrap(),
                    remote,
                    reactor: None,
                };
                conns.push(TcpConnection::new(
                    stream,
                    next_token,
                    Arc::clone(&target),
                    peer,
                    params,
                ));
                next_token += 1;
            }
        }
        let mut closed = vec![false; conns.len()];
        for (i, c) in conns.iter_mut().enumerate() {
            // Connections accepted in this round have no pollfd yet.
            let re = fds.get(i + 1).map_or(0, |f| f.revents);
            if re & libc::POLLOUT != 0 && c.on_writable() == ConnStatus::Closed {
                closed[i] = true;
                continue;
            }
            if re & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
                && c.on_readable(&mut io) == ConnStatus::Closed
            {
                closed[i] = true;
            }
        }
        if last_tick.elapsed() >= Duration::from_millis(50) {
            last_tick = Instant::now();
            for (i, c) in conns.iter_mut().enumerate() {
                if !closed[i] && c.on_tick(last_tick, &mut io) == ConnStatus::Closed {
                    closed[i] = true;
                }
            }
        }
        let mut i = 0;
        conns.retain(|_| {
            i += 1;
            !closed[i - 1]
        });
    }
}

fn params() -> TcpParams {
    TcpParams {
        max_h2c_data: 16 * 1024,
        in_capsule_data_size: 8192,
        max_data_transfer: 256 * 1024,
    }
}

fn args(addr: SocketAddr, extra: &[&str]) -> Args {
    let addr = addr.to_string();
    let base = ["nvmfd-perf", "--addr", &addr, "--nqn", SUBNQN];
    Args::try_parse_from(base.iter().chain(extra.iter()).copied()).unwrap()
}

#[test]
fn randrw_for_a_second_over_two_controllers() {
    // Two I/O queues per controller: three queues need a second controller.
    let t = start_target(2, params());
    let a = args(
        t.addr,
        &[
            "-w", "randrw", "--mix", "50", "--qd", "16", "--queues", "3", "--time", "1",
            "--warmup", "0.2",
        ],
    );
    let r = run::run_nvme(&a).expect("run");
    let s = r.summary;
    assert_eq!(s.errors, 0);
    // Loose: CI machines are shared; this checks the loop runs, not its speed.
    assert!(s.ios > 200, "{s:?}");
    assert!(s.reads > s.ios / 4 && s.writes > s.ios / 4, "{s:?}");
    assert!((s.elapsed_s - 1.0).abs() < 1e-6);
    assert!(s.lat_p50_us > 0.0 && s.lat_p50_us <= s.lat_p99_us && s.lat_p99_us <= s.lat_max_us);
    assert!(s.cpu_percent > 0.0);
}

#[test]
fn r2t_writes_and_reads_with_digests_count_exactly() {
    // 64 KiB writes exceed the 8 KiB in-capsule allowance: R2T, answered in 16 KiB H2CData.
    let t = start_target(4, params());
    for w in ["write", "randread"] {
        let a = args(
            t.addr,
            &[
                "-w", w, "--bs", "64k", "--qd", "4", "--ios", "301", "--digest", "both",
            ],
        );
        let r = run::run_nvme(&a).unwrap_or_else(|e| panic!("{w}: {e}"));
        assert_eq!(r.summary.ios, 301, "{w}");
        assert_eq!(r.summary.errors, 0, "{w}");
        assert_eq!(r.info.digests, "header+data");
    }
}

#[test]
fn sequential_writes_land_with_the_generator_payload() {
    let t = start_target(4, params());
    // 16 in-capsule writes of 4 KiB cover the first 64 KiB exactly once.
    let a = args(
        t.addr,
        &["-w", "write", "--range", "64k", "--qd", "4", "--ios", "16"],
    );
    assert_eq!(run::run_nvme(&a).unwrap().summary.ios, 16);
    let mut admin = Client::connect(t.addr, ClientOptions::default()).unwrap();
    let hostid = [7; 16];
    let host = "nqn.2014-08.org.nvmexpress:uuid:perf-check";
    let cntlid = admin
        .fabrics_connect(0, 31, 0xffff, SUBNQN, host, hostid, 0)
        .unwrap();
    admin.enable_controller(Duration::from_secs(5)).unwrap();
    let mut io = Client::connect(t.addr, ClientOptions::default()).unwrap();
    io.fabrics_connect(1, 7, cntlid, SUBNQN, host, hostid, 0)
        .unwrap();
    let want = run::payload(4096);
    for i in 0..16u64 {
        let got = io.read(1, i * 8, 8, BLOCK).unwrap();
        assert!(got[..] == want[..], "block {} differs", i * 8);
    }
    // Nothing beyond the range was written (RAM reads as zeroes).
    assert!(io.read(1, 128, 8, BLOCK).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn setup_errors_are_reported() {
    let t = start_target(4, params());
    let mut a = args(t.addr, &["--ios", "1"]);
    a.nqn = "nqn.2026-12.dev.nvmfd:nonexistent".into();
    assert!(matches!(
        run::run_nvme(&a),
        Err(RunError::Setup(SetupError::CommandFailed {
            step: "admin Connect",
            ..
        }))
    ));
    // The target's queues hold 64 entries.
    let a = args(t.addr, &["--qd", "65", "--ios", "1"]);
    assert!(matches!(
        run::run_nvme(&a),
        Err(RunError::Setup(SetupError::QueueTooDeep {
            qd: 65,
            max: 64
        }))
    ));
    let a = args(t.addr, &["--bs", "512k", "--ios", "1"]);
    assert!(matches!(
        run::run_nvme(&a),
        Err(RunError::Setup(SetupError::TooLarge { .. }))
    ));
}

#[test]
fn raw_reference_against_the_echo_peer() {
    raw_reference(std::time::Duration::ZERO);
}

/// The polling echo peer (`--poll-window-us`) answers the same and stops when told.
#[test]
fn raw_reference_against_the_polling_echo_peer() {
    raw_reference(std::time::Duration::from_micros(50));
}

fn raw_reference(window: std::time::Duration) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let peer = std::thread::spawn(move || nvmfd_perf::echo::serve_polling(listener, stop2, window));
    for w in ["randread", "randwrite", "write"] {
        let a = args(
            addr,
            &[
                "--raw-tcp",
                "-w",
                w,
                "--bs",
                "16k",
                "--qd",
                "8",
                "-Q",
                "2",
                "--ios",
                "4000",
            ],
        );
        let r = run::run_raw(&a).unwrap();
        assert_eq!(r.summary.ios, 4000, "{w}");
        assert_eq!(r.info.mode, "raw-tcp");
    }
    let a = args(addr, &["--raw-tcp", "--time", "0.3", "--qd", "32"]);
    let r = run::run_raw(&a).unwrap();
    assert!(r.summary.ios > 100, "{:?}", r.summary);
    stop.store(true, Ordering::Release);
    peer.join().unwrap().unwrap();
}

#[test]
fn idle_connections_are_opened_and_held() {
    let t = start_target(3, params());
    let a = args(
        t.addr,
        &["--idle-connections", "10", "--time", "0.2", "--qd", "4"],
    );
    let mut announced = None;
    let r = run::run_idle(&a, 10, &mut |r| announced = Some(r.connections)).unwrap();
    assert_eq!(announced, Some(10));
    // 3 I/O queues per controller: 4 + 4 + 2 connections.
    assert_eq!((r.connections, r.controllers, r.io_queues), (10, 3, 7));
    assert!(r.held_s >= 0.2);
}
