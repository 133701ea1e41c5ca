//! What a gateway group exports to `[metrics]`: ANA ownership changes by group, reason and
//! new state, the lease renewal latency, groups owned, whether this instance is fenced, and
//! image operations the OSDs refused because it is.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Upper bounds of the renewal latency buckets, in milliseconds (the last is +Inf).
const RENEW_BUCKETS_MS: [u64; 9] = [5, 10, 25, 50, 100, 250, 500, 1000, 2500];

/// The counters; shared by the gateway's threads and the metrics endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    /// (group, reason label, new state name) → count.
    changes: Mutex<BTreeMap<(u32, &'static str, &'static str), u64>>,
    renew_buckets: [AtomicU64; RENEW_BUCKETS_MS.len() + 1],
    renew_sum_us: AtomicU64,
    renew_count: AtomicU64,
    pub owned: AtomicU64,
    pub fenced: AtomicU64,
}

impl Stats {
    pub fn change(&self, group: u32, reason: &'static str, state: &'static str) {
        let mut c = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        *c.entry((group, reason, state)).or_default() += 1;
    }

    pub fn renewal(&self, us: u64) {
        let ms = us / 1000;
        let i = RENEW_BUCKETS_MS
            .iter()
            .position(|&b| ms < b)
            .unwrap_or(RENEW_BUCKETS_MS.len());
        self.renew_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.renew_sum_us.fetch_add(us, Ordering::Relaxed);
        self.renew_count.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot for one scrape.
    pub fn scrape(&self, fenced_ops: u64) -> Scrape {
        Scrape {
            changes: self
                .changes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            buckets: self
                .renew_buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.renew_sum_us.load(Ordering::Relaxed),
            count: self.renew_count.load(Ordering::Relaxed),
            owned: self.owned.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            fenced_ops,
        }
    }
}

/// One scrape of [`Stats`].
#[derive(Debug)]
pub struct Scrape {
    changes: BTreeMap<(u32, &'static str, &'static str), u64>,
    buckets: Vec<u64>,
    sum_us: u64,
    count: u64,
    owned: u64,
    fenced: u64,
    fenced_ops: u64,
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        if !self.changes.is_empty() {
            let mut m = e.encode_descriptor(
                "nvmfd_gateway_ana_changes",
                "ANA state changes of this gateway per group, reason and new state",
                None,
                MetricType::Counter,
            )?;
            for ((group, reason, state), n) in &self.changes {
                let labels = [
                    ("group", group.to_string()),
                    ("reason", (*reason).to_owned()),
                    ("state", (*state).to_owned()),
                ];
                m.encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
        }
        // Per-bucket counts: the encoder writes them cumulated.
        let buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let le = RENEW_BUCKETS_MS
                    .get(i)
                    .map_or(f64::INFINITY, |&ms| ms as f64 / 1e3);
                (le, n)
            })
            .collect();
        let mut m = e.encode_descriptor(
            "nvmfd_gateway_lease_renew_seconds",
            "Time a lease renewal (RADOS lock renew) took",
            None,
            MetricType::Histogram,
        )?;
        m.encode_histogram::<NoLabelSet>(self.sum_us as f64 / 1e6, self.count, &buckets, None)?;
        for (name, help, v) in [
            (
                "nvmfd_gateway_groups_owned",
                "ANA groups this gateway owns (reports Optimized)",
                self.owned,
            ),
            (
                "nvmfd_gateway_fenced",
                "1 once this gateway's RADOS client is blocklisted (it then stops)",
                self.fenced,
            ),
        ] {
            let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            prometheus_client::metrics::gauge::ConstGauge::new(v as i64).encode(m)?;
        }
        let m = e.encode_descriptor(
            "nvmfd_gateway_fenced_image_ops",
            "RBD image operations the OSDs refused because this gateway is blocklisted",
            None,
            MetricType::Counter,
        )?;
        prometheus_client::metrics::counter::ConstCounter::new(self.fenced_ops).encode(m)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrape_encodes_changes_latency_and_gauges() {
        let s = Stats::default();
        s.change(2, "takeover-fenced", "optimized");
        s.renewal(3_000);
        s.renewal(700_000);
        s.owned.store(1, Ordering::Relaxed);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(s.scrape(5)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains(
            "nvmfd_gateway_ana_changes_total{group=\"2\",reason=\"takeover-fenced\",state=\"optimized\"} 1"
        ), "{out}");
        assert!(
            out.contains("nvmfd_gateway_lease_renew_seconds_count 2"),
            "{out}"
        );
        assert!(
            out.contains("nvmfd_gateway_lease_renew_seconds_bucket{le=\"0.005\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("nvmfd_gateway_lease_renew_seconds_bucket{le=\"1.0\"} 2"),
            "{out}"
        );
        assert!(out.contains("nvmfd_gateway_groups_owned 1"), "{out}");
        assert!(
            out.contains("nvmfd_gateway_fenced_image_ops_total 5"),
            "{out}"
        );
    }
}
