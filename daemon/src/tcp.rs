//! The NVMe/TCP connection as a reactor [`Connection`] (ARCHITECTURE.md contract 5).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use nvme::backend::IoSubmit;
use nvme::queue::{PeerInfo, TransportKind};
use nvme::target::{Limits, Target};
use transport::tcp::{ConnStatus, TcpConnection, TcpParams};

use crate::reactor::{Accepted, Connection, ConnectionFactory};

fn open(status: ConnStatus) -> bool {
    matches!(status, ConnStatus::Open)
}

impl Connection for TcpConnection {
    fn fd(&self) -> RawFd {
        TcpConnection::fd(self)
    }
    fn on_readable(&mut self, io: &mut dyn IoSubmit) -> bool {
        open(TcpConnection::on_readable(self, io))
    }
    fn on_writable(&mut self) -> bool {
        open(TcpConnection::on_writable(self))
    }
    fn on_io_complete(&mut self, tag: u64, result: i32, io: &mut dyn IoSubmit) -> bool {
        open(TcpConnection::on_io_complete(self, tag, result, io))
    }
    fn on_tick(&mut self, now: Instant, io: &mut dyn IoSubmit) -> bool {
        open(TcpConnection::on_tick(self, now, io))
    }
    fn wants_write(&self) -> bool {
        TcpConnection::wants_write(self)
    }
    fn inflight_ops(&self) -> usize {
        TcpConnection::inflight_ops(self)
    }
}

/// Transport parameters from the target limits. MAXH2CDATA = MDTS: one H2CData PDU may carry
/// a whole command's data, which the per-slot buffer (sized to MDTS) can hold anyway
/// (NVMe/TCP 1.0 §3.6.2.3: a multiple of 4 and ≥ 4096; MDTS is a power of two ≥ 4096).
pub fn params(limits: &Limits) -> TcpParams {
    TcpParams {
        max_h2c_data: limits.max_data_transfer,
        in_capsule_data_size: limits.in_capsule_data_size,
        max_data_transfer: limits.max_data_transfer,
    }
}

/// Builds TCP connections for one reactor.
pub fn factory(target: Arc<Target>) -> ConnectionFactory<TcpConnection> {
    let params = params(target.limits());
    Box::new(
        move |accepted: Accepted, token: u32| -> io::Result<TcpConnection> {
            let peer = PeerInfo {
                transport: TransportKind::Tcp,
                port_id: accepted.port_id,
                local: accepted.local,
                remote: accepted.remote,
            };
            Ok(TcpConnection::new(
                accepted.stream,
                token,
                Arc::clone(&target),
                peer,
                params,
            ))
        },
    )
}
