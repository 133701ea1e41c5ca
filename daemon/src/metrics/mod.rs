//! Metrics: the views over the queues' counters (`nvme::metrics`) that the metrics endpoint
//! ([`http`]) and `nvmfd ctl top` show, and their exposition (OpenMetrics or the Prometheus
//! text format 0.0.4, both written by prometheus-client).
//!
//! Nothing here runs on a reactor: a scrape or a `ctl top` request takes a snapshot of the
//! registry (queues publish into it from their own threads) and of the reactors' busy time
//! (each reactor stores its own total once per tick) and sums it up. Every configured
//! namespace, subsystem and port has its series from the start, at zero, so that a dashboard
//! shows 0 rather than "No data" before the first I/O.

pub mod http;
mod qos;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nvme::metrics::{
    bucket_bound_us, Class, ClassCounters, Histogram, QueueCounters, Registry, LATENCY_BUCKETS,
};
use nvme::queue::TransportKind;
use nvme::target::Target;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::reactor::ReactorHandle;

/// What a scrape reads: the queues' registry, the reactors, and the target (its configured
/// subsystems, namespaces and ports, and its count of failed in-band authentications).
#[derive(Debug, Clone)]
pub struct Sources {
    pub registry: Arc<Registry>,
    pub reactors: Vec<Arc<ReactorHandle>>,
    pub target: Arc<Target>,
    /// The gateway group's counters (with a `[gateway_group]`; only in `rbd` builds).
    #[cfg_attr(not(feature = "rbd"), allow(dead_code))]
    pub gateway: Option<Arc<crate::gateway::stats::Stats>>,
}

/// The exposition format of a scrape (chosen from the request's `Accept`, [`http`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`application/openmetrics-text`).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (`text/plain; version=0.0.4`).
    Text,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// I/O classes shown per namespace (admin commands have no namespace).
pub const IO_CLASSES: [Class; 4] = [Class::Read, Class::Write, Class::Flush, Class::Other];

/// Counters summed per namespace, controller, subsystem and port.
#[derive(Debug, Default)]
pub struct Views {
    /// (subsystem, nsid) → per class, and backend errors.
    pub namespaces: BTreeMap<(String, u32), ([ClassCounters; 5], u64)>,
    /// (subsystem, cntlid, host NQN) → counters of its queues (live and closed).
    pub controllers: BTreeMap<(String, u16, String), QueueCounters>,
    /// subsystem → counters of every queue ever connected to it.
    pub subsystems: BTreeMap<String, QueueCounters>,
    /// (port id, transport) → counters of every queue of the port, and its live queues.
    pub ports: BTreeMap<(u16, &'static str), (QueueCounters, u64)>,
}

fn transport_name(t: TransportKind) -> &'static str {
    match t {
        TransportKind::Tcp => nvme::metrics::Transport::Tcp.name(),
        TransportKind::Rdma => nvme::metrics::Transport::Rdma.name(),
    }
}

impl Views {
    /// The sums over the registry, with a zero entry for every configured subsystem,
    /// namespace and port of `target` (when given) that has not counted anything yet. The
    /// controllers' latency histograms are summed only with `controller_latency` (`ctl top`
    /// shows them; the endpoint does not, see `Scrape`).
    pub fn new(registry: &Registry, target: Option<&Target>, controller_latency: bool) -> Views {
        let mut v = Views::default();
        if let Some(target) = target {
            for port in target.ports() {
                v.ports
                    .entry((port.id, transport_name(port.transport)))
                    .or_default();
            }
            for nqn in target.subsystem_nqns() {
                if let Some(sub) = target.subsystem(&nqn) {
                    for nsid in sub.namespaces().nsids_after(0) {
                        v.namespaces.entry((nqn.clone(), nsid)).or_default();
                    }
                }
                v.subsystems.entry(nqn).or_default();
            }
        }
        registry.for_each(|key, live, counters| {
            let port = v
                .ports
                .entry((key.port_id, key.transport.name()))
                .or_default();
            port.0.add_counts(counters, false);
            if live {
                port.1 += 1;
            }
            let Some(sub) = &key.subsystem else {
                return;
            };
            match v.subsystems.get_mut(sub) {
                Some(q) => q.add_counts(counters, false),
                None => {
                    let mut q = QueueCounters::default();
                    q.add_counts(counters, false);
                    v.subsystems.insert(sub.clone(), q);
                }
            }
            for n in counters.namespaces.iter().filter(|n| n.nsid != 0) {
                let ns = match v.namespaces.get_mut(&(sub.clone(), n.nsid)) {
                    Some(ns) => ns,
                    None => v.namespaces.entry((sub.clone(), n.nsid)).or_default(),
                };
                for (a, b) in ns.0.iter_mut().zip(n.classes.iter()) {
                    a.add(b);
                }
                ns.1 += n.backend_errors;
            }
            if let (Some(cntlid), Some(host)) = (key.cntlid, &key.hostnqn) {
                v.controllers
                    .entry((sub.clone(), cntlid, host.clone()))
                    .or_default()
                    .add_counts(counters, controller_latency);
            }
        });
        v
    }
}

impl Sources {
    /// The endpoint's body in `format`, into `out` (cleared first). The endpoint keeps one
    /// buffer for every scrape: a thousand controllers make megabytes, which a new buffer
    /// would grow by doubling and fault in page by page each time.
    pub fn encode_into(&self, format: Format, out: &mut String) -> std::fmt::Result {
        out.clear();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Scrape {
            views: Views::new(&self.registry, Some(&self.target), false),
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
            auth_failures: self.target.auth_failures().total(),
        }));
        // A gateway group exists only in builds with librados (`rbd`).
        #[cfg(feature = "rbd")]
        if let Some(g) = &self.gateway {
            let fenced_ops = storage::rbd::fenced_ops();
            registry.register_collector(Box::new(g.scrape(fenced_ops)));
        }
        registry.register_collector(Box::new(qos::QosScrape::new(&self.target)));
        match format {
            Format::OpenMetrics => prometheus_client::encoding::text::encode(out, &registry),
            Format::Text => prometheus_client::encoding::prometheus_text::encode(out, &registry),
        }
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
    rows: impl IntoIterator<Item = (Labels, Histogram)>,
) -> std::fmt::Result {
    family(encoder, name, help, MetricType::Histogram, rows, |m, h| {
        // Per-bucket counts: the encoder writes them cumulated.
        let mut buckets = [(0.0, 0); LATENCY_BUCKETS];
        for (i, (b, &n)) in buckets.iter_mut().zip(h.buckets.iter()).enumerate() {
            let le = bucket_bound_us(i).map_or(f64::INFINITY, |us| us as f64 / 1e6);
            *b = (le, n);
        }
        m.encode_histogram::<NoLabelSet>(h.sum_ns as f64 / 1e9, h.count, &buckets, None)
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

/// One row per namespace and I/O class: its labels and `f` of its counters.
fn ns_rows<'a, T: 'a>(
    v: &'a Views,
    f: fn(&ClassCounters) -> T,
) -> impl Iterator<Item = (Labels, T)> + 'a {
    v.namespaces
        .iter()
        .flat_map(move |((sub, nsid), (classes, _))| {
            IO_CLASSES
                .iter()
                .map(move |&c| (ns_labels(sub, *nsid, c), f(&classes[c as usize])))
        })
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let v = &self.views;
        counter(
            &mut e,
            "nvmfd_namespace_commands",
            "Completed I/O commands per namespace and class",
            ns_rows(v, |c| c.commands),
        )?;
        counter(
            &mut e,
            "nvmfd_namespace_bytes",
            "Data bytes moved per namespace and class",
            ns_rows(v, |c| c.bytes),
        )?;
        histogram(
            &mut e,
            "nvmfd_namespace_latency_seconds",
            "Command latency in the target, from the arrival of the command capsule to the \
             response handed to the socket or queue pair, per namespace and class",
            ns_rows(v, |c| c.latency),
        )?;
        histogram(
            &mut e,
            "nvmfd_namespace_backend_latency_seconds",
            "Storage backend latency, from the submission of a command's block operation to \
             its completion, per namespace and class (commands completed in line, as by RAM \
             and null namespaces, have none)",
            ns_rows(v, |c| c.backend),
        )?;
        counter(
            &mut e,
            "nvmfd_namespace_backend_errors",
            "Commands whose block operation the storage backend failed, per namespace",
            v.namespaces.iter().map(|((sub, nsid), (_, errors))| {
                let labels = vec![("subsystem", sub.clone()), ("nsid", nsid.to_string())];
                (labels, *errors)
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
                .map(|(sub, q)| (vec![("subsystem", sub.clone())], q.backend_errors())),
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
