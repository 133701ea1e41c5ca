//! Gateway groups: several nvmfd gateways serving the same subsystems, each ANA group owned
//! by one of them at a time through a RADOS lock with a lease, with fencing (blocklisting)
//! before takeover and failback to the preferred gateway.
//!
//! `lease` is the sans-I/O state machine, `round` one round of RADOS steps around it
//! (generic over the store, so that tests run it against `sim`, an in-memory cluster with a
//! virtual clock), `ceph` the store on librados, `host` the threads that run it in the daemon
//! and hand ANA changes to the main loop, `stats` what `[metrics]` exports. The machine is
//! built into every binary (its tests run everywhere); only `ceph` and `host` need librados
//! (the `rbd` feature).

#[cfg(feature = "rbd")]
pub mod ceph;
#[cfg(feature = "rbd")]
pub mod host;
#[cfg_attr(not(feature = "rbd"), allow(dead_code))]
pub mod lease;
#[cfg_attr(not(feature = "rbd"), allow(dead_code))]
pub mod round;
#[cfg(test)]
mod sim;
#[cfg_attr(not(feature = "rbd"), allow(dead_code))]
pub mod stats;

#[cfg(feature = "rbd")]
pub use host::Host;

/// What [`Host::poll`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Poll {
    /// Reported states changed: re-apply the configuration.
    pub changed: bool,
    /// This instance is blocklisted: stop.
    pub fenced: bool,
}

/// Without librados there is no gateway group: a configuration with one is refused at start.
#[cfg(not(feature = "rbd"))]
pub enum Host {}

#[cfg(not(feature = "rbd"))]
impl Host {
    pub fn connect(config: &conf::Config) -> Result<Option<Host>, String> {
        match config.gateway_group {
            Some(_) => {
                Err("[gateway_group] needs nvmfd built with the rbd feature (librados)".to_owned())
            }
            None => Ok(None),
        }
    }

    pub fn manages(&self, _group: u32) -> bool {
        match *self {}
    }

    pub fn overlay(&self, _mapped: &mut nvme::target::TargetConfig) {
        match *self {}
    }

    pub fn start(&mut self, _wake: Box<dyn Fn() + Send + Sync>) -> Result<(), String> {
        match *self {}
    }

    pub fn poll(&mut self) -> Poll {
        match *self {}
    }

    pub fn view(&self) -> lease::View {
        match *self {}
    }

    pub fn stats(&self) -> std::sync::Arc<stats::Stats> {
        match *self {}
    }

    pub fn stop(&mut self) {
        match *self {}
    }
}
