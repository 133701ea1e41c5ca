//! nvmfd transports: NVMe/TCP (`tcp`), NVMe/RDMA (`rdma`) and a host-side client (`client`).
//!
//! Each transport is a sans-I/O core (`tcp::core`, `rdma::core`: protocol state over the
//! dispatch core's `nvme::queue::Queue`; the RDMA core generic over [`dispatch::Dispatch`] for
//! its scripted test double) behind a thin shell that owns the descriptors and implements the
//! reactor's [`conn::Connection`] (`tcp::conn`, `rdma::conn`). A new transport follows the
//! same shape: `<name>/core.rs` + `<name>/conn.rs`, and one arm in the daemon's factory.

pub mod client;
pub mod conn;
pub mod dispatch;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod tcp;
mod timing;
