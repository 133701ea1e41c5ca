//! NVMe/RDMA transport (NVMe RDMA Transport 1.0b) on the same dispatch core as NVMe/TCP.
//!
//! - `verbs`: RAII wrappers over librdmacm/libibverbs (the only `unsafe` verbs code).
//! - `cm`: CM private data of CONNECT_REQUEST / accept / reject.
//! - `pool`: pinned, pre-registered capsule / response / data buffers per device.
//! - `conn`: the per-connection command state machine (sans-IO: it emits work requests).
//! - `listener`: the rdma_cm listener and the reactor-facing API (ARCHITECTURE.md Contract 6).

pub mod cm;
pub mod conn;
pub mod listener;
pub mod pool;
#[cfg(test)]
mod selftest;
pub mod verbs;

pub use conn::ConnStatus;
pub use listener::{ListenerEvent, RdmaConnection, RdmaError, RdmaListener, RdmaParams};
