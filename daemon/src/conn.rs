//! The transports' connection types behind the reactor's [`Connection`] trait: NVMe/TCP
//! (ARCHITECTURE.md contract 5) and NVMe/RDMA (contract 6), plus the rdma_cm listener.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::backend::IoSubmit;
use nvme::queue::{PeerInfo, TransportKind};
use nvme::target::{Limits, Target};
use transport::tcp::{ConnStatus, TcpConnection, TcpParams};

use crate::reactor::{Accepted, Connection, ConnectionFactory};

/// Any connection a reactor serves. TCP is stored inline (the slab entry is reused across
/// connections and every event touches it); the RDMA connection is boxed by its listener.
#[allow(clippy::large_enum_variant)]
pub enum AnyConn {
    Tcp(TcpConnection),
    #[cfg(feature = "rdma")]
    Rdma(Box<transport::rdma::RdmaConnection>),
}

fn open(status: ConnStatus) -> bool {
    matches!(status, ConnStatus::Open)
}

#[cfg(feature = "rdma")]
fn rdma_open(status: transport::rdma::ConnStatus) -> bool {
    matches!(status, transport::rdma::ConnStatus::Open)
}

impl Connection for AnyConn {
    fn fd(&self) -> RawFd {
        match self {
            AnyConn::Tcp(c) => c.fd(),
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(c) => c.fd(),
        }
    }
    fn on_readable(&mut self, io: &mut dyn IoSubmit) -> bool {
        match self {
            AnyConn::Tcp(c) => open(c.on_readable(io)),
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(c) => rdma_open(c.on_cq_event(io)),
        }
    }
    fn on_writable(&mut self) -> bool {
        match self {
            AnyConn::Tcp(c) => open(c.on_writable()),
            // Never registered for EPOLLOUT: every send is a posted work request.
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(_) => true,
        }
    }
    fn on_io_complete(&mut self, tag: u64, result: i32, io: &mut dyn IoSubmit) -> bool {
        match self {
            AnyConn::Tcp(c) => open(c.on_io_complete(tag, result, io)),
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(c) => rdma_open(c.on_io_complete(tag, result, io)),
        }
    }
    fn on_tick(&mut self, now: Instant, io: &mut dyn IoSubmit) -> bool {
        match self {
            AnyConn::Tcp(c) => open(c.on_tick(now, io)),
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(c) => rdma_open(c.on_tick(now, io)),
        }
    }
    fn wants_write(&self) -> bool {
        match self {
            AnyConn::Tcp(c) => c.wants_write(),
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(_) => false,
        }
    }
    fn inflight_ops(&self) -> usize {
        match self {
            AnyConn::Tcp(c) => c.inflight_ops(),
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(c) => c.inflight_ops(),
        }
    }
    fn on_disconnected(&mut self) -> bool {
        match self {
            // TCP learns about the peer from the socket itself.
            AnyConn::Tcp(_) => true,
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(c) => rdma_open(c.on_disconnected()),
        }
    }
    fn shut_down(&mut self) {
        match self {
            // The peer sees FIN now; the socket itself closes when the connection is dropped
            // after its I/O has drained.
            AnyConn::Tcp(c) => {
                let _ = nix::sys::socket::shutdown(c.fd(), nix::sys::socket::Shutdown::Both);
            }
            // The RDMA connection disconnects its QP itself when it closes.
            #[cfg(feature = "rdma")]
            AnyConn::Rdma(_) => {}
        }
    }
}

/// Transport parameters from the target limits. MAXH2CDATA = MDTS: one H2CData PDU may carry
/// a whole command's data, which the per-slot buffer (sized to MDTS) holds anyway
/// (NVMe/TCP 1.0 §3.6.2.3: a multiple of 4 and ≥ 4096; MDTS is a power of two ≥ 4096).
pub fn tcp_params(limits: &Limits) -> TcpParams {
    TcpParams {
        max_h2c_data: limits.max_data_transfer,
        in_capsule_data_size: limits.in_capsule_data_size,
        max_data_transfer: limits.max_data_transfer,
    }
}

/// Builds TCP connections for one reactor; each is closed when it completes no Fabrics
/// Connect within `connect_timeout`.
pub fn tcp_factory(target: Arc<Target>, connect_timeout: Duration) -> ConnectionFactory<AnyConn> {
    let params = tcp_params(target.limits());
    Box::new(
        move |accepted: Accepted, token: u32| -> io::Result<AnyConn> {
            let peer = PeerInfo {
                transport: TransportKind::Tcp,
                port_id: accepted.port_id,
                local: accepted.local,
                remote: accepted.remote,
            };
            Ok(AnyConn::Tcp(
                TcpConnection::new(accepted.stream, token, Arc::clone(&target), peer, params)
                    .with_connect_timeout(connect_timeout),
            ))
        },
    )
}

#[cfg(feature = "rdma")]
pub use rdma::RdmaPort;

#[cfg(feature = "rdma")]
mod rdma {
    use std::net::IpAddr;
    use std::os::fd::RawFd;
    use std::sync::Arc;

    use nvme::target::{Limits, Target};
    use transport::rdma::{ListenerEvent, RdmaError, RdmaListener, RdmaParams};

    use super::AnyConn;
    use crate::reactor::{EventListener, ListenerOutput};

    /// Registered memory budget for data buffers per RDMA device.
    const DATA_BUFFER_BUDGET: u64 = 128 << 20;

    /// Pool sizes per device: receive capsules for four controllers at full queue depth on
    /// every queue, and data buffers within [`DATA_BUFFER_BUDGET`] (commands wait for a
    /// buffer when all are busy, so this bounds memory, not correctness).
    pub fn rdma_params(port_id: u16, limits: &Limits) -> RdmaParams {
        let depth = u32::from(limits.max_queue_size);
        let queues = u32::from(limits.max_io_queues) + 1;
        let mdts = u64::from(limits.max_data_transfer.max(4096));
        RdmaParams {
            port_id,
            in_capsule_data_size: limits.in_capsule_data_size,
            max_data_transfer: limits.max_data_transfer,
            max_queue_entries: limits.max_queue_size,
            max_io_queues: limits.max_io_queues,
            capsule_buffers: depth
                .saturating_mul(queues)
                .saturating_mul(4)
                .clamp(256, 16384),
            data_buffers: (DATA_BUFFER_BUDGET / mdts).clamp(16, 1024) as u32,
        }
    }

    /// One RDMA port, living on the reactor that created it (verbs objects are `Rc`).
    pub struct RdmaPort {
        listener: RdmaListener,
        target: Arc<Target>,
        port_id: u16,
        events: Vec<ListenerEvent>,
    }

    impl RdmaPort {
        pub fn new(
            address: IpAddr,
            service: u16,
            port_id: u16,
            target: Arc<Target>,
        ) -> Result<Self, RdmaError> {
            let params = rdma_params(port_id, target.limits());
            Ok(RdmaPort {
                listener: RdmaListener::new(address, service, params)?,
                target,
                port_id,
                events: Vec::new(),
            })
        }
    }

    impl EventListener<AnyConn> for RdmaPort {
        fn fd(&self) -> RawFd {
            self.listener.fd()
        }
        fn port_id(&self) -> u16 {
            self.port_id
        }
        fn on_event(
            &mut self,
            next_token: &mut dyn FnMut() -> u32,
            out: &mut Vec<ListenerOutput<AnyConn>>,
        ) {
            self.listener
                .on_event(&self.target, next_token, &mut self.events);
            for event in self.events.drain(..) {
                out.push(match event {
                    ListenerEvent::Connected(conn) => ListenerOutput::Connected {
                        token: conn.token(),
                        conn: AnyConn::Rdma(conn),
                    },
                    ListenerEvent::Disconnected(token) => ListenerOutput::Disconnected(token),
                    ListenerEvent::ListenerRemoved => ListenerOutput::Removed,
                });
            }
        }
    }
}
