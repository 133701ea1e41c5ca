//! The daemon's connection factory: the right transport connection for each listener —
//! NVMe/TCP for accepted sockets (ARCHITECTURE.md, connection contract), NVMe/RDMA from the rdma_cm
//! listener (RDMA contract) — handed to the reactor as a `Box<dyn transport::conn::Connection>`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use nvme::queue::{PeerInfo, TransportKind};
use nvme::target::{Limits, Target};
use transport::tcp::{TcpConnection, TcpParams};

use crate::reactor::{Accepted, Conn, ConnectionFactory};

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
pub fn tcp_factory(target: Arc<Target>, connect_timeout: Duration) -> ConnectionFactory {
    let params = tcp_params(target.limits());
    Box::new(move |accepted: Accepted, token: u32| -> io::Result<Conn> {
        let peer = PeerInfo {
            transport: TransportKind::Tcp,
            port_id: accepted.port_id,
            local: accepted.local,
            remote: accepted.remote,
        };
        let target = Arc::clone(&target);
        let conn = match accepted.tls {
            None => TcpConnection::new(accepted.stream, token, target, peer, params),
            Some(tls) => TcpConnection::new_tls(
                accepted.stream,
                tls.record,
                token,
                target,
                peer,
                params,
                tls.hostnqn,
                tls.subnqn,
            ),
        };
        Ok(Box::new(conn.with_connect_timeout(connect_timeout)))
    })
}

#[cfg(feature = "rdma")]
pub use rdma::RdmaPort;

#[cfg(feature = "rdma")]
mod rdma {
    use std::net::{IpAddr, SocketAddr};
    use std::os::fd::BorrowedFd;
    use std::sync::Arc;

    use nvme::target::{Limits, Target};
    use transport::rdma::{ListenerEvent, RdmaError, RdmaListener, RdmaParams};

    use crate::reactor::{EventListener, ListenerOutput};

    /// Registered memory budget for data buffers per RDMA device when
    /// `rdma.data_buffer_memory` is unset.
    const DATA_BUFFER_BUDGET: u64 = 128 << 20;

    /// Pool sizes per device from `[rdma]` (validated by `conf`), or when unset: receive
    /// capsules for four controllers at full queue depth on every queue, and data buffers
    /// within [`DATA_BUFFER_BUDGET`]. Commands wait for a buffer when all are busy, so these
    /// bound memory, not correctness. Response buffers (16 bytes each, two per queue entry of
    /// a connection) follow the larger of the two capsule counts, so that with a shared
    /// receive queue smaller than Σ queue depths as many connections fit as without one.
    pub fn rdma_params(port_id: u16, limits: &Limits, rdma: &conf::Rdma) -> RdmaParams {
        let depth = u32::from(limits.max_queue_size);
        let queues = u32::from(limits.max_io_queues) + 1;
        let mdts = u64::from(limits.max_data_transfer.max(4096));
        let derived_capsules = depth
            .saturating_mul(queues)
            .saturating_mul(4)
            .clamp(256, 16384);
        let capsule_buffers = rdma.capsule_buffers.unwrap_or(derived_capsules);
        let data_buffers = match rdma.data_buffer_memory {
            Some(budget) => (budget.bytes() / mdts).clamp(1, u64::from(u32::MAX)) as u32,
            None => (DATA_BUFFER_BUDGET / mdts).clamp(16, 1024) as u32,
        };
        RdmaParams {
            port_id,
            in_capsule_data_size: limits.in_capsule_data_size,
            max_data_transfer: limits.max_data_transfer,
            max_queue_entries: limits.max_queue_size,
            max_io_queues: limits.max_io_queues,
            capsule_buffers,
            response_buffers: capsule_buffers.max(derived_capsules).saturating_mul(2),
            data_buffers,
            shared_receive_queue: rdma.shared_receive_queue,
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
            rdma: &conf::Rdma,
        ) -> Result<Self, RdmaError> {
            let params = rdma_params(port_id, target.limits(), rdma);
            Ok(RdmaPort {
                listener: RdmaListener::new(address, service, params)?,
                target,
                port_id,
                events: Vec::new(),
            })
        }
    }

    impl EventListener for RdmaPort {
        fn fd(&self) -> BorrowedFd<'_> {
            self.listener.fd()
        }
        fn port_id(&self) -> u16 {
            self.port_id
        }
        fn address(&self) -> SocketAddr {
            self.listener.local_addr()
        }
        fn stop_accepting(&mut self) {
            self.listener.stop_listening();
        }
        fn connections(&self) -> usize {
            self.listener.live_connections()
        }
        fn on_event(&mut self, next_token: &mut dyn FnMut() -> u32, out: &mut Vec<ListenerOutput>) {
            self.listener
                .on_event(&self.target, next_token, &mut self.events);
            for event in self.events.drain(..) {
                out.push(match event {
                    ListenerEvent::Connected(conn) => ListenerOutput::Connected {
                        token: conn.token(),
                        conn,
                    },
                    ListenerEvent::Disconnected(token) => ListenerOutput::Disconnected(token),
                    ListenerEvent::ListenerRemoved => ListenerOutput::Removed,
                });
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn unset_keys_keep_the_derived_pool_sizes() {
            let p = rdma_params(3, &Limits::default(), &conf::Rdma::default());
            // 128 entries × 9 queues × 4 controllers; 128M of 1M buffers.
            assert_eq!(p.port_id, 3);
            assert_eq!(p.capsule_buffers, 4608);
            assert_eq!(p.response_buffers, 9216);
            assert_eq!(p.data_buffers, 128);
            assert!(!p.shared_receive_queue);
            let small = Limits {
                max_data_transfer: 4096,
                max_queue_size: 16,
                max_io_queues: 1,
                ..Limits::default()
            };
            let p = rdma_params(1, &small, &conf::Rdma::default());
            assert_eq!((p.capsule_buffers, p.data_buffers), (256, 1024));
        }

        #[test]
        fn configured_keys_size_the_pools() {
            let rdma = conf::Rdma {
                capsule_buffers: Some(512),
                data_buffer_memory: Some(conf::ByteSize(40 << 20)),
                shared_receive_queue: true,
                busy_poll_us: 50,
            };
            let p = rdma_params(1, &Limits::default(), &rdma);
            assert_eq!(p.capsule_buffers, 512);
            assert_eq!(p.data_buffers, 40, "budget / MDTS, no 16..=1024 clamp");
            assert!(p.shared_receive_queue);
            // A small SRQ does not shrink how many connections the responses can serve.
            assert_eq!(p.response_buffers, 9216);
            let big = conf::Rdma {
                capsule_buffers: Some(20000),
                ..rdma
            };
            assert_eq!(
                rdma_params(1, &Limits::default(), &big).response_buffers,
                40000
            );
        }
    }
}
