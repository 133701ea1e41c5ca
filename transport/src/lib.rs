//! nvmfd transports: NVMe/TCP (`tcp`), NVMe/RDMA (`rdma`) and a host-side client (`client`).

pub mod client;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod tcp;
