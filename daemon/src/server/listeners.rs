//! The ports' listeners: TCP bound on the main thread, RDMA opened on its reactor, placed by
//! NUMA node, and opened or closed live on a reload.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use nvme::target::{PortConfig, Target, TransportKind};

#[cfg(feature = "rdma")]
use super::error::error_chain;
use super::error::ServeError;
use super::Server;
use crate::reactor::{
    self, EventListener, EventListenerBuilder, EventListenerChange, Listener, ListenerUpdate,
    ReactorHandle,
};
use crate::topology::Sysfs;

/// How long a reload waits for a reactor to open or close an RDMA listener (rdma_cm bind and
/// listen; the buffer pools are registered only with the first connection).
const RDMA_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A port and the NUMA node of its NIC, for the placement log line.
#[derive(Debug, Clone)]
pub(super) struct PortNode {
    pub(super) port_id: u16,
    pub(super) transport: &'static str,
    pub(super) address: SocketAddr,
    pub(super) node: Option<u32>,
}

/// One line per port: its node and the reactors that take its connections
/// (`topology::serving`, the rule the reactors place by).
pub(super) fn log_placement(port: &PortNode, handles: &[Arc<ReactorHandle>]) {
    let reactors = reactor::serving_reactors(handles, port.node);
    let (port_id, transport, address) = (port.port_id, port.transport, port.address);
    match port.node {
        Some(node) if handles.iter().any(|h| h.node() == Some(node)) => tracing::info!(
            port_id,
            transport,
            %address,
            node,
            ?reactors,
            "port on NUMA node {node}: connections go to the reactors of that node"
        ),
        Some(node) => tracing::info!(
            port_id,
            transport,
            %address,
            node,
            ?reactors,
            "port on NUMA node {node}, which has no reactor: connections go to every reactor"
        ),
        None => tracing::info!(
            port_id,
            transport,
            %address,
            ?reactors,
            "port: no NUMA node known; connections go to every reactor"
        ),
    }
}

/// Binds every TCP port now (so that errors stop start-up before READY=1) and returns the
/// RDMA ports, which are opened on their reactor thread (verbs objects are not `Send`).
pub(super) fn bind(
    target: &Target,
    tls: &HashMap<u16, Arc<crate::tls::TlsGate>>,
    sysfs: &Sysfs,
) -> Result<(Vec<Listener>, Vec<PortConfig>), ServeError> {
    let mut listeners = Vec::new();
    let mut rdma_ports = Vec::new();
    for port in target.ports() {
        let address = SocketAddr::new(port.address, port.service);
        if port.transport == TransportKind::Rdma {
            if cfg!(feature = "rdma") {
                rdma_ports.push(port);
                continue;
            }
            return Err(ServeError::UnsupportedTransport {
                port_id: port.id,
                address,
                transport: "rdma",
            });
        }
        let bind_err = |source| ServeError::Bind {
            port_id: port.id,
            address,
            source,
        };
        let socket = TcpListener::bind(address).map_err(bind_err)?;
        socket.set_nonblocking(true).map_err(bind_err)?;
        tracing::info!(
            port_id = port.id,
            transport = "tcp",
            address = %socket.local_addr().unwrap_or(address),
            "listening"
        );
        listeners.push(Listener {
            socket,
            port_id: port.id,
            tls: tls.get(&port.id).cloned(),
            node: sysfs.address_node(port.address),
        });
    }
    Ok((listeners, rdma_ports))
}

/// Opens the RDMA ports assigned to one reactor. "No RDMA here" (no device, no kernel
/// support) is one log line and the port stays dark, as the RDMA contract asks; any other failure
/// stops start-up.
#[cfg(feature = "rdma")]
pub(super) fn open_rdma_ports(
    ports: &[PortConfig],
    target: &Arc<Target>,
    rdma: &conf::Rdma,
    sysfs: &Sysfs,
) -> Result<Vec<Box<dyn EventListener>>, String> {
    use transport::rdma::RdmaError;
    let mut listeners: Vec<Box<dyn EventListener>> = Vec::new();
    for port in ports {
        let listener = crate::conn::RdmaPort::new(
            port.address,
            port.service,
            port.id,
            Arc::clone(target),
            rdma,
            sysfs,
        );
        match listener {
            Ok(listener) => listeners.push(Box::new(listener)),
            Err(e @ (RdmaError::NotSupported(_) | RdmaError::NoDevice)) => tracing::warn!(
                port_id = port.id,
                address = %SocketAddr::new(port.address, port.service),
                "NVMe/RDMA port not served: {}",
                error_chain(&e)
            ),
            Err(e) => return Err(format!("port {}: {}", port.id, error_chain(&e))),
        }
    }
    Ok(listeners)
}

#[cfg(not(feature = "rdma"))]
pub(super) fn open_rdma_ports(
    _ports: &[PortConfig],
    _target: &Arc<Target>,
    _rdma: &conf::Rdma,
    _sysfs: &Sysfs,
) -> Result<Vec<Box<dyn EventListener>>, String> {
    Ok(Vec::new())
}

impl Server {
    /// RDMA ports to close (gone or moved, with their reactor) and to open (new or moved).
    pub(super) fn rdma_changes(
        &self,
        new_ports: &[PortConfig],
    ) -> (Vec<(PortConfig, usize)>, Vec<PortConfig>) {
        let new: Vec<&PortConfig> = new_ports
            .iter()
            .filter(|p| p.transport == TransportKind::Rdma)
            .collect();
        let gone = self
            .rdma_placement
            .iter()
            .filter(|(old, _)| !new.contains(&old))
            .cloned()
            .collect();
        let added = new
            .into_iter()
            .filter(|n| !self.rdma_placement.iter().any(|(old, _)| old == *n))
            .cloned()
            .collect();
        (gone, added)
    }

    /// Opens `ports` on the reactors holding the fewest RDMA ports and waits until each
    /// listens. A port this machine cannot serve (no RDMA device, address not on one) is
    /// logged and placed anyway, as at start-up. On a failure the listeners opened so far are
    /// closed again and nothing changed.
    pub(super) fn open_rdma_listeners(
        &self,
        ports: Vec<PortConfig>,
    ) -> Result<Vec<(PortConfig, usize)>, String> {
        let mut opened: Vec<(PortConfig, usize)> = Vec::new();
        for port in ports {
            let outcome = if cfg!(feature = "rdma") {
                let reactor = (0..self.handles.len())
                    .min_by_key(|r| {
                        self.rdma_placement
                            .iter()
                            .chain(&opened)
                            .filter(|(_, placed)| placed == r)
                            .count()
                    })
                    .unwrap_or(0);
                let (target, rdma, p, sysfs) = (
                    Arc::clone(&self.target),
                    self.config.rdma.clone(),
                    port.clone(),
                    self.sysfs.clone(),
                );
                let build: EventListenerBuilder = Box::new(move || {
                    open_rdma_ports(std::slice::from_ref(&p), &target, &rdma, &sysfs)
                        .map(|mut l| l.pop())
                });
                let (reply, answer) = std::sync::mpsc::channel();
                self.handles[reactor]
                    .change_event_listener(EventListenerChange::Add { build, reply });
                match answer.recv_timeout(RDMA_CHANGE_TIMEOUT) {
                    Ok(Ok(_listening)) => Ok(reactor),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(format!("reactor {reactor} did not answer")),
                }
            } else {
                Err("this nvmfd is built without RDMA support".to_owned())
            };
            match outcome {
                Ok(reactor) => opened.push((port, reactor)),
                Err(e) => {
                    self.close_rdma_listeners(&opened);
                    return Err(format!("port {}: {e}", port.id));
                }
            }
        }
        Ok(opened)
    }

    /// Stops the listeners of `ports` from accepting (their connections stay) and waits for
    /// each reactor to have done it.
    pub(super) fn close_rdma_listeners(&self, ports: &[(PortConfig, usize)]) {
        for (port, reactor) in ports {
            let (reply, answer) = std::sync::mpsc::channel();
            let change = EventListenerChange::Remove {
                port_id: port.id,
                address: SocketAddr::new(port.address, port.service),
                reply,
            };
            if self.handles[*reactor].change_event_listener(change)
                && answer.recv_timeout(RDMA_CHANGE_TIMEOUT).is_err()
            {
                tracing::warn!(
                    port_id = port.id,
                    reactor,
                    "reactor did not confirm closing the RDMA listener"
                );
            }
        }
    }

    /// TCP listeners to close (ports gone or moved) and to open (new or moved, bound here).
    pub(super) fn listener_changes(
        &self,
        new_ports: &[PortConfig],
    ) -> Result<ListenerUpdate, String> {
        let tcp = |ports: Vec<PortConfig>| -> Vec<PortConfig> {
            ports
                .into_iter()
                .filter(|p| p.transport == TransportKind::Tcp)
                .collect()
        };
        let old = tcp(self.target.ports());
        let new = tcp(new_ports.to_vec());
        let mut update = ListenerUpdate {
            remove: old
                .iter()
                .filter(|o| !new.contains(o))
                .map(|o| o.id)
                .collect(),
            add: Vec::new(),
        };
        for port in new.iter().filter(|n| !old.contains(n)) {
            let address = SocketAddr::new(port.address, port.service);
            let socket = TcpListener::bind(address)
                .and_then(|socket| socket.set_nonblocking(true).map(|()| socket))
                .map_err(|e| format!("port {}: cannot listen on {address}: {e}", port.id))?;
            tracing::info!(port_id = port.id, transport = "tcp", %address, "listening");
            let node = self.sysfs.address_node(port.address);
            let placed = PortNode {
                port_id: port.id,
                transport: "tcp",
                address,
                node,
            };
            log_placement(&placed, &self.handles);
            // TLS ports are restart-only (`restart_only_changes`): a port opened here is plain.
            update.add.push(Listener {
                socket,
                port_id: port.id,
                tls: None,
                node,
            });
        }
        Ok(update)
    }
}
