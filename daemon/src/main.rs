//! nvmfd: NVMe-over-Fabrics target daemon.
//!
//! `nvmfd [--config PATH]` serves; `nvmfd check-config` validates; `nvmfd import-nvmetcli FILE`
//! converts a Linux kernel target configuration; `nvmfd ctl …` talks to a running daemon
//! over its control socket. Without `--config`, `/etc/nvmfd/nvmfd.toml`
//! is used when it exists, otherwise the embedded default (a 1 GiB RAM namespace on
//! 127.0.0.1:4420).

mod conn;
mod control;
mod gateway;
#[cfg(feature = "rbd")]
mod group_reservations;
mod health;
mod logging;
mod mapping;
mod metrics;
mod notify;
mod reactor;
mod server;
mod tls;
mod topology;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Validate the configuration, print every problem, exit 1 if there is any.
    CheckConfig {
        /// Configuration file (default: as for running).
        #[arg(long, short = 'c', value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Convert an `nvmetcli save` JSON file to nvmfd TOML on standard output.
    ImportNvmetcli {
        /// The saveconfig.json (usually /etc/nvmet/config.json).
        file: PathBuf,
    },
    /// Inspect or change a running nvmfd through its control socket.
    Ctl(control::cli::CtlArgs),
}

fn origin(path: Option<&Path>) -> String {
    path.map_or_else(
        || "<embedded default>".to_owned(),
        |p| p.display().to_string(),
    )
}

/// Configuration errors go to stderr one per line, before logging exists.
fn report_config_error(path: Option<&Path>, error: &conf::ConfError) {
    match error {
        conf::ConfError::Invalid(errors) => {
            eprintln!("nvmfd: {}: {} error(s):", origin(path), errors.len());
            for e in errors {
                eprintln!("  {e}");
            }
        }
        other => eprintln!("nvmfd: {other}"),
    }
}

fn check_config(path: Option<&Path>) -> ExitCode {
    match conf::Config::load(path) {
        Ok(config) => {
            for warning in config.warnings() {
                eprintln!("warning: {warning}");
            }
            let namespaces: usize = config.subsystems.iter().map(|s| s.namespaces.len()).sum();
            println!(
                "{}: OK ({} port(s), {} subsystem(s), {} namespace(s))",
                origin(path),
                config.ports.len(),
                config.subsystems.len(),
                namespaces
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            report_config_error(path, &e);
            ExitCode::FAILURE
        }
    }
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
    let server = match server::Server::start(path, config, log, notifier) {
        Ok(server) => server,
        Err(e) => {
            tracing::error!("{}", server::error_chain(&e));
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
        Some(Command::CheckConfig { config }) => {
            let path = config.or(cli.config);
            check_config(conf::resolve_path(path.as_deref()).as_deref())
        }
        Some(Command::ImportNvmetcli { file }) => import_nvmetcli(&file),
        Some(Command::Ctl(args)) => control::cli::run(args, cli.config.as_deref()),
        None => run(conf::resolve_path(cli.config.as_deref())),
    }
}
