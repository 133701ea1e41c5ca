//! A single-reactor NVMe/RDMA target for runs against the real Linux host (soft-RoCE in the
//! e2e guest), independent of the daemon. Ignored by default: it needs an RDMA device.
//!
//! ```text
//! NVMFD_RDMA_SELFTEST_ADDR=10.0.0.1 NVMFD_RDMA_SELFTEST_SECS=120 \
//!     transport-<hash> --ignored --exact rdma::selftest::serve_real_hosts --nocapture
//! ```
//!
//! In the e2e guest (tests/e2e, with `rxe_setup 10.99.0.1/24` from lib/nvmet.sh), build with
//! `cargo test -p transport --lib --no-run`, pass the printed test binary as `NVMFD_BIN` to
//! `tests/e2e/run.sh` with a scenario that starts it as above (NVMFD_RDMA_SELFTEST_STOP=<file>
//! ends it early) and drives `nvme discover/connect -t rdma`, fio and `rdma link delete`.
//!
//! Serves `nqn.2026-12.dev.nvmfd:rdma0` (nsid 1: 256 MiB RAM; nsid 2: a 128 MiB file through
//! io_uring, so both the inline and the submitted completion paths run) on port 4420, drives
//! the listener and connections exactly as the RDMA contract tells the daemon to, and fails if any
//! connection closed for a reason other than the host disconnecting.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig, TransportKind};
use storage::uring::UringEngine;

use super::{ListenerEvent, RdmaAcceptor, RdmaConnection, RdmaListener, RdmaParams};
use crate::conn::{ConnStatus, Connection};

pub const NQN: &str = "nqn.2026-12.dev.nvmfd:rdma0";

fn target(addr: IpAddr, file: &str) -> std::sync::Arc<Target> {
    let limits = Limits::default();
    let config = TargetConfig {
        ports: vec![PortConfig {
            id: 1,
            transport: TransportKind::Rdma,
            address: addr,
            service: 4420,
            secure_channel: Default::default(),
        }],
        subsystems: vec![SubsystemConfig::open_to_any_host(
            NQN,
            "nvmfd-rdma-selftest",
            vec![
                NamespaceConfig::new(1, BackendConfig::Ram { size: 256 << 20 }, 512),
                NamespaceConfig {
                    nsid: 2,
                    backend: BackendConfig::File {
                        path: file.into(),
                        size: Some(128 << 20),
                        direct_io: true,
                    },
                    block_size: 512,
                    read_only: false,
                    uuid: None,
                    nguid: None,
                    ana_group: 1,
                },
            ],
        )],
        limits,
        ..TargetConfig::default()
    };
    Target::with_opener(config, &storage::open).expect("target")
}

#[test]
#[ignore = "needs an RDMA device (run in the e2e guest with rdma_rxe)"]
fn serve_real_hosts() {
    let addr: IpAddr = std::env::var("NVMFD_RDMA_SELFTEST_ADDR")
        .expect("NVMFD_RDMA_SELFTEST_ADDR")
        .parse()
        .expect("address");
    let secs: u64 = std::env::var("NVMFD_RDMA_SELFTEST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let file = std::env::var("NVMFD_RDMA_SELFTEST_FILE")
        .unwrap_or_else(|_| "/var/tmp/nvmfd-rdma-selftest.img".into());
    // The scenario creates this file to end the run early (after the host disconnected).
    let stop = std::env::var("NVMFD_RDMA_SELFTEST_STOP").ok();
    let target = target(addr, &file);
    let limits = Limits::default();
    let params = RdmaParams {
        port_id: 1,
        in_capsule_data_size: limits.in_capsule_data_size,
        max_data_transfer: limits.max_data_transfer,
        max_queue_entries: limits.max_queue_size,
        max_io_queues: limits.max_io_queues,
        capsule_buffers: 2048,
        response_buffers: 4096,
        data_buffers: 64,
        shared_receive_queue: std::env::var_os("NVMFD_RDMA_SELFTEST_SRQ").is_some(),
    };
    let mut listener = RdmaListener::new(addr, 4420, params).expect("RDMA listener");
    let mut acceptor = RdmaAcceptor::new(0, 1).expect("RDMA acceptor");
    let mut disconnected = Vec::new();
    // DEVICE_REMOVAL of the listener's device: drop it, let the connections drain, then stop.
    let mut removed = false;
    let mut ring = UringEngine::new(256).expect("io_uring");
    let mut conns: HashMap<u32, Box<RdmaConnection>> = HashMap::new();
    let mut next = 0u32;
    let mut events = Vec::new();
    let mut failures = Vec::new();
    let (mut accepted, mut closed) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last_tick = Instant::now();
    eprintln!("selftest: serving {NQN} on {addr}:4420 for {secs} s");

    while Instant::now() < deadline
        && !stop
            .as_deref()
            .is_some_and(|p| std::path::Path::new(p).exists())
    {
        let tokens: Vec<u32> = conns.keys().copied().collect();
        if removed && conns.is_empty() {
            break;
        }
        let (listener_ready, acceptor_ready, ring_ready, ready) = {
            let mut fds = vec![
                PollFd::new(listener.fd(), PollFlags::POLLIN),
                PollFd::new(acceptor.fd(), PollFlags::POLLIN),
                // SAFETY: the ring's eventfd stays open while `ring` lives (the whole test).
                PollFd::new(
                    unsafe { std::os::fd::BorrowedFd::borrow_raw(ring.fd()) },
                    PollFlags::POLLIN,
                ),
            ];
            for t in &tokens {
                fds.push(PollFd::new(conns[t].fd(), PollFlags::POLLIN));
            }
            poll(&mut fds, PollTimeout::from(100u16)).expect("poll");
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (
                ready(&fds[0]),
                ready(&fds[1]),
                ready(&fds[2]),
                fds[3..].iter().map(ready).collect::<Vec<_>>(),
            )
        };
        // Like the daemon, stop reading the listener once it reported removal: the
        // connections' own DEVICE_REMOVAL events on the acceptor must be enough to release
        // the device.
        if listener_ready && !removed {
            listener.on_event(&mut events);
            for ev in events.drain(..) {
                match ev {
                    ListenerEvent::Request(request) => {
                        next += 1;
                        if let Some(c) = acceptor.accept(request, &target, next) {
                            accepted += 1;
                            conns.insert(c.token(), Box::new(c));
                        }
                    }
                    ListenerEvent::ListenerRemoved => {
                        eprintln!("selftest: listener device removed");
                        removed = true;
                    }
                }
            }
        }
        if acceptor_ready {
            acceptor.on_event(&mut disconnected);
            for t in disconnected.drain(..) {
                if let Some(c) = conns.get_mut(&t) {
                    c.on_disconnected();
                }
            }
        }
        for (t, r) in tokens.iter().zip(ready) {
            if r {
                if let Some(c) = conns.get_mut(t) {
                    c.on_readable(&mut ring);
                }
            }
        }
        if ring_ready || ring.in_flight() > 0 {
            let mut done = Vec::new();
            ring.reap(|tag, res| done.push((tag, res)));
            for (tag, res) in done {
                if let Some(c) = conns.get_mut(&((tag >> 32) as u32)) {
                    c.on_io_complete(tag, res, &mut ring);
                }
            }
        }
        if last_tick.elapsed() >= Duration::from_millis(100) {
            last_tick = Instant::now();
            for c in conns.values_mut() {
                c.on_tick(last_tick, &mut ring);
            }
        }
        ring.flush();
        conns.retain(|t, c| {
            let gone = c.status() == ConnStatus::Closed && c.inflight_ops() == 0;
            if gone {
                closed += 1;
                let why = c.close_reason().unwrap_or_default();
                eprintln!("selftest: connection {t} closed: {why}");
                if !removed
                    && !why.contains("reported the connection gone")
                    && !why.contains("terminated")
                {
                    failures.push(format!("connection {t}: {why}"));
                }
            }
            !gone
        });
    }
    eprintln!(
        "selftest: {accepted} connections accepted, {closed} closed, {} open at the end",
        conns.len()
    );
    assert!(accepted > 0, "no host connected");
    if removed {
        eprintln!("selftest: device removal handled, every connection released");
    }
    assert!(failures.is_empty(), "abnormal closes: {failures:?}");
}
