//! `[metrics]`: command counters and latencies, read by `nvmfd ctl top` and, with `listen`,
//! served over HTTP (`GET /metrics`, OpenMetrics or the Prometheus text format) from a thread of
//! its own, off the data path.
//!
//! Off by default: counting and timing cost some 6–8 % of the target's user-space instructions
//! per I/O (docs/monitoring.md).

use serde::{Deserialize, Serialize};

use crate::report::Errors;

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Count commands even without `listen` (for `nvmfd ctl top` only).
    pub enabled: bool,
    /// `address:port` of the HTTP endpoint, e.g. "127.0.0.1:9469" (implies `enabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

impl Metrics {
    /// Whether every key is at its default (the section is then omitted from `to_toml`).
    pub fn is_default(&self) -> bool {
        *self == Metrics::default()
    }

    /// Whether commands are counted.
    pub fn counting(&self) -> bool {
        self.enabled || self.listen.is_some()
    }

    /// The endpoint's address (validated by `check`).
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listen.as_deref().and_then(|l| l.parse().ok())
    }
}

/// Every problem with `[metrics]`, each naming its key.
pub(crate) fn check(metrics: &Metrics, errors: &mut Errors) {
    if let Some(listen) = &metrics.listen {
        if listen.parse::<std::net::SocketAddr>().is_err() {
            errors.push(
                "metrics.listen",
                listen,
                "must be address:port, e.g. \"127.0.0.1:9469\" or \"[::1]:9469\"",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, EMBEDDED_DEFAULT};

    fn with(section: &str) -> Config {
        toml::from_str(&format!("{EMBEDDED_DEFAULT}\n{section}")).unwrap()
    }

    #[test]
    fn off_by_default_and_listen_must_be_an_address() {
        let c = with("");
        assert!(!c.metrics.counting());
        let c = with("[metrics]\nlisten = \"127.0.0.1:9469\"\n");
        assert!(c.metrics.counting());
        assert_eq!(c.metrics.listen_addr().unwrap().port(), 9469);
        c.validate().unwrap();
        let c = with("[metrics]\nlisten = \"localhost\"\n");
        let errors = c.validate().unwrap_err();
        assert!(errors
            .iter()
            .any(|e| e.to_string().contains("metrics.listen")));
        assert!(toml::from_str::<Config>("[metrics]\nlisen = \"x\"\n").is_err());
    }
}
