//! The metrics end to end: I/O through the real binary with the host-side client, then
//! `GET /metrics` must parse as OpenMetrics text (checked strictly below) when asked for it,
//! pass `promtool check metrics` in the Prometheus text format otherwise, and count exactly
//! the commands, bytes, latencies and backend errors done; `nvmfd ctl top --once --json` must
//! agree.

mod fixture;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use fixture::{free_port, one_subsystem, pattern, serve, Daemon, TempDir};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:metrics";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-444455556677";
const BLOCK: u32 = 512;

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// A strict reading of the OpenMetrics text format (the parts nvmfd emits): every line is a
/// `# HELP`/`# TYPE`/`# UNIT` line or a sample of the family declared last, with the suffixes
/// its type allows; label values are quoted and escaped; values are numbers; histogram
/// buckets are cumulative and the `+Inf` bucket equals `_count`; the text ends with `# EOF`.
fn parse_openmetrics(text: &str) -> Result<Vec<Sample>, String> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.pop() != Some("") {
        return Err("text does not end with a newline".into());
    }
    if lines.pop() != Some("# EOF") {
        return Err("last line is not # EOF".into());
    }
    let mut family: Option<(String, String)> = None;
    let mut samples = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let err = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name, arg) = (parts.next(), parts.next(), parts.next());
            let (Some(kind), Some(name)) = (kind, name) else {
                return Err(err("short descriptor"));
            };
            match kind {
                "TYPE" => {
                    let t = arg.ok_or_else(|| err("TYPE without type"))?;
                    if !["counter", "gauge", "histogram", "info", "unknown"].contains(&t) {
                        return Err(err("unknown type"));
                    }
                    family = Some((name.to_owned(), t.to_owned()));
                }
                "HELP" | "UNIT" => {}
                _ => return Err(err("unknown descriptor")),
            }
            continue;
        }
        let (fname, ftype) = family.as_ref().ok_or_else(|| err("sample before TYPE"))?;
        let (name_labels, value) = line.rsplit_once(' ').ok_or_else(|| err("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().map_err(|_| err("value is not a number"))?,
        };
        let (name, labels) = match name_labels.split_once('{') {
            None => (name_labels, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| err("unclosed labels"))?;
                (name, parse_labels(body).map_err(|e| err(&e))?)
            }
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(err("bad metric name"));
        }
        let suffix = name
            .strip_prefix(fname.as_str())
            .ok_or_else(|| err("sample outside its family"))?;
        let allowed: &[&str] = match ftype.as_str() {
            "counter" => &["_total", "_created"],
            "gauge" => &[""],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            _ => &[""],
        };
        if !allowed.contains(&suffix) {
            return Err(err("suffix not allowed for the family's type"));
        }
        if suffix == "_bucket" && !labels.contains_key("le") {
            return Err(err("bucket without le"));
        }
        samples.push((name.to_owned(), labels, value));
    }
    check_histograms(&samples)?;
    Ok(samples)
}

fn parse_labels(body: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {key:?}"));
        }
        if chars.next() != Some('"') {
            return Err("label value not quoted".into());
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    _ => return Err("bad escape".into()),
                },
                Some(c) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        }
        if labels.insert(key.clone(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        match chars.next() {
            None => break,
            Some(',') => {}
            Some(c) => return Err(format!("unexpected {c:?} after a label")),
        }
    }
    Ok(labels)
}

fn check_histograms(samples: &[Sample]) -> Result<(), String> {
    // (name, labels without le) → (buckets (le, count), _count)
    type Series = BTreeMap<(String, Vec<(String, String)>), (Vec<(f64, f64)>, Option<f64>)>;
    let mut series = Series::new();
    for (name, labels, value) in samples {
        let rest: Vec<(String, String)> = labels
            .iter()
            .filter(|(k, _)| *k != "le")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(base) = name.strip_suffix("_bucket") {
            let le = match labels["le"].as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().map_err(|_| format!("le {v:?}"))?,
            };
            series
                .entry((base.into(), rest))
                .or_default()
                .0
                .push((le, *value));
        } else if let Some(base) = name.strip_suffix("_count") {
            series.entry((base.into(), rest)).or_default().1 = Some(*value);
        }
    }
    for ((name, labels), (buckets, count)) in &series {
        let what = format!("{name} {labels:?}");
        if buckets
            .windows(2)
            .any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1)
        {
            return Err(format!("{what}: buckets not increasing"));
        }
        match (buckets.last(), count) {
            (Some(&(le, n)), Some(count)) if le.is_infinite() && n == *count => {}
            _ => return Err(format!("{what}: +Inf bucket does not match _count")),
        }
    }
    Ok(())
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
        })
        .map(|s| s.2)
}

/// What Prometheus 2.x asks for.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `GET /metrics` with `accept` (none: no Accept header): the body, after checking that the
/// Content-Type is `content_type`.
fn get(address: SocketAddr, accept: Option<&str>, content_type: &str) -> String {
    let mut s = TcpStream::connect(address).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("HTTP head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains(&format!("Content-Type: {content_type}")),
        "{head}"
    );
    body.to_owned()
}

/// An OpenMetrics scrape, as Prometheus asks for it.
fn scrape(address: SocketAddr) -> String {
    get(
        address,
        Some(PROMETHEUS_ACCEPT),
        "application/openmetrics-text; version=1.0.0",
    )
}

/// A scrape in the Prometheus text format 0.0.4 (what curl gets), checked by `promtool
/// check metrics` when promtool is installed (Debian: package `prometheus`).
fn scrape_text_and_promtool(address: SocketAddr) -> String {
    let text = get(address, None, "text/plain; version=0.0.4");
    assert!(!text.contains("# EOF"), "{text}");
    let promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut promtool) = promtool else {
        eprintln!(
            "promtool not found: `promtool check metrics` skipped (apt-get install prometheus)"
        );
        return text;
    };
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}\n{text}"
    );
    text
}

/// The samples of a text-format scrape (its syntax is promtool's to check).
fn parse_text(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|line| {
            let (name_labels, value) = line.rsplit_once(' ').expect(line);
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect(line),
            };
            let (name, labels) = match name_labels.split_once('{') {
                None => (name_labels, BTreeMap::new()),
                Some((name, rest)) => (
                    name,
                    parse_labels(rest.strip_suffix('}').expect(line)).expect(line),
                ),
            };
            (name.to_owned(), labels, value)
        })
        .collect()
}

#[test]
fn scrape_and_ctl_top_count_exactly_the_io_done() {
    let dir = TempDir::new("metrics");
    let port = free_port();
    let metrics_port = free_port();
    let socket = dir.join("control.sock");
    let global = format!("control_socket = \"{}\"", socket.display());
    // Namespace 2 fails reads of its first 8 blocks (EIO) and holds reads of blocks 64..72
    // back 30 ms in the backend (an io_uring timeout: a block operation with a latency).
    let namespaces = format!(
        "\n[[subsystems.namespaces]]\nnsid = 1\nram_size = \"16M\"\n\n\
         [[subsystems.namespaces]]\nnsid = 2\nram_size = \"1M\"\nfaults = [\n\
         {{ slba = 0, blocks = 8, on = \"read\", error = \"eio\" }},\n\
         {{ slba = 64, blocks = 8, on = \"read\", latency_ms = 30 }},\n]\n\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"
    );
    let config = one_subsystem(port, &global, (SUBNQN, HOSTNQN), &namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    daemon.wait_until("control socket", Duration::from_secs(10), || {
        socket.exists()
    });
    let metrics_address: SocketAddr = ([127, 0, 0, 1], metrics_port).into();

    // Before any host connected, every configured namespace, subsystem and port has its
    // series, at zero.
    let samples = parse_text(&scrape_text_and_promtool(metrics_address));
    for nsid in ["1", "2"] {
        for class in ["read", "write", "flush", "other"] {
            let labels = [("subsystem", SUBNQN), ("nsid", nsid), ("class", class)];
            for name in [
                "nvmfd_namespace_commands_total",
                "nvmfd_namespace_bytes_total",
                "nvmfd_namespace_latency_seconds_count",
                "nvmfd_namespace_backend_latency_seconds_count",
            ] {
                assert_eq!(
                    value(&samples, name, &labels),
                    Some(0.0),
                    "{name} {labels:?}"
                );
            }
        }
        let labels = [("subsystem", SUBNQN), ("nsid", nsid)];
        let name = "nvmfd_namespace_backend_errors_total";
        assert_eq!(
            value(&samples, name, &labels),
            Some(0.0),
            "{name} {labels:?}"
        );
    }
    let sub = [("subsystem", SUBNQN)];
    assert_eq!(
        value(&samples, "nvmfd_subsystem_backend_errors_total", &sub),
        Some(0.0)
    );
    // The port's series too (its queue gauge may count the fixture's probe of the listener).
    let port_labels = [("port", "1"), ("transport", "tcp")];
    assert!(value(&samples, "nvmfd_port_queues", &port_labels).is_some());
    let port_reads = [("port", "1"), ("transport", "tcp"), ("class", "read")];
    assert_eq!(
        value(&samples, "nvmfd_port_commands_total", &port_reads),
        Some(0.0)
    );

    let (mut admin, cntlid) = fixture::connect(
        address,
        ClientOptions::default(),
        (0, 0xffff, 30_000),
        (SUBNQN, HOSTNQN, [7; 16]),
    )
    .expect("Connect admin");
    admin.enable_controller(Duration::from_secs(5)).unwrap();
    let (mut io, _) = fixture::connect(
        address,
        ClientOptions::default(),
        (1, cntlid, 30_000),
        (SUBNQN, HOSTNQN, [7; 16]),
    )
    .expect("Connect I/O");

    // 40 writes of 4 KiB, 25 reads of 8 KiB (pipelined, so some are in flight together),
    // 3 flushes, 1 read of a namespace that does not exist.
    let cids: Vec<u16> = (0..40u32)
        .map(|i| {
            io.submit(
                Client::write_sqe(1, u64::from(i) * 8, 8, false),
                DataOut::Write(pattern(4096, i)),
            )
            .unwrap()
        })
        .collect();
    for cid in cids {
        assert!(io.wait(cid).unwrap().cqe.status.is_success());
    }
    let cids: Vec<u16> = (0..25u64)
        .map(|i| {
            io.submit(Client::read_sqe(1, i * 16, 16), DataOut::Read(8192))
                .unwrap()
        })
        .collect();
    for cid in cids {
        assert!(io.wait(cid).unwrap().cqe.status.is_success());
    }
    for _ in 0..3 {
        io.flush(1).unwrap();
    }
    assert!(io.read(9, 0, 1, BLOCK).is_err(), "nsid 9 does not exist");
    // Namespace 2: three reads the backend fails, one it holds 30 ms.
    for _ in 0..3 {
        assert!(io.read(2, 0, 8, BLOCK).is_err(), "injected EIO");
    }
    io.read(2, 64, 8, BLOCK).expect("a slow read");

    // Queues publish within 100 ms of their last batch and on every tick.
    std::thread::sleep(Duration::from_millis(500));
    let text = scrape(metrics_address);
    let samples = parse_openmetrics(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let ns = |name: &str, class: &str| {
        value(
            &samples,
            name,
            &[("subsystem", SUBNQN), ("nsid", "1"), ("class", class)],
        )
        .unwrap_or_else(|| panic!("{name} {class} missing\n{text}"))
    };
    assert_eq!(ns("nvmfd_namespace_commands_total", "write"), 40.0);
    assert_eq!(ns("nvmfd_namespace_bytes_total", "write"), 40.0 * 4096.0);
    assert_eq!(ns("nvmfd_namespace_commands_total", "read"), 25.0);
    assert_eq!(ns("nvmfd_namespace_bytes_total", "read"), 25.0 * 8192.0);
    assert_eq!(ns("nvmfd_namespace_commands_total", "flush"), 3.0);
    // Every command is timed, capsule arrival to response handed to the socket.
    assert_eq!(ns("nvmfd_namespace_latency_seconds_count", "write"), 40.0);
    assert_eq!(ns("nvmfd_namespace_latency_seconds_count", "read"), 25.0);
    assert_eq!(ns("nvmfd_namespace_latency_seconds_count", "flush"), 3.0);
    assert!(ns("nvmfd_namespace_latency_seconds_sum", "write") > 0.0);
    assert!(ns("nvmfd_namespace_latency_seconds_sum", "read") > 0.0);
    // RAM completes in line: no block operation, no backend latency.
    assert_eq!(
        ns("nvmfd_namespace_backend_latency_seconds_count", "read"),
        0.0
    );
    let ns2 = |name: &str, extra: &[(&str, &str)]| {
        let mut labels = vec![("subsystem", SUBNQN), ("nsid", "2")];
        labels.extend_from_slice(extra);
        value(&samples, name, &labels).unwrap_or_else(|| panic!("{name} {labels:?}\n{text}"))
    };
    assert_eq!(ns2("nvmfd_namespace_backend_errors_total", &[]), 3.0);
    assert_eq!(
        value(
            &samples,
            "nvmfd_subsystem_backend_errors_total",
            &[("subsystem", SUBNQN)]
        ),
        Some(3.0)
    );
    // The held read: one block operation of at least 30 ms, in the (25, 50] ms bucket, and
    // the command's own latency at least as long.
    let read2 = [("class", "read")];
    assert_eq!(
        ns2("nvmfd_namespace_backend_latency_seconds_count", &read2),
        1.0
    );
    assert!(ns2("nvmfd_namespace_backend_latency_seconds_sum", &read2) >= 0.030);
    let mut bucket = read2.to_vec();
    bucket.push(("le", "0.025"));
    assert_eq!(
        ns2("nvmfd_namespace_backend_latency_seconds_bucket", &bucket),
        0.0
    );
    bucket[1] = ("le", "0.05");
    assert_eq!(
        ns2("nvmfd_namespace_backend_latency_seconds_bucket", &bucket),
        1.0
    );
    assert_eq!(ns2("nvmfd_namespace_latency_seconds_count", &read2), 4.0);
    assert!(ns2("nvmfd_namespace_latency_seconds_sum", &read2) >= 0.030);
    let cntlid_text = cntlid.to_string();
    let ctrl = [
        ("subsystem", SUBNQN),
        ("cntlid", cntlid_text.as_str()),
        ("host", HOSTNQN),
    ];
    assert_eq!(
        value(&samples, "nvmfd_controller_in_flight", &ctrl),
        Some(0.0),
        "{text}"
    );
    let mut read_ctrl = ctrl.to_vec();
    read_ctrl.push(("class", "read"));
    // The controller also saw the read of nsid 9 (Invalid Namespace, counted without one)
    // and the four of nsid 2.
    assert_eq!(
        value(&samples, "nvmfd_controller_commands_total", &read_ctrl),
        Some(30.0)
    );
    assert_eq!(
        value(
            &samples,
            "nvmfd_subsystem_errors_total",
            &[("subsystem", SUBNQN), ("status", "0x00b")]
        ),
        Some(1.0),
        "{text}"
    );
    // Unrecovered Read Error (SCT 2h, SC 81h).
    assert_eq!(
        value(
            &samples,
            "nvmfd_subsystem_errors_total",
            &[("subsystem", SUBNQN), ("status", "0x281")]
        ),
        Some(3.0),
        "{text}"
    );
    scrape_text_and_promtool(metrics_address);
    assert_eq!(
        value(
            &samples,
            "nvmfd_port_queues",
            &[("port", "1"), ("transport", "tcp")]
        ),
        Some(2.0)
    );
    assert!(value(
        &samples,
        "nvmfd_reactor_busy_seconds_total",
        &[("reactor", "0")]
    )
    .is_some());
    // Every metric the shipped Grafana dashboard queries is one the endpoint serves.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../contrib/grafana/nvmfd.json"
    ))
    .unwrap();
    let served: std::collections::BTreeSet<&str> =
        samples.iter().map(|(name, _, _)| name.as_str()).collect();
    let mut queried = 0;
    for (i, _) in dashboard.match_indices("nvmfd_") {
        let name: String = dashboard[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        queried += 1;
        assert!(
            served.contains(name.as_str()),
            "dashboard queries {name}, not served"
        );
    }
    assert!(queried > 10);

    // ctl top: one interval with no I/O, its totals the same counters.
    let out = fixture::nvmfd()
        .args(["ctl", "--socket"])
        .arg(&socket)
        .args(["top", "--once", "--json", "--interval", "0.2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &report["namespaces"][0];
    assert!(
        row["mean_latency_us"].is_null(),
        "no I/O during the interval"
    );
    assert_eq!(row["nqn"], SUBNQN);
    assert_eq!(row["nsid"], 1);
    assert_eq!(row["write_commands"], 40);
    assert_eq!(row["read_commands"], 25);
    assert_eq!(row["bytes_written"], 40 * 4096);
    assert_eq!(row["bytes_read"], 25 * 8192);
    assert_eq!(row["iops"], 0.0, "no I/O during the interval");
    let ctrl_row = &report["controllers"][0];
    assert_eq!(ctrl_row["cntlid"], cntlid);
    assert_eq!(ctrl_row["read_commands"], 30);

    // Closing the I/O queue keeps its counts (they move to its controller's closed total).
    drop(io);
    std::thread::sleep(Duration::from_millis(300));
    let samples = parse_openmetrics(&scrape(metrics_address)).unwrap();
    assert_eq!(
        value(
            &samples,
            "nvmfd_namespace_commands_total",
            &[("subsystem", SUBNQN), ("nsid", "1"), ("class", "write")]
        ),
        Some(40.0)
    );
    drop(admin);
    let (status, _, log) = daemon.terminate();
    assert!(status.success(), "{log}");
}

#[test]
fn ctl_top_says_when_metrics_are_off() {
    let dir = TempDir::new("metrics-off");
    let port = free_port();
    let socket = dir.join("control.sock");
    let global = format!("control_socket = \"{}\"", socket.display());
    let namespaces = "\n[[subsystems.namespaces]]\nnsid = 1\nram_size = \"1M\"\n";
    let config = one_subsystem(port, &global, (SUBNQN, HOSTNQN), namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    daemon.wait_for_listener(([127, 0, 0, 1], port).into(), Duration::from_secs(10));
    daemon.wait_until("control socket", Duration::from_secs(10), || {
        socket.exists()
    });
    let out = fixture::nvmfd()
        .args(["ctl", "--socket"])
        .arg(&socket)
        .args(["top", "--once", "--interval", "0.1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("metrics are off"), "{stderr}");
    daemon.terminate();
}

/// A scrape with 1,000 controllers connected (1,000 admin queues on loopback, each its own
/// controller): every controller has its series, and the time of each scrape is printed
/// (`cargo test -p nvmfd --test metrics thousand -- --nocapture`), not asserted — timings on
/// a shared machine are the benchmark's business, not a test's.
#[test]
fn scrape_with_a_thousand_controllers() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const CONTROLLERS: usize = 1000;
    // Both ends of 1,000 connections (this process and the daemon, which inherits the limit).
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let want = (CONTROLLERS as u64 + 256).max(soft);
    if hard < want {
        eprintln!("RLIMIT_NOFILE hard limit {hard} < {want}: 1,000-controller scrape skipped");
        return;
    }
    setrlimit(Resource::RLIMIT_NOFILE, want, hard).unwrap();

    let dir = TempDir::new("metrics-scale");
    let port = free_port();
    let metrics_port = free_port();
    let namespaces = format!(
        "\n[[subsystems.namespaces]]\nnsid = 1\nram_size = \"1M\"\n\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"
    );
    let config = one_subsystem(port, "", (SUBNQN, HOSTNQN), &namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    let metrics_address: SocketAddr = ([127, 0, 0, 1], metrics_port).into();

    let started = std::time::Instant::now();
    let admins: Vec<Client> = (0..CONTROLLERS)
        .map(|i| {
            fixture::connect(
                address,
                ClientOptions::default(),
                (0, 0xffff, 120_000),
                (SUBNQN, HOSTNQN, [7; 16]),
            )
            .unwrap_or_else(|e| panic!("Connect of admin queue {i}: {e}"))
            .0
        })
        .collect();
    eprintln!(
        "{CONTROLLERS} controllers connected in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    // Each queue publishes on its reactor's next tick (≤ 100 ms).
    std::thread::sleep(Duration::from_millis(500));

    for (format, accept, content_type) in [
        (
            "OpenMetrics",
            Some(PROMETHEUS_ACCEPT),
            "application/openmetrics-text",
        ),
        ("text 0.0.4", None, "text/plain; version=0.0.4"),
    ] {
        let mut times = Vec::new();
        let mut body = String::new();
        let cpu_before = endpoint_cpu_ms(daemon.pid());
        for _ in 0..10 {
            let t = std::time::Instant::now();
            body = get(metrics_address, accept, content_type);
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let cpu = endpoint_cpu_ms(daemon.pid()) - cpu_before;
        times.sort_by(f64::total_cmp);
        eprintln!(
            "scrape with {CONTROLLERS} controllers ({format}): {} bytes, {} lines; \
             min {:.1} ms, median {:.1} ms, max {:.1} ms (10 scrapes); the endpoint \
             thread's CPU time {:.1} ms a scrape",
            body.len(),
            body.lines().count(),
            times[0],
            times[times.len() / 2],
            times[times.len() - 1],
            cpu / 10.0
        );
        let in_flight = body
            .lines()
            .filter(|l| l.starts_with("nvmfd_controller_in_flight{"))
            .count();
        assert_eq!(in_flight, CONTROLLERS, "one series per controller");
        assert!(
            body.contains("nvmfd_port_queues{port=\"1\",transport=\"tcp\"} 1000"),
            "1000 open queues"
        );
    }
    drop(admins);
    daemon.terminate();
}

/// CPU time (user + system, ms) of the daemon's metrics-http thread so far: a scrape's cost on
/// a machine whose other load stretches wall-clock times.
fn endpoint_cpu_ms(pid: u32) -> f64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "metrics-http" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // proc(5): utime and stime are fields 14 and 15, counted after the ")" of the name.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        return ticks * 1000.0 / hz;
    }
    panic!("no metrics-http thread in /proc/{pid}/task");
}
