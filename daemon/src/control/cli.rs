//! `nvmfd ctl …`: the control socket client. One request, one answer, printed as a table
//! (or as the daemon's JSON with `--json`). Exit status: see [`EXIT_STATUS`].

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::de::DeserializeOwned;

use super::proto::{
    ApplyView, ControllerView, Envelope, NamespaceView, PortView, QueueReactor, Request, Response,
    Saved, StatusView, SubsystemDetail, SubsystemView, WriteConfigView,
};

/// Exit statuses of `nvmfd ctl` and what they mean (also the manual page's EXIT STATUS).
pub const EXIT_STATUS: [(u8, &str); 4] = [
    (0, "done"),
    (EXIT_REFUSED, "the daemon refused the request (the reason is printed)"),
    (
        EXIT_FAILED,
        "the daemon could not be asked: bad arguments, no permission on the socket, a broken answer",
    ),
    (
        EXIT_NOT_RUNNING,
        "no daemon is running: nothing listens on the control socket",
    ),
];
const EXIT_REFUSED: u8 = 1;
const EXIT_FAILED: u8 = 2;
const EXIT_NOT_RUNNING: u8 = 3;

/// Generous: a reload may open and size large image files.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(150);

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Control socket (default: global.control_socket of the configuration).
    #[arg(long, short = 's', value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print the daemon's JSON answer instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Apply a change to the running daemon only. By default an applied change is also
    /// written to the configuration file, so that the next reload or restart keeps it.
    #[arg(long, global = true)]
    transient: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Version, uptime and counts.
    Status,
    /// List subsystems.
    Subsystems,
    /// One subsystem with its namespaces and controllers.
    Subsystem { nqn: String },
    /// Namespaces with their read/write counters (all subsystems, or one).
    Namespaces { nqn: Option<String> },
    /// Listening ports.
    Ports,
    /// The gateway group: members, which ANA groups each owns, lease ages.
    Gateways,
    /// Connected controllers: cntlid, host NQN and address, queues.
    Controllers { nqn: Option<String> },
    /// Live IOPS, MiB/s, mean and p99 latency per namespace and controller, every interval
    /// (needs `[metrics]` in the configuration).
    Top {
        /// Seconds between reports.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// One report (over one interval), then exit.
        #[arg(long)]
        once: bool,
    },
    /// Add a namespace to a subsystem (live; hosts get a Namespace Attribute Changed AEN).
    AddNamespace {
        nqn: String,
        #[arg(long)]
        nsid: u32,
        /// RAM-backed namespace of this size ("1G").
        #[arg(long, conflicts_with = "path", required_unless_present = "path")]
        ram_size: Option<String>,
        /// Regular file or block device.
        #[arg(long)]
        path: Option<PathBuf>,
        /// Create or extend the file at --path to this size.
        #[arg(long, requires = "path")]
        size: Option<String>,
        #[arg(long, default_value_t = 512)]
        block_size: u32,
        #[arg(long)]
        read_only: bool,
        /// Buffered I/O instead of O_DIRECT.
        #[arg(long)]
        buffered: bool,
        #[arg(long)]
        uuid: Option<String>,
        #[arg(long)]
        nguid: Option<String>,
        /// Show the namespace to this host NQN only (repeat for several); default: every
        /// host the subsystem admits.
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
    /// Remove a namespace (live).
    RemoveNamespace { nqn: String, nsid: u32 },
    /// Show a namespace to the given hosts only, or with --all to every admitted host (live;
    /// hosts whose view changes get a Namespace Attribute Changed AEN).
    SetNamespaceHosts {
        nqn: String,
        nsid: u32,
        /// A host NQN that sees the namespace (repeat for several).
        #[arg(long = "host", required_unless_present = "all")]
        hosts: Vec<String>,
        #[arg(long, conflicts_with = "hosts")]
        all: bool,
    },
    /// Allow a host NQN on a subsystem.
    AddHost { nqn: String, host: String },
    /// Disallow a host NQN (removing the last one does not open the subsystem to all); its
    /// live controllers are disconnected.
    RemoveHost { nqn: String, host: String },
    /// Set or rotate a host's DH-HMAC-CHAP keys live (allows the host if it was not; without
    /// keys, the host is allowed without authentication). A key on the command line is
    /// visible to other local users: prefer --key-file / --ctrl-key-file (mode 0600).
    SetHostKey {
        nqn: String,
        host: String,
        /// The host's secret, DHHC-1:… (nvme gen-dhchap-key).
        #[arg(long, conflicts_with = "key_file")]
        key: Option<String>,
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// The controller's secret (bidirectional authentication).
        #[arg(long, conflicts_with = "ctrl_key_file")]
        ctrl_key: Option<String>,
        #[arg(long)]
        ctrl_key_file: Option<PathBuf>,
        /// Allowed hashes, most preferred first: hmac(sha256),hmac(sha384),hmac(sha512).
        #[arg(long, value_delimiter = ',')]
        hashes: Vec<String>,
        /// Allowed DH groups, most preferred first: ffdhe2048,…,ffdhe8192,null.
        #[arg(long, value_delimiter = ',')]
        dhgroups: Vec<String>,
    },
    /// Add or replace a host's TLS PSK live (`[[tls_keys]]`): new TLS connections use it,
    /// established ones continue with theirs.
    SetTlsKey {
        /// The host NQN of the PSK identities the key answers.
        host: String,
        /// The key in the interchange format (nvme gen-tls-key), owner-only (mode 0600).
        #[arg(long)]
        key_file: PathBuf,
        /// Only for this subsystem (default: every subsystem).
        #[arg(long)]
        subsystem: Option<String>,
        /// HKDF-Expand-Label encoding of the key's creator: compat (nvme-cli 2.13) or rfc8446.
        #[arg(long, default_value = "compat")]
        hkdf_label: String,
    },
    /// Remove a host's TLS PSK live (established connections continue).
    RemoveTlsKey {
        host: String,
        #[arg(long)]
        subsystem: Option<String>,
    },
    /// Add a listening port (TCP ports start listening at once).
    AddPort {
        id: u16,
        #[arg(long, default_value = "tcp")]
        transport: String,
        #[arg(long)]
        address: String,
        #[arg(long, default_value_t = 4420)]
        service: u32,
    },
    /// Remove a port.
    RemovePort { id: u16 },
    /// Set an ANA group's state (live; hosts get an ANA change notice): on one port with
    /// --port, else on every port. STATE: optimized, non-optimized, inaccessible,
    /// persistent-loss, change.
    SetAnaState {
        group: u32,
        state: String,
        #[arg(long)]
        port: Option<u16>,
    },
    /// Set the QoS limits of a namespace (--nsid, all hosts together) or of a host (--host,
    /// all its queues) live; every limit 0 (or absent) removes them. No host reconnects.
    SetQos {
        nqn: String,
        #[arg(long, conflicts_with = "host", required_unless_present = "host")]
        nsid: Option<u32>,
        /// Host NQN.
        #[arg(long)]
        host: Option<String>,
        /// Commands per second (read and write together).
        #[arg(long, default_value_t = 0)]
        iops: u64,
        /// Read MiB/s.
        #[arg(long, default_value_t = 0)]
        read_mbps: u64,
        /// Write MiB/s.
        #[arg(long, default_value_t = 0)]
        write_mbps: u64,
        /// Read and write MiB/s together.
        #[arg(long, default_value_t = 0)]
        total_mbps: u64,
        /// Burst allowance, milliseconds of each rate (0: the default, 100; at least 5).
        #[arg(long, default_value_t = 0)]
        burst_ms: u32,
    },
    /// QoS limits with the IOPS and MiB/s each admitted and the commands it held back over
    /// an interval.
    Qos {
        nqn: Option<String>,
        /// Seconds between the two samples.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Re-read the configuration file (as SIGHUP), report the outcome.
    Reload,
    /// Write the running configuration as TOML (default: the file it was loaded from).
    WriteConfig { path: Option<PathBuf> },
}

#[derive(Debug, thiserror::Error)]
enum CtlError {
    #[error("{0}")]
    Usage(String),
    #[error(
        "nvmfd is not running: nothing listens on {} ({source}); start it with \
         `systemctl start nvmfd` and see `systemctl status nvmfd`, or name the socket of \
         another daemon with --socket PATH (or --config FILE)",
        path.display()
    )]
    NotRunning {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket: {0}")]
    Io(#[source] std::io::Error),
    #[error("unexpected answer from nvmfd: {0}")]
    Answer(String),
    #[error("{0}")]
    Refused(String),
}

impl CtlError {
    fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CtlError::Refused(_) => EXIT_REFUSED,
            CtlError::NotRunning { .. } => EXIT_NOT_RUNNING,
            _ => EXIT_FAILED,
        })
    }
}

fn absolute(path: PathBuf) -> PathBuf {
    if path.is_absolute() {
        return path;
    }
    std::env::current_dir().map_or(path.clone(), |cwd| cwd.join(path))
}

fn size(key: &str, text: &str) -> Result<conf::ByteSize, CtlError> {
    conf::ByteSize::parse(text).map_err(|e| CtlError::Usage(format!("{key} {text}: {e}")))
}

fn transport(text: &str) -> Result<conf::Transport, CtlError> {
    match text {
        "tcp" => Ok(conf::Transport::Tcp),
        "rdma" => Ok(conf::Transport::Rdma),
        other => Err(CtlError::Usage(format!("--transport {other}: tcp or rdma"))),
    }
}

fn ana_state(text: &str) -> Result<conf::multipath::AnaState, CtlError> {
    // The names of the configuration file (kebab-case), parsed by the same serde definition.
    serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|_| {
        CtlError::Usage(format!(
            "ANA state {text}: optimized, non-optimized, inaccessible, persistent-loss or change"
        ))
    })
}

fn request(command: CtlCommand) -> Result<Request, CtlError> {
    Ok(match command {
        CtlCommand::Status => Request::Status,
        CtlCommand::Subsystems => Request::Subsystems,
        CtlCommand::Subsystem { nqn } => Request::Subsystem { nqn },
        CtlCommand::Namespaces { nqn } => Request::Namespaces { nqn },
        CtlCommand::Ports => Request::Ports,
        CtlCommand::Gateways => Request::Gateways,
        CtlCommand::Controllers { nqn } => Request::Controllers { nqn },
        CtlCommand::Top { .. } => Request::Top,
        CtlCommand::AddNamespace {
            nqn,
            nsid,
            ram_size,
            path,
            size: file_size,
            block_size,
            read_only,
            buffered,
            uuid,
            nguid,
            hosts,
        } => {
            // Built from `new_ram` so that keys added to the schema keep their defaults.
            let mut namespace = conf::Namespace::new_ram(nsid, conf::ByteSize(0));
            namespace.ram_size = ram_size.map(|s| size("--ram-size", &s)).transpose()?;
            namespace.path = path.map(absolute);
            namespace.size = file_size.map(|s| size("--size", &s)).transpose()?;
            namespace.block_size = block_size;
            namespace.read_only = read_only;
            namespace.direct_io = !buffered;
            namespace.uuid = uuid;
            namespace.nguid = nguid;
            namespace.hosts = (!hosts.is_empty()).then_some(hosts);
            Request::AddNamespace {
                nqn,
                namespace: Box::new(namespace),
            }
        }
        CtlCommand::RemoveNamespace { nqn, nsid } => Request::RemoveNamespace { nqn, nsid },
        CtlCommand::SetNamespaceHosts {
            nqn,
            nsid,
            hosts,
            all,
        } => Request::SetNamespaceHosts {
            nqn,
            nsid,
            hosts: (!all).then_some(hosts),
        },
        CtlCommand::AddHost { nqn, host } => Request::AddHost { nqn, host },
        CtlCommand::RemoveHost { nqn, host } => Request::RemoveHost { nqn, host },
        CtlCommand::SetHostKey {
            nqn,
            host,
            key,
            key_file,
            ctrl_key,
            ctrl_key_file,
            hashes,
            dhgroups,
        } => {
            let mut entry = conf::Host::new(host);
            entry.dhchap_key = key;
            entry.dhchap_key_file = key_file.map(absolute);
            entry.dhchap_ctrl_key = ctrl_key;
            entry.dhchap_ctrl_key_file = ctrl_key_file.map(absolute);
            entry.dhchap_hashes = hashes;
            entry.dhchap_dhgroups = dhgroups;
            Request::SetHostKey { nqn, host: entry }
        }
        CtlCommand::SetTlsKey {
            host,
            key_file,
            subsystem,
            hkdf_label,
        } => Request::SetTlsKey {
            key: conf::TlsKey {
                host,
                subsystem,
                key_file: absolute(key_file),
                hkdf_label: match hkdf_label.as_str() {
                    "compat" => conf::HkdfLabel::Compat,
                    "rfc8446" => conf::HkdfLabel::Rfc8446,
                    other => {
                        return Err(CtlError::Usage(format!(
                            "--hkdf-label {other}: compat or rfc8446"
                        )))
                    }
                },
            },
        },
        CtlCommand::RemoveTlsKey { host, subsystem } => Request::RemoveTlsKey { host, subsystem },
        CtlCommand::AddPort {
            id,
            transport: t,
            address,
            service,
        } => Request::AddPort {
            port: conf::Port {
                id,
                transport: transport(&t)?,
                address,
                service,
                // A TLS port needs keys held from start-up: configured in the file only.
                tls: conf::TlsPolicy::None,
            },
        },
        CtlCommand::RemovePort { id } => Request::RemovePort { id },
        CtlCommand::SetAnaState { group, state, port } => Request::SetAnaState {
            group,
            state: ana_state(&state)?,
            port,
        },
        CtlCommand::SetQos {
            nqn,
            nsid,
            host,
            iops,
            read_mbps,
            write_mbps,
            total_mbps,
            burst_ms,
        } => Request::SetQos {
            nqn,
            nsid,
            host,
            qos: conf::Qos {
                iops,
                read_mbps,
                write_mbps,
                total_mbps,
                burst_ms,
            },
        },
        CtlCommand::Qos { nqn, .. } => Request::Qos { nqn },
        CtlCommand::Reload => Request::Reload,
        CtlCommand::WriteConfig { path } => Request::WriteConfig {
            path: path.map(absolute),
        },
    })
}

/// `--socket`, else `global.control_socket` of the configuration nvmfd would load, else the
/// built-in default.
fn socket_path(explicit: Option<PathBuf>, config: Option<&Path>) -> PathBuf {
    explicit.unwrap_or_else(|| {
        let resolved = conf::resolve_path(config);
        conf::Config::load(resolved.as_deref())
            .map(|c| c.global.control_socket)
            .unwrap_or_else(|_| conf::Global::default().control_socket)
    })
}

fn exchange(path: &Path, request: &Envelope) -> Result<Response, CtlError> {
    let stream = UnixStream::connect(path).map_err(|source| {
        let path = path.to_owned();
        // No socket file, or a socket left behind with nobody accepting on it.
        match source.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                CtlError::NotRunning { path, source }
            }
            _ => CtlError::Connect { path, source },
        }
    })?;
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(CtlError::Io)?;
    let mut line = serde_json::to_vec(request).map_err(|e| CtlError::Answer(e.to_string()))?;
    line.push(b'\n');
    // A refused peer is answered and closed before its request is read: the write then fails
    // with EPIPE, but the refusal is waiting to be read.
    let sent = (&stream).write_all(&line);
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(CtlError::Io)?;
    if answer.is_empty() {
        sent.map_err(CtlError::Io)?;
        return Err(CtlError::Answer(
            "connection closed without an answer".into(),
        ));
    }
    serde_json::from_str(&answer).map_err(|e| CtlError::Answer(e.to_string()))
}

pub fn run(args: CtlArgs, config: Option<&Path>) -> ExitCode {
    let json = args.json;
    if let CtlCommand::Top { interval, once } = args.command {
        return top(socket_path(args.socket, config), interval, once, json);
    }
    if let CtlCommand::Qos { nqn, interval } = args.command {
        return qos(socket_path(args.socket, config), nqn, interval, json);
    }
    let request = match request(args.command) {
        Ok(request) => request,
        Err(e) => {
            eprintln!("nvmfd ctl: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let path = socket_path(args.socket, config);
    let envelope = Envelope {
        request,
        transient: args.transient,
    };
    let response = match exchange(&path, &envelope) {
        Ok(response) => response,
        Err(e) => {
            eprintln!("nvmfd ctl: {e}");
            return e.exit_code();
        }
    };
    if json {
        match serde_json::to_string_pretty(&response) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("nvmfd ctl: {e}");
                return ExitCode::from(EXIT_FAILED);
            }
        }
        return if response.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if !response.ok {
        eprintln!(
            "nvmfd ctl: {}",
            response.error.as_deref().unwrap_or("refused")
        );
        return ExitCode::FAILURE;
    }
    match render(&envelope.request, response.result) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvmfd ctl: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `ctl qos`: two `qos` requests `interval` apart, printed as rates.
fn qos(path: PathBuf, nqn: Option<String>, interval: f64, json: bool) -> ExitCode {
    if !(interval.is_finite() && (0.1..=3600.0).contains(&interval)) {
        eprintln!("nvmfd ctl: --interval {interval}: 0.1..=3600 seconds");
        return ExitCode::from(2);
    }
    let envelope = Envelope {
        request: Request::Qos { nqn },
        transient: false,
    };
    let fetch = || -> Result<(Vec<super::proto::QosView>, Instant), (CtlError, ExitCode)> {
        let response = exchange(&path, &envelope).map_err(|e| (e, ExitCode::from(2)))?;
        if !response.ok {
            let refused = response.error.unwrap_or_else(|| "refused".to_owned());
            return Err((CtlError::Refused(refused), ExitCode::FAILURE));
        }
        let views = decode(response.result).map_err(|e| (e, ExitCode::from(2)))?;
        Ok((views, Instant::now()))
    };
    let sampled = fetch().and_then(|first| {
        std::thread::sleep(Duration::from_secs_f64(interval));
        fetch().map(|second| (first, second))
    });
    let ((before, t0), (now, t1)) = match sampled {
        Ok(s) => s,
        Err((e, code)) => {
            eprintln!("nvmfd ctl: {e}");
            return code;
        }
    };
    let secs = (t1 - t0).as_secs_f64();
    let rows = super::qos::rates(&before, now, secs);
    if json {
        match serde_json::to_string_pretty(&rows) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("nvmfd ctl: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", super::qos::render(&rows, secs));
    }
    ExitCode::SUCCESS
}

/// `ctl top`: two or more `top` requests, printed as rates (JSON lines with `--json`).
fn top(path: PathBuf, interval: f64, once: bool, json: bool) -> ExitCode {
    if !(interval.is_finite() && (0.1..=3600.0).contains(&interval)) {
        eprintln!("nvmfd ctl: --interval {interval}: 0.1..=3600 seconds");
        return ExitCode::from(EXIT_FAILED);
    }
    let envelope = Envelope {
        request: Request::Top,
        transient: false,
    };
    let fetch = || -> Result<super::proto::TopView, (CtlError, ExitCode)> {
        let response = exchange(&path, &envelope).map_err(|e| {
            let code = e.exit_code();
            (e, code)
        })?;
        if !response.ok {
            let refused = response.error.unwrap_or_else(|| "refused".to_owned());
            return Err((CtlError::Refused(refused), ExitCode::FAILURE));
        }
        decode(response.result).map_err(|e| (e, ExitCode::from(EXIT_FAILED)))
    };
    let interactive = !once && !json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let show = |r: &super::top::Report| {
        if json {
            match serde_json::to_string(r) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("nvmfd ctl: {e}"),
            }
        } else if interactive {
            // Clear the screen and home the cursor, as top does.
            print!("\x1b[2J\x1b[H{}", super::top::render(r));
        } else {
            println!("{}", super::top::render(r));
        }
        let _ = std::io::stdout().flush();
    };
    match super::top::run(Duration::from_secs_f64(interval), once, fetch, show) {
        Ok(()) => ExitCode::SUCCESS,
        Err((e, code)) => {
            eprintln!("nvmfd ctl: {e}");
            code
        }
    }
}

fn decode<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, CtlError> {
    serde_json::from_value(value).map_err(|e| CtlError::Answer(e.to_string()))
}

/// The human-readable form of a result.
fn render(request: &Request, result: serde_json::Value) -> Result<String, CtlError> {
    Ok(match request {
        Request::Status => {
            let s: StatusView = decode(result)?;
            let config = s
                .config_path
                .as_ref()
                .map_or_else(|| "<built-in>".to_owned(), |p| p.display().to_string());
            format!(
                "nvmfd {} (pid {}), up {}\nconfiguration: {config}\n\
                 subsystems: {}  namespaces: {}  ports: {}\n\
                 controllers: {}  connections: {}  discovery genctr: {}\n\
                 failed authentications: {}\n",
                s.version,
                s.pid,
                duration(s.uptime_secs),
                s.subsystems,
                s.namespaces,
                s.ports,
                s.controllers,
                s.connections,
                s.discovery_genctr,
                s.auth_failures
            )
        }
        Request::Subsystems => subsystem_table(&decode::<Vec<SubsystemView>>(result)?),
        Request::Subsystem { .. } => {
            let d: SubsystemDetail = decode(result)?;
            let s = &d.subsystem;
            let hosts = if s.allow_any_host {
                "any".to_owned()
            } else if s.allowed_hosts.is_empty() {
                "none".to_owned()
            } else {
                s.allowed_hosts.join(", ")
            };
            format!(
                "nqn: {}\nserial: {}\nmodel: {}\nhosts: {hosts}\nports: {}\n\nnamespaces:\n{}\ncontrollers:\n{}",
                s.nqn,
                s.serial,
                s.model,
                port_list(&s.ports),
                namespace_table(&d.namespace_list),
                controller_table(&d.controller_list)
            )
        }
        Request::Namespaces { .. } => namespace_table(&decode::<Vec<NamespaceView>>(result)?),
        Request::Ports => port_table(&decode::<Vec<PortView>>(result)?),
        Request::Gateways => gateway_view(&decode::<crate::gateway::lease::View>(result)?),
        Request::Controllers { .. } => controller_table(&decode::<Vec<ControllerView>>(result)?),
        Request::WriteConfig { .. } => {
            let w: WriteConfigView = decode(result)?;
            format!("wrote {} bytes to {}\n", w.bytes, w.path.display())
        }
        _ => {
            let a: ApplyView = decode(result)?;
            let saved = match a.saved {
                None => String::new(),
                Some(Saved::Written { path }) => format!("saved to {}\n", path.display()),
                Some(Saved::Transient) => {
                    "not saved (--transient): the next reload or restart undoes it\n".to_owned()
                }
                Some(Saved::Failed { reason }) => {
                    format!("NOT saved: {reason}\nthe next reload or restart undoes it\n")
                }
            };
            format!("applied: {}\n{saved}", a.summary)
        }
    })
}

fn port_list(ports: &[u16]) -> String {
    if ports.is_empty() {
        "all".to_owned()
    } else {
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// 1536 → "1.5K"; binary units as in the configuration file.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}")
    } else if value.fract() == 0.0 {
        format!("{value:.0}{}", UNITS[unit])
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn subsystem_table(list: &[SubsystemView]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.nqn.clone(),
                s.namespaces.to_string(),
                s.controllers.to_string(),
                if s.allow_any_host {
                    "any".to_owned()
                } else {
                    s.allowed_hosts.len().to_string()
                },
                port_list(&s.ports),
                s.serial.clone(),
            ]
        })
        .collect();
    table(&["NQN", "NS", "CTRLS", "HOSTS", "PORTS", "SERIAL"], &rows)
}

fn namespace_table(list: &[NamespaceView]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|n| {
            vec![
                n.nqn.clone(),
                n.nsid.to_string(),
                n.backend.clone(),
                human(n.size_bytes),
                n.block_size.to_string(),
                if n.read_only { "ro" } else { "rw" }.to_owned(),
                n.read_commands.to_string(),
                n.write_commands.to_string(),
                human(n.bytes_read),
                human(n.bytes_written),
                n.path
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |p| p.display().to_string()),
            ]
        })
        .collect();
    table(
        &[
            "NQN", "NSID", "BACKEND", "SIZE", "BS", "MODE", "READS", "WRITES", "READ", "WRITTEN",
            "PATH",
        ],
        &rows,
    )
}

fn gateway_view(v: &crate::gateway::lease::View) -> String {
    let ms =
        |m: Option<u64>| m.map_or_else(|| "-".to_owned(), |m| format!("{:.1}s", m as f64 / 1e3));
    let members: Vec<Vec<String>> = v
        .members
        .iter()
        .map(|m| {
            let owns: Vec<String> = v
                .groups
                .iter()
                .filter(|g| g.owner_client.as_deref() == Some(m.client.as_str()))
                .map(|g| g.group.to_string())
                .collect();
            vec![
                m.gateway.clone(),
                m.client.clone(),
                m.addr.clone(),
                ms(m.up_ms),
                if owns.is_empty() {
                    "-".to_owned()
                } else {
                    owns.join(",")
                },
            ]
        })
        .collect();
    let groups: Vec<Vec<String>> = v
        .groups
        .iter()
        .map(|g| {
            vec![
                g.group.to_string(),
                g.owner.clone().unwrap_or_else(|| "-".to_owned()),
                g.preferred.clone().unwrap_or_else(|| "-".to_owned()),
                ms(g.held_ms),
                g.role.clone(),
                g.state.clone(),
                ms(g.lease_age_ms),
            ]
        })
        .collect();
    format!(
        "this gateway: {} ({} at {}){}; survey {} ago; takeovers {}, fenced {}, handbacks {}, losses {}\n\nmembers:\n{}\nANA groups:\n{}",
        v.gateway,
        v.client,
        v.addr,
        if v.fenced { ", FENCED" } else { "" },
        ms(v.survey_age_ms),
        v.takeovers,
        v.fences,
        v.handbacks,
        v.losses,
        table(&["GATEWAY", "CLIENT", "ADDRESS", "UP", "OWNS"], &members),
        table(
            &["GROUP", "OWNER", "PREFERRED", "HELD", "ROLE HERE", "STATE HERE", "LEASE AGE"],
            &groups
        )
    )
}

fn port_table(list: &[PortView]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.transport.clone(),
                p.address.clone(),
                p.service.to_string(),
                p.controllers.to_string(),
                p.subsystems.join(","),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "TRANSPORT",
            "ADDRESS",
            "SERVICE",
            "CTRLS",
            "SUBSYSTEMS",
        ],
        &rows,
    )
}

fn controller_table(list: &[ControllerView]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            vec![
                c.nqn.clone(),
                c.cntlid.to_string(),
                c.host_nqn.clone(),
                c.host_address.clone(),
                c.transport.clone(),
                c.port_id.to_string(),
                c.queues.to_string(),
                format!("{}s", c.kato_ms / 1000),
                reactor_list(&c.queue_reactors),
            ]
        })
        .collect();
    table(
        &[
            "NQN",
            "CNTLID",
            "HOST NQN",
            "HOST ADDRESS",
            "TRANSPORT",
            "PORT",
            "QUEUES",
            "KATO",
            "REACTORS",
        ],
        &rows,
    )
}

/// `qid:reactor` per queue, admin queue first ("-" for a reactor not known).
fn reactor_list(queues: &[QueueReactor]) -> String {
    let list: Vec<String> = queues
        .iter()
        .map(|q| match q.reactor {
            Some(r) => format!("{}:{r}", q.qid),
            None => format!("{}:-", q.qid),
        })
        .collect();
    list.join(" ")
}

#[cfg(test)]
mod tests;
