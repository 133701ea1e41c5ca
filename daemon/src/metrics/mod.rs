//! Metrics: the views over the queues' counters (`nvme::metrics`) that the OpenMetrics
//! endpoint ([`http`]) and `nvmfd ctl top` show, and their exposition.
//!
//! Nothing here runs on a reactor: a scrape or a `ctl top` request takes a snapshot of the
//! registry (queues publish into it from their own threads) and of the reactors' busy time
//! (each reactor stores its own total once per tick) and sums it up.

pub mod http;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nvme::auth::FailureLimiter;
use nvme::metrics::{bucket_bound_us, Class, ClassCounters, QueueCounters, Registry, Snapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::reactor::ReactorHandle;

/// What a scrape reads: the queues' registry, the reactors and the target's count of failed
/// in-band authentications.
#[derive(Debug, Clone)]
pub struct Sources {
    pub registry: Arc<Registry>,
    pub reactors: Vec<Arc<ReactorHandle>>,
    pub auth_failures: Arc<FailureLimiter>,
    /// The gateway group's counters (with a `[gateway_group]`; only in `rbd` builds).
    #[cfg_attr(not(feature = "rbd"), allow(dead_code))]
    pub gateway: Option<Arc<crate::gateway::stats::Stats>>,
}

/// I/O classes shown per namespace (admin commands have no namespace).
pub const IO_CLASSES: [Class; 4] = [Class::Read, Class::Write, Class::Flush, Class::Other];

/// Counters summed per namespace, controller, subsystem and port.
#[derive(Debug, Default)]
pub struct Views {
    /// (subsystem, nsid) → per class.
    pub namespaces: BTreeMap<(String, u32), [ClassCounters; 5]>,
    /// (subsystem, cntlid, host NQN) → counters of its queues (live and closed).
    pub controllers: BTreeMap<(String, u16, String), QueueCounters>,
    /// subsystem → counters of every queue ever connected to it.
    pub subsystems: BTreeMap<String, QueueCounters>,
    /// (port id, transport) → counters of every queue of the port, and its live queues.
    pub ports: BTreeMap<(u16, &'static str), (QueueCounters, u64)>,
}

impl Views {
    pub fn from_snapshot(s: &Snapshot) -> Views {
        let mut v = Views::default();
        for e in &s.entries {
            let port = v
                .ports
                .entry((e.key.port_id, e.key.transport.name()))
                .or_default();
            port.0.add(&e.counters);
            if e.live {
                port.1 += 1;
            }
            let Some(sub) = &e.key.subsystem else {
                continue;
            };
            v.subsystems
                .entry(sub.clone())
                .or_default()
                .add(&e.counters);
            for n in e.counters.namespaces.iter().filter(|n| n.nsid != 0) {
                let ns = v.namespaces.entry((sub.clone(), n.nsid)).or_default();
                for (a, b) in ns.iter_mut().zip(n.classes.iter()) {
                    a.add(b);
                }
            }
            if let (Some(cntlid), Some(host)) = (e.key.cntlid, &e.key.hostnqn) {
                v.controllers
                    .entry((sub.clone(), cntlid, host.clone()))
                    .or_default()
                    .add(&e.counters);
            }
        }
        v
    }
}

impl Sources {
    /// The endpoint's body (OpenMetrics text, ending in `# EOF`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Scrape {
            views: Views::from_snapshot(&self.registry.snapshot()),
            busy_ns: self
                .reactors
                .iter()
                .map(|r| r.busy_ns.load(Ordering::Relaxed))
                .collect(),
            connections: self
                .reactors
                .iter()
                .map(|r| r.connections.load(Ordering::Relaxed) as u64)
                .collect(),
            auth_failures: self.auth_failures.total(),
        }));
        // A gateway group exists only in builds with librados (`rbd`).
        #[cfg(feature = "rbd")]
        if let Some(g) = &self.gateway {
            let fenced_ops = nvme::backend::rbd::fenced_ops();
            registry.register_collector(Box::new(g.scrape(fenced_ops)));
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// One scrape's data, encoded by prometheus-client.
#[derive(Debug)]
struct Scrape {
    views: Views,
    busy_ns: Vec<u64>,
    connections: Vec<u64>,
    auth_failures: u64,
}

type Labels = Vec<(&'static str, String)>;

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    family(encoder, name, help, MetricType::Counter, rows, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(&v, None)
    })
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    family(encoder, name, help, MetricType::Gauge, rows, |m, v| {
        m.encode_gauge(&(v as i64))
    })
}

fn family<T>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (Labels, T)>,
    mut each: impl FnMut(&mut prometheus_client::encoding::MetricEncoder, T) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut m = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in rows {
        each(&mut m.encode_family(&labels)?, value)?;
    }
    Ok(())
}

fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, ClassCounters)>,
) -> std::fmt::Result {
    family(encoder, name, help, MetricType::Histogram, rows, |m, c| {
        // Per-bucket counts: the encoder writes them cumulated.
        let buckets: Vec<(f64, u64)> = c
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let le = bucket_bound_us(i).map_or(f64::INFINITY, |us| us as f64 / 1e6);
                (le, n)
            })
            .collect();
        m.encode_histogram::<NoLabelSet>(
            c.latency_sum_ns as f64 / 1e9,
            c.latency_count,
            &buckets,
            None,
        )
    })
}

fn ns_labels(sub: &str, nsid: u32, class: Class) -> Labels {
    vec![
        ("subsystem", sub.to_owned()),
        ("nsid", nsid.to_string()),
        ("class", class.name().to_owned()),
    ]
}

fn ctrl_labels(sub: &str, cntlid: u16, host: &str) -> Labels {
    vec![
        ("subsystem", sub.to_owned()),
        ("cntlid", cntlid.to_string()),
        ("host", host.to_owned()),
    ]
}

fn with(mut labels: Labels, key: &'static str, value: String) -> Labels {
    labels.push((key, value));
    labels
}

fn port_labels(port: u16, transport: &str) -> Labels {
    vec![
        ("port", port.to_string()),
        ("transport", transport.to_owned()),
    ]
}

fn status_label(code: u16) -> String {
    format!("0x{code:03x}")
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let v = &self.views;
        let ns_rows = |f: fn(&ClassCounters) -> u64| {
            v.namespaces.iter().flat_map(move |((sub, nsid), classes)| {
                IO_CLASSES
                    .iter()
                    .map(move |&c| (ns_labels(sub, *nsid, c), f(&classes[c as usize])))
            })
        };
        counter(
            &mut e,
            "nvmfd_namespace_commands",
            "Completed I/O commands per namespace and class",
            ns_rows(|c| c.commands),
        )?;
        counter(
            &mut e,
            "nvmfd_namespace_bytes",
            "Data bytes moved per namespace and class",
            ns_rows(|c| c.bytes),
        )?;
        histogram(
            &mut e,
            "nvmfd_namespace_latency_seconds",
            "Command latency, admission to completion, per namespace and class",
            v.namespaces.iter().flat_map(|((sub, nsid), classes)| {
                IO_CLASSES
                    .iter()
                    .map(move |&c| (ns_labels(sub, *nsid, c), classes[c as usize]))
            }),
        )?;

        let ctrl_rows = |f: fn(&ClassCounters) -> u64| {
            v.controllers.iter().flat_map(move |((sub, id, host), q)| {
                Class::ALL.iter().map(move |&c| {
                    let labels = with(ctrl_labels(sub, *id, host), "class", c.name().into());
                    (labels, f(&q.class_total(c)))
                })
            })
        };
        counter(
            &mut e,
            "nvmfd_controller_commands",
            "Completed commands per controller and class",
            ctrl_rows(|c| c.commands),
        )?;
        counter(
            &mut e,
            "nvmfd_controller_bytes",
            "Data bytes moved per controller and class",
            ctrl_rows(|c| c.bytes),
        )?;
        histogram(
            &mut e,
            "nvmfd_controller_latency_seconds",
            "Command latency per controller and class (held AERs excluded)",
            v.controllers.iter().flat_map(|((sub, id, host), q)| {
                Class::ALL.iter().map(move |&c| {
                    let labels = with(ctrl_labels(sub, *id, host), "class", c.name().into());
                    (labels, q.class_total(c))
                })
            }),
        )?;
        gauge(
            &mut e,
            "nvmfd_controller_in_flight",
            "Commands admitted and not yet completed, per controller",
            v.controllers
                .iter()
                .map(|((sub, id, host), q)| (ctrl_labels(sub, *id, host), q.in_flight())),
        )?;
        counter(
            &mut e,
            "nvmfd_controller_keep_alive_expiries",
            "Keep-alive timeouts that ended the controller",
            v.controllers
                .iter()
                .map(|((sub, id, host), q)| (ctrl_labels(sub, *id, host), q.keep_alive_expiries)),
        )?;

        counter(
            &mut e,
            "nvmfd_subsystem_errors",
            "Failed completions per subsystem and status (SCT << 8 | SC)",
            v.subsystems.iter().flat_map(|(sub, q)| {
                q.errors.iter().map(move |&(code, n)| {
                    let labels = vec![("subsystem", sub.clone()), ("status", status_label(code))];
                    (labels, n)
                })
            }),
        )?;
        counter(
            &mut e,
            "nvmfd_subsystem_backend_errors",
            "Block operations the storage backend failed, per subsystem",
            v.subsystems
                .iter()
                .map(|(sub, q)| (vec![("subsystem", sub.clone())], q.backend_errors)),
        )?;
        counter(
            &mut e,
            "nvmfd_subsystem_keep_alive_expiries",
            "Keep-alive timeouts per subsystem (controllers gone included)",
            v.subsystems
                .iter()
                .map(|(sub, q)| (vec![("subsystem", sub.clone())], q.keep_alive_expiries)),
        )?;

        gauge(
            &mut e,
            "nvmfd_port_queues",
            "Open NVMe-oF queues (one per TCP connection or RDMA queue pair)",
            v.ports
                .iter()
                .map(|((port, t), (_, live))| (port_labels(*port, t), *live)),
        )?;
        counter(
            &mut e,
            "nvmfd_port_rdma_pool_waits",
            "Commands that waited for a free data buffer of the RDMA device pool, per port",
            v.ports
                .iter()
                .filter(|((_, t), _)| *t == nvme::metrics::Transport::Rdma.name())
                .map(|((port, t), (q, _))| (port_labels(*port, t), q.pool_waits)),
        )?;
        counter(
            &mut e,
            "nvmfd_port_connect_failures",
            "Fabrics Connect commands that failed, per port",
            v.ports
                .iter()
                .map(|((port, t), (q, _))| (port_labels(*port, t), q.connect_failures)),
        )?;
        counter(
            &mut e,
            "nvmfd_port_commands",
            "Completed commands per port and class",
            v.ports.iter().flat_map(|((port, t), (q, _))| {
                Class::ALL.iter().map(move |&c| {
                    let labels = with(port_labels(*port, t), "class", c.name().into());
                    (labels, q.class_total(c).commands)
                })
            }),
        )?;
        counter(
            &mut e,
            "nvmfd_port_bytes",
            "Data bytes moved per port and class",
            v.ports.iter().flat_map(|((port, t), (q, _))| {
                Class::ALL.iter().map(move |&c| {
                    let labels = with(port_labels(*port, t), "class", c.name().into());
                    (labels, q.class_total(c).bytes)
                })
            }),
        )?;
        counter(
            &mut e,
            "nvmfd_port_errors",
            "Failed completions per port and status (SCT << 8 | SC)",
            v.ports.iter().flat_map(|((port, t), (q, _))| {
                q.errors.iter().map(move |&(code, n)| {
                    (with(port_labels(*port, t), "status", status_label(code)), n)
                })
            }),
        )?;

        family(
            &mut e,
            "nvmfd_reactor_busy_seconds",
            "Time each reactor spent handling events (not waiting in epoll)",
            MetricType::Counter,
            self.busy_ns
                .iter()
                .enumerate()
                .map(|(i, &ns)| (vec![("reactor", i.to_string())], ns as f64 / 1e9)),
            |m, v| m.encode_counter::<NoLabelSet, _, u64>(&v, None),
        )?;
        gauge(
            &mut e,
            "nvmfd_reactor_connections",
            "Connections each reactor serves",
            self.connections
                .iter()
                .enumerate()
                .map(|(i, &n)| (vec![("reactor", i.to_string())], n)),
        )?;
        counter(
            &mut e,
            "nvmfd_auth_failures",
            "Failed in-band authentications (DH-HMAC-CHAP), all hosts and ports",
            [(Labels::new(), self.auth_failures)],
        )?;
        Ok(())
    }
}
