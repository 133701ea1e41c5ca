//! `nvmfd ctl top`: IOPS, MiB/s, mean and p99 latency per namespace and per controller, from
//! two `top` answers an interval apart (like `iostat -x 1`: every report covers the last
//! interval). Latency is the target's: capsule arrival to response handed to the socket or
//! queue pair. p99 is interpolated inside its histogram bucket, as Prometheus'
//! `histogram_quantile` does.

use std::time::{Duration, Instant};

use nvme::metrics::{ClassCounters, Histogram, LATENCY_BUCKETS};
use serde::Serialize;

use super::proto::{ClassView, TopRow, TopView};

/// One row of a report: rates over the interval, and the totals at its end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rate {
    pub nqn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cntlid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_nqn: Option<String>,
    pub read_iops: f64,
    pub write_iops: f64,
    /// All I/O commands (read, write, flush, other).
    pub iops: f64,
    pub read_mib_s: f64,
    pub write_mib_s: f64,
    /// Mean and p99 latency of the interval's I/O commands, µs (`null` without any).
    pub mean_latency_us: Option<f64>,
    pub p99_latency_us: Option<f64>,
    pub read_commands: u64,
    pub write_commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub interval_secs: f64,
    pub namespaces: Vec<Rate>,
    pub controllers: Vec<Rate>,
}

fn counters(v: &ClassView) -> ClassCounters {
    let mut c = ClassCounters {
        commands: v.commands,
        bytes: v.bytes,
        latency: Histogram {
            count: v.latency_count,
            sum_ns: v.latency_sum_ns,
            ..Default::default()
        },
        ..Default::default()
    };
    for (a, b) in c.latency.buckets.iter_mut().zip(v.latency_buckets.iter()) {
        *a = *b;
    }
    c
}

/// `now - before` (counters that went back, a series that restarted, count from zero).
fn delta(now: &ClassCounters, before: Option<&ClassCounters>) -> ClassCounters {
    let Some(b) = before.filter(|b| b.commands <= now.commands) else {
        return *now;
    };
    let mut d = ClassCounters {
        commands: now.commands - b.commands,
        bytes: now.bytes.saturating_sub(b.bytes),
        latency: Histogram {
            count: now.latency.count.saturating_sub(b.latency.count),
            sum_ns: now.latency.sum_ns.saturating_sub(b.latency.sum_ns),
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..LATENCY_BUCKETS {
        d.latency.buckets[i] = now.latency.buckets[i].saturating_sub(b.latency.buckets[i]);
    }
    d
}

fn same(a: &TopRow, b: &TopRow) -> bool {
    a.nqn == b.nqn && a.nsid == b.nsid && a.cntlid == b.cntlid && a.host_nqn == b.host_nqn
}

fn rate(now: &TopRow, before: Option<&TopRow>, secs: f64) -> Rate {
    let classes = |r: &TopRow| [&r.read, &r.write, &r.flush, &r.other].map(counters);
    let n = classes(now);
    let b = before.map(classes);
    let d: Vec<ClassCounters> = (0..4)
        .map(|i| delta(&n[i], b.as_ref().map(|b| &b[i])))
        .collect();
    let mut all = ClassCounters::default();
    for c in &d {
        all.add(c);
    }
    let per_sec = |x: u64| x as f64 / secs;
    const MIB: f64 = 1024.0 * 1024.0;
    Rate {
        nqn: now.nqn.clone(),
        nsid: now.nsid,
        cntlid: now.cntlid,
        host_nqn: now.host_nqn.clone(),
        read_iops: per_sec(d[0].commands),
        write_iops: per_sec(d[1].commands),
        iops: per_sec(all.commands),
        read_mib_s: per_sec(d[0].bytes) / MIB,
        write_mib_s: per_sec(d[1].bytes) / MIB,
        mean_latency_us: all.latency.mean_us(),
        p99_latency_us: all.latency.quantile_us(0.99),
        read_commands: now.read.commands,
        write_commands: now.write.commands,
        bytes_read: now.read.bytes,
        bytes_written: now.write.bytes,
    }
}

/// The report for the interval between two answers.
pub fn report(before: &TopView, now: &TopView, elapsed: Duration) -> Report {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rows = |now: &[TopRow], before: &[TopRow]| -> Vec<Rate> {
        now.iter()
            .map(|r| rate(r, before.iter().find(|b| same(b, r)), secs))
            .collect()
    };
    Report {
        interval_secs: secs,
        namespaces: rows(&now.namespaces, &before.namespaces),
        controllers: rows(&now.controllers, &before.controllers),
    }
}

fn lat(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |us| format!("{us:.1}"))
}

/// The table `ctl top` prints every interval. The name column is as wide as the longest name
/// (a controller's host NQN is often 60+ characters), so the numbers stay in their columns.
pub fn render(r: &Report) -> String {
    let rows: Vec<(String, &Rate)> = r
        .namespaces
        .iter()
        .map(|x| (format!("{} ns {}", x.nqn, x.nsid.unwrap_or(0)), x))
        .chain(r.controllers.iter().map(|x| {
            let host = x.host_nqn.as_deref().unwrap_or("");
            (format!("ctrl {} {}", x.cntlid.unwrap_or(0), host), x)
        }))
        .collect();
    const HEAD: &str = "namespace / controller";
    let w = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(HEAD.len());
    let mut out = format!(
        "interval {:.1} s: {} namespace(s), {} controller(s); latency: capsule arrival to response sent\n",
        r.interval_secs,
        r.namespaces.len(),
        r.controllers.len()
    );
    out.push_str(&format!(
        "{HEAD:<w$} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
        "r/s", "w/s", "io/s", "rMiB/s", "wMiB/s", "mean_us", "p99_us"
    ));
    for (name, x) in rows {
        out.push_str(&format!(
            "{name:<w$} {:>10.0} {:>10.0} {:>10.0} {:>9.1} {:>9.1} {:>9} {:>9}\n",
            x.read_iops,
            x.write_iops,
            x.iops,
            x.read_mib_s,
            x.write_mib_s,
            lat(x.mean_latency_us),
            lat(x.p99_latency_us)
        ));
    }
    out
}

/// Asks `fetch` every `interval` and hands each report to `show` (once with `once`).
pub fn run<E>(
    interval: Duration,
    once: bool,
    mut fetch: impl FnMut() -> Result<TopView, E>,
    mut show: impl FnMut(&Report),
) -> Result<(), E> {
    let mut before = fetch()?;
    let mut at = Instant::now();
    loop {
        std::thread::sleep(interval);
        let now = fetch()?;
        let now_at = Instant::now();
        show(&report(&before, &now, now_at - at));
        if once {
            return Ok(());
        }
        (before, at) = (now, now_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(reads: u64, bytes: u64, lat_us: u64) -> TopRow {
        let mut c = ClassCounters::default();
        for _ in 0..reads {
            c.latency.observe(lat_us * 1000);
        }
        c.commands = reads;
        c.bytes = bytes;
        let v = ClassView {
            commands: c.commands,
            bytes: c.bytes,
            latency_count: c.latency.count,
            latency_sum_ns: c.latency.sum_ns,
            latency_buckets: c.latency.buckets.to_vec(),
        };
        TopRow {
            nqn: "nqn.x".into(),
            nsid: Some(1),
            cntlid: None,
            host_nqn: None,
            read: v,
            write: ClassView::default(),
            flush: ClassView::default(),
            other: ClassView::default(),
        }
    }

    #[test]
    fn rates_are_over_the_interval() {
        let before = TopView {
            namespaces: vec![row(100, 409_600, 10)],
            controllers: vec![],
        };
        let now = TopView {
            namespaces: vec![row(1100, 4_505_600, 10)],
            controllers: vec![],
        };
        let r = report(&before, &now, Duration::from_secs(2));
        let x = &r.namespaces[0];
        assert_eq!(x.read_iops, 500.0);
        assert!((x.read_mib_s - 4_096_000.0 / 2.0 / 1048576.0).abs() < 1e-9);
        assert_eq!(x.mean_latency_us, Some(10.0));
        // 10 µs is in (5, 10]: p99 interpolates near the top of that bucket.
        let p99 = x.p99_latency_us.unwrap();
        assert!(p99 > 5.0 && p99 <= 10.0, "{p99}");
        assert_eq!(x.read_commands, 1100);
        assert!(render(&r).contains("nqn.x ns 1"));
    }

    #[test]
    fn long_host_nqns_keep_the_columns_aligned() {
        let ns = row(10, 40960, 10);
        let mut ctrl = row(10, 40960, 10);
        ctrl.nsid = None;
        ctrl.cntlid = Some(1);
        ctrl.host_nqn =
            Some("nqn.2014-08.org.nvmexpress:uuid:6e766d66-642d-7065-7266-000000000002".into());
        let view = TopView {
            namespaces: vec![ns],
            controllers: vec![ctrl],
        };
        let empty = TopView {
            namespaces: vec![],
            controllers: vec![],
        };
        let text = render(&report(&empty, &view, Duration::from_secs(1)));
        let table: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(table.len(), 3, "{text}");
        // Every column ends where the header's does.
        assert!(table.iter().all(|l| l.len() == table[0].len()), "{text}");
        assert!(table[2].starts_with("ctrl 1 nqn.2014-08"), "{text}");
    }
}
