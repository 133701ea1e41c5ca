//! nvmfd configuration: schema, loading (TOML + environment), validation, nvmetcli import.
//!
//! Pure data: this crate knows the file format (ARCHITECTURE.md contract 3) and nothing about
//! NVMe internals; the daemon maps a validated [`Config`] onto `nvme::target::TargetConfig`.

mod load;
pub mod multipath;
pub mod names;
mod nvmetcli;
pub mod rdma;
mod schema;
mod size;
mod validate;

pub use load::{resolve_path, ConfError, EnvSource, DEFAULT_PATH, ENV_PREFIX};
pub use nvmetcli::Import;
pub use rdma::Rdma;
pub use schema::{
    Config, Global, LogFormat, Namespace, Port, Referral, Storage, Subsystem, Transport,
    EMBEDDED_DEFAULT,
};
pub use size::{ByteSize, SizeError};
pub use validate::{ValidationError, BLOCK_SIZES};
