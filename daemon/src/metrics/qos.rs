//! QoS limiters in the exposition: each limit (a gauge per quantity, 0 = none), what the
//! limiter admitted, and the commands it held back and for how long (counters; `rate()` of
//! them is the achieved rate and the held time per second).

use std::sync::Arc;

use nvme::qos::{QosCounters, QosLimits};
use nvme::target::Target;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// One scrape's copy of every limiter: labels, limits, counters.
#[derive(Debug)]
pub struct QosScrape {
    rows: Vec<(Labels, QosLimits, QosCounters)>,
}

type Labels = Vec<(&'static str, String)>;

impl QosScrape {
    pub fn new(target: &Arc<Target>) -> Self {
        let mut rows = Vec::new();
        for nqn in target.subsystem_nqns() {
            let Some(s) = target.subsystem(&nqn) else {
                continue;
            };
            let table = s.qos();
            for (nsid, l) in &table.namespaces {
                let labels = vec![("subsystem", nqn.clone()), ("nsid", nsid.to_string())];
                rows.push((labels, l.limits(), l.counters()));
            }
            for (host, l) in &table.hosts {
                let labels = vec![("subsystem", nqn.clone()), ("host", host.clone())];
                rows.push((labels, l.limits(), l.counters()));
            }
        }
        Self { rows }
    }

    fn family(
        &self,
        e: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        kind: MetricType,
        values: impl Fn(&QosLimits, &QosCounters) -> Vec<(Option<(&'static str, &'static str)>, f64)>,
    ) -> std::fmt::Result {
        if self.rows.is_empty() {
            return Ok(());
        }
        let mut m = e.encode_descriptor(name, help, None, kind)?;
        for (labels, limits, counters) in &self.rows {
            for (extra, v) in values(limits, counters) {
                let mut labels = labels.clone();
                if let Some((k, val)) = extra {
                    labels.push((k, val.to_owned()));
                }
                let mut f = m.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => f.encode_counter::<NoLabelSet, _, f64>(&v, None)?,
                    _ => f.encode_gauge(&v)?,
                }
            }
        }
        Ok(())
    }
}

impl Collector for QosScrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        self.family(
            &mut e,
            "nvmfd_qos_limit",
            "QoS limit of a namespace or host (commands/s or bytes/s; 0 = none)",
            MetricType::Gauge,
            |l, _| {
                vec![
                    (Some(("quantity", "iops")), l.iops as f64),
                    (
                        Some(("quantity", "read_bytes")),
                        l.read_bytes_per_sec as f64,
                    ),
                    (
                        Some(("quantity", "write_bytes")),
                        l.write_bytes_per_sec as f64,
                    ),
                    (
                        Some(("quantity", "total_bytes")),
                        l.total_bytes_per_sec as f64,
                    ),
                ]
            },
        )?;
        self.family(
            &mut e,
            "nvmfd_qos_commands",
            "Commands a QoS limiter admitted",
            MetricType::Counter,
            |_, c| vec![(None, c.commands as f64)],
        )?;
        self.family(
            &mut e,
            "nvmfd_qos_bytes",
            "Data bytes of the commands a QoS limiter admitted",
            MetricType::Counter,
            |_, c| {
                vec![
                    (Some(("direction", "read")), c.read_bytes as f64),
                    (Some(("direction", "write")), c.write_bytes as f64),
                ]
            },
        )?;
        self.family(
            &mut e,
            "nvmfd_qos_held_commands",
            "Commands a QoS limiter held back before they started",
            MetricType::Counter,
            |_, c| vec![(None, c.held_commands as f64)],
        )?;
        self.family(
            &mut e,
            "nvmfd_qos_held_seconds",
            "Time commands spent held back by a QoS limiter",
            MetricType::Counter,
            |_, c| vec![(None, c.held_ns as f64 / 1e9)],
        )
    }
}
