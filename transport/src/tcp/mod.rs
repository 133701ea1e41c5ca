//! NVMe/TCP (NVMe/TCP Transport Specification 1.0): PDU codec, receive state machine and
//! the target-side connection driven by the reactor (Contract 5 of ARCHITECTURE.md).

pub mod buffers;
pub mod conn;
pub mod pdu;
pub mod recv;
pub mod send;

pub use conn::{ConnStatus, TcpConnection, TcpParams};
