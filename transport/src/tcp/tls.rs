//! NVMe/TCP over TLS 1.3 with external PSKs (NVMe/TCP Transport Specification 1.1 §3.6, TP
//! 8011): the TLS server handshake of a target port, the client handshake of the host side
//! (test client, nvmfd-perf), then the record layer — the kernel's ([`super::ktls`]) when it
//! takes the keys, else the user-space one ([`super::record`]) — so that
//! [`super::TcpConnection`] reads and writes plaintext as before.
//!
//! The handshake is OpenSSL's: it is the well-kept library with TLS 1.3 *external* PSK server
//! support (rustls has none). It runs blocking, with one deadline for the whole handshake, on
//! a thread of its own per connection (the daemon's choice, ARCHITECTURE.md), never on a
//! reactor. What the target accepts (§3.6.1.3): a PSK identity `NVMe0R0x …` or
//! `NVMe1R0x … <digest>` that names a host and subsystem with a configured PSK, with the cipher
//! suite of its hash (01: TLS_AES_128_GCM_SHA256, 02: TLS_AES_256_GCM_SHA384 — the PSK goes to
//! OpenSSL as a session naming the suite, `super::tls_ffi`), the `psk_dhe_ke` exchange mode of
//! the host's choice; no certificates, no session tickets (they would be records under the
//! traffic keys before the kernel takes over, and a retained PSK needs no resumption). A PSK
//! is bound to its hash (RFC 8446 §4.2.11) but OpenSSL picks the suite before it looks at the
//! PSK, and drops a PSK whose hash is not the suite's: so the client-hello callback reads the
//! offered identities first and narrows the connection's suites to the one of the first
//! identity with a configured PSK — the identity OpenSSL will then use — whatever order the
//! host offers the suites in.
//!
//! One exception, for the Linux host: tlshd 1.0 (GnuTLS PSK credentials without a hash) binds
//! every PSK to SHA-256, a `NVMe0R02` / `NVMe1R02` one included, and then offers
//! TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256. The kernel target (nvmet, whose
//! tlshd does the same) runs such a PSK — the same 48 TLS PSK bytes — as a SHA-256 PSK under
//! ChaCha20-Poly1305; so does this target: a SHA-384 identity with a 32-byte binder gets the
//! SHA-256 suites ([`REBOUND_SUITES`]). Any other mismatch between identity and binder is
//! refused.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hkdf::Hkdf;
use nvmfd_auth::psk::{hkdf_label, Derivation, Identity, PskHash};
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, HandshakeError, Ssl, SslAlert, SslContext, SslContextBuilder, SslMethod,
    SslOptions, SslRef, SslStream, SslVersion,
};
use sha2::{Sha256, Sha384};
use thiserror::Error;
use zeroize::Zeroizing;

use super::ktls::{self, Aead, RecordKeys};
use super::record::{LinkIo, RecordLayer};

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
    #[error("PSK bound to another hash than its identity's: {0} ({1})")]
    PskBinding(String, String),
    #[error("kernel TLS: {0}")]
    Kernel(io::Error),
}

/// A TLS 1.3 session whose handshake is done: the session (its socket with no TLS byte of it
/// unread), what was agreed, and the record keys of both directions.
pub struct Established {
    tls: SslStream<LinkIo>,
    pub identity: Identity,
    /// The hash the PSK was bound to: its identity's, or SHA-256 for a SHA-384 identity the
    /// host bound so (tlshd 1.0).
    pub psk_hash: PskHash,
    pub cipher: &'static str,
    pub tx: RecordKeys,
    pub rx: RecordKeys,
}

/// Which record layer a secured connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordLayerKind {
    Kernel,
    User,
}

impl RecordLayerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordLayerKind::Kernel => "kernel TLS",
            RecordLayerKind::User => "user space",
        }
    }
}

/// A connection ready for NVMe/TCP over TLS: the socket (non-blocking) and, when the kernel
/// did not take the record keys, the user-space record layer.
pub struct Secured {
    pub stream: TcpStream,
    pub identity: Identity,
    /// As [`Established::psk_hash`].
    pub psk_hash: PskHash,
    pub cipher: &'static str,
    pub record: Option<Box<RecordLayer>>,
    /// Why kernel TLS was not used, when it was tried and refused.
    pub kernel_refused: Option<io::Error>,
}

impl Secured {
    pub fn kind(&self) -> RecordLayerKind {
        match self.record {
            Some(_) => RecordLayerKind::User,
            None => RecordLayerKind::Kernel,
        }
    }
}

impl Established {
    /// The session as a blocking stream on its socket, record layer in user space, bounded by
    /// the socket's own timeouts (the test client's way).
    pub fn into_blocking(mut self) -> SslStream<LinkIo> {
        self.tls.get_mut().keep_socket();
        self.tls
    }

    /// Hands the record layer to the kernel when `kernel` and it takes the keys; otherwise
    /// (or when the kernel refuses before it holds a key) keeps it in user space.
    pub fn secure(self, kernel: bool) -> Result<Secured, TlsError> {
        let mut kernel_refused = None;
        // Without read-ahead OpenSSL reads exactly one record at a time; a record it already
        // opened would be lost to the kernel's record layer, so the session stays here then.
        if kernel && self.tls.ssl().pending() != 0 {
            kernel_refused = Some(io::Error::other(
                "application data arrived with the handshake",
            ));
        } else if kernel {
            let stream = self
                .tls
                .get_ref()
                .stream()
                .ok_or_else(|| TlsError::Handshake("session without a socket".into()))?;
            match ktls::install(stream.as_fd(), &self.tx, &self.rx) {
                Ok(()) => {
                    let stream = stream.try_clone()?;
                    stream.set_read_timeout(None)?;
                    stream.set_write_timeout(None)?;
                    stream.set_nonblocking(true)?;
                    return Ok(Secured {
                        stream,
                        identity: self.identity,
                        psk_hash: self.psk_hash,
                        cipher: self.cipher,
                        record: None,
                        kernel_refused: None,
                    });
                }
                // A key half installed cannot be taken back: that connection is lost.
                Err(ktls::InstallError::Partial(e)) => return Err(TlsError::Kernel(e)),
                Err(ktls::InstallError::Refused(e)) => kernel_refused = Some(e),
            }
        }
        let (stream, record) = RecordLayer::new(self.tls)?;
        Ok(Secured {
            stream,
            identity: self.identity,
            psk_hash: self.psk_hash,
            cipher: self.cipher,
            record: Some(Box::new(record)),
            kernel_refused,
        })
    }
}

/// What one handshake learns through OpenSSL's callbacks.
#[derive(Default)]
struct Session {
    identity: Option<Identity>,
    /// The hash the PSK goes to OpenSSL with.
    psk_hash: Option<PskHash>,
    /// Why the PSK the client-hello callback found cannot verify (its binder's hash).
    misbound: Option<String>,
    /// A SHA-384 identity (as the wire carries it) the host bound to SHA-256, to be run as a
    /// SHA-256 PSK, and what to say if the handshake fails all the same.
    rebound: Option<(Box<[u8]>, String)>,
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

fn store_index() -> Result<Index<SslContext, Arc<dyn PskStore>>, ErrorStack> {
    static INDEX: OnceLock<Index<SslContext, Arc<dyn PskStore>>> = OnceLock::new();
    if let Some(index) = INDEX.get() {
        return Ok(*index);
    }
    let index = SslContext::new_ex_index()?;
    Ok(*INDEX.get_or_init(|| index))
}

/// The server's PSK lookup (`tls_ffi::FindPsk`): the identity parsed, the key from the
/// context's store, what was found or refused noted in the handshake's [`Session`].
fn find_psk(ssl: &SslRef, identity: &[u8]) -> Option<(Zeroizing<Vec<u8>>, PskHash)> {
    let text = String::from_utf8_lossy(identity).into_owned();
    let store = store_index()
        .ok()
        .and_then(|index| ssl.ssl_context().ex_data(index))?;
    let found = match Identity::parse(identity) {
        Err(e) => Err(e.to_string()),
        Ok(id) => match store.tls_psk(&id) {
            Some(key) => Ok((id, key)),
            None => Err(format!("no PSK for identity {text:?}")),
        },
    };
    let mut answer = None;
    with_session(ssl, |session| match found {
        Ok((id, key)) => {
            let rebound = session
                .rebound
                .as_ref()
                .is_some_and(|(raw, _)| **raw == *identity);
            let hash = if rebound { PskHash::Sha256 } else { id.hash };
            answer = Some((key, hash));
            session.psk_hash = Some(hash);
            session.identity = Some(id);
        }
        Err(why) => session.refused = Some(why),
    });
    answer
}

/// `pre_shared_key` (RFC 8446 §4.2): the ClientHello extension carrying the PSK identities.
const PRE_SHARED_KEY: u16 = 41;

/// The identities of a ClientHello's `pre_shared_key` extension body (RFC 8446 §4.2.11,
/// OfferedPsks: `identities<7..2^16-1>` of {`identity<1..2^16-1>`, uint32
/// obfuscated_ticket_age}, then `binders<33..2^16-1>` of `PskBinderEntry<32..255>`, one per
/// identity), each with the length of its binder, in the client's order. None when the
/// extension is malformed (OpenSSL's own parse then rejects the ClientHello).
fn offered_psks(ext: &[u8]) -> Option<Vec<(&[u8], usize)>> {
    let (len, rest) = ext.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_be_bytes(*len));
    let (mut list, rest) = (rest.get(..len)?, &rest[len..]);
    let mut identities = Vec::new();
    while !list.is_empty() {
        let (len, rest) = list.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        if len == 0 || rest.len() < len + 4 {
            return None;
        }
        identities.push(&rest[..len]);
        list = &rest[len + 4..];
    }
    let (len, rest) = rest.split_first_chunk::<2>()?;
    let mut binders = rest.get(..usize::from(u16::from_be_bytes(*len)))?;
    let mut offered = Vec::with_capacity(identities.len());
    for identity in identities {
        let (&len, rest) = binders.split_first()?;
        let len = usize::from(len);
        binders = rest.get(len..)?;
        offered.push((identity, len));
    }
    (!offered.is_empty() && binders.is_empty()).then_some(offered)
}

/// The hash a client bound its PSK to: the length of the PSK's binder (an HMAC with that
/// hash, RFC 8446 §4.2.11.2).
fn binder_hash(len: usize) -> Option<PskHash> {
    match len {
        32 => Some(PskHash::Sha256),
        48 => Some(PskHash::Sha384),
        _ => None,
    }
}

/// The suites of a SHA-384 identity the host bound to SHA-256: NVMe/TCP's SHA-256 suite
/// (§3.6.1.3) and TLS_CHACHA20_POLY1305_SHA256, the only SHA-256 suite tlshd 1.0 offers with
/// such a PSK and the one nvmet's tlshd runs it under (tests/e2e/FINDINGS.md, 2026-12-04 20:10).
/// The host's order decides between them.
pub const REBOUND_SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";

/// The server's client-hello callback: OpenSSL takes, of the offered identities, the first
/// one its find-session callback ([`find_psk`]) knows, and keeps a PSK only when the chosen
/// suite has its hash; so the suites of this connection become that identity's suite alone.
/// With no known identity the context's list stays, and the handshake fails for want of a
/// PSK (a suite the host did not offer fails it too: no shared cipher). The hash a host bound
/// the PSK to is its binder's length (§4.2.11.2): a SHA-384 identity bound to SHA-256 (tlshd
/// 1.0) becomes a SHA-256 PSK with [`REBOUND_SUITES`], noted for [`find_psk`]; any other
/// mismatch fails the binder check, noted for the refusal to say so.
fn narrow_suite_to_psk(
    store: &dyn PskStore,
    ssl: &mut SslRef,
    alert: &mut SslAlert,
) -> Result<ClientHelloResponse, ErrorStack> {
    let found = super::tls_ffi::client_hello_ext(ssl, PRE_SHARED_KEY)
        .and_then(offered_psks)
        .and_then(|offered| {
            offered.into_iter().find_map(|(raw, binder_len)| {
                let id = Identity::parse(raw).ok()?;
                store.tls_psk(&id)?;
                Some((Box::<[u8]>::from(raw), id, binder_len))
            })
        });
    let Some((raw, id, binder_len)) = found else {
        return Ok(ClientHelloResponse::SUCCESS);
    };
    let bound = binder_hash(binder_len);
    let rebound = id.hash == PskHash::Sha384 && bound == Some(PskHash::Sha256);
    let suites = if rebound {
        REBOUND_SUITES
    } else {
        id.hash.cipher_suite()
    };
    ssl.set_ciphersuites(suites).inspect_err(|_| {
        *alert = SslAlert::INTERNAL_ERROR;
    })?;
    if rebound {
        let note = format!(
            "{id}: the host bound the SHA-384 PSK to SHA-256 (a 32-byte binder, as tlshd 1.0 \
             does); tried as a SHA-256 PSK under {REBOUND_SUITES}"
        );
        with_session(ssl, |session| session.rebound = Some((raw, note)));
    } else if let Some(bound) = bound.filter(|h| *h != id.hash) {
        let why = format!(
            "{id}: the host bound the PSK to {bound:?} (a {binder_len}-byte binder), \
             not to its identity's {:?}",
            id.hash
        );
        with_session(ssl, |session| session.misbound = Some(why));
    }
    Ok(ClientHelloResponse::SUCCESS)
}

/// What the client offers: its identity (as the wire carries it), the TLS PSK and the hash
/// it is bound to.
struct ClientPsk {
    identity: Box<[u8]>,
    key: Zeroizing<Vec<u8>>,
    hash: PskHash,
}

fn client_index() -> Result<Index<Ssl, ClientPsk>, ErrorStack> {
    static INDEX: OnceLock<Index<Ssl, ClientPsk>> = OnceLock::new();
    if let Some(index) = INDEX.get() {
        return Ok(*index);
    }
    let index = Ssl::new_ex_index()?;
    Ok(*INDEX.get_or_init(|| index))
}

/// The client's offer (`tls_ffi::UsePsk`), from the SSL's ex data.
fn offer_psk(ssl: &SslRef) -> Option<(&[u8], &[u8], PskHash)> {
    let psk = ssl.ex_data(client_index().ok()?)?;
    Some((&psk.identity, &psk.key, psk.hash))
}

/// The TLS server of one or more ports (the OpenSSL context; shared by handshake threads).
#[derive(Clone)]
pub struct TlsServer {
    ctx: SslContext,
}

impl TlsServer {
    pub fn new(store: Arc<dyn PskStore>) -> Result<Self, TlsError> {
        let mut ctx = SslContextBuilder::new(SslMethod::tls_server())?;
        ctx.set_min_proto_version(Some(SslVersion::TLS1_3))?;
        ctx.set_max_proto_version(Some(SslVersion::TLS1_3))?;
        // Both suites of NVMe/TCP §3.6.1.3; each connection narrows them to its PSK's
        // (`narrow_suite_to_psk`).
        ctx.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")?;
        ctx.set_options(SslOptions::NO_TICKET | SslOptions::NO_RENEGOTIATION);
        ctx.set_num_tickets(0)?;
        let lookup = Arc::clone(&store);
        ctx.set_client_hello_callback(move |ssl, alert| narrow_suite_to_psk(&*lookup, ssl, alert));
        ctx.set_ex_data(store_index()?, store);
        super::tls_ffi::set_find_psk(&mut ctx, find_psk);
        keylog_into_session(&mut ctx);
        Ok(TlsServer { ctx: ctx.build() })
    }

    /// Runs the server side of the handshake on `stream` (blocking, finished or failed within
    /// `timeout`).
    pub fn handshake(&self, stream: TcpStream, timeout: Duration) -> Result<Established, TlsError> {
        stream.set_nonblocking(false)?;
        let index = session_index()?;
        let mut ssl = Ssl::new(&self.ctx)?;
        ssl.set_ex_data(index, Mutex::new(Session::default()));
        let tls = match ssl.accept(LinkIo::socket(stream, Some(Instant::now() + timeout))) {
            Ok(tls) => tls,
            Err(HandshakeError::SetupFailure(e)) => return Err(e.into()),
            Err(HandshakeError::Failure(mid)) | Err(HandshakeError::WouldBlock(mid)) => {
                let (refused, misbound, rebound) = mid
                    .ssl()
                    .ex_data(index)
                    .and_then(|s| {
                        let mut s = s.lock().ok()?;
                        Some((s.refused.take(), s.misbound.take(), s.rebound.take()))
                    })
                    .unwrap_or_default();
                let error = mid.error().to_string();
                return Err(match (refused, misbound, rebound) {
                    (Some(why), _, _) => TlsError::UnknownIdentity(why),
                    (None, Some(why), _) => TlsError::PskBinding(why, error),
                    (None, None, Some((_, note))) => {
                        TlsError::Handshake(format!("{error} ({note})"))
                    }
                    (None, None, None) => TlsError::Handshake(error),
                });
            }
        };
        established(tls, index)
    }
}

fn established(
    tls: SslStream<LinkIo>,
    index: Index<Ssl, Mutex<Session>>,
) -> Result<Established, TlsError> {
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
    let (Some(identity), Some(psk_hash), Some(client), Some(server)) = (
        session.identity,
        session.psk_hash,
        session.client_secret,
        session.server_secret,
    ) else {
        return Err(TlsError::Handshake(
            "no PSK identity or traffic secrets".into(),
        ));
    };
    let suite = Suite::named(cipher)
        .ok_or_else(|| TlsError::Handshake(format!("unexpected cipher suite {cipher}")))?;
    let (tx, rx) = if tls.ssl().is_server() {
        (server, client)
    } else {
        (client, server)
    };
    Ok(Established {
        tls,
        identity,
        psk_hash,
        cipher: suite.name,
        // Neither side sent a record under its traffic key yet (no tickets): both sequence
        // numbers start at 0 (RFC 8446 §5.3).
        tx: suite.record_keys(&tx, 0),
        rx: suite.record_keys(&rx, 0),
    })
}

/// How a host binds its PSK (RFC 8446 §4.2.11) and which suites it offers with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostBinding {
    /// To its identity's hash, offering that hash's suite (NVMe/TCP §3.6.1.3).
    #[default]
    Identity,
    /// As tlshd 1.0 (ktls-utils on GnuTLS, the Linux host's handshake daemon) does: a
    /// SHA-384 identity's PSK bound to SHA-256, offering TLS_AES_256_GCM_SHA384 and
    /// TLS_CHACHA20_POLY1305_SHA256 (its "PSK SHA384 priority string"); a SHA-256 identity
    /// as [`HostBinding::Identity`].
    Tlshd1,
}

impl HostBinding {
    /// The hash the PSK of an identity of hash `hash` is bound to, and the suites offered
    /// (OpenSSL's list, in the host's order of preference).
    fn offer(self, hash: PskHash) -> (PskHash, &'static str) {
        match (self, hash) {
            (HostBinding::Tlshd1, PskHash::Sha384) => (
                PskHash::Sha256,
                "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
            ),
            _ => (hash, hash.cipher_suite()),
        }
    }
}

/// The host side of the handshake (what tlshd does for the Linux host): offers `identity`
/// with the TLS PSK `psk` derived for it, bound as `binding` says, within `timeout`.
pub fn client_handshake(
    stream: TcpStream,
    identity: &Identity,
    psk: &[u8],
    binding: HostBinding,
    timeout: Duration,
) -> Result<Established, TlsError> {
    let (bind, suites) = binding.offer(identity.hash);
    client_handshake_offering(stream, identity, psk, bind, suites, timeout)
}

/// [`client_handshake`] with the PSK bound to `bind`, offering the cipher suites `suites`
/// (OpenSSL's list, in the client's order of preference).
fn client_handshake_offering(
    stream: TcpStream,
    identity: &Identity,
    psk: &[u8],
    bind: PskHash,
    suites: &str,
    timeout: Duration,
) -> Result<Established, TlsError> {
    stream.set_nonblocking(false)?;
    let index = session_index()?;
    let mut ctx = SslContextBuilder::new(SslMethod::tls_client())?;
    ctx.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    ctx.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    ctx.set_ciphersuites(suites)?;
    // A target closes without close_notify (the kernel's record layer sends none): end of
    // stream is the end, not an error.
    ctx.set_options(SslOptions::NO_TICKET | SslOptions::IGNORE_UNEXPECTED_EOF);
    super::tls_ffi::set_use_psk(&mut ctx, offer_psk);
    keylog_into_session(&mut ctx);
    let mut ssl = Ssl::new(&ctx.build())?;
    ssl.set_ex_data(
        client_index()?,
        ClientPsk {
            identity: identity.to_string().into_bytes().into_boxed_slice(),
            key: Zeroizing::new(psk.to_vec()),
            hash: bind,
        },
    );
    ssl.set_ex_data(
        index,
        Mutex::new(Session {
            identity: Some(identity.clone()),
            psk_hash: Some(bind),
            ..Session::default()
        }),
    );
    let tls = ssl
        .connect(LinkIo::socket(stream, Some(Instant::now() + timeout)))
        .map_err(|e| TlsError::Handshake(e.to_string()))?;
    established(tls, index)
}

/// The handshake's traffic secrets (OpenSSL's key log lines, NSS format) into the session's
/// ex data: the kernel record layer needs them.
fn keylog_into_session(ctx: &mut SslContextBuilder) {
    ctx.set_keylog_callback(|ssl, line| {
        let mut words = line.split(' ');
        let (Some(label), Some(_random), Some(secret)) = (words.next(), words.next(), words.next())
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
}

/// A TLS 1.3 cipher suite this target runs: its hash and AEAD (RFC 8446 §B.4).
#[derive(Clone, Copy)]
struct Suite {
    name: &'static str,
    sha384: bool,
    aead: Aead,
}

impl Suite {
    fn named(name: &str) -> Option<Self> {
        let (name, sha384, aead) = match name {
            "TLS_AES_128_GCM_SHA256" => ("TLS_AES_128_GCM_SHA256", false, Aead::Aes128Gcm),
            "TLS_AES_256_GCM_SHA384" => ("TLS_AES_256_GCM_SHA384", true, Aead::Aes256Gcm),
            "TLS_CHACHA20_POLY1305_SHA256" => (
                "TLS_CHACHA20_POLY1305_SHA256",
                false,
                Aead::ChaCha20Poly1305,
            ),
            _ => return None,
        };
        Some(Suite { name, sha384, aead })
    }

    /// `[sender]_write_key` and `[sender]_write_iv` from a traffic secret (RFC 8446 §7.3).
    fn record_keys(self, secret: &[u8], seq: u64) -> RecordKeys {
        let key_len = self.aead.key_len();
        let mut key = Zeroizing::new(vec![0u8; key_len]);
        let mut iv = [0u8; 12];
        let key_info = hkdf_label(b"key", b"", key_len, Derivation::Rfc8446);
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
        RecordKeys {
            aead: self.aead,
            key,
            iv,
            seq,
        }
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
    use std::io::{IoSlice, IoSliceMut, Read, Write};
    use std::net::TcpListener;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001";
    const SUB: &str = "nqn.2026-12.dev.nvmfd:tls";
    const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    /// A SHA-384 configured PSK (48 bytes 0x64..0x93).
    const KEY384: &str =
        "NVMeTLSkey-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";

    struct OneKey(ConfiguredPsk);

    impl PskStore for OneKey {
        fn tls_psk(&self, identity: &Identity) -> Option<Zeroizing<Vec<u8>>> {
            (identity.hostnqn == HOST && identity.subnqn == SUB)
                .then(|| self.0.tls_psk(identity, Derivation::Rfc8446))
                .flatten()
        }
    }

    fn server() -> TlsServer {
        server_with(KEY)
    }

    fn server_with(key: &str) -> TlsServer {
        TlsServer::new(Arc::new(OneKey(ConfiguredPsk::parse(key).unwrap()))).unwrap()
    }

    /// An OpenSSL TLS 1.3 client offering `identity` with `psk`, as tlshd does for the host.
    fn client(
        stream: TcpStream,
        identity: String,
        psk: Vec<u8>,
    ) -> Result<openssl::ssl::SslStream<TcpStream>, String> {
        let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
        b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
        b.set_ciphersuites("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256")
            .unwrap();
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

    fn aead_cipher(aead: Aead) -> Cipher {
        match aead {
            Aead::Aes128Gcm => Cipher::aes_128_gcm(),
            Aead::Aes256Gcm => Cipher::aes_256_gcm(),
            Aead::ChaCha20Poly1305 => Cipher::chacha20_poly1305(),
        }
    }

    /// TLS 1.3 record: header (RFC 8446 §5.2) + the AEAD of content || type with the nonce
    /// iv XOR seq (§5.3). Seals `plain` as application data.
    fn seal(keys: &RecordKeys, plain: &[u8]) -> Vec<u8> {
        let mut inner = plain.to_vec();
        inner.push(23);
        let len = (inner.len() + 16) as u16;
        let header = [23, 3, 3, (len >> 8) as u8, len as u8];
        let mut tag = [0u8; 16];
        let ct = encrypt_aead(
            aead_cipher(keys.aead),
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
        let sent = exchange_first_records(&est);
        assert_eq!(t.join().unwrap(), sent);
    }

    /// The server's side of the first application records: opens the client's with the RX
    /// keys (expecting "ICReq under TLS"), sends "ICResp" sealed with the TX keys; returns
    /// what the client is to read.
    fn exchange_first_records(est: &Established) -> Vec<u8> {
        let mut stream = est.tls.get_ref().stream().unwrap().try_clone().unwrap();
        let mut header = [0u8; 5];
        stream.read_exact(&mut header).unwrap();
        assert_eq!(header[0], 23, "application data record");
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).unwrap();
        let (ct, tag) = body.split_at(len - 16);
        let plain = decrypt_aead(
            aead_cipher(est.rx.aead),
            &est.rx.key,
            Some(&nonce(&est.rx)),
            &header,
            ct,
            tag,
        )
        .unwrap();
        assert_eq!(plain, b"ICReq under TLS\x17");
        stream.write_all(&seal(&est.tx, b"ICResp")).unwrap();
        b"ICResp".to_vec()
    }

    /// The record keys of every suite (the kernel's record layer gets them; this host has
    /// none to try them on): AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305 (a SHA-384
    /// identity bound to SHA-256 as tlshd 1.0 does), each opening the client's first record
    /// and sealing one the client's OpenSSL reads.
    #[test]
    fn record_keys_of_every_suite_are_the_sessions() {
        for (key_text, binding, suite, aead) in [
            (
                KEY,
                HostBinding::Identity,
                "TLS_AES_128_GCM_SHA256",
                Aead::Aes128Gcm,
            ),
            (
                KEY384,
                HostBinding::Identity,
                "TLS_AES_256_GCM_SHA384",
                Aead::Aes256Gcm,
            ),
            (
                KEY384,
                HostBinding::Tlshd1,
                "TLS_CHACHA20_POLY1305_SHA256",
                Aead::ChaCha20Poly1305,
            ),
        ] {
            let key = ConfiguredPsk::parse(key_text).unwrap();
            let id = Identity::v0(key.hash(), HOST, SUB);
            let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
            let (srv, cli) = pair();
            let t = std::thread::spawn(move || {
                let est =
                    client_handshake(cli, &id, &psk, binding, Duration::from_secs(10)).unwrap();
                let (cipher, tx, rx) = (est.cipher, est.tx.aead, est.rx.aead);
                let mut tls = est.into_blocking();
                tls.write_all(b"ICReq under TLS").unwrap();
                let mut buf = [0u8; 32];
                let n = tls.read(&mut buf).unwrap();
                (cipher, tx, rx, buf[..n].to_vec())
            });
            let est = server_with(key_text)
                .handshake(srv, Duration::from_secs(10))
                .unwrap();
            assert_eq!(est.cipher, suite);
            assert_eq!((est.tx.aead, est.rx.aead), (aead, aead), "{suite}");
            assert_eq!(est.tx.key.len(), aead.key_len(), "{suite}");
            let sent = exchange_first_records(&est);
            assert_eq!(t.join().unwrap(), (suite, aead, aead, sent), "{suite}");
        }
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

    /// Both ends of one session with their record layers in user space (non-blocking).
    fn user_space_pair() -> ((TcpStream, RecordLayer), (TcpStream, RecordLayer)) {
        user_space_pair_with(KEY, "TLS_AES_128_GCM_SHA256")
    }

    fn user_space_pair_with(
        key_text: &str,
        cipher: &str,
    ) -> ((TcpStream, RecordLayer), (TcpStream, RecordLayer)) {
        user_space_pair_as(key_text, true, HostBinding::Identity, cipher)
    }

    /// [`user_space_pair_with`] with a version 0 or 1 identity, the client binding its PSK as
    /// `binding` says.
    fn user_space_pair_as(
        key_text: &str,
        version_1: bool,
        binding: HostBinding,
        cipher: &str,
    ) -> ((TcpStream, RecordLayer), (TcpStream, RecordLayer)) {
        let (srv, cli) = pair();
        let key = ConfiguredPsk::parse(key_text).unwrap();
        let id = if version_1 {
            Identity::v1(&key, HOST, SUB, Derivation::Rfc8446)
        } else {
            Identity::v0(key.hash(), HOST, SUB)
        };
        let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap().to_vec();
        let t = std::thread::spawn(move || {
            client_handshake(cli, &id, &psk, binding, Duration::from_secs(10))
                .unwrap()
                .secure(false)
                .unwrap()
        });
        let server = server_with(key_text)
            .handshake(srv, Duration::from_secs(10))
            .unwrap()
            .secure(false)
            .unwrap();
        let client = t.join().unwrap();
        assert_eq!(server.kind(), RecordLayerKind::User);
        assert_eq!((server.cipher, client.cipher), (cipher, cipher));
        assert_eq!(server.identity, client.identity);
        assert_eq!(server.psk_hash, client.psk_hash);
        let open = |s: Secured| (s.stream, *s.record.unwrap());
        (open(server), open(client))
    }

    fn send_all(end: &mut (TcpStream, RecordLayer), mut data: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !data.is_empty() || end.1.has_output() {
            assert!(Instant::now() < deadline, "send stalled");
            match end.1.write_vectored(&mut &end.0, &[IoSlice::new(data)]) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }

    fn receive(end: &mut (TcpStream, RecordLayer), len: usize) -> io::Result<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = vec![0u8; len];
        let mut have = 0;
        while have < len {
            assert!(Instant::now() < deadline, "receive stalled");
            match end.1.read(&mut &end.0, &mut out[have..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Answers (KeyUpdates) go out while waiting, as the reactor flushes.
                    let _ = end.1.flush(&mut &end.0);
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Data both ways through the user-space record layers, large writes and small ones, and
    /// KeyUpdates (one requesting ours in return) between them: the data arrives intact under
    /// the new keys on both sides.
    #[test]
    fn user_space_record_layer_moves_data_across_key_updates() {
        let (mut server, mut client) = user_space_pair();
        let big = pattern(300_000, 7);
        send_all(&mut client, &big);
        assert_eq!(receive(&mut server, big.len()).unwrap(), big);
        for request in [false, true, true] {
            client.1.key_update(request).unwrap();
            send_all(&mut client, b"after a KeyUpdate");
            assert_eq!(receive(&mut server, 17).unwrap(), b"after a KeyUpdate");
            let echo = pattern(70_000, 9);
            send_all(&mut server, &echo);
            assert_eq!(receive(&mut client, echo.len()).unwrap(), echo);
        }
        // Many small writes in one gather: one record, the bytes in order.
        let pieces = [&b"abc"[..], b"", b"defgh", &[0u8; 100]];
        let iov: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        assert_eq!(server.1.write_vectored(&mut &server.0, &iov).unwrap(), 108);
        send_all(&mut server, &[]);
        assert_eq!(receive(&mut client, 108).unwrap(), pieces.concat());
        // close_notify is not required: end of stream at a record boundary is a clean close.
        drop(client);
        let mut buf = [0u8; 16];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match server.1.read(&mut &server.0, &mut buf) {
                Ok(0) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline);
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => panic!("expected end of stream, got {other:?}"),
            }
        }
    }

    /// KeyUpdates without data in between beyond the limit: the connection fails (and only
    /// the reading of it), whatever the peer asks for.
    #[test]
    fn key_update_flood_is_cut_off() {
        let (mut server, mut client) = user_space_pair();
        for i in 0..=super::super::record::MAX_RECORDS_WITHOUT_DATA {
            client.1.key_update(i % 2 == 0).unwrap();
        }
        send_all(&mut client, b"late");
        let err = receive(&mut server, 4).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("without data"), "{err}");
    }

    /// A record that does not authenticate, and one cut short by the end of the stream: each
    /// is an error for that connection.
    #[test]
    fn forged_or_truncated_records_fail() {
        let (mut server, client) = user_space_pair();
        let mut forged = vec![23, 3, 3, 0, 40];
        forged.extend_from_slice(&[0x41; 40]);
        (&client.0).write_all(&forged).unwrap();
        let err = receive(&mut server, 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");

        let (mut server, client) = user_space_pair();
        (&client.0).write_all(&[23, 3, 3, 0, 200, 1, 2, 3]).unwrap();
        client.0.shutdown(std::net::Shutdown::Write).unwrap();
        let err = receive(&mut server, 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    }

    /// A socket in memory as edge-triggered readiness leaves it: what arrived since the last
    /// event is there at the next read, then the reads fail with WouldBlock (the socket has
    /// nothing more and no new event will come). It takes at most `room` bytes of writes.
    struct MemSocket {
        input: Vec<u8>,
        reads: usize,
        written: Vec<u8>,
        room: usize,
    }

    impl MemSocket {
        fn new(input: Vec<u8>, room: usize) -> Self {
            MemSocket {
                input,
                reads: 0,
                written: Vec::new(),
                room,
            }
        }
    }

    impl Read for MemSocket {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            if self.input.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.input.len());
            buf[..n].copy_from_slice(&self.input[..n]);
            self.input.drain(..n);
            Ok(n)
        }
    }

    impl Write for MemSocket {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room - self.written.len());
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The records of one burst as the host's record layer seals them: data of 1 byte to
    /// several full records, an empty write (no record) and a KeyUpdate between them, more
    /// ciphertext in all than one receive buffer holds. Returns the ciphertext and the
    /// plaintext it carries.
    fn burst(client: &mut RecordLayer) -> (Vec<u8>, Vec<u8>) {
        let chunks = [
            pattern(10, 1),
            pattern(4168, 2),
            Vec::new(),
            pattern(16384, 3),
            pattern(1, 4),
            pattern(30_000, 5),
            pattern(72, 6),
            pattern(70_000, 7),
        ];
        let mut wire = MemSocket::new(Vec::new(), usize::MAX);
        for (i, chunk) in chunks.iter().enumerate() {
            if i == 2 {
                client.key_update(false).unwrap();
            }
            let mut rest = &chunk[..];
            loop {
                let n = client
                    .write_vectored(&mut wire, &[IoSlice::new(rest)])
                    .unwrap();
                rest = &rest[n..];
                if rest.is_empty() {
                    break;
                }
            }
            assert!(!client.has_output());
        }
        (wire.written, chunks.concat())
    }

    /// A burst of records arrives at once, as one readiness event: a consumer taking a few
    /// bytes at a time gets every byte before the record layer first says WouldBlock. The
    /// reactor reads until WouldBlock and is not woken again for bytes the socket already
    /// delivered (edge-triggered), so plaintext left in OpenSSL (`SSL_pending`) or ciphertext
    /// left in the receive buffer at that point would wait for the next packet from the peer.
    #[test]
    fn records_of_one_readiness_event_are_all_delivered_before_would_block() {
        for take in [1usize, 7, 100, 4096, 65536] {
            let (mut server, mut client) = user_space_pair();
            let (ciphertext, expected) = burst(&mut client.1);
            assert!(ciphertext.len() > super::super::record::RECEIVE_BUFFER);
            let mut sock = MemSocket::new(ciphertext, usize::MAX);
            let mut got = Vec::new();
            let mut buf = vec![0u8; take];
            let end = loop {
                match server.1.read(&mut sock, &mut buf) {
                    Ok(0) => break "end of stream",
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break "WouldBlock",
                    Err(e) => panic!("read with {take}-byte buffers: {e}"),
                }
            };
            assert_eq!(end, "WouldBlock");
            assert_eq!(got.len(), expected.len(), "{take}-byte buffers");
            assert!(got == expected, "{take}-byte buffers: data differs");
        }
    }

    /// One socket read feeds several records: a burst of three records that one read brings
    /// is opened by one read call, gathered in order across the caller's buffers (a command's
    /// data, then the staging buffer); the next call reads the socket, which is drained.
    /// Buffers smaller than the burst take it in turn, still from that one socket read.
    #[test]
    fn one_socket_read_feeds_several_records() {
        let (mut server, mut client) = user_space_pair();
        let parts = [pattern(1000, 1), pattern(3000, 2), pattern(500, 3)];
        let mut wire = MemSocket::new(Vec::new(), usize::MAX);
        for part in &parts {
            // One write call, one record.
            let taken = client.1.write_vectored(&mut wire, &[IoSlice::new(part)]);
            assert_eq!(taken.unwrap(), part.len());
        }
        let expected = parts.concat();

        let mut sock = MemSocket::new(wire.written.clone(), usize::MAX);
        let (mut data, mut staging) = (vec![0u8; 1500], vec![0u8; 32 * 1024]);
        let mut iov = [IoSliceMut::new(&mut data), IoSliceMut::new(&mut staging)];
        assert_eq!(server.1.read_vectored(&mut sock, &mut iov).unwrap(), 4500);
        assert_eq!(sock.reads, 1);
        assert!(data[..] == expected[..1500] && staging[..3000] == expected[1500..]);
        let err = server.1.read(&mut sock, &mut staging).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(sock.reads, 2);

        let (mut server, mut client) = user_space_pair();
        let mut wire = MemSocket::new(Vec::new(), usize::MAX);
        for part in &parts {
            client
                .1
                .write_vectored(&mut wire, &[IoSlice::new(part)])
                .unwrap();
        }
        let mut sock = MemSocket::new(wire.written, usize::MAX);
        let mut got = Vec::new();
        let mut buf = [0u8; 2000];
        for want in [2000, 2000, 500] {
            let n = server.1.read(&mut sock, &mut buf).unwrap();
            assert_eq!(n, want);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(sock.reads, 1);
        assert!(got == expected);
    }

    /// A record that fails after data of the same socket read: the data comes first, the
    /// error with the next call (and the connection closes then).
    #[test]
    fn an_error_after_data_of_the_same_read_comes_with_the_next_call() {
        let (mut server, mut client) = user_space_pair();
        let mut wire = MemSocket::new(Vec::new(), usize::MAX);
        client
            .1
            .write_vectored(&mut wire, &[IoSlice::new(b"ICReq")])
            .unwrap();
        let mut input = wire.written;
        input.extend_from_slice(&[23, 3, 3, 0, 40]);
        input.extend_from_slice(&[0x41; 40]);
        let mut sock = MemSocket::new(input, usize::MAX);
        let mut buf = [0u8; 4096];
        assert_eq!(server.1.read(&mut sock, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"ICReq");
        let err = server.1.read(&mut sock, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert_eq!(sock.reads, 1);
    }

    /// Sending into a socket that takes only part of the sealed records: all the plaintext
    /// is taken, the rest of the ciphertext waits in the record layer and says so
    /// (`has_output`, which arms EPOLLOUT), and flushing when the socket has room delivers
    /// every byte.
    #[test]
    fn sealed_records_the_socket_did_not_take_are_reported_and_sent_later() {
        let (mut server, mut client) = user_space_pair();
        let data = pattern(40_000, 8);
        let mut sock = MemSocket::new(Vec::new(), 1000);
        assert_eq!(
            client
                .1
                .write_vectored(&mut sock, &[IoSlice::new(&data)])
                .unwrap(),
            data.len()
        );
        assert!(client.1.has_output());
        let err = client.1.flush(&mut sock).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        sock.room = usize::MAX;
        client.1.flush(&mut sock).unwrap();
        assert!(!client.1.has_output());
        let mut rx = MemSocket::new(sock.written, usize::MAX);
        let mut got = vec![0u8; data.len()];
        let mut have = 0;
        while have < data.len() {
            have += server.1.read(&mut rx, &mut got[have..]).unwrap();
        }
        assert!(got == data);
    }

    /// A SHA-384 PSK (`NVMe1R02`): TLS_AES_256_GCM_SHA384 with 256-bit record keys, data both
    /// ways; the same key offered under a SHA-256 identity finds nothing.
    #[test]
    fn sha384_psk_negotiates_aes_256_gcm_sha384() {
        let (mut server, mut client) = user_space_pair_with(KEY384, "TLS_AES_256_GCM_SHA384");
        let data = pattern(50_000, 3);
        send_all(&mut client, &data);
        assert_eq!(receive(&mut server, data.len()).unwrap(), data);
        send_all(&mut server, b"ICResp");
        assert_eq!(receive(&mut client, 6).unwrap(), b"ICResp");

        let (srv, cli) = pair();
        let t = std::thread::spawn(move || {
            let id = Identity::v0(PskHash::Sha384, HOST, SUB);
            let key = ConfiguredPsk::parse(KEY384).unwrap();
            let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
            let est = client_handshake(
                cli,
                &id,
                &psk,
                HostBinding::Identity,
                Duration::from_secs(10),
            )
            .unwrap();
            (est.cipher, est.tx.key.len())
        });
        let est = server_with(KEY384)
            .handshake(srv, Duration::from_secs(10))
            .unwrap();
        assert_eq!(est.cipher, "TLS_AES_256_GCM_SHA384");
        assert_eq!((est.tx.key.len(), est.rx.key.len()), (32, 32));
        assert_eq!(t.join().unwrap(), ("TLS_AES_256_GCM_SHA384", 32));

        // A SHA-256 identity for a SHA-384 key: no PSK, no handshake.
        let (srv, cli) = pair();
        let t = std::thread::spawn(move || {
            let id = Identity::v0(PskHash::Sha256, HOST, SUB);
            let binding = HostBinding::Identity;
            client_handshake(cli, &id, &[7u8; 32], binding, Duration::from_secs(10)).map(|_| ())
        });
        assert!(server_with(KEY384)
            .handshake(srv, Duration::from_secs(10))
            .is_err());
        assert!(t.join().unwrap().is_err());
    }
    /// A PSK is bound to its hash (RFC 8446 §4.2.11): whatever order the host offers both
    /// suites in, a SHA-384 PSK gets TLS_AES_256_GCM_SHA384 and a SHA-256 PSK
    /// TLS_AES_128_GCM_SHA256, under either identity version.
    #[test]
    fn psk_hash_decides_the_suite_whatever_the_client_order() {
        let both_128_first = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";
        let both_256_first = "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256";
        let cases = [
            (KEY384, both_128_first, "TLS_AES_256_GCM_SHA384", 32),
            (KEY384, both_256_first, "TLS_AES_256_GCM_SHA384", 32),
            (KEY, both_256_first, "TLS_AES_128_GCM_SHA256", 16),
            (KEY, both_128_first, "TLS_AES_128_GCM_SHA256", 16),
        ];
        for (key_text, offered, expected, key_len) in cases {
            let key = ConfiguredPsk::parse(key_text).unwrap();
            for id in [
                Identity::v0(key.hash(), HOST, SUB),
                Identity::v1(&key, HOST, SUB, Derivation::Rfc8446),
            ] {
                let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
                let (srv, cli) = pair();
                let t = std::thread::spawn(move || {
                    let bind = id.hash;
                    client_handshake_offering(
                        cli,
                        &id,
                        &psk,
                        bind,
                        offered,
                        Duration::from_secs(10),
                    )
                    .map(|est| est.cipher)
                    .map_err(|e| e.to_string())
                });
                let est = server_with(key_text).handshake(srv, Duration::from_secs(10));
                let client = t.join().unwrap();
                let what = format!("{key_text} offered {offered}");
                let est = est.unwrap_or_else(|e| panic!("{what}: server: {e}; client: {client:?}"));
                assert_eq!(est.cipher, expected, "{what}");
                assert_eq!((est.tx.key.len(), est.rx.key.len()), (key_len, key_len));
                assert_eq!(client.as_deref(), Ok(expected), "{what}");
            }
        }
        // A SHA-384 PSK from a host that offers only the SHA-256 suite: no suite fits it.
        let key = ConfiguredPsk::parse(KEY384).unwrap();
        let id = Identity::v0(PskHash::Sha384, HOST, SUB);
        let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
        let (srv, cli) = pair();
        let t = std::thread::spawn(move || {
            let suite = "TLS_AES_128_GCM_SHA256";
            let bind = PskHash::Sha384;
            client_handshake_offering(cli, &id, &psk, bind, suite, Duration::from_secs(10))
                .map(|_| ())
        });
        assert!(server_with(KEY384)
            .handshake(srv, Duration::from_secs(10))
            .is_err());
        assert!(t.join().unwrap().is_err());
    }

    #[test]
    fn offered_psks_are_read_with_every_length_checked() {
        // Two identities ("ab", "c"), each with its ticket age, then binders of 2 and 1 bytes.
        let ids = [0, 15, 0, 2, b'a', b'b', 0, 0, 0, 0, 0, 1, b'c', 0, 0, 0, 0];
        let ext = [&ids[..], &[0, 5, 2, 9, 9, 1, 9]].concat();
        assert_eq!(
            offered_psks(&ext),
            Some(vec![(&b"ab"[..], 2), (&b"c"[..], 1)])
        );
        let cut = |n: usize| ext[..ext.len() - n].to_vec();
        for bad in [
            vec![],
            vec![0],
            vec![0, 0, 0, 0], // no identity
            [&[0, 16][..], &ids[2..], &[0, 5, 2, 9, 9, 1, 9]].concat(), // list beyond its end
            vec![0, 6, 0, 2, b'a', b'b', 0, 0, 0, 2, 1, 9], // ticket age cut off
            vec![0, 5, 0, 0, 0, 0, 0, 0, 2, 1, 9], // empty identity
            vec![0, 7, 0, 9, b'a', b'b', 0, 0, 0, 0, 2, 1, 9], // identity beyond the list
            ids.to_vec(),     // no binders
            cut(1),           // binder list beyond the body
            [&ids[..], &[0, 3, 2, 9, 9]].concat(), // one binder for two identities
            [&ids[..], &[0, 6, 2, 9, 9, 1, 9, 0]].concat(), // a third binder
        ] {
            assert_eq!(offered_psks(&bad), None, "{bad:?}");
        }
    }

    /// The PSK (`NVMe0R02` / `NVMe1R02`, 48 bytes) of a SHA-384 identity bound to SHA-256 by
    /// the host (a 32-byte binder), as tlshd 1.0 does offering TLS_AES_256_GCM_SHA384 and
    /// TLS_CHACHA20_POLY1305_SHA256, or as OpenSSL's legacy PSK callback does offering both
    /// AES-GCM suites: run as a SHA-256 PSK under the SHA-256 suite the host offers, both
    /// sides agreeing. The same host with a wrong key, an unknown identity, or no SHA-256
    /// suite on offer still fails.
    #[test]
    fn sha384_identity_bound_to_sha256_runs_as_a_sha256_psk() {
        let key = ConfiguredPsk::parse(KEY384).unwrap();
        for id in [
            Identity::v0(PskHash::Sha384, HOST, SUB),
            Identity::v1(&key, HOST, SUB, Derivation::Rfc8446),
        ] {
            let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
            assert_eq!(psk.len(), 48);
            let (srv, cli) = pair();
            let (client_id, client_psk) = (id.clone(), psk.clone());
            let t = std::thread::spawn(move || {
                let binding = HostBinding::Tlshd1;
                client_handshake(
                    cli,
                    &client_id,
                    &client_psk,
                    binding,
                    Duration::from_secs(10),
                )
                .map(|est| (est.cipher, est.psk_hash))
                .map_err(|e| e.to_string())
            });
            let est = server_with(KEY384)
                .handshake(srv, Duration::from_secs(10))
                .unwrap();
            assert_eq!(est.identity, id);
            assert_eq!(
                (est.cipher, est.psk_hash),
                ("TLS_CHACHA20_POLY1305_SHA256", PskHash::Sha256)
            );
            assert_eq!(
                t.join().unwrap(),
                Ok(("TLS_CHACHA20_POLY1305_SHA256", PskHash::Sha256))
            );

            let (srv, cli) = pair();
            let (name, legacy_psk) = (id.to_string(), psk.to_vec());
            let t = std::thread::spawn(move || client(cli, name, legacy_psk).map(|_| ()));
            let est = server_with(KEY384)
                .handshake(srv, Duration::from_secs(10))
                .unwrap();
            assert_eq!(
                (est.cipher, est.psk_hash),
                ("TLS_AES_128_GCM_SHA256", PskHash::Sha256)
            );
            t.join().unwrap().unwrap();
        }

        let id = Identity::v0(PskHash::Sha384, HOST, SUB);
        let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
        let stranger = Identity::v0(PskHash::Sha384, HOST, "nqn.2026-12.dev.nvmfd:other");
        let only_aes256 = "TLS_AES_256_GCM_SHA384";
        let cases = [
            (
                id.clone(),
                vec![0x5a; 48],
                REBOUND_SUITES,
                "tried as a SHA-256 PSK",
            ),
            (
                stranger,
                psk.to_vec(),
                REBOUND_SUITES,
                "no PSK for identity",
            ),
            (id, psk.to_vec(), only_aes256, "tried as a SHA-256 PSK"),
        ];
        for (id, psk, suites, reason) in cases {
            let (srv, cli) = pair();
            let what = format!("{id} offering {suites}");
            let t = std::thread::spawn(move || {
                let (bind, timeout) = (PskHash::Sha256, Duration::from_secs(10));
                client_handshake_offering(cli, &id, &psk, bind, suites, timeout).map(|_| ())
            });
            let err = server_with(KEY384)
                .handshake(srv, Duration::from_secs(10))
                .err()
                .unwrap_or_else(|| panic!("{what}: the handshake must fail"));
            assert!(err.to_string().contains(reason), "{what}: {err}");
            assert!(t.join().unwrap().is_err(), "{what}: the client must see it");
        }
    }

    /// A SHA-256 identity whose PSK the host bound to SHA-384 (a 48-byte binder): no suite
    /// verifies it, and the refusal says why.
    #[test]
    fn sha256_identity_bound_to_sha384_is_refused_with_the_reason() {
        let id = Identity::v0(PskHash::Sha256, HOST, SUB);
        let psk = host_psk(&id);
        let (srv, cli) = pair();
        let t = std::thread::spawn(move || {
            let suites = "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256";
            let (bind, timeout) = (PskHash::Sha384, Duration::from_secs(10));
            client_handshake_offering(cli, &id, &psk, bind, suites, timeout).map(|_| ())
        });
        let err = server()
            .handshake(srv, Duration::from_secs(10))
            .err()
            .expect("a misbound PSK must fail the handshake");
        assert!(t.join().unwrap().is_err());
        match err {
            TlsError::PskBinding(why, _) => {
                assert!(why.contains("Sha384 (a 48-byte binder)"), "{why}")
            }
            other => panic!("{other}"),
        }
    }

    /// Sealed by `sender` into memory: `first`, a KeyUpdate, `second` (three records).
    fn sealed(sender: &mut RecordLayer, first: &[u8], second: &[u8]) -> Vec<u8> {
        let mut wire = MemSocket::new(Vec::new(), usize::MAX);
        let taken = sender.write_vectored(&mut wire, &[IoSlice::new(first)]);
        assert_eq!(taken.unwrap(), first.len());
        sender.key_update(false).unwrap();
        let taken = sender.write_vectored(&mut wire, &[IoSlice::new(second)]);
        assert_eq!(taken.unwrap(), second.len());
        assert!(!sender.has_output());
        wire.written
    }

    /// Reads from `sock` until the record layer says WouldBlock.
    fn drain(receiver: &mut RecordLayer, sock: &mut MemSocket, got: &mut Vec<u8>) {
        let mut buf = [0u8; 512];
        loop {
            match receiver.read(sock, &mut buf) {
                Ok(0) => panic!("end of stream"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Every suite × identity version (ChaCha20-Poly1305: a SHA-384 identity bound to SHA-256
    /// as tlshd 1.0 does), user-space record layers at both ends: data both ways over the
    /// socket, then records (data, KeyUpdate, data) in each direction arriving in two pieces
    /// cut at every byte — each cut a new set of records of the same session — the plaintext
    /// intact every time.
    #[test]
    fn every_suite_moves_data_both_ways_split_at_every_byte() {
        let cases = [
            (KEY, HostBinding::Identity, "TLS_AES_128_GCM_SHA256"),
            (KEY384, HostBinding::Identity, "TLS_AES_256_GCM_SHA384"),
            (KEY384, HostBinding::Tlshd1, "TLS_CHACHA20_POLY1305_SHA256"),
        ];
        for (key_text, binding, suite) in cases {
            for version_1 in [false, true] {
                let what = format!("{suite}, identity version {}", u8::from(version_1));
                let (mut server, mut client) =
                    user_space_pair_as(key_text, version_1, binding, suite);
                let data = pattern(50_000, 4);
                send_all(&mut client, &data);
                assert!(receive(&mut server, data.len()).unwrap() == data, "{what}");
                send_all(&mut server, &data[..20_000]);
                assert!(
                    receive(&mut client, 20_000).unwrap() == data[..20_000],
                    "{what}"
                );

                let (first, second) = (pattern(5, 1), pattern(300, 2));
                let expected = [&first[..], &second[..]].concat();
                for client_sends in [true, false] {
                    let (sender, receiver) = if client_sends {
                        (&mut client.1, &mut server.1)
                    } else {
                        (&mut server.1, &mut client.1)
                    };
                    // The first set read whole, then one set per cut.
                    let wire = sealed(sender, &first, &second);
                    let len = wire.len();
                    let mut sock = MemSocket::new(wire, usize::MAX);
                    let mut got = Vec::new();
                    drain(receiver, &mut sock, &mut got);
                    assert!(got == expected, "{what}: whole");
                    for cut in 1..len {
                        let wire = sealed(sender, &first, &second);
                        assert_eq!(wire.len(), len);
                        let mut sock = MemSocket::new(wire[..cut].to_vec(), usize::MAX);
                        let mut got = Vec::new();
                        drain(receiver, &mut sock, &mut got);
                        sock.input.extend_from_slice(&wire[cut..]);
                        drain(receiver, &mut sock, &mut got);
                        assert!(got == expected, "{what}: split at byte {cut}");
                    }
                }
            }
        }
    }
}
