//! Counting and reporting: a latency histogram per worker (merged at the end), the summary
//! line (IOPS, MiB/s, latency percentiles, the generator's own CPU time) as a human table and
//! as JSON.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in nanoseconds up to this bound (larger values are clamped, so a
/// stalled I/O still shows up as "max ≥ 60 s" instead of being lost).
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// Counters of one worker (or of the whole run after [`Stats::merge`]).
#[derive(Debug, Clone)]
pub struct Stats {
    latency_ns: Histogram<u64>,
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    /// Completions with a non-success status or a data digest error.
    pub errors: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    pub fn new() -> Self {
        Self {
            // 3 significant digits: 0.1 % resolution at every magnitude.
            latency_ns: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .expect("static histogram bounds are valid"),
            reads: 0,
            writes: 0,
            bytes: 0,
            errors: 0,
        }
    }

    /// One completed I/O of `bytes` that took `latency`.
    pub fn record(&mut self, read: bool, bytes: u32, latency: Duration, ok: bool) {
        if read {
            self.reads += 1;
        } else {
            self.writes += 1;
        }
        self.bytes += bytes as u64;
        if !ok {
            self.errors += 1;
        }
        let ns = (latency.as_nanos() as u64).clamp(1, MAX_LATENCY_NS);
        // In range by the clamp above, so recording cannot fail.
        let _ = self.latency_ns.record(ns);
    }

    pub fn ios(&self) -> u64 {
        self.reads + self.writes
    }

    pub fn merge(&mut self, other: &Stats) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_ns.add(&other.latency_ns);
        self.reads += other.reads;
        self.writes += other.writes;
        self.bytes += other.bytes;
        self.errors += other.errors;
    }

    /// The summary over a measurement window of `elapsed`, with `cpu` the generator's CPU
    /// time in that window.
    pub fn summary(&self, elapsed: Duration, cpu: Duration) -> Summary {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let h = &self.latency_ns;
        let us = |ns: u64| ns as f64 / 1000.0;
        let empty = h.is_empty();
        Summary {
            ios: self.ios(),
            reads: self.reads,
            writes: self.writes,
            errors: self.errors,
            elapsed_s: elapsed.as_secs_f64(),
            iops: self.ios() as f64 / secs,
            mib_s: self.bytes as f64 / secs / (1024.0 * 1024.0),
            lat_mean_us: if empty { 0.0 } else { h.mean() / 1000.0 },
            lat_p50_us: us(h.value_at_quantile(0.5)),
            lat_p99_us: us(h.value_at_quantile(0.99)),
            lat_p999_us: us(h.value_at_quantile(0.999)),
            lat_max_us: us(h.max()),
            cpu_percent: cpu.as_secs_f64() / secs * 100.0,
            target_cpu_percent: None,
            target_rss_kib: None,
        }
    }
}

/// The result of a run. CPU% is of one core (200 % = two cores busy).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    pub errors: u64,
    pub elapsed_s: f64,
    pub iops: f64,
    pub mib_s: f64,
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    pub lat_max_us: f64,
    pub cpu_percent: f64,
    /// CPU% of the process given with --target-pid over the same window.
    pub target_cpu_percent: Option<f64>,
    /// Its resident set size at the end of the run (VmRSS).
    pub target_rss_kib: Option<u64>,
}

/// What was run, printed with the result.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    /// "nvme-tcp", "nvme-tcp-tls", "nvme-rdma" or "raw-tcp".
    pub mode: &'static str,
    pub addr: String,
    pub workload: String,
    pub read_percent: u8,
    pub bs: u32,
    pub qd: u32,
    pub queues: u32,
    pub threads: u32,
    pub digests: String,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    run: &'a RunInfo,
    result: &'a Summary,
}

pub fn to_json(info: &RunInfo, s: &Summary) -> String {
    serde_json::to_string_pretty(&JsonReport {
        run: info,
        result: s,
    })
    .expect("plain structs serialize")
}

/// The human table: one header line, one result line.
pub fn to_table(info: &RunInfo, s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {} {} bs={} qd={} queues={} threads={} digests={}{}",
        info.mode,
        info.addr,
        info.workload,
        info.bs,
        info.qd,
        info.queues,
        info.threads,
        info.digests,
        if info.workload == "randrw" {
            format!(" read%={}", info.read_percent)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "{:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7}{}",
        "IOPS",
        "MiB/s",
        "mean(us)",
        "p50(us)",
        "p99(us)",
        "p99.9(us)",
        "max(us)",
        "errors",
        "cpu%",
        if s.target_cpu_percent.is_some() {
            format!(" {:>11} {:>11}", "target-cpu%", "target-MiB")
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "{:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8} {:>7.1}{}",
        s.iops,
        s.mib_s,
        s.lat_mean_us,
        s.lat_p50_us,
        s.lat_p99_us,
        s.lat_p999_us,
        s.lat_max_us,
        s.errors,
        s.cpu_percent,
        match s.target_cpu_percent {
            Some(c) => format!(
                " {:>11.1} {:>11.1}",
                c,
                s.target_rss_kib.unwrap_or(0) as f64 / 1024.0
            ),
            None => String::new(),
        }
    );
    out
}

/// User + system CPU time of process `pid` so far, from /proc/PID/stat (fields 14 and 15,
/// in clock ticks; proc(5)). None when the process is gone or the file is unreadable.
pub fn other_process_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat_cpu(&stat, clock_ticks_per_second())
}

/// USER_HZ; 100 (the value on every Linux architecture) if sysconf cannot tell.
fn clock_ticks_per_second() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as u64,
        _ => 100,
    }
}

/// `stat` is the text of /proc/PID/stat. The command name (field 2) is in parentheses and
/// may itself contain spaces and parentheses, so fields are counted after the last ')'.
fn parse_proc_stat_cpu(stat: &str, ticks_per_second: u64) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // After the name come field 3 (state) … ; utime is field 14, stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime + stime;
    let tps = ticks_per_second.max(1);
    Some(
        Duration::from_secs(ticks / tps)
            + Duration::from_nanos((ticks % tps) * 1_000_000_000 / tps),
    )
}

/// VmRSS of process `pid` in KiB (/proc/PID/status).
pub fn other_process_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

/// User + system CPU time of this process so far (getrusage(2) RUSAGE_SELF).
pub fn process_cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        // getrusage(RUSAGE_SELF) cannot fail on Linux; report 0 rather than abort a run.
        Err(_) => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn percentiles_and_rates_from_known_latencies() {
        let mut s = Stats::new();
        // 1..=1000 µs once each: p50 ≈ 500, p99 ≈ 990, p99.9 ≈ 999, max 1000, mean 500.5.
        for i in 1..=1000 {
            s.record(i % 2 == 0, 4096, us(i), true);
        }
        let r = s.summary(Duration::from_secs(2), Duration::from_millis(500));
        assert_eq!(r.ios, 1000);
        assert_eq!((r.reads, r.writes), (500, 500));
        assert_eq!(r.iops, 500.0);
        assert!((r.mib_s - 1000.0 * 4096.0 / 2.0 / 1048576.0).abs() < 1e-9);
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.002 + 0.01;
        assert!(near(r.lat_p50_us, 500.0), "p50 {}", r.lat_p50_us);
        assert!(near(r.lat_p99_us, 990.0), "p99 {}", r.lat_p99_us);
        assert!(near(r.lat_p999_us, 999.0), "p99.9 {}", r.lat_p999_us);
        assert!(near(r.lat_max_us, 1000.0), "max {}", r.lat_max_us);
        assert!(near(r.lat_mean_us, 500.5), "mean {}", r.lat_mean_us);
        assert_eq!(r.cpu_percent, 25.0);
    }

    #[test]
    fn merge_adds_counts_and_keeps_the_tail() {
        let mut a = Stats::new();
        let mut b = Stats::new();
        for _ in 0..99 {
            a.record(true, 512, us(10), true);
        }
        b.record(false, 512, us(5000), false);
        a.merge(&b);
        let r = a.summary(Duration::from_secs(1), Duration::ZERO);
        assert_eq!((r.ios, r.errors), (100, 1));
        assert!(r.lat_p50_us < 10.1);
        assert!(r.lat_max_us >= 4995.0);
    }

    #[test]
    fn huge_latency_is_clamped_not_lost() {
        let mut s = Stats::new();
        s.record(true, 1, Duration::from_secs(3600), true);
        let r = s.summary(Duration::from_secs(1), Duration::ZERO);
        assert_eq!(r.ios, 1);
        assert!(r.lat_max_us >= 59_000_000.0);
    }

    #[test]
    fn empty_run_reports_zeroes() {
        let r = Stats::new().summary(Duration::from_secs(1), Duration::ZERO);
        assert_eq!(r.iops, 0.0);
        assert_eq!(r.lat_mean_us, 0.0);
        assert_eq!(r.lat_max_us, 0.0);
    }

    fn info() -> RunInfo {
        RunInfo {
            mode: "nvme-tcp",
            addr: "127.0.0.1:4420".into(),
            workload: "randrw".into(),
            read_percent: 70,
            bs: 4096,
            qd: 32,
            queues: 2,
            threads: 1,
            digests: "none".into(),
        }
    }

    #[test]
    fn table_and_json_carry_the_numbers() {
        let mut s = Stats::new();
        s.record(true, 4096, us(100), true);
        let sum = s.summary(Duration::from_secs(1), Duration::from_millis(10));
        let table = to_table(&info(), &sum);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("randrw") && lines[0].contains("read%=70"));
        assert!(lines[1].contains("p99.9(us)"));
        assert!(lines[2].trim_start().starts_with("1 "), "{}", lines[2]);
        let v: serde_json::Value = serde_json::from_str(&to_json(&info(), &sum)).unwrap();
        assert_eq!(v["run"]["qd"], 32);
        assert_eq!(v["result"]["ios"], 1);
        assert_eq!(v["result"]["iops"], 1.0);
        assert_eq!(v["result"]["cpu_percent"], 1.0);
    }

    #[test]
    fn proc_stat_and_status_parsing() {
        // The name contains ") " to show fields are counted after the last parenthesis.
        let stat = "1234 (nv) mfd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(parse_proc_stat_cpu(stat, 100), Some(Duration::from_secs(3)));
        assert_eq!(parse_proc_stat_cpu("garbage", 100), None);
        let status = "Name:\tnvmfd\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(5120));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        let me = std::process::id();
        assert!(other_process_cpu_time(me).is_some());
        assert!(other_process_rss_kib(me).unwrap() > 0);
    }

    #[test]
    fn process_cpu_time_moves_forward() {
        let a = process_cpu_time();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        // Spin until the kernel has charged some CPU time (bounded, for a loaded machine).
        while process_cpu_time() <= a && t.elapsed() < Duration::from_secs(10) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        assert!(process_cpu_time() > a);
    }
}
