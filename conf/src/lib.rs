//! nvmfd configuration: schema, loading (TOML + environment), validation, nvmetcli import.
//!
//! Pure data: this crate knows the file format (configuration contract) and nothing about
//! NVMe internals; the daemon maps a validated [`Config`] onto `nvme::target::TargetConfig`.
//!
//! One module per section owns its serde types and its checks (`global`, `ports`,
//! `subsystems`, `multipath`, `rdma`, `tls`, `metrics`, `gateway`); `file` puts the sections together, `validate` runs the
//! checks in file order, `load` reads text and the environment.

#![forbid(unsafe_code)]

mod file;
pub mod gateway;
mod global;
pub mod hosts;
mod load;
pub mod manual;
pub mod metrics;
pub mod multipath;
pub mod names;
mod nvmetcli;
mod ports;
pub mod rdma;
mod report;
pub mod schema;
mod size;
mod source;
mod subsystems;
mod tls;
mod validate;

pub use file::{Config, EMBEDDED_DEFAULT};
pub use gateway::{GatewayGroup, StandbyState};
pub use global::{Global, LogFormat};
pub use hosts::{Host, HostKeys};
pub use load::{
    position_of, resolve_path, Checked, ConfError, EnvSource, DEFAULT_PATH, EMBEDDED_ORIGIN,
    ENV_PREFIX,
};
pub use metrics::Metrics;
pub use nvmetcli::{Backing, Import};
pub use ports::{Port, Referral, Transport};
pub use rdma::Rdma;
pub use report::{Problem, ProblemKind, ValidationError};
pub use size::{ByteSize, SizeError};
pub use subsystems::{Fault, FaultError, FaultOn, Namespace, Storage, Subsystem, BLOCK_SIZES};
pub use tls::{read_key_file, HkdfLabel, TlsKey, TlsPolicy};
