//! A new configuration made the running one (SIGHUP, a control socket edit, a gateway
//! group's ANA change): what can change live is applied, anything else is refused whole.

use super::error::error_chain;
use super::{log_topology, Server};
use crate::mapping::target_config;

/// The keys of `new` that differ from `old` and cannot change while running (marked
/// restart-only in the schema, `conf::schema::KEYS`): the `[rdma]` pool sizes are those of the
/// listeners running (RDMA ports themselves open and close live); reactors, CPUs and the limits
/// are baked into every queue; the log format into the installed logger; a TLS port's policy
/// and server are set up at start (its keys, `[[tls_keys]]`, change live); the state directory
/// is read at start.
fn restart_only_changes(old: &conf::Config, new: &conf::Config) -> Vec<&'static str> {
    conf::schema::restart_only_changes(old, new)
}

impl Server {
    /// SIGHUP: re-read and validate the file, then apply what can change live: subsystems,
    /// namespaces, hosts, referrals, TCP and RDMA listeners, ANA states, log level. A file that
    /// changes what is fixed for the life of the process (`restart_only_changes`) is refused
    /// with the list of those keys, like a file that fails validation: the running one stays
    /// untouched.
    pub(super) fn reload(&mut self) -> Result<String, String> {
        self.notifier.reloading();
        tracing::info!(path = ?self.config_path, "reloading configuration");
        let outcome = conf::Config::load(self.config_path.as_deref())
            .map_err(|e| e.to_string())
            .and_then(|new| self.apply_config(new));
        match &outcome {
            Ok(summary) => tracing::info!(%summary, "configuration reloaded"),
            Err(e) => {
                for line in e.lines() {
                    tracing::error!("reload refused: {line}");
                }
            }
        }
        let status = match outcome {
            Ok(_) => self.status_line(),
            Err(_) => format!(
                "reload failed, previous configuration kept; {}",
                self.status_line()
            ),
        };
        self.notifier.ready(&status);
        outcome
    }

    /// Makes `new` the running configuration (a reloaded file or a control socket edit):
    /// validate, map, bind new TCP listeners, `Target::apply`, move listeners. Any failure
    /// leaves the running configuration as it was.
    pub(super) fn apply_config(&mut self, new: conf::Config) -> Result<String, String> {
        let old = &self.config;
        let needs_restart = restart_only_changes(old, &new);
        if !needs_restart.is_empty() {
            // Refused rather than half-applied: reporting success while ignoring a key made the
            // operator believe e.g. a new reactor count was in force.
            return Err(format!(
                "these settings take effect only on restart (the running configuration is kept): {}",
                needs_restart.join(", ")
            ));
        }
        // Re-validate the merged result: kept ports must still satisfy the new subsystems.
        new.validate().map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        // Warned about once, when the name first appears (not at every later edit).
        for warning in new.warnings() {
            if !old.subsystems.iter().any(|s| s.nqn == warning.value) {
                tracing::warn!("{warning}");
            }
        }
        let mut mapped = nvme::target::TargetConfig {
            reservation_stores: self.reservation_stores.clone(),
            ..target_config(&new).map_err(|e| e.to_string())?
        };
        if let Some(g) = &self.gateway {
            g.overlay(&mut mapped);
        }
        // Key files are read (and refused) before anything live changes.
        let tls_keys = (old.tls_keys != new.tls_keys)
            .then(|| crate::tls::load_keys(&new.tls_keys))
            .transpose()?;
        // New TCP sockets are bound before anything live changes; on any failure below they are
        // dropped and nothing changed.
        let update = self.listener_changes(&mapped.ports)?;
        // New RDMA listeners likewise open first (on their reactors), and close again if the
        // target refuses the configuration.
        let (rdma_gone, rdma_new) = self.rdma_changes(&mapped.ports);
        let rdma_opened = self.open_rdma_listeners(rdma_new)?;
        let summary = match self.target.apply_with_opener(mapped, &storage::open) {
            Ok(summary) => summary,
            Err(e) => {
                self.close_rdma_listeners(&rdma_opened);
                return Err(error_chain(&e));
            }
        };
        if !rdma_gone.is_empty() || !rdma_opened.is_empty() {
            tracing::info!(
                removed = ?rdma_gone.iter().map(|(p, _)| p.id).collect::<Vec<_>>(),
                added = ?rdma_opened.iter().map(|(p, _)| p.id).collect::<Vec<_>>(),
                "RDMA listeners changed"
            );
        }
        self.close_rdma_listeners(&rdma_gone);
        self.rdma_placement
            .retain(|placed| !rdma_gone.contains(placed));
        self.rdma_placement.extend(rdma_opened);
        if !update.remove.is_empty() || !update.add.is_empty() {
            tracing::info!(
                removed = ?update.remove,
                added = ?update.add.iter().map(|l| l.port_id).collect::<Vec<_>>(),
                "TCP listeners changed"
            );
            if !self.handles[0].update_listeners(update) {
                return Err("reactor 0 is gone; listeners not updated".to_owned());
            }
        }
        if let Some(keys) = tls_keys {
            let count = keys.len();
            self.tls_keys.replace(keys);
            tracing::info!(
                keys = count,
                "TLS keys replaced: new handshakes use them, established sessions keep theirs"
            );
        }
        if let Err(e) = self.log.set_level(&new.global.log_level) {
            tracing::warn!(error = %e, "log_level not applied");
        }
        self.config = new;
        log_topology(&self.target);
        Ok(format!(
            "subsystems +{:?} -{:?} ~{:?}, namespaces +{:?} -{:?}, shown to other hosts {:?}, \
             QoS changed {:?}, genctr {}, ANA chgcnt {}",
            summary.subsystems_added,
            summary.subsystems_removed,
            summary.subsystems_changed,
            summary.namespaces_added,
            summary.namespaces_removed,
            summary.namespaces_visibility_changed,
            summary.qos_changed,
            summary.discovery_genctr,
            summary.ana_chgcnt
        ))
    }
}

#[cfg(test)]
mod tests;
