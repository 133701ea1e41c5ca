//! Why serving stopped or could not start, and how an error is told on one line.

use std::io;
use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
    #[error("cannot build the target: {0}")]
    Target(#[source] nvme::target::TargetError),
    #[error("port {port_id} ({address}): {transport} listeners are not served by this build")]
    UnsupportedTransport {
        port_id: u16,
        address: SocketAddr,
        transport: &'static str,
    },
    #[error(
        "port {port_id}: cannot listen on {address}: {source}{}",
        in_use_hint(source, address)
    )]
    Bind {
        port_id: u16,
        address: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("signal handling: {0}")]
    Signals(#[source] io::Error),
    #[error("reactor {id}: {reason}")]
    Reactor { id: usize, reason: String },
    #[error("reactor {id} ended unexpectedly (see the panic above); its connections are gone")]
    ReactorDied { id: usize },
    #[error("cannot start the authentication workers: {0}")]
    AuthPool(std::io::Error),
    #[error("cannot start reactor thread: {0}")]
    Spawn(#[source] io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot start the SMART/Health saver thread: {0}")]
    Health(#[source] io::Error),
    #[error("{0}")]
    Gateway(String),
    #[error("fenced: this gateway's RADOS client was blocklisted by another gateway of its group; restart to rejoin")]
    Fenced,
    #[error("metrics.listen {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// What to look at when a port is taken: who else listens there.
fn in_use_hint(error: &io::Error, address: &SocketAddr) -> String {
    if error.kind() != io::ErrorKind::AddrInUse {
        return String::new();
    }
    format!(
        " (another process listens there: another nvmfd, or the kernel target nvmet; \
         `ss -ltnp 'sport = :{}'` names it)",
        address.port()
    )
}

impl ServeError {
    /// The `[[ports]]` id of an error about one port.
    pub fn port_id(&self) -> Option<u16> {
        match self {
            ServeError::Bind { port_id, .. } | ServeError::UnsupportedTransport { port_id, .. } => {
                Some(*port_id)
            }
            _ => None,
        }
    }
}

/// An error and its sources on one line ("cannot build the target: …: …: No such file").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
