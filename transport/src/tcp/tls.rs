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
mod tests;
