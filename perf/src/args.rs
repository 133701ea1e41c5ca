//! Command line of `nvmfd-perf` (spdk_nvme_perf-like names where they exist).

use std::net::SocketAddr;

use clap::{Parser, ValueEnum};
use transport::tcp::pdu::Digests;

use crate::workload::WorkloadKind;

/// The subsystem of nvmfd's embedded default configuration (configuration contract).
pub const DEFAULT_SUBNQN: &str = "nqn.2026-12.dev.nvmfd:ram0";
pub const DEFAULT_HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:6e766d66-642d-7065-7266-000000000001";

#[derive(Debug, Clone, Parser)]
#[command(
    name = "nvmfd-perf",
    version,
    about = "NVMe/TCP and NVMe/RDMA load generator (host side) with a raw TCP loopback reference",
    long_about = "Drives an NVMe/TCP (or, with --transport rdma, NVMe/RDMA) target with a \
                  pipelined, non-blocking initiator and reports IOPS, MiB/s, latency \
                  percentiles and its own CPU use.\n\n\
                  --echo-server ADDR runs the raw TCP reference peer; --raw-tcp drives such a \
                  peer at --addr with the NVMe/TCP message sizes of the same workload."
)]
pub struct Args {
    /// Fabric of the NVMe run: NVMe/TCP, or NVMe/RDMA through librdmacm/libibverbs (needs an
    /// RDMA device: an HCA or a soft-RoCE link).
    #[arg(long, value_enum, default_value_t = Transport::Tcp,
          conflicts_with_all = ["raw_tcp", "echo_server", "idle_connections", "tls_key"])]
    pub transport: Transport,
    /// Target (or echo peer) address.
    #[arg(long, short = 'a', default_value = "127.0.0.1:4420")]
    pub addr: SocketAddr,
    /// Subsystem NQN to connect to.
    #[arg(long, default_value = DEFAULT_SUBNQN)]
    pub nqn: String,
    /// Host NQN to connect as.
    #[arg(long, default_value = DEFAULT_HOSTNQN)]
    pub hostnqn: String,
    #[arg(long, short = 'w', value_enum, default_value_t = WorkloadKind::Randread)]
    pub workload: WorkloadKind,
    /// Read percentage of randrw.
    #[arg(long, short = 'M', default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub mix: u8,
    /// I/O size (512, 4k, 128K, 1M …).
    #[arg(long, short = 'o', default_value = "4k", value_parser = parse_size)]
    pub bs: u32,
    /// Outstanding I/Os per queue.
    #[arg(long, short = 'q', default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub qd: u32,
    /// I/O queues, each its own connection (more controllers are created when one
    /// grants fewer).
    #[arg(long, visible_alias = "connections", short = 'Q', default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub queues: u32,
    /// Seconds to measure.
    #[arg(long, short = 't', default_value_t = 5.0)]
    pub time: f64,
    /// Seconds to run before measuring.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Stop after this many I/Os in total instead of after --time (no warm-up).
    #[arg(long)]
    pub ios: Option<u64>,
    /// CPUs to pin the worker threads to (e.g. "1" or "2-5,8").
    #[arg(long, value_parser = parse_cpu_list)]
    pub cpu: Option<CpuList>,
    /// Worker threads (default: one per --cpu entry, else 1); queues are spread round-robin.
    #[arg(long)]
    pub threads: Option<u32>,
    /// Spin in epoll_wait(0) instead of sleeping (with --transport rdma: poll the completion
    /// queues without sleeping on their channels); lower latency, one busy core per thread.
    #[arg(long)]
    pub busy_poll: bool,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// Use only the first SIZE bytes of the namespace (default: all of it).
    #[arg(long, value_parser = parse_size_u64)]
    pub range: Option<u64>,
    /// NVMe/TCP digests: none, header, data or both (`--digest` alone: both).
    #[arg(long, value_enum, default_value_t = DigestMode::None, num_args = 0..=1,
          default_missing_value = "both")]
    pub digest: DigestMode,
    /// Keep alive timeout asked for at Connect, milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub kato_ms: u32,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 0x6e76_6d66)]
    pub seed: u64,
    /// Also report the CPU% (over the measurement window) and final RSS of this process,
    /// e.g. the target's PID.
    #[arg(long, value_name = "PID")]
    pub target_pid: Option<u32>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run the raw TCP reference peer on ADDR until killed (pinned to the first --cpu).
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["raw_tcp", "idle_connections"])]
    pub echo_server: Option<SocketAddr>,
    /// Echo peer: after work, poll (epoll timeout 0) this many µs before sleeping, like
    /// nvmfd's `poll_window_us` (0 = always sleep).
    #[arg(long, default_value_t = 0, requires = "echo_server")]
    pub poll_window_us: u32,
    /// Print the mean cache-line round trip between the first two --cpu CPUs (ns), measured
    /// for --time seconds: the machine's core-to-core speed, which paces loopback runs.
    #[arg(long, requires = "cpu", conflicts_with_all = ["raw_tcp", "echo_server", "idle_connections"])]
    pub core_probe: bool,
    /// Drive an echo peer at --addr with this workload's NVMe/TCP message sizes.
    #[arg(long, conflicts_with = "idle_connections")]
    pub raw_tcp: bool,
    /// In-capsule write limit the raw reference assumes (nvmfd default: 8 KiB); with
    /// `--transport rdma`, the largest write sent in-capsule (also bounded by the
    /// controller's IOCCSZ; 0: every write by keyed SGL, read by the target with RDMA READ).
    #[arg(long, default_value = "8k", value_parser = parse_size_u32)]
    pub in_capsule: u32,
    /// Open N connections (admin + I/O queues of as many controllers as needed), hold them
    /// idle for --time seconds, sending only keep-alives.
    #[arg(long, value_name = "N")]
    pub idle_connections: Option<u32>,
    /// TLS 1.3 on every queue with this configured PSK: a key file (owner-only, as nvmfd
    /// wants its own) or the interchange text `NVMeTLSkey-1:01:…:` itself. The record layer
    /// runs in this process.
    #[arg(long, value_name = "FILE|KEY")]
    pub tls_key: Option<String>,
    /// PSK identity version offered: 1 (`NVMe1R0x <hostnqn> <subnqn> <digest>`, what the
    /// Linux host offers for a generated key) or 0 (`NVMe0R0x <hostnqn> <subnqn>`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1),
          requires = "tls_key")]
    pub tls_identity: u8,
    /// HKDF-Expand-Label encoding the key was made with (nvmfd's `hkdf_label`).
    #[arg(long, value_enum, default_value_t = TlsHkdf::Compat, requires = "tls_key")]
    pub tls_hkdf: TlsHkdf,
}

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Tcp,
    Rdma,
}

/// `--tls-hkdf`: libnvme's encoding (nvme-cli 2.13) or RFC 8446's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsHkdf {
    Compat,
    Rfc8446,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DigestMode {
    None,
    Header,
    Data,
    Both,
}

impl DigestMode {
    pub fn digests(self) -> Digests {
        Digests {
            header: matches!(self, Self::Header | Self::Both),
            data: matches!(self, Self::Data | Self::Both),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Header => "header",
            Self::Data => "data",
            Self::Both => "header+data",
        }
    }
}

/// A list of CPU numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Parses "4096", "4k", "4K", "4KiB", "128k", "1M", "1G" (binary multiples).
pub fn parse_size_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("invalid size unit in {s:?}")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} too large"))
}

/// An I/O size: 1 byte to 64 MiB.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let n = parse_size_u64(s)?;
    if n == 0 || n > 64 << 20 {
        return Err(format!("size {s:?} out of range (1 byte to 64 MiB)"));
    }
    Ok(n as u32)
}

/// A byte count up to 4 GiB − 1, 0 included.
pub fn parse_size_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size_u64(s)?).map_err(|_| format!("size {s:?} out of range"))
}

/// Parses "1", "0-3", "0,2,4-5".
pub fn parse_cpu_list(s: &str) -> Result<CpuList, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("invalid CPU list {s:?}");
        match part.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.trim().parse().map_err(|_| bad())?;
                let b: usize = b.trim().parse().map_err(|_| bad())?;
                if a > b || b >= 4096 {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => {
                let c: usize = part.parse().map_err(|_| bad())?;
                if c >= 4096 {
                    return Err(bad());
                }
                cpus.push(c);
            }
        }
    }
    if cpus.is_empty() {
        return Err(format!("empty CPU list {s:?}"));
    }
    Ok(CpuList(cpus))
}

impl Args {
    /// Worker threads: --threads, else one per pinned CPU, never more than queues.
    pub fn worker_threads(&self) -> u32 {
        let t = self
            .threads
            .unwrap_or_else(|| self.cpu.as_ref().map_or(1, |c| c.0.len() as u32));
        t.clamp(1, self.queues.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("nvmfd-perf").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128K"), Ok(131072));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size_u64("2G"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("65M").is_err());
        assert!(parse_size("4x").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size_u64("99999999999999999999").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("1"), Ok(CpuList(vec![1])));
        assert_eq!(parse_cpu_list("0,2-4"), Ok(CpuList(vec![0, 2, 3, 4])));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("a").is_err());
    }

    #[test]
    fn defaults() {
        let a = parse(&[]);
        assert_eq!(a.addr, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(a.nqn, DEFAULT_SUBNQN);
        assert_eq!(a.workload, WorkloadKind::Randread);
        assert_eq!((a.bs, a.qd, a.queues), (4096, 32, 1));
        assert_eq!(a.digest, DigestMode::None);
        assert_eq!(a.worker_threads(), 1);
        assert!(!a.json && !a.raw_tcp && a.echo_server.is_none());
        assert_eq!(a.transport, Transport::Tcp);
        assert_eq!(a.in_capsule, 8192);
    }

    #[test]
    fn full_command_line() {
        let a = parse(&[
            "--addr",
            "127.0.0.1:4421",
            "--workload",
            "randrw",
            "--mix",
            "30",
            "--bs",
            "128k",
            "--qd",
            "8",
            "--connections",
            "4",
            "--time",
            "2.5",
            "--warmup",
            "1",
            "--cpu",
            "1-2",
            "--nsid",
            "3",
            "--digest",
            "--json",
        ]);
        assert_eq!(a.addr.port(), 4421);
        assert_eq!(a.workload, WorkloadKind::Randrw);
        assert_eq!((a.mix, a.bs, a.qd, a.queues, a.nsid), (30, 131072, 8, 4, 3));
        assert_eq!((a.time, a.warmup), (2.5, 1.0));
        assert_eq!(a.cpu, Some(CpuList(vec![1, 2])));
        assert_eq!(a.worker_threads(), 2);
        assert_eq!(a.digest, DigestMode::Both);
        assert!(a.digest.digests().header && a.digest.digests().data);
        assert!(a.json);
        assert!(!parse(&["--digest", "header"]).digest.digests().data);
        let r = parse(&["--transport", "rdma", "--in-capsule", "0"]);
        assert_eq!((r.transport, r.in_capsule), (Transport::Rdma, 0));
        assert_eq!(
            parse(&["--threads", "8", "--queues", "2"]).worker_threads(),
            2
        );
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            &["--mix", "101"][..],
            &["--qd", "0"],
            &["--queues", "0"],
            &["--workload", "trim"],
            &["--raw-tcp", "--echo-server", "127.0.0.1:1"],
            &["--transport", "rdma", "--raw-tcp"],
            &["--transport", "rdma", "--tls-key", "k"],
            &["--transport", "rdma", "--idle-connections", "3"],
            &["--transport", "infiniband"],
        ] {
            assert!(
                Args::try_parse_from(std::iter::once("nvmfd-perf").chain(bad.iter().copied()))
                    .is_err(),
                "{bad:?} accepted"
            );
        }
    }
}
