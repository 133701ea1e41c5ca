//! NVMe/RDMA transport (NVMe RDMA Transport 1.0b) on the same dispatch core as NVMe/TCP.
//!
//! - `verbs`: RAII wrappers over librdmacm/libibverbs (the only `unsafe` verbs code).
//! - `cm`: CM private data of CONNECT_REQUEST / accept / reject.
//! - `pool`: pinned, pre-registered capsule / response / data buffers per device.
//! - `core`: the per-connection command state machine (sans-IO: it emits work requests).
//! - `conn`: `RdmaConnection`, the verbs shell around the core that the reactor drives
//!   (`crate::conn::Connection`, ARCHITECTURE.md, RDMA contract).
//! - `profile`: the core driven by an in-memory NIC, for instruction counts per I/O.
//! - `listener`: the rdma_cm listener that takes connect requests, and the per-reactor
//!   acceptor that sets them up.

pub mod cm;
pub mod conn;
pub mod core;
pub mod listener;
pub mod pool;
pub mod profile;
#[cfg(test)]
mod selftest;
pub mod verbs;

pub use conn::RdmaConnection;
pub use listener::{
    ListenerEvent, PendingConnect, RdmaAcceptor, RdmaError, RdmaListener, RdmaParams,
};
