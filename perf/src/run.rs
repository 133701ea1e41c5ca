//! A whole run: connect, spread the queues over pinned worker threads, keep the controllers
//! alive while they work, and merge what they measured.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use nvmfd_auth::psk::{ConfiguredPsk, Derivation};
use transport::client::TlsParams;
use transport::rdma::pool::MAX_BUFFER_SIZE;

use crate::args::{Args, DigestMode, TlsHkdf};
use crate::echo::EchoQueue;
use crate::engine::{self, Connection, EngineError, Protocol, Timeline, WorkerConfig};
use crate::nvme_proto::{NvmeQueue, QueueParams};
use crate::pin::{pin_to, PinError};
use crate::rdma::{self, IoParams, IoQueue, RdmaError, RdmaQueue};
use crate::setup::{self, Controller, HostParams, NamespaceInfo, SetupError};
use crate::socket::Socket;
use crate::stats::{
    other_process_cpu_time, other_process_rss_kib, process_cpu_time, RunInfo, Stats, Summary,
};
use crate::workload::{IoGenerator, WorkloadError, WorkloadSpec};

/// Worker threads start this long after being spawned, all at the same instant.
const START_DELAY: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("setup: {0}")]
    Setup(#[from] SetupError),
    #[error("workload: {0}")]
    Workload(#[from] WorkloadError),
    #[error("worker: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Pin(#[from] PinError),
    #[error("a worker thread panicked")]
    WorkerPanicked,
    #[error("invalid options: {0}")]
    Options(String),
    #[error("NVMe/RDMA: {0}")]
    Rdma(#[from] RdmaError),
    #[error("run aborted before the start (another worker failed to connect)")]
    Aborted,
}

/// The measured result with what was run.
#[derive(Debug, Clone)]
pub struct Report {
    pub info: RunInfo,
    pub summary: Summary,
}

/// A payload that is not all zeroes (nothing on the way can shortcut it).
pub fn payload(bs: u32) -> Arc<[u8]> {
    let mut x = 0x9e37_79b9u32;
    (0..bs)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn timeline(args: &Args) -> Result<Timeline, RunError> {
    let secs = |s: f64, what: &str| {
        Duration::try_from_secs_f64(s).map_err(|_| RunError::Options(format!("{what} {s}")))
    };
    let start = Instant::now() + START_DELAY;
    if args.ios.is_some() {
        return Ok(Timeline {
            start,
            measure_from: start,
            stop_at: None,
        });
    }
    let measure_from = start + secs(args.warmup, "--warmup")?;
    Ok(Timeline {
        start,
        measure_from,
        stop_at: Some(measure_from + secs(args.time, "--time")?),
    })
}

/// I/O budget of queue `i` of `n` when the run is count-limited.
fn budget(total: Option<u64>, i: u32, n: u32) -> Option<u64> {
    total.map(|t| t / n as u64 + u64::from((i as u64) < t % n as u64))
}

/// Runs the connections on `threads` workers while `tick` keeps the session alive;
/// returns the merged stats, the measured window and the CPU time spent in it.
fn run_workers<P: Protocol + Send + 'static>(
    conns: Vec<Connection<P>>,
    args: &Args,
    payload: Arc<[u8]>,
    tick: &mut dyn FnMut() -> Result<(), RunError>,
) -> Result<Measured, RunError> {
    let threads = args.worker_threads() as usize;
    let tl = timeline(args)?;
    let cfg = WorkerConfig {
        bs: args.bs,
        busy_poll: args.busy_poll,
    };
    let mut groups: Vec<Vec<Connection<P>>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, c) in conns.into_iter().enumerate() {
        groups[i % threads].push(c);
    }
    let cpus = args.cpu.as_ref().map(|c| c.0.clone());
    let failed = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::with_capacity(threads);
    for (i, group) in groups.into_iter().enumerate() {
        let payload = Arc::clone(&payload);
        let cpu = cpus.as_ref().map(|c| c[i % c.len()]);
        let failed = Arc::clone(&failed);
        handles.push(thread::Builder::new().name(format!("perf-{i}")).spawn(
            move || -> Result<engine::WorkerResult, RunError> {
                if let Some(cpu) = cpu {
                    pin_to(cpu)?;
                }
                let r = engine::run_worker(group, &payload, tl, cfg).map_err(RunError::from);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                r
            },
        )?);
    }

    supervise(handles, tl, &failed, args, tick)
}

type WorkerHandle = thread::JoinHandle<Result<engine::WorkerResult, RunError>>;

/// The main thread while the workers run: waits, sends keep-alives (`tick`), samples CPU time
/// at the window edges, then merges what the workers measured.
fn supervise(
    handles: Vec<WorkerHandle>,
    tl: Timeline,
    failed: &AtomicBool,
    args: &Args,
    tick: &mut dyn FnMut() -> Result<(), RunError>,
) -> Result<Measured, RunError> {
    let wait_until = |t: Instant, tick: &mut dyn FnMut() -> Result<(), RunError>| {
        let mut last_tick = Instant::now();
        while Instant::now() < t && !failed.load(Ordering::Relaxed) {
            thread::sleep((t - Instant::now()).min(Duration::from_millis(100)));
            if last_tick.elapsed() >= keep_alive_interval(args.kato_ms) {
                tick()?;
                last_tick = Instant::now();
            }
        }
        Ok::<(), RunError>(())
    };
    let target_cpu = || args.target_pid.and_then(other_process_cpu_time);
    wait_until(tl.measure_from, tick)?;
    let cpu0 = process_cpu_time();
    let target0 = target_cpu();
    let mut cpu1 = None;
    let mut target1 = None;
    if let Some(stop) = tl.stop_at {
        wait_until(stop, tick)?;
        cpu1 = Some(process_cpu_time());
        target1 = target_cpu();
    }
    let mut last_tick = Instant::now();
    while !handles.iter().all(|h| h.is_finished()) {
        thread::sleep(Duration::from_millis(5));
        if last_tick.elapsed() >= keep_alive_interval(args.kato_ms) {
            tick()?;
            last_tick = Instant::now();
        }
    }
    let cpu1 = cpu1.unwrap_or_else(process_cpu_time);
    let target1 = target1.or_else(target_cpu);
    let mut stats = Stats::new();
    let mut last = None;
    for h in handles {
        let r = h.join().map_err(|_| RunError::WorkerPanicked)??;
        stats.merge(&r.stats);
        last = last.max(r.last_completion);
    }
    let window = match tl.stop_at {
        Some(stop) => stop - tl.measure_from,
        None => last.map_or(Duration::ZERO, |l| l - tl.measure_from),
    };
    let target = match (target0, target1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    Ok(Measured {
        stats,
        window,
        cpu: cpu1.saturating_sub(cpu0),
        target_cpu: target,
        target_rss_kib: args.target_pid.and_then(other_process_rss_kib),
    })
}

/// What the workers measured, with the window it covers.
struct Measured {
    stats: Stats,
    window: Duration,
    cpu: Duration,
    target_cpu: Option<Duration>,
    target_rss_kib: Option<u64>,
}

impl Measured {
    fn summary(&self) -> Summary {
        let mut s = self.stats.summary(self.window, self.cpu);
        let secs = self.window.as_secs_f64().max(1e-9);
        s.target_cpu_percent = self.target_cpu.map(|c| c.as_secs_f64() / secs * 100.0);
        s.target_rss_kib = self.target_rss_kib;
        s
    }
}

fn keep_alive_interval(kato_ms: u32) -> Duration {
    // Linux sends keep-alives at half the KATO; a quarter leaves room for a slow reply.
    Duration::from_millis((kato_ms as u64 / 4).clamp(500, 10_000))
}

/// `--tls-key`: the key file's text, or the key given inline.
fn tls_params(args: &Args) -> Result<Option<TlsParams>, RunError> {
    let Some(key) = &args.tls_key else {
        return Ok(None);
    };
    let text = if key.trim_start().starts_with("NVMeTLSkey-1:") {
        key.clone()
    } else {
        std::fs::read_to_string(key)
            .map_err(|e| RunError::Options(format!("--tls-key {key}: {e}")))?
    };
    let key =
        ConfiguredPsk::parse(&text).map_err(|e| RunError::Options(format!("--tls-key: {e}")))?;
    let derivation = match args.tls_hkdf {
        TlsHkdf::Compat => Derivation::LibnvmeCompat,
        TlsHkdf::Rfc8446 => Derivation::Rfc8446,
    };
    TlsParams::new(
        &key,
        &args.hostnqn,
        &args.nqn,
        args.tls_identity == 1,
        derivation,
    )
    .map(Some)
    .ok_or_else(|| RunError::Options("--tls-key: no TLS PSK for this identity".into()))
}

fn host_params(args: &Args) -> Result<HostParams, RunError> {
    // A host ID per process, so that concurrent generators are distinct hosts.
    let mut hostid = [0u8; 16];
    hostid[..4].copy_from_slice(b"perf");
    hostid[12..].copy_from_slice(&std::process::id().to_le_bytes());
    Ok(HostParams {
        addr: args.addr,
        subnqn: args.nqn.clone(),
        hostnqn: args.hostnqn.clone(),
        hostid,
        digests: args.digest.digests(),
        kato_ms: args.kato_ms,
        timeout: Duration::from_secs(10),
        tls: tls_params(args)?,
    })
}

fn run_info(args: &Args, mode: &'static str) -> RunInfo {
    RunInfo {
        mode,
        addr: args.addr.to_string(),
        workload: args.workload.to_string(),
        read_percent: args.workload.read_percent(args.mix),
        bs: args.bs,
        qd: args.qd,
        queues: args.queues,
        threads: args.worker_threads(),
        digests: if mode == "raw-tcp" || mode == "nvme-rdma" {
            "none".into()
        } else {
            args.digest.name().into()
        },
    }
}

/// The I/O stream of a run on namespace `ns` (its first --range bytes).
fn workload_spec(args: &Args, ns: &NamespaceInfo) -> WorkloadSpec {
    let blocks = match args.range {
        Some(bytes) => (bytes / ns.block_size as u64).min(ns.blocks),
        None => ns.blocks,
    };
    WorkloadSpec {
        kind: args.workload,
        mix: args.mix,
        bs: args.bs,
        block_size: ns.block_size,
        blocks,
        queues: args.queues,
        seed: args.seed,
    }
}

/// The NVMe/TCP run against a target.
pub fn run_nvme(args: &Args) -> Result<Report, RunError> {
    let host = host_params(args)?;
    let mut fabric = setup::connect_fabric(&host, args.nsid, args.queues, args.qd, args.bs)?;
    let ns = fabric.namespace;
    let spec = workload_spec(args, &ns);
    let payload = payload(args.bs);
    let mut conns = Vec::with_capacity(fabric.queues.len());
    for (i, q) in std::mem::take(&mut fabric.queues).into_iter().enumerate() {
        let generator = IoGenerator::new(&spec, i as u32)?;
        let params = QueueParams {
            nsid: ns.nsid,
            bs: args.bs,
            nlb: generator.blocks_per_io(),
            qd: args.qd,
            in_capsule_limit: fabric.info.in_capsule_limit,
        };
        let (proto, stream) = NvmeQueue::new(q, params, Arc::clone(&payload));
        conns.push(Connection::new(
            stream,
            proto,
            generator,
            args.qd,
            budget(args.ios, i as u32, args.queues),
        ));
    }
    let controllers = &mut fabric.controllers;
    let mut tick = || -> Result<(), RunError> {
        for c in controllers.iter_mut() {
            c.keep_alive()?;
        }
        Ok(())
    };
    let m = run_workers(conns, args, payload, &mut tick)?;
    Ok(Report {
        info: run_info(
            args,
            if host.tls.is_some() {
                "nvme-tcp-tls"
            } else {
                "nvme-tcp"
            },
        ),
        summary: m.summary(),
    })
}

/// The NVMe/RDMA run against a target: controllers (admin queues) on this thread, each
/// worker thread connects its own I/O queues (verbs objects stay on the thread that made
/// them), and all start together once every queue is connected.
pub fn run_rdma(args: &Args) -> Result<Report, RunError> {
    if args.digest != DigestMode::None {
        return Err(RunError::Options(
            "--digest: NVMe/RDMA has no digests (NVMe/TCP only)".into(),
        ));
    }
    if args.bs as usize > MAX_BUFFER_SIZE {
        return Err(RunError::Options(format!(
            "--bs {}: a keyed SGL data block holds at most {MAX_BUFFER_SIZE} bytes",
            args.bs
        )));
    }
    let host = host_params(args)?;
    let mut plan = setup::plan_controllers(
        args.nsid,
        args.queues,
        args.qd,
        args.bs,
        &mut |want| -> Result<Controller<RdmaQueue>, RdmaError> {
            let admin = rdma::connect_admin(&host)?;
            Ok(Controller::bring_up(admin, &host, want)?)
        },
    )?;
    let spec = workload_spec(args, &plan.namespace);
    let base = IoParams {
        nsid: plan.namespace.nsid,
        bs: args.bs,
        nlb: 0,
        qd: args.qd,
        in_capsule_limit: plan.info.in_capsule_limit.min(args.in_capsule),
    };
    let threads = args.worker_threads() as usize;
    let mut groups: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, &(info, qid)) in plan.queues.iter().enumerate() {
        let generator = IoGenerator::new(&spec, i as u32)?;
        let io_budget = budget(args.ios, i as u32, args.queues);
        groups[i % threads].push((info, qid, generator, io_budget));
    }
    let payload = payload(args.bs);
    let cfg = WorkerConfig {
        bs: args.bs,
        busy_poll: args.busy_poll,
    };
    let cpus = args.cpu.as_ref().map(|c| c.0.clone());
    let failed = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<bool>();
    let mut starts = Vec::with_capacity(threads);
    let mut handles = Vec::with_capacity(threads);
    for (i, group) in groups.into_iter().enumerate() {
        let (start_tx, start_rx) = mpsc::channel::<Timeline>();
        starts.push(start_tx);
        let ready = ready_tx.clone();
        let host = host.clone();
        let payload = Arc::clone(&payload);
        let cpu = cpus.as_ref().map(|c| c[i % c.len()]);
        let failed = Arc::clone(&failed);
        handles.push(thread::Builder::new().name(format!("perf-{i}")).spawn(
            move || -> Result<engine::WorkerResult, RunError> {
                let opened = cpu
                    .map_or(Ok(()), pin_to)
                    .map_err(RunError::from)
                    .and_then(|()| {
                        group
                            .into_iter()
                            .map(|(info, qid, generator, io_budget)| {
                                let params = IoParams {
                                    nlb: generator.blocks_per_io(),
                                    ..base
                                };
                                IoQueue::open(
                                    &host, &info, qid, params, &payload, generator, io_budget,
                                )
                                .map_err(RunError::from)
                            })
                            .collect::<Result<Vec<_>, _>>()
                    });
                // The main thread waits for every worker's answer before it starts the run.
                let _ = ready.send(opened.is_ok());
                let queues = opened?;
                let tl = start_rx.recv().map_err(|_| RunError::Aborted)?;
                let r = rdma::run_worker(queues, tl, cfg).map_err(RunError::from);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                r
            },
        )?);
    }
    drop(ready_tx);
    let all_ready = (0..handles.len()).all(|_| ready_rx.recv().unwrap_or(false));
    if !all_ready {
        // Dropping the start channels releases the workers that did connect.
        drop(starts);
        let mut first = None;
        for h in handles {
            match h.join() {
                Ok(Ok(_)) | Ok(Err(RunError::Aborted)) => {}
                Ok(Err(e)) => {
                    first.get_or_insert(e);
                }
                Err(_) => {
                    first.get_or_insert(RunError::WorkerPanicked);
                }
            }
        }
        return Err(first.unwrap_or(RunError::Aborted));
    }
    let tl = timeline(args)?;
    for s in &starts {
        // A worker that is gone already reports its error when joined.
        let _ = s.send(tl);
    }
    let controllers = &mut plan.controllers;
    let mut tick = || -> Result<(), RunError> {
        for c in controllers.iter_mut() {
            c.keep_alive()?;
        }
        Ok(())
    };
    let m = supervise(handles, tl, &failed, args, &mut tick)?;
    Ok(Report {
        info: run_info(args, "nvme-rdma"),
        summary: m.summary(),
    })
}

/// The raw TCP reference against an echo peer at --addr.
pub fn run_raw(args: &Args) -> Result<Report, RunError> {
    // Offsets do not matter to the echo peer; a 1 GiB space of 512-byte blocks keeps the
    // generator's work identical to an NVMe run.
    let spec = WorkloadSpec {
        kind: args.workload,
        mix: args.mix,
        bs: args.bs,
        block_size: 512,
        blocks: ((1u64 << 30) / 512).max(args.bs as u64 / 512),
        queues: args.queues,
        seed: args.seed,
    };
    let payload = payload(args.bs);
    let mut conns = Vec::with_capacity(args.queues as usize);
    for i in 0..args.queues {
        let stream = std::net::TcpStream::connect(args.addr)?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let generator = IoGenerator::new(&spec, i)?;
        conns.push(Connection::new(
            Socket::plain(stream),
            EchoQueue::new(args.qd, args.bs, args.in_capsule),
            generator,
            args.qd,
            budget(args.ios, i, args.queues),
        ));
    }
    let m = run_workers(conns, args, payload, &mut || Ok(()))?;
    Ok(Report {
        info: run_info(args, "raw-tcp"),
        summary: m.summary(),
    })
}

/// What the idle-connection mode held open.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct IdleReport {
    pub connections: u32,
    pub controllers: u32,
    pub io_queues: u32,
    pub setup_s: f64,
    pub held_s: f64,
}

/// Opens `n` connections (admin queues plus their I/O queues) and holds them for --time.
pub fn run_idle(
    args: &Args,
    n: u32,
    ready: &mut dyn FnMut(&IdleReport),
) -> Result<IdleReport, RunError> {
    let host = host_params(args)?;
    let t0 = Instant::now();
    let mut controllers: Vec<Controller> = Vec::new();
    let mut queues = Vec::new();
    let mut open = 0u32;
    while open < n {
        let left = n - open;
        // One connection for the admin queue, the rest for I/O queues.
        let want = (left - 1).clamp(1, u16::MAX as u32) as u16;
        let ctrl = Controller::connect(&host, want)?;
        open += 1;
        let take = (ctrl.info.io_queues as u32).min(n - open);
        for qid in 1..=take as u16 {
            queues.push(setup::open_io_queue(
                &host,
                &ctrl.info,
                qid,
                setup::queue_entries(args.qd).min(ctrl.info.max_queue_entries),
                4096,
            )?);
            open += 1;
        }
        controllers.push(ctrl);
    }
    let setup_s = t0.elapsed().as_secs_f64();
    let mut report = IdleReport {
        connections: open,
        controllers: controllers.len() as u32,
        io_queues: queues.len() as u32,
        setup_s,
        held_s: 0.0,
    };
    ready(&report);
    let hold = Duration::try_from_secs_f64(args.time)
        .map_err(|_| RunError::Options(format!("--time {}", args.time)))?;
    let t1 = Instant::now();
    let mut last_tick = Instant::now();
    while t1.elapsed() < hold {
        thread::sleep((hold - t1.elapsed()).min(Duration::from_millis(100)));
        if last_tick.elapsed() >= keep_alive_interval(args.kato_ms) {
            for c in controllers.iter_mut() {
                c.keep_alive()?;
            }
            last_tick = Instant::now();
        }
    }
    report.held_s = t1.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_add_up() {
        for (total, n) in [(10u64, 3u32), (1, 4), (1000, 7), (0, 2)] {
            let parts: Vec<u64> = (0..n).map(|i| budget(Some(total), i, n).unwrap()).collect();
            assert_eq!(parts.iter().sum::<u64>(), total);
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
        }
        assert_eq!(budget(None, 0, 1), None);
    }

    fn rdma_args(extra: &[&str]) -> Args {
        use clap::Parser;
        let base = [
            "nvmfd-perf",
            "--transport",
            "rdma",
            "--addr",
            "127.0.0.1:1",
            "--ios",
            "1",
        ];
        Args::try_parse_from(base.iter().chain(extra)).unwrap()
    }

    #[test]
    fn rdma_refuses_what_it_cannot_do() {
        assert!(matches!(
            run_rdma(&rdma_args(&["--digest"])),
            Err(RunError::Options(_))
        ));
        assert!(matches!(
            run_rdma(&rdma_args(&["--bs", "16M"])),
            Err(RunError::Options(_))
        ));
        // Without an RDMA device (this project's build hosts) the run says so before any
        // connection attempt; with one, nothing listens on port 1.
        let r = run_rdma(&rdma_args(&[]));
        if transport::rdma::verbs::device_count() == 0 {
            assert!(
                matches!(r, Err(RunError::Rdma(RdmaError::NoDevice))),
                "{r:?}"
            );
        } else {
            assert!(r.is_err());
        }
    }

    #[test]
    fn payload_is_not_zero() {
        let p = payload(4096);
        assert_eq!(p.len(), 4096);
        assert!(p.iter().filter(|&&b| b == 0).count() < 100);
    }
}
