//! Logging to stderr (journald picks it up under systemd) as text or JSON lines.
//!
//! The filter is `RUST_LOG` when set, otherwise `global.log_level`; it sits behind a reload
//! handle so that SIGHUP can apply a new `log_level` without a restart.
//!
//! When stderr is the journal (systemd sets `$JOURNAL_STREAM` to the `device:inode` of the
//! stream it connected, sd_journal_stream_fd(3)), every line starts with the syslog priority
//! prefix `<N>` that journald parses (SyslogLevelPrefix=, on by default; sd-daemon(3)), so
//! `journalctl -p err` shows exactly the ERROR lines. A stderr redirected elsewhere by the
//! unit or the operator keeps plain lines.

use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;

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
        .with_writer(Stderr {
            journal: stderr_is_journal(),
        })
        .with_ansi(ansi)
        .with_target(true);
    let installed = match format {
        LogFormat::Text => registry.with(fmt).try_init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).try_init(),
    };
    installed.map_err(|_| LoggingError::AlreadyInstalled)?;
    Ok(LogHandle { handle, from_env })
}

/// The priority journald gives a line starting with `<N>` (syslog(3) levels; tracing has no
/// levels above ERROR, and DEBUG and TRACE both map to debug).
fn journal_priority(level: tracing::Level) -> u8 {
    match level {
        tracing::Level::ERROR => 3,
        tracing::Level::WARN => 4,
        tracing::Level::INFO => 6,
        tracing::Level::DEBUG | tracing::Level::TRACE => 7,
    }
}

/// Whether `$JOURNAL_STREAM` names the stream that stderr is (a unit may also send stderr to
/// a file while stdout stays on the journal; then the variable is set but does not match).
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(std::io::stderr().as_raw_fd()) else {
        return false;
    };
    journal_stream_matches(&value.to_string_lossy(), stat.st_dev, stat.st_ino)
}

fn journal_stream_matches(value: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.split_once(':') else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

/// stderr, with each event prefixed by its journald priority when stderr is the journal.
struct Stderr {
    journal: bool,
}

/// One formatted event: the fmt layer writes it whole, then drops the writer.
struct EventWriter {
    prefix: Option<u8>,
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        match self.prefix.take() {
            // One write for prefix and line, so lines of two threads never interleave.
            Some(p) => {
                let mut line = Vec::with_capacity(buf.len() + 3);
                line.extend_from_slice(&[b'<', b'0' + p, b'>']);
                line.extend_from_slice(buf);
                err.write_all(&line)?;
            }
            None => err.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter { prefix: None }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> EventWriter {
        EventWriter {
            prefix: self.journal.then(|| journal_priority(*meta.level())),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_follow_syslog_levels() {
        assert_eq!(journal_priority(tracing::Level::ERROR), 3);
        assert_eq!(journal_priority(tracing::Level::WARN), 4);
        assert_eq!(journal_priority(tracing::Level::INFO), 6);
        assert_eq!(journal_priority(tracing::Level::DEBUG), 7);
        assert_eq!(journal_priority(tracing::Level::TRACE), 7);
    }

    #[test]
    fn journal_stream_must_name_this_stream() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(!journal_stream_matches("8:12345", 8, 12346));
        assert!(!journal_stream_matches("9:12345", 8, 12345));
        assert!(!journal_stream_matches("812345", 8, 12345));
        assert!(!journal_stream_matches("", 8, 12345));
        assert!(!journal_stream_matches("x:y", 8, 12345));
    }
}
