//! `nvmfd ctl qos`: each QoS limiter's limits and, from two `qos` answers an interval apart,
//! what it admitted (IOPS, MiB/s) and held back (commands/s, mean wait) over the interval.

use serde::Serialize;

use super::proto::QosView;

/// One limiter over an interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QosRate {
    #[serde(flatten)]
    pub view: QosView,
    pub iops: f64,
    pub read_mib_s: f64,
    pub write_mib_s: f64,
    /// Commands that waited, per second, and their mean wait (ms; `null` without any).
    pub held_per_s: f64,
    pub mean_held_ms: Option<f64>,
}

/// Rates over `secs` from `before` to `now` (a limiter new since counts from zero).
pub fn rates(before: &[QosView], now: Vec<QosView>, secs: f64) -> Vec<QosRate> {
    now.into_iter()
        .map(|v| {
            let b = before
                .iter()
                .find(|b| b.nqn == v.nqn && b.nsid == v.nsid && b.host == v.host);
            let d = |f: fn(&QosView) -> u64| f(&v).saturating_sub(b.map_or(0, f)) as f64;
            let held = d(|x| x.held_commands);
            let held_ns = d(|x| x.held_ns);
            let mib = (1u64 << 20) as f64;
            QosRate {
                iops: d(|x| x.commands) / secs,
                read_mib_s: d(|x| x.read_bytes) / mib / secs,
                write_mib_s: d(|x| x.write_bytes) / mib / secs,
                held_per_s: held / secs,
                mean_held_ms: (held > 0.0).then(|| held_ns / held / 1e6),
                view: v,
            }
        })
        .collect()
}

fn limit(v: u64, unit: &str) -> String {
    if v == 0 {
        "-".to_owned()
    } else {
        format!("{v}{unit}")
    }
}

pub fn render(rows: &[QosRate], secs: f64) -> String {
    let mut out = format!(
        "over {secs:.1} s\n{:<40} {:<24} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9} {:>8} {:>8} {:>8} {:>9}\n",
        "SUBSYSTEM",
        "LIMITED",
        "IOPS-LIM",
        "RD-LIM",
        "WR-LIM",
        "TOT-LIM",
        "BURST",
        "IOPS",
        "RD-MiB/s",
        "WR-MiB/s",
        "HELD/s",
        "WAIT-ms"
    );
    if rows.is_empty() {
        out.push_str("(no QoS limits)\n");
    }
    for r in rows {
        let v = &r.view;
        let what = match (&v.nsid, &v.host) {
            (Some(nsid), _) => format!("nsid {nsid}"),
            (None, Some(host)) => host.clone(),
            _ => String::new(),
        };
        let l = &v.limits;
        out.push_str(&format!(
            "{:<40} {:<24} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9.1} {:>8.2} {:>8.2} {:>8.1} {:>9}\n",
            v.nqn,
            what,
            limit(l.iops, ""),
            limit(l.read_mbps, "M"),
            limit(l.write_mbps, "M"),
            limit(l.total_mbps, "M"),
            limit(u64::from(l.burst_ms), "ms"),
            r.iops,
            r.read_mib_s,
            r.write_mib_s,
            r.held_per_s,
            r.mean_held_ms
                .map_or("-".to_owned(), |ms| format!("{ms:.2}")),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(commands: u64, held: u64, held_ns: u64) -> QosView {
        QosView {
            nqn: "nqn.x".into(),
            nsid: Some(1),
            host: None,
            limits: conf::Qos {
                iops: 500,
                ..Default::default()
            },
            commands,
            read_bytes: commands * 4096,
            write_bytes: 0,
            held_commands: held,
            held_ns,
        }
    }

    #[test]
    fn rates_are_the_interval_deltas() {
        let r = rates(
            &[view(1000, 10, 0)],
            vec![view(1500, 110, 200_000_000)],
            1.0,
        );
        assert_eq!(r[0].iops, 500.0);
        assert_eq!(r[0].held_per_s, 100.0);
        assert_eq!(r[0].mean_held_ms, Some(2.0));
        assert!((r[0].read_mib_s - 500.0 * 4096.0 / 1048576.0).abs() < 1e-9);
        let text = render(&r, 1.0);
        assert!(text.contains("nsid 1") && text.contains("500.0"), "{text}");
    }
}
