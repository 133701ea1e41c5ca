//! NVMe/TCP over TLS 1.3 with external PSKs (NVMe/TCP Transport Specification 1.1 §3.6, TP
//! 8011), target side: the TLS server handshake, then the record layer handed to the kernel
//! ([`super::ktls`]) so that [`super::TcpConnection`] reads and writes plaintext as before.
//!
//! The handshake is OpenSSL's: it is the well-kept library with TLS 1.3 *external* PSK server
//! support (rustls has none). It runs blocking, with one deadline for the whole handshake, on
//! a thread of its own per connection (the daemon's choice, ARCHITECTURE.md), never on a
//! reactor. What the target accepts (§3.6.1.3): the cipher suite TLS_AES_128_GCM_SHA256, a
//! PSK identity `NVMe0R01 …` or `NVMe1R01 … <digest>` that names a host and subsystem with a
//! configured PSK, the `psk_dhe_ke` exchange mode of the host's choice; no certificates, no
//! session tickets (they would be records under the traffic keys before the kernel takes
//! over, and a retained PSK needs no resumption).
//!
//! SHA-384 PSKs (`NVMe0R02`, TLS_AES_256_GCM_SHA384) are refused: OpenSSL's TLS 1.3 PSK
//! server callback always pairs the key with SHA-256, and a SHA-384 PSK needs the session
//! callback (`SSL_CTX_set_psk_find_session_callback`) that the openssl crate does not expose.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hkdf::Hkdf;
use nvmfd_auth::psk::{hkdf_label, Derivation, Identity, PskHash};
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    HandshakeError, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef, SslVersion,
};
use sha2::{Sha256, Sha384};
use thiserror::Error;
use zeroize::Zeroizing;

use super::ktls::{self, RecordKeys};

/// The first byte of a TLS record carrying a handshake message (RFC 8446 §5.1,
/// ContentType.handshake): how an "optional" port tells a ClientHello from a plaintext ICReq
/// (PDU type 00h, NVMe/TCP §3.6.2.2).
pub const TLS_HANDSHAKE_RECORD: u8 = 22;

/// The PSKs the target knows, looked up by the identity a host offers.
pub trait PskStore: Send + Sync {
    /// The TLS PSK (already derived for this identity), or None when no configured PSK
    /// matches the identity's host, subsystem and hash.
    fn tls_psk(&self, identity: &Identity) -> Option<Zeroizing<Vec<u8>>>;
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("TLS library: {0}")]
    Library(#[from] ErrorStack),
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("the host offered no PSK identity this target knows ({0})")]
    UnknownIdentity(String),
    #[error("kernel TLS: {0}")]
    Kernel(io::Error),
}

/// A TLS 1.3 session whose handshake is done: the socket (no TLS byte of it unread), what
/// was agreed, and the record keys of both directions.
pub struct Established {
    pub stream: TcpStream,
    pub identity: Identity,
    pub cipher: &'static str,
    pub tx: RecordKeys,
    pub rx: RecordKeys,
}

impl Established {
    /// Hands the record layer to the kernel; the socket then carries plaintext for the
    /// process.
    pub fn into_ktls(self) -> Result<(TcpStream, Identity), TlsError> {
        ktls::install(self.stream.as_fd(), &self.tx, &self.rx).map_err(TlsError::Kernel)?;
        Ok((self.stream, self.identity))
    }
}

/// What one handshake learns through OpenSSL's callbacks.
#[derive(Default)]
struct Session {
    identity: Option<Identity>,
    refused: Option<String>,
    client_secret: Option<Zeroizing<Vec<u8>>>,
    server_secret: Option<Zeroizing<Vec<u8>>>,
}

fn session_index() -> Result<Index<Ssl, Mutex<Session>>, ErrorStack> {
    static INDEX: OnceLock<Index<Ssl, Mutex<Session>>> = OnceLock::new();
    if let Some(index) = INDEX.get() {
        return Ok(*index);
    }
    let index = Ssl::new_ex_index()?;
    Ok(*INDEX.get_or_init(|| index))
}

fn with_session(ssl: &SslRef, f: impl FnOnce(&mut Session)) {
    let Ok(index) = session_index() else { return };
    if let Some(session) = ssl.ex_data(index) {
        let mut session = session.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut session);
    }
}

/// The TLS server of one or more ports (the OpenSSL context; shared by handshake threads).
#[derive(Clone)]
pub struct TlsServer {
    ctx: SslContext,
}

impl TlsServer {
    pub fn new(store: Arc<dyn PskStore>) -> Result<Self, TlsError> {
        let index = session_index()?;
        let mut ctx = SslContextBuilder::new(SslMethod::tls_server())?;
        ctx.set_min_proto_version(Some(SslVersion::TLS1_3))?;
        ctx.set_max_proto_version(Some(SslVersion::TLS1_3))?;
        ctx.set_ciphersuites("TLS_AES_128_GCM_SHA256")?;
        ctx.set_options(SslOptions::NO_TICKET | SslOptions::NO_RENEGOTIATION);
        ctx.set_num_tickets(0)?;
        ctx.set_psk_server_callback(move |ssl, identity, psk| {
            let text = String::from_utf8_lossy(identity.unwrap_or_default()).into_owned();
            let found = match Identity::parse(identity.unwrap_or_default()) {
                Err(e) => Err(e.to_string()),
                Ok(id) if id.hash != PskHash::Sha256 => Err(format!(
                    "SHA-384 PSK identities are not supported: {text:?}"
                )),
                Ok(id) => match store.tls_psk(&id) {
                    Some(key) if key.len() <= psk.len() => Ok((id, key)),
                    Some(_) => Err(format!("PSK too long for {text:?}")),
                    None => Err(format!("no PSK for identity {text:?}")),
                },
            };
            let session = ssl.ex_data(index);
            let mut session = match session {
                Some(s) => s.lock().unwrap_or_else(|e| e.into_inner()),
                None => return Ok(0),
            };
            match found {
                Ok((id, key)) => {
                    psk[..key.len()].copy_from_slice(&key);
                    session.identity = Some(id);
                    Ok(key.len())
                }
                Err(why) => {
                    session.refused = Some(why);
                    Ok(0)
                }
            }
        });
        ctx.set_keylog_callback(|ssl, line| {
            let mut words = line.split(' ');
            let (Some(label), Some(_random), Some(secret)) =
                (words.next(), words.next(), words.next())
            else {
                return;
            };
            let Some(secret) = unhex(secret) else { return };
            with_session(ssl, |session| match label {
                "CLIENT_TRAFFIC_SECRET_0" => session.client_secret = Some(secret),
                "SERVER_TRAFFIC_SECRET_0" => session.server_secret = Some(secret),
                _ => {}
            });
        });
        Ok(TlsServer { ctx: ctx.build() })
    }

    /// Runs the server side of the handshake on `stream` (blocking, finished or failed within
    /// `timeout`). The stream is left blocking, without timeouts.
    pub fn handshake(&self, stream: TcpStream, timeout: Duration) -> Result<Established, TlsError> {
        stream.set_nonblocking(false)?;
        let index = session_index()?;
        let mut ssl = Ssl::new(&self.ctx)?;
        ssl.set_ex_data(index, Mutex::new(Session::default()));
        let bounded = Bounded {
            stream,
            deadline: Instant::now() + timeout,
        };
        let tls = match ssl.accept(bounded) {
            Ok(tls) => tls,
            Err(HandshakeError::SetupFailure(e)) => return Err(e.into()),
            Err(HandshakeError::Failure(mid)) | Err(HandshakeError::WouldBlock(mid)) => {
                let refused = mid
                    .ssl()
                    .ex_data(index)
                    .and_then(|s| s.lock().ok()?.refused.take());
                return Err(match refused {
                    Some(why) => TlsError::UnknownIdentity(why),
                    None => TlsError::Handshake(mid.error().to_string()),
                });
            }
        };
        // Without read-ahead OpenSSL reads exactly one record at a time; anything it still
        // holds would be lost to the kernel's record layer.
        if tls.ssl().pending() != 0 {
            return Err(TlsError::Handshake(
                "data after the handshake in the same read".into(),
            ));
        }
        let cipher = tls
            .ssl()
            .current_cipher()
            .map(|c| c.standard_name().unwrap_or(c.name()))
            .unwrap_or_default();
        let session = tls
            .ssl()
            .ex_data(index)
            .map(|s| std::mem::take(&mut *s.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default();
        let (Some(identity), Some(client), Some(server)) = (
            session.identity,
            session.client_secret,
            session.server_secret,
        ) else {
            return Err(TlsError::Handshake(
                "no PSK identity or traffic secrets".into(),
            ));
        };
        let suite = Suite::named(cipher)
            .ok_or_else(|| TlsError::Handshake(format!("unexpected cipher suite {cipher}")))?;
        let stream = tls.get_ref().stream.try_clone()?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        Ok(Established {
            stream,
            identity,
            cipher: suite.name,
            // The server sent no record under its traffic key yet (no tickets), nor did the
            // client under its own: both sequence numbers start at 0 (RFC 8446 §5.3).
            tx: suite.record_keys(&server, 0),
            rx: suite.record_keys(&client, 0),
        })
    }
}

/// A TLS 1.3 AES-GCM cipher suite: its hash and key length (RFC 8446 §B.4).
#[derive(Clone, Copy)]
struct Suite {
    name: &'static str,
    sha384: bool,
    key_len: usize,
}

impl Suite {
    fn named(name: &str) -> Option<Self> {
        match name {
            "TLS_AES_128_GCM_SHA256" => Some(Suite {
                name: "TLS_AES_128_GCM_SHA256",
                sha384: false,
                key_len: 16,
            }),
            "TLS_AES_256_GCM_SHA384" => Some(Suite {
                name: "TLS_AES_256_GCM_SHA384",
                sha384: true,
                key_len: 32,
            }),
            _ => None,
        }
    }

    /// `[sender]_write_key` and `[sender]_write_iv` from a traffic secret (RFC 8446 §7.3).
    fn record_keys(self, secret: &[u8], seq: u64) -> RecordKeys {
        let mut key = Zeroizing::new(vec![0u8; self.key_len]);
        let mut iv = [0u8; 12];
        let key_info = hkdf_label(b"key", b"", self.key_len, Derivation::Rfc8446);
        let iv_info = hkdf_label(b"iv", b"", iv.len(), Derivation::Rfc8446);
        // A traffic secret is a pseudorandom key of the hash's length; the lengths asked for
        // are far below HKDF's limit. A secret of another length is refused by from_prk.
        let ok = if self.sha384 {
            Hkdf::<Sha384>::from_prk(secret).is_ok_and(|h| {
                h.expand(&key_info, &mut key).is_ok() && h.expand(&iv_info, &mut iv).is_ok()
            })
        } else {
            Hkdf::<Sha256>::from_prk(secret).is_ok_and(|h| {
                h.expand(&key_info, &mut key).is_ok() && h.expand(&iv_info, &mut iv).is_ok()
            })
        };
        if !ok {
            key.iter_mut().for_each(|b| *b = 0);
            key.clear();
        }
        RecordKeys { key, iv, seq }
    }
}

fn unhex(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Zeroizing::new(Vec::with_capacity(text.len() / 2));
    for pair in text.as_bytes().chunks(2) {
        let pair = std::str::from_utf8(pair).ok()?;
        out.push(u8::from_str_radix(pair, 16).ok()?);
    }
    Some(out)
}

/// The socket during the handshake: every read and write waits at most until the deadline,
/// so a host that sends its ClientHello one byte a minute is dropped all the same.
struct Bounded {
    stream: TcpStream,
    deadline: Instant,
}

impl Bounded {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            ))
        } else {
            Ok(left)
        }
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.remaining()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.remaining()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Waits (until `timeout`) for the first byte of a new connection on a port where TLS is
/// optional and tells whether it starts a TLS handshake; the byte stays unread.
pub fn starts_with_tls(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(timeout))?;
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first)?;
    stream.set_read_timeout(None)?;
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(first[0] == TLS_HANDSHAKE_RECORD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmfd_auth::psk::ConfiguredPsk;
    use openssl::ssl::SslConnector;
    use openssl::symm::{decrypt_aead, encrypt_aead, Cipher};
    use std::net::TcpListener;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001";
    const SUB: &str = "nqn.2026-12.dev.nvmfd:tls";
    const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    struct OneKey(ConfiguredPsk);

    impl PskStore for OneKey {
        fn tls_psk(&self, identity: &Identity) -> Option<Zeroizing<Vec<u8>>> {
            (identity.hostnqn == HOST && identity.subnqn == SUB)
                .then(|| self.0.tls_psk(identity, Derivation::Rfc8446))
                .flatten()
        }
    }

    fn server() -> TlsServer {
        TlsServer::new(Arc::new(OneKey(ConfiguredPsk::parse(KEY).unwrap()))).unwrap()
    }

    /// An OpenSSL TLS 1.3 client offering `identity` with `psk`, as tlshd does for the host.
    fn client(
        stream: TcpStream,
        identity: String,
        psk: Vec<u8>,
    ) -> Result<openssl::ssl::SslStream<TcpStream>, String> {
        let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
        b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
        b.set_ciphersuites("TLS_AES_128_GCM_SHA256").unwrap();
        b.set_psk_client_callback(move |_, _, id_buf, psk_buf| {
            id_buf[..identity.len()].copy_from_slice(identity.as_bytes());
            id_buf[identity.len()] = 0;
            psk_buf[..psk.len()].copy_from_slice(&psk);
            Ok(psk.len())
        });
        let mut ssl = Ssl::new(&b.build().into_context()).unwrap();
        ssl.set_connect_state();
        ssl.connect(stream).map_err(|e| e.to_string())
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l.accept().unwrap().0, c)
    }

    fn host_psk(identity: &Identity) -> Vec<u8> {
        ConfiguredPsk::parse(KEY)
            .unwrap()
            .tls_psk(identity, Derivation::Rfc8446)
            .unwrap()
            .to_vec()
    }

    /// TLS 1.3 record: header (RFC 8446 §5.2) + AES-GCM of content || type with the nonce
    /// iv XOR seq (§5.3). Seals `plain` as application data.
    fn seal(keys: &RecordKeys, plain: &[u8]) -> Vec<u8> {
        let mut inner = plain.to_vec();
        inner.push(23);
        let len = (inner.len() + 16) as u16;
        let header = [23, 3, 3, (len >> 8) as u8, len as u8];
        let mut tag = [0u8; 16];
        let ct = encrypt_aead(
            Cipher::aes_128_gcm(),
            &keys.key,
            Some(&nonce(keys)),
            &header,
            &inner,
            &mut tag,
        )
        .unwrap();
        [header.as_slice(), &ct, &tag].concat()
    }

    fn nonce(keys: &RecordKeys) -> [u8; 12] {
        let mut nonce = keys.iv;
        for (n, s) in nonce[4..].iter_mut().zip(keys.seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// The keys handed to the kernel are the session's: the server opens the client's first
    /// application record with the RX keys, and the client reads a record sealed with the TX
    /// keys — both at sequence number 0, as kTLS will start.
    #[test]
    fn handshake_yields_the_record_keys_of_both_directions() {
        let (srv, cli) = pair();
        let id = Identity::v0(PskHash::Sha256, HOST, SUB);
        let psk = host_psk(&id);
        let t = std::thread::spawn(move || {
            let mut tls = client(cli, id.to_string(), psk).unwrap();
            tls.write_all(b"ICReq under TLS").unwrap();
            let mut buf = [0u8; 32];
            let n = tls.read(&mut buf).unwrap();
            buf[..n].to_vec()
        });
        let est = server().handshake(srv, Duration::from_secs(10)).unwrap();
        assert_eq!(est.cipher, "TLS_AES_128_GCM_SHA256");
        assert_eq!(est.identity, Identity::v0(PskHash::Sha256, HOST, SUB));
        assert_eq!((est.tx.key.len(), est.rx.key.len()), (16, 16));
        let mut stream = est.stream;
        let mut header = [0u8; 5];
        stream.read_exact(&mut header).unwrap();
        assert_eq!(header[0], 23, "application data record");
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).unwrap();
        let (ct, tag) = body.split_at(len - 16);
        let plain = decrypt_aead(
            Cipher::aes_128_gcm(),
            &est.rx.key,
            Some(&nonce(&est.rx)),
            &header,
            ct,
            tag,
        )
        .unwrap();
        assert_eq!(plain, b"ICReq under TLS\x17");
        stream.write_all(&seal(&est.tx, b"ICResp")).unwrap();
        assert_eq!(t.join().unwrap(), b"ICResp");
    }

    #[test]
    fn version_1_identity_is_accepted() {
        let (srv, cli) = pair();
        let key = ConfiguredPsk::parse(KEY).unwrap();
        let id = Identity::v1(&key, HOST, SUB, Derivation::Rfc8446);
        let psk = host_psk(&id);
        let name = id.to_string();
        let t = std::thread::spawn(move || client(cli, name, psk).map(|_| ()));
        // What an "optional" port looks at first: the ClientHello's record type, left unread.
        assert!(starts_with_tls(&srv, Duration::from_secs(10)).unwrap());
        let est = server().handshake(srv, Duration::from_secs(10)).unwrap();
        assert_eq!(est.identity, id);
        t.join().unwrap().unwrap();
    }

    #[test]
    fn wrong_psk_or_unknown_identity_fails_the_handshake() {
        let id = Identity::v0(PskHash::Sha256, HOST, SUB);
        let cases = [
            (id.to_string(), vec![0x5a; 32], "wrong key"),
            (
                Identity::v0(PskHash::Sha256, HOST, "nqn.2026-12.dev.nvmfd:other").to_string(),
                host_psk(&id),
                "unknown subsystem",
            ),
            (
                "not an identity".to_string(),
                host_psk(&id),
                "garbage identity",
            ),
        ];
        for (identity, psk, what) in cases {
            let (srv, cli) = pair();
            let t = std::thread::spawn(move || client(cli, identity, psk).map(|_| ()));
            let result = server().handshake(srv, Duration::from_secs(10));
            assert!(result.is_err(), "{what}: handshake must fail");
            assert!(
                t.join().unwrap().is_err(),
                "{what}: the client must see the failure"
            );
        }
    }

    /// A ClientHello without a pre_shared_key extension (a certificate-based client): this
    /// target has no certificate, so the handshake fails and the client is told.
    #[test]
    fn client_hello_without_psk_fails() {
        let (srv, cli) = pair();
        let t = std::thread::spawn(move || {
            let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
            b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
            b.set_verify(openssl::ssl::SslVerifyMode::NONE);
            let mut ssl = Ssl::new(&b.build().into_context()).unwrap();
            ssl.set_connect_state();
            ssl.connect(cli).map(|_| ()).map_err(|e| e.to_string())
        });
        assert!(server().handshake(srv, Duration::from_secs(10)).is_err());
        assert!(t.join().unwrap().is_err());
    }

    #[test]
    fn garbage_or_silence_instead_of_a_client_hello() {
        // A plaintext ICReq (PDU type 00h, HLEN 128) where the ClientHello belongs.
        let (srv, mut cli) = pair();
        let mut icreq = vec![0u8; 128];
        icreq[2] = 128;
        icreq[4] = 128;
        cli.write_all(&icreq).unwrap();
        assert!(!starts_with_tls(&srv, Duration::from_secs(5)).unwrap());
        assert!(server().handshake(srv, Duration::from_secs(5)).is_err());
        // A host that says nothing is dropped at the deadline.
        let (srv, _cli) = pair();
        let started = Instant::now();
        let err = server()
            .handshake(srv, Duration::from_millis(300))
            .err()
            .expect("no ClientHello: the handshake must fail");
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
    }

    #[test]
    fn record_keys_follow_rfc8446_key_schedule() {
        // RFC 8448 §3 (simple 1-RTT handshake), server application traffic secret and the
        // server write key / iv derived from it.
        let secret =
            unhex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643").unwrap();
        let keys = Suite::named("TLS_AES_128_GCM_SHA256")
            .unwrap()
            .record_keys(&secret, 0);
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(&keys.key), "9f02283b6c9c07efc26bb9f2ac92e356");
        assert_eq!(hex(&keys.iv), "cf782b88dd83549aadf1e984");
    }
}
