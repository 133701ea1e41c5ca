//! Pinning the calling thread to one CPU: the workers, the echo peer and the core probe all
//! run where `--cpu` puts them, so a figure belongs to a known pair of CPUs.

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

#[derive(Debug, thiserror::Error)]
#[error("cannot pin to CPU {cpu}: {source}")]
pub struct PinError {
    pub cpu: usize,
    #[source]
    pub source: nix::Error,
}

pub fn pin_to(cpu: usize) -> Result<(), PinError> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|source| PinError { cpu, source })?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|source| PinError { cpu, source })
}
