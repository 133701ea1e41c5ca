//! Semantic validation: every problem in the file, each naming its key path and value.
//!
//! Deserialization already guarantees types and refuses unknown keys; each section's module
//! checks its ranges, cross-references and files, and this pass only runs them in file order.

use crate::file::Config;
use crate::report::{Errors, ValidationError};
use crate::{gateway, global, metrics, multipath, ports, rdma, subsystems, tls};

impl Config {
    /// Every problem in the configuration (ranges, cross-references, files), in file order.
    pub fn validate(&self) -> Result<(), Vec<ValidationError>> {
        let mut errors = Errors::default();
        global::check(&self.global, &mut errors);
        ports::check(&self.ports, &mut errors);
        subsystems::check(&self.subsystems, &self.ports, &mut errors);
        subsystems::check_discovery_nqn(
            &self.subsystems,
            self.global.discovery_nqn.as_deref(),
            &mut errors,
        );
        let cntlids = (self.global.cntlid_min, self.global.cntlid_max);
        multipath::check(cntlids, &self.ana_groups, &self.ports, &mut errors);
        subsystems::check_ana_groups(&self.subsystems, &self.ana_groups, &mut errors);
        rdma::check(&self.rdma, &self.global, &mut errors);
        metrics::check(&self.metrics, &mut errors);
        ports::check_referrals(&self.referrals, &mut errors);
        ports::check_tls(&self.ports, !self.tls_keys.is_empty(), &mut errors);
        tls::check(&self.tls_keys, &mut errors);
        if let Some(group) = &self.gateway_group {
            gateway::check(group, &self.ana_groups, &mut errors);
            gateway::check_rbd_namespaces(group, &self.subsystems, &mut errors);
        }
        errors.into_result()
    }

    /// What validates but deserves a word (names nvmet accepts that are not well-formed NQNs),
    /// in file order, each naming its key path and value.
    pub fn warnings(&self) -> Vec<ValidationError> {
        let mut warnings = Vec::new();
        subsystems::warnings(&self.subsystems, &mut warnings);
        warnings
    }
}
