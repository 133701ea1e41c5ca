//! Who is on the other end of a queue: the transport and the addresses of its connection.

use std::net::SocketAddr;

use crate::spec::disc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Tcp,
    Rdma,
}

impl TransportKind {
    /// TRTYPE in discovery log and error log entries (NVMe Base 2.0 Figure 264).
    pub fn trtype(self) -> u8 {
        match self {
            TransportKind::Tcp => disc::TRTYPE_TCP,
            TransportKind::Rdma => disc::TRTYPE_RDMA,
        }
    }
}

/// Who is on the other end of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub transport: TransportKind,
    pub port_id: u16,
    /// Our address of this connection (what the host connected to).
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The daemon's reactor thread that serves this connection (`nvmfd ctl controllers`);
    /// `None` outside a reactor (tests, tools).
    pub reactor: Option<u16>,
}
