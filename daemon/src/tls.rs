//! NVMe/TCP over TLS 1.3 in the daemon: the gate in front of a TLS port's connections.
//!
//! A port with `tls = "required"` or `"optional"` hands every accepted socket to a handshake
//! thread (one per connection in handshake, at most [`MAX_HANDSHAKES`] at once), which runs the
//! TLS server handshake ([`transport::tcp::tls`]) within `global.connect_timeout_ms`, hands the
//! record keys to the kernel (kTLS) and then the socket to a reactor like any other accepted
//! connection. The reactors never block on a handshake. A failed handshake closes that socket
//! only, with one log line naming the peer and the reason.
//!
//! When the kernel has no TLS upper layer protocol, or refuses the keys, the session's record
//! layer stays in user space ([`transport::tcp::record`]): the reactor then decrypts and
//! encrypts the connection's records itself. Each port says at start which record layer it
//! expects, each connection which one it got.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use conf::TlsPolicy;
use nvmfd_auth::psk::{ConfiguredPsk, Derivation, Identity};
use transport::tcp::ktls;
use transport::tcp::record::RecordLayer;
use transport::tcp::tls::{starts_with_tls, PskStore, TlsServer};
use zeroize::Zeroizing;

/// Connections in handshake at once, over all TLS ports; more are closed at once (a flood of
/// silent connections must not become a flood of threads).
pub const MAX_HANDSHAKES: usize = 256;

/// Configured PSKs by (host NQN, subsystem NQN or None for "any subsystem").
pub type PskKeys = HashMap<(String, Option<String>), (ConfiguredPsk, Derivation)>;

/// The configured PSKs every TLS port's handshakes look up. Replaced as a whole when
/// `[[tls_keys]]` changes (`nvmfd ctl set-tls-key`, reload): handshakes from then on use the
/// new keys; established sessions keep theirs (a TLS 1.3 session never goes back to the PSK).
#[derive(Default)]
pub struct PskTable {
    keys: RwLock<PskKeys>,
}

impl PskTable {
    fn new(keys: PskKeys) -> Self {
        PskTable {
            keys: RwLock::new(keys),
        }
    }

    pub fn replace(&self, keys: PskKeys) {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }
}

impl PskStore for PskTable {
    fn tls_psk(&self, identity: &Identity) -> Option<Zeroizing<Vec<u8>>> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let host = identity.hostnqn.clone();
        let (key, derivation) = keys
            .get(&(host.clone(), Some(identity.subnqn.clone())))
            .or_else(|| keys.get(&(host, None)))?;
        key.tls_psk(identity, *derivation)
    }
}

/// Reads and parses every `[[tls_keys]]` key file (permissions checked as for the
/// authentication keys); fails naming the first one that cannot be used.
pub fn load_keys(tls_keys: &[conf::TlsKey]) -> Result<PskKeys, String> {
    let mut keys = HashMap::new();
    for (i, key) in tls_keys.iter().enumerate() {
        let text = conf::read_key_file(&key.key_file)
            .map_err(|e| format!("tls_keys[{i}].key_file {}: {e}", key.key_file.display()))?;
        let psk = ConfiguredPsk::parse(&text)
            .map_err(|e| format!("tls_keys[{i}].key_file {}: {e}", key.key_file.display()))?;
        let derivation = match key.hkdf_label {
            conf::HkdfLabel::Compat => Derivation::LibnvmeCompat,
            conf::HkdfLabel::Rfc8446 => Derivation::Rfc8446,
        };
        keys.insert((key.host.clone(), key.subsystem.clone()), (psk, derivation));
    }
    Ok(keys)
}

/// The TLS side of the running daemon: the gates of the TLS ports and the key table they
/// share.
pub struct Tls {
    pub gates: HashMap<u16, Arc<TlsGate>>,
    pub keys: Arc<PskTable>,
}

/// A connection the handshake secured: who it is (the PSK identity's NQNs, which its Fabrics
/// Connect must name) and its record layer (None: the kernel's).
#[derive(Debug)]
pub struct TlsConnection {
    pub hostnqn: String,
    pub subnqn: String,
    pub record: Option<Box<RecordLayer>>,
}

/// The TLS policy and server of one port.
pub struct TlsGate {
    port_id: u16,
    policy: TlsPolicy,
    server: TlsServer,
    timeout: Duration,
    busy: Arc<AtomicUsize>,
    /// Whether the kernel offered the TLS ULP at start (then kTLS is tried first).
    kernel: bool,
}

impl std::fmt::Debug for TlsGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsGate")
            .field("port_id", &self.port_id)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl TlsGate {
    /// Takes over an accepted socket: `deliver` gets it back ready for NVMe/TCP (kTLS
    /// installed, or plaintext on an optional port whose host sent no ClientHello), with the
    /// PSK identity and user-space record layer when TLS is on, on the handshake thread; a
    /// failure closes it here.
    pub fn admit(
        self: &Arc<Self>,
        stream: TcpStream,
        remote: SocketAddr,
        deliver: impl FnOnce(TcpStream, Option<TlsConnection>) + Send + 'static,
    ) {
        let port_id = self.port_id;
        if self.busy.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            self.busy.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(port_id, %remote, limit = MAX_HANDSHAKES, "too many TLS handshakes in progress; connection closed");
            return;
        }
        let gate = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("tls-handshake".into())
            .spawn(move || {
                let result = gate.secure(stream, remote);
                gate.busy.fetch_sub(1, Ordering::AcqRel);
                match result {
                    Ok((stream, identity)) => deliver(stream, identity),
                    Err(reason) => {
                        tracing::warn!(port_id, %remote, %reason, "TLS: connection refused")
                    }
                }
            });
        if let Err(e) = spawned {
            self.busy.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(port_id, %remote, error = %e, "cannot start a TLS handshake thread; connection closed");
        }
    }

    fn secure(
        &self,
        stream: TcpStream,
        remote: SocketAddr,
    ) -> Result<(TcpStream, Option<TlsConnection>), String> {
        if self.policy == TlsPolicy::Optional {
            match starts_with_tls(&stream, self.timeout) {
                Ok(false) => {
                    tracing::info!(port_id = self.port_id, %remote, "TLS optional: plaintext connection");
                    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
                    return Ok((stream, None));
                }
                Ok(true) => {}
                Err(e) => return Err(format!("no first byte: {e}")),
            }
        }
        // A required port answers a plaintext ICReq by failing the handshake and closing, as
        // nvmet (with tlshd) does: the host sees the connection reset before any ICResp.
        let established = self
            .server
            .handshake(stream, self.timeout)
            .map_err(|e| e.to_string())?;
        let secured = established.secure(self.kernel).map_err(|e| e.to_string())?;
        if secured.psk_hash != secured.identity.hash {
            // tlshd 1.0 binds every PSK to SHA-256; nvmet runs such a PSK the same way
            // (transport::tcp::tls, REBOUND_SUITES).
            tracing::info!(
                port_id = self.port_id,
                %remote,
                identity = %secured.identity,
                cipher = secured.cipher,
                "TLS: the host bound its {} PSK identity to {} (as tlshd 1.0 does); used as a {} PSK",
                secured.identity.hash.name(),
                secured.psk_hash.name(),
                secured.psk_hash.name(),
            );
        }
        let record_layer = secured.kind().as_str();
        match &secured.kernel_refused {
            None => tracing::info!(
                port_id = self.port_id,
                %remote,
                identity = %secured.identity,
                cipher = secured.cipher,
                record_layer,
                "TLS 1.3 established"
            ),
            Some(why) => tracing::info!(
                port_id = self.port_id,
                %remote,
                identity = %secured.identity,
                cipher = secured.cipher,
                record_layer,
                kernel_refused = %why,
                "TLS 1.3 established"
            ),
        }
        let tls = TlsConnection {
            hostnqn: secured.identity.hostnqn,
            subnqn: secured.identity.subnqn,
            record: secured.record,
        };
        Ok((secured.stream, Some(tls)))
    }
}

/// The gates of the configuration's TLS ports by port id (empty when no port uses TLS) and
/// the key table. Reads every key file; fails when one cannot be used.
pub fn gates(config: &conf::Config) -> Result<Tls, String> {
    let keys = Arc::new(PskTable::new(load_keys(&config.tls_keys)?));
    let tls_ports: Vec<&conf::Port> = config.ports.iter().filter(|p| !p.tls.is_none()).collect();
    if tls_ports.is_empty() {
        return Ok(Tls {
            gates: HashMap::new(),
            keys,
        });
    }
    let kernel = ktls::available();
    let store: Arc<dyn PskStore> = Arc::clone(&keys) as Arc<dyn PskStore>;
    let server = TlsServer::new(store).map_err(|e| e.to_string())?;
    let timeout = Duration::from_millis(config.global.connect_timeout_ms.into());
    let busy = Arc::new(AtomicUsize::new(0));
    let gates = tls_ports
        .into_iter()
        .map(|port| {
            // The one line per port saying which record layer its connections get.
            tracing::info!(
                port_id = port.id,
                policy = port.tls.as_str(),
                record_layer = if kernel {
                    "kernel TLS (user space if a socket refuses the keys)"
                } else {
                    "user space (no \"tls\" in /proc/sys/net/ipv4/tcp_available_ulp)"
                },
                "TLS 1.3 port"
            );
            let gate = TlsGate {
                port_id: port.id,
                policy: port.tls,
                server: server.clone(),
                timeout,
                busy: Arc::clone(&busy),
                kernel,
            };
            (port.id, Arc::new(gate))
        })
        .collect();
    Ok(Tls { gates, keys })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmfd_auth::psk::PskHash;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001";
    const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    fn gate(policy: TlsPolicy) -> TlsGate {
        let table = PskTable::default();
        TlsGate {
            port_id: 1,
            policy,
            server: TlsServer::new(Arc::new(table)).unwrap(),
            timeout: Duration::from_secs(5),
            busy: Arc::new(AtomicUsize::new(0)),
            kernel: false,
        }
    }

    /// A plaintext ICReq (PDU type 00h, HLEN 128, PLEN 128) from a new connection.
    fn plaintext_host() -> (TcpStream, TcpStream, SocketAddr) {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut host = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, remote) = listener.accept().unwrap();
        let mut icreq = [0u8; 128];
        icreq[2] = 128;
        icreq[4] = 128;
        host.write_all(&icreq).unwrap();
        (accepted, host, remote)
    }

    /// "optional" serves a host that starts with a plaintext ICReq as it is (the ICReq still
    /// unread); "required" refuses it (the handshake fails on the non-TLS record).
    #[test]
    fn optional_serves_plaintext_required_refuses_it() {
        use std::io::Read;
        let (accepted, _host, remote) = plaintext_host();
        let (mut stream, identity) = gate(TlsPolicy::Optional).secure(accepted, remote).unwrap();
        assert!(identity.is_none());
        stream.set_nonblocking(false).unwrap();
        let mut icreq = [0u8; 128];
        stream.read_exact(&mut icreq).unwrap();
        assert_eq!((icreq[0], icreq[2]), (0, 128));
        let (accepted, _host, remote) = plaintext_host();
        assert!(gate(TlsPolicy::Required).secure(accepted, remote).is_err());
    }

    #[test]
    fn keys_per_host_and_subsystem() {
        let key = ConfiguredPsk::parse(KEY).unwrap();
        let mut keys = HashMap::new();
        keys.insert((HOST.to_owned(), None), (key.clone(), Derivation::Rfc8446));
        keys.insert(
            (HOST.to_owned(), Some("nqn.2026-12.dev.nvmfd:b".to_owned())),
            (key.clone(), Derivation::LibnvmeCompat),
        );
        let table = PskTable::new(keys);
        let any = Identity::v0(PskHash::Sha256, HOST, "nqn.2026-12.dev.nvmfd:a");
        let b = Identity::v0(PskHash::Sha256, HOST, "nqn.2026-12.dev.nvmfd:b");
        assert_eq!(
            table.tls_psk(&any),
            key.tls_psk(&any, Derivation::Rfc8446),
            "the host's key for any subsystem"
        );
        assert_eq!(
            table.tls_psk(&b),
            key.tls_psk(&b, Derivation::LibnvmeCompat),
            "the subsystem's own key first"
        );
        let stranger = Identity::v0(
            PskHash::Sha256,
            "nqn.2014-08.org.example:other",
            "nqn.2026-12.dev.nvmfd:a",
        );
        assert!(table.tls_psk(&stranger).is_none());
    }
}
