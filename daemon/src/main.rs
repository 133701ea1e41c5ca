//! nvmfd: NVMe-over-Fabrics target daemon.
//!
//! `nvmfd [--config PATH]` serves; `nvmfd check-config [FILE]` validates; `nvmfd import-nvmetcli FILE`
//! converts a Linux kernel target configuration; `nvmfd ctl …` talks to a running daemon
//! over its control socket. Without `--config`, `/etc/nvmfd/nvmfd.toml`
//! is used when it exists, otherwise the embedded default (a 1 GiB RAM namespace on
//! 127.0.0.1:4420).

mod auth_pool;
mod conn;
mod control;
mod gateway;
#[cfg(feature = "rbd")]
mod group_reservations;
mod health;
mod logging;
mod manual;
mod mapping;
mod metrics;
mod notify;
mod reactor;
mod server;
mod tls;
mod topology;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "nvmfd", version, about = "NVMe-over-Fabrics target daemon")]
struct Cli {
    /// Configuration file (default: /etc/nvmfd/nvmfd.toml if it exists, else built-in).
    #[arg(long, short = 'c', value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate the configuration, print every problem (file:line:column, key path, reason),
    /// exit 1 if there is any.
    CheckConfig {
        /// Configuration file (default: --config, else as for running).
        #[arg(value_name = "FILE", conflicts_with = "config")]
        file: Option<PathBuf>,
        /// Configuration file (as FILE).
        #[arg(long, short = 'c', value_name = "PATH")]
        config: Option<PathBuf>,
        /// Print the result as one JSON object: file, ok, errors and warnings (each with
        /// kind, file, line, column, env, key, value, message).
        #[arg(long)]
        json: bool,
    },
    /// Convert an `nvmetcli save` JSON file to nvmfd TOML on standard output.
    ImportNvmetcli {
        /// The saveconfig.json (usually /etc/nvmet/config.json).
        file: PathBuf,
    },
    /// Inspect or change a running nvmfd through its control socket.
    Ctl(control::cli::CtlArgs),
    /// Write the manual pages (DIR/man) and shell completions (DIR/completions).
    #[command(hide = true)]
    GenerateDocs {
        /// Output directory.
        dir: PathBuf,
    },
}

fn origin(path: Option<&Path>) -> String {
    path.map_or_else(
        || "<embedded default>".to_owned(),
        |p| p.display().to_string(),
    )
}

/// Configuration errors go to stderr one per line (`file:line:column: key: value: reason`, or
/// `NVMFD_…: key: …` for an environment override), before logging exists.
fn report_config_error(path: Option<&Path>, error: &conf::ConfError) {
    let problems = error.problems();
    if problems.is_empty() {
        eprintln!("nvmfd: {error}");
        return;
    }
    for problem in problems {
        eprintln!("{problem}");
    }
    if problems.len() > 1 {
        eprintln!("nvmfd: {} errors in {}", problems.len(), origin(path));
    }
}

fn check_config(path: Option<&Path>, json: bool) -> ExitCode {
    let checked = conf::Config::check(path, conf::EnvSource::Process);
    if json {
        let (config, errors, warnings) = match &checked {
            Ok(c) => (Some(&c.config), Vec::new(), c.warnings.clone()),
            Err(conf::ConfError::Problems(problems)) => (None, problems.clone(), Vec::new()),
            Err(other) => {
                let mut problem = serde_json::json!({
                    "kind": "unreadable", "file": origin(path), "line": null, "column": null,
                    "env": null, "key": "", "value": "", "message": other.to_string(),
                });
                if let conf::ConfError::Read { source, .. } = other {
                    problem["message"] = source.to_string().into();
                }
                let report = serde_json::json!({
                    "file": origin(path), "ok": false, "errors": [problem], "warnings": [],
                });
                println!("{report:#}");
                return ExitCode::FAILURE;
            }
        };
        let mut report = serde_json::json!({
            "file": origin(path),
            "ok": config.is_some(),
            "errors": errors,
            "warnings": warnings,
        });
        if let Some(config) = config {
            report["ports"] = config.ports.len().into();
            report["subsystems"] = config.subsystems.len().into();
            report["namespaces"] = namespace_count(config).into();
        }
        println!("{report:#}");
        return if config.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    match checked {
        Ok(checked) => {
            for warning in &checked.warnings {
                eprintln!("warning: {warning}");
            }
            let config = &checked.config;
            println!(
                "{}: OK ({} port(s), {} subsystem(s), {} namespace(s))",
                origin(path),
                config.ports.len(),
                config.subsystems.len(),
                namespace_count(config)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            report_config_error(path, &e);
            ExitCode::FAILURE
        }
    }
}

fn namespace_count(config: &conf::Config) -> usize {
    config.subsystems.iter().map(|s| s.namespaces.len()).sum()
}

fn import_nvmetcli(file: &Path) -> ExitCode {
    let json = match std::fs::read_to_string(file) {
        Ok(json) => json,
        Err(e) => {
            eprintln!("nvmfd: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    let import = match conf::Config::from_nvmetcli_json(&json) {
        Ok(import) => import,
        Err(e) => {
            eprintln!("nvmfd: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    for warning in &import.warnings {
        eprintln!("warning: {warning}");
    }
    // The file is converted either way; problems on this machine (missing devices, NQNs the
    // kernel tolerates but the spec does not) are reported so they can be fixed in the TOML.
    if let Err(errors) = import.config.validate() {
        for e in errors {
            eprintln!("warning: would not validate here: {e}");
        }
    }
    match import.config.to_toml() {
        Ok(toml) => {
            println!(
                "# Imported from {} by nvmfd import-nvmetcli",
                file.display()
            );
            print!("{toml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvmfd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: Option<PathBuf>) -> ExitCode {
    // Signals first: a SIGTERM during start-up must not be lost (nor kill us half-initialised
    // with the default action before the handlers exist).
    let signals = match server::install_signals() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("nvmfd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = match conf::Config::load(path.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            report_config_error(path.as_deref(), &e);
            return ExitCode::FAILURE;
        }
    };
    let log = match logging::init(&config.global.log_level, config.global.log_format) {
        Ok(log) => log,
        Err(e) => {
            eprintln!("nvmfd: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %origin(path.as_deref()),
        "nvmfd starting"
    );
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let notifier = match notify::Notifier::from_env() {
        Ok(notifier) => notifier,
        Err(e) => {
            tracing::error!(error = %e, "NOTIFY_SOCKET unusable");
            return ExitCode::FAILURE;
        }
    };
    if notifier.is_active() {
        tracing::info!(watchdog = ?notifier.watchdog_interval(), "systemd notification enabled");
    }
    let port_ids: Vec<u16> = config.ports.iter().map(|p| p.id).collect();
    let file = path.clone();
    let server = match server::Server::start(path, config, log, notifier) {
        Ok(server) => server,
        Err(e) => {
            // A port that cannot be opened is named where the file sets it.
            let at = e
                .port_id()
                .and_then(|id| port_ids.iter().position(|&p| p == id))
                .zip(file.as_deref())
                .and_then(|(i, file)| conf::position_of(file, &format!("ports[{i}].service")))
                .map(|position| format!("{position}: "))
                .unwrap_or_default();
            tracing::error!("{at}{}", server::error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    match server.serve(signals) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", server::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { file, config, json }) => {
            let path = file.or(config).or(cli.config);
            check_config(conf::resolve_path(path.as_deref()).as_deref(), json)
        }
        Some(Command::ImportNvmetcli { file }) => import_nvmetcli(&file),
        Some(Command::Ctl(args)) => control::cli::run(args, cli.config.as_deref()),
        Some(Command::GenerateDocs { dir }) => match manual::generate(Cli::command(), &dir) {
            Ok(paths) => {
                for path in paths {
                    println!("{}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nvmfd: {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
        None => run(conf::resolve_path(cli.config.as_deref())),
    }
}
