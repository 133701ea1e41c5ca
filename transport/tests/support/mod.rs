//! Test support: a real `TcpConnection` per accepted socket on 127.0.0.1, driven by a minimal
//! poll(2) loop on a thread, against an `nvme::target::Target` with a RAM namespace (nsid 1)
//! and a file namespace (nsid 2, whose I/O goes through `IoSubmit` as pread/pwrite).

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::queue::{PeerInfo, TransportKind};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig};
use storage::sync::SyncEngine;
use transport::client::{Client, ClientOptions};
use transport::conn::{ConnStatus, Connection};
use transport::tcp::{TcpConnection, TcpParams};

pub const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:test";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
pub const HOSTID: [u8; 16] = [1; 16];
pub const RAM_NSID: u32 = 1;
pub const FILE_NSID: u32 = 2;
pub const BLOCK: u32 = 512;

pub struct TestTarget {
    pub addr: SocketAddr,
    pub params: TcpParams,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _dir: TempDir,
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for TestTarget {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("target thread panicked");
        }
    }
}

pub fn default_params() -> TcpParams {
    TcpParams {
        max_h2c_data: 32 * 1024,
        in_capsule_data_size: 8192,
        max_data_transfer: 256 * 1024,
    }
}

pub fn start(params: TcpParams) -> TestTarget {
    start_with_tick(params, Duration::from_millis(50))
}

/// As [`start`], calling `on_tick` every `tick` (a long tick shows whether anything relies
/// on it to make progress).
pub fn start_with_tick(params: TcpParams, tick: Duration) -> TestTarget {
    let dir = std::env::temp_dir().join(format!(
        "nvmfd-tcp-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = TempDir(dir);
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
            "nvmfd-test",
            vec![
                NamespaceConfig::new(RAM_NSID, BackendConfig::Ram { size: 64 << 20 }, BLOCK),
                NamespaceConfig {
                    nsid: FILE_NSID,
                    backend: BackendConfig::File {
                        path: dir.0.join("ns2.img"),
                        size: Some(16 << 20),
                        direct_io: false,
                    },
                    block_size: BLOCK,
                    read_only: false,
                    uuid: None,
                    nguid: None,
                    ana_group: 1,
                },
            ],
        )],
        limits: Limits {
            max_queue_size: 64,
            max_io_queues: 4,
            max_data_transfer: params.max_data_transfer,
            in_capsule_data_size: params.in_capsule_data_size,
            kato_default_ms: 120_000,
        },
        referrals: vec![],
        multipath: Default::default(),
        state_dir: None,
        discovery_nqn: None,
        reservation_stores: None,
    };
    let target = Target::with_opener(config, &storage::open).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let thread = std::thread::spawn(move || serve(listener, target, params, stop2, tick));
    TestTarget {
        addr,
        params,
        stop,
        thread: Some(thread),
        _dir: dir,
    }
}

/// The minimal reactor: poll(2) over the listener and every connection.
fn serve(
    listener: TcpListener,
    target: Arc<Target>,
    params: TcpParams,
    stop: Arc<AtomicBool>,
    tick: Duration,
) {
    listener.set_nonblocking(true).unwrap();
    let mut conns: Vec<(u32, TcpConnection, bool)> = Vec::new(); // (token, conn, open)
    let mut next_token = 1u32;
    // Ops run synchronously; completions are delivered on the next loop turn (as io_uring
    // would), so slots really stay busy in between.
    let mut io = SyncEngine::default();
    let mut last_tick = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        for (_, c, open) in &conns {
            let mut events = 0;
            if *open {
                events |= libc::POLLIN;
                if c.wants_write() {
                    events |= libc::POLLOUT;
                }
            }
            fds.push(libc::pollfd {
                fd: c.fd().as_raw_fd(),
                events,
                revents: 0,
            });
        }
        let timeout = if io.done.is_empty() { 20 } else { 0 };
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        assert!(
            n >= 0 || std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        );
        if fds[0].revents & libc::POLLIN != 0 {
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
                let token = next_token;
                next_token += 1;
                let conn = TcpConnection::new(stream, token, Arc::clone(&target), peer, params);
                conns.push((token, conn, true));
            }
        }
        for (i, (_, c, open)) in conns.iter_mut().enumerate() {
            let re = fds.get(i + 1).map_or(0, |f| f.revents);
            if !*open {
                continue;
            }
            if re & libc::POLLOUT != 0 && c.on_writable() == ConnStatus::Closed {
                *open = false;
                continue;
            }
            if re & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
                && c.on_readable(&mut io) == ConnStatus::Closed
            {
                *open = false;
            }
        }
        for (tag, res) in std::mem::take(&mut io.done) {
            let token = (tag >> 32) as u32;
            if let Some((_, c, open)) = conns.iter_mut().find(|(t, _, _)| *t == token) {
                if c.on_io_complete(tag, res, &mut io) == ConnStatus::Closed {
                    *open = false;
                }
            }
        }
        if last_tick.elapsed() >= tick {
            last_tick = Instant::now();
            for (_, c, open) in conns.iter_mut() {
                if *open && c.on_tick(last_tick, &mut io) == ConnStatus::Closed {
                    *open = false;
                }
            }
        }
        conns.retain(|(_, c, open)| *open || c.inflight_ops() > 0);
    }
}

pub fn digest_options(header: bool, data: bool) -> ClientOptions {
    ClientOptions {
        header_digest: header,
        data_digest: data,
        hpda: 0,
        timeout: Duration::from_secs(5),
    }
}

/// Admin queue: ICReq, Connect, enable. Returns the client and the controller id.
pub fn admin(t: &TestTarget, opts: ClientOptions) -> (Client, u16) {
    let mut c = Client::connect(t.addr, opts).expect("ICReq");
    let cntlid = c
        .fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 30_000)
        .expect("admin connect");
    c.enable_controller(Duration::from_secs(5)).expect("enable");
    (c, cntlid)
}

/// An I/O queue of `sqsize + 1` entries for controller `cntlid`.
pub fn io_queue(t: &TestTarget, opts: ClientOptions, cntlid: u16, qid: u16, sqsize: u16) -> Client {
    let mut c = Client::connect(t.addr, opts).expect("ICReq");
    c.fabrics_connect(qid, sqsize, cntlid, SUBNQN, HOSTNQN, HOSTID, 0)
        .expect("io connect");
    c.in_capsule_limit = t.params.in_capsule_data_size;
    c
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    nvme::testing::pattern(len, seed.into())
}
