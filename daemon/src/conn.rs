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

/// Builds TCP connections for reactor `reactor`; each is closed when it completes no Fabrics
/// Connect within `connect_timeout`, names its command buffers to the reactor's ring when
/// `fixed_buffers` (`[global] uring_fixed_buffers` set), and sends read data of at least
/// `zerocopy_threshold` bytes zero-copy (`[global] zerocopy_send_threshold`, 0 = off).
pub fn tcp_factory(
    target: Arc<Target>,
    connect_timeout: Duration,
    reactor: usize,
    fixed_buffers: bool,
    zerocopy_threshold: usize,
) -> ConnectionFactory {
    let params = tcp_params(target.limits());
    let reactor = u16::try_from(reactor).ok();
    Box::new(move |accepted: Accepted, token: u32| -> io::Result<Conn> {
        let peer = PeerInfo {
            transport: TransportKind::Tcp,
            port_id: accepted.port_id,
            local: accepted.local,
            remote: accepted.remote,
            reactor,
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
        Ok(Box::new(
            conn.with_connect_timeout(connect_timeout)
                .with_fixed_buffers(fixed_buffers)
                .with_zerocopy(zerocopy_threshold),
        ))
    })
}

#[cfg(feature = "rdma")]
pub use rdma::RdmaPort;

#[cfg(feature = "rdma")]
mod rdma {
    use std::any::Any;
    use std::net::{IpAddr, SocketAddr};
    use std::os::fd::BorrowedFd;
    use std::sync::Arc;

    use nvme::target::{Limits, Target};
    use transport::rdma::{
        ListenerEvent, PendingConnect, RdmaAcceptor, RdmaError, RdmaListener, RdmaParams,
    };

    use crate::reactor::{
        Acceptor, Conn, EventListener, ListenerOutput, PendingConnection, Placement,
    };
    use crate::topology::Sysfs;

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

    /// One RDMA port's listener, living on the reactor that created it; its connections are
    /// set up on the reactor each is placed on (`Request`).
    pub struct RdmaPort {
        listener: RdmaListener,
        target: Arc<Target>,
        port_id: u16,
        node: Option<u32>,
        events: Vec<ListenerEvent>,
    }

    impl RdmaPort {
        pub fn new(
            address: IpAddr,
            service: u16,
            port_id: u16,
            target: Arc<Target>,
            rdma: &conf::Rdma,
            sysfs: &Sysfs,
        ) -> Result<Self, RdmaError> {
            let params = rdma_params(port_id, target.limits(), rdma);
            let listener = RdmaListener::new(address, service, params)?;
            // The bound device's node; when it reports none (a soft device such as rxe has
            // no `device` of its own), that of the interface holding the address, which is
            // the same PCI function for RoCE, iWARP and IPoIB.
            let device = listener.device_name();
            let node = device
                .as_deref()
                .and_then(|device| sysfs.rdma_node(device))
                .or_else(|| sysfs.address_node(address));
            tracing::info!(port_id, device = ?device, node = ?node, "RDMA port's device");
            Ok(RdmaPort {
                listener,
                target,
                port_id,
                node,
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
        fn node(&self) -> Option<u32> {
            self.node
        }
        fn on_event(&mut self, out: &mut Vec<ListenerOutput>) {
            self.listener.on_event(&mut self.events);
            for event in self.events.drain(..) {
                out.push(match event {
                    ListenerEvent::Request(pending) => ListenerOutput::Request(Box::new(Request {
                        pending,
                        target: Arc::clone(&self.target),
                    })),
                    ListenerEvent::ListenerRemoved => ListenerOutput::Removed,
                });
            }
        }
    }

    /// An RDMA connect request on its way to the reactor that serves it.
    #[derive(Debug)]
    struct Request {
        pending: PendingConnect,
        target: Arc<Target>,
    }

    impl PendingConnection for Request {
        fn port_id(&self) -> u16 {
            self.pending.port_id()
        }

        fn accept(
            self: Box<Self>,
            acceptor: &mut Option<Box<dyn Acceptor>>,
            place: Placement,
            token: u32,
        ) -> Option<Conn> {
            if acceptor.is_none() {
                let reactors = u32::try_from(place.reactors).unwrap_or(u32::MAX);
                match RdmaAcceptor::new(place.reactor, reactors) {
                    Ok(a) => *acceptor = Some(Box::new(RdmaSide(a))),
                    Err(e) => {
                        // Dropping the request refuses the host.
                        tracing::error!(reactor = place.reactor, error = %e, "cannot create the RDMA acceptor");
                        return None;
                    }
                }
            }
            let side = acceptor.as_mut()?.as_any().downcast_mut::<RdmaSide>()?;
            let conn = side.0.accept(self.pending, &self.target, token)?;
            Some(Box::new(conn))
        }
    }

    /// A reactor's RDMA acceptor, as the reactor holds it.
    struct RdmaSide(RdmaAcceptor);

    impl Acceptor for RdmaSide {
        fn fd(&self) -> BorrowedFd<'_> {
            self.0.fd()
        }
        fn on_event(&mut self, disconnected: &mut Vec<u32>) {
            self.0.on_event(disconnected);
        }
        fn as_any(&mut self) -> &mut dyn Any {
            self
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
