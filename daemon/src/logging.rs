//! Logging to stderr (journald picks it up under systemd) as text or JSON lines.
//!
//! The filter is `RUST_LOG` when set, otherwise `global.log_level`; it sits behind a reload
//! handle so that SIGHUP can apply a new `log_level` without a restart.

use std::io::IsTerminal;

use conf::LogFormat;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("log filter {directive:?}: {source}")]
    Filter {
        directive: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
    #[error("the logger is gone")]
    Gone,
}

/// Changes the active filter later (SIGHUP).
pub struct LogHandle {
    handle: reload::Handle<EnvFilter, Registry>,
    from_env: bool,
}

fn filter(directive: &str) -> Result<EnvFilter, LoggingError> {
    EnvFilter::try_new(directive).map_err(|source| LoggingError::Filter {
        directive: directive.to_owned(),
        source,
    })
}

/// Installs the global subscriber.
pub fn init(level: &str, format: LogFormat) -> Result<LogHandle, LoggingError> {
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let from_env = env.is_some();
    let (layer, handle) = reload::Layer::new(filter(env.as_deref().unwrap_or(level))?);
    let registry = tracing_subscriber::registry().with(layer);
    // Colour only for a person at a terminal: journald and log files get plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(true);
    let installed = match format {
        LogFormat::Text => registry.with(fmt).try_init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).try_init(),
    };
    installed.map_err(|_| LoggingError::AlreadyInstalled)?;
    Ok(LogHandle { handle, from_env })
}

impl LogHandle {
    /// Applies a reloaded `log_level` (ignored while `RUST_LOG` rules, which the operator set
    /// explicitly for this process). The output format cannot change without a restart.
    pub fn set_level(&self, level: &str) -> Result<(), LoggingError> {
        if self.from_env {
            return Ok(());
        }
        let new = filter(level)?;
        self.handle.reload(new).map_err(|_| LoggingError::Gone)
    }
}
