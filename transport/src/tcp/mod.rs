//! NVMe/TCP (NVMe/TCP Transport Specification 1.0): PDU codec, receive state machine, the
//! sans-I/O connection core and the socket shell the reactor drives (connection contract of
//! ARCHITECTURE.md).
//!
//! - `pdu`: wire codec; `recv`: the PDU receive state machine; `send`: the send queue;
//!   `buffers`: per-command data buffers.
//! - `core`: [`TcpCore`], one connection's protocol state (slots, R2T, responses), fed bytes
//!   and completions, producing bytes to send; never touches a socket.
//! - `conn`: [`TcpConnection`], the non-blocking socket around the core
//!   (`crate::conn::Connection`); `zerocopy`: its `MSG_ZEROCOPY` sends and their
//!   notifications.
//! - `tls`: the TLS 1.3 (external PSK) handshakes; `ktls`: the record layer handed to the
//!   kernel afterwards, or `record`: the user-space record layer when the kernel cannot take
//!   it — either way `conn` and the core see plaintext; `tls_ffi`: OpenSSL calls the
//!   `openssl` crate does not wrap.
//!
//! Reactor notes: register connections edge-triggered (EPOLLET). `on_readable` drains the
//! socket unless the connection is back-pressured (every command slot busy, or the host not
//! reading its responses); it then resumes by itself from `on_io_complete`, `on_tick` or the
//! next `on_readable`, once a slot is free — `on_writable` only flushes (it has no
//! `IoSubmit` to run a command with).

pub mod buffers;
pub mod conn;
pub mod core;
pub mod ktls;
pub mod pdu;
pub mod record;
pub mod recv;
pub mod send;
pub mod tls;
mod tls_ffi;
pub mod zerocopy;

pub use self::conn::TcpConnection;
pub use self::core::{TcpCore, TcpParams, ADMIN_IN_CAPSULE_DATA, CONNECT_TIMEOUT};
