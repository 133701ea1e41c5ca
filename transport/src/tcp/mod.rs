//! NVMe/TCP (NVMe/TCP Transport Specification 1.0): PDU codec, receive state machine and
//! the target-side connection driven by the reactor (Contract 5 of ARCHITECTURE.md).
//!
//! Reactor notes: register connections edge-triggered (EPOLLET). `on_readable` drains the
//! socket unless the connection is back-pressured (every command slot busy, or the host not
//! reading its responses); it then resumes by itself from `on_io_complete`, `on_tick` or the
//! next `on_readable`, once a slot is free — `on_writable` only flushes (it has no
//! `IoSubmit` to run a command with).

pub mod buffers;
pub mod conn;
pub mod pdu;
pub mod recv;
pub mod send;

pub use conn::{ConnStatus, TcpConnection, TcpParams};
