//! nvmfd transports: NVMe/TCP (`tcp`), NVMe/RDMA (`rdma`) and a host-side client (`client`).
