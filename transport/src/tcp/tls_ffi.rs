//! OpenSSL calls the `openssl` crate does not wrap (declared here against the libssl it
//! links, OpenSSL 1.1.1+):
//!
//! - `SSL_key_update` (RFC 8446 §4.6.3 KeyUpdate);
//! - `SSL_client_hello_get0_ext` (an extension of the ClientHello, from the client-hello
//!   callback: the server reads the PSK identities before OpenSSL picks the cipher suite);
//! - the TLS 1.3 external PSK session callbacks (`SSL_CTX_set_psk_find_session_callback`,
//!   `SSL_CTX_set_psk_use_session_callback`), which — unlike the PSK callbacks the crate wraps,
//!   that always pair a key with SHA-256 — take a session naming the cipher suite, so that a
//!   SHA-384 PSK (NVMe/TCP 1.1 §3.6.1.3) goes with TLS_AES_256_GCM_SHA384.
//!
//! Each callback is one `extern "C"` trampoline calling the Rust function registered once
//! with [`set_find_psk`] / [`set_use_psk`]; that function finds its data through the SSL's
//! ex data, so one trampoline serves every context.

use std::os::raw::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use foreign_types::ForeignTypeRef;
use nvmfd_auth::psk::PskHash;
use openssl::error::ErrorStack;
use openssl::ssl::{SslContextBuilder, SslRef};
use zeroize::Zeroizing;

/// `SSL_KEY_UPDATE_NOT_REQUESTED` / `SSL_KEY_UPDATE_REQUESTED` (ssl.h).
const NOT_REQUESTED: c_int = 0;
const REQUESTED: c_int = 1;
/// `TLS1_3_VERSION` (tls1.h).
const TLS1_3_VERSION: c_int = 0x0304;

type FindSessionCb = unsafe extern "C" fn(
    ssl: *mut c_void,
    identity: *const u8,
    identity_len: usize,
    sess: *mut *mut c_void,
) -> c_int;
type UseSessionCb = unsafe extern "C" fn(
    ssl: *mut c_void,
    md: *const c_void,
    id: *mut *const u8,
    idlen: *mut usize,
    sess: *mut *mut c_void,
) -> c_int;

extern "C" {
    fn SSL_key_update(ssl: *mut c_void, updatetype: c_int) -> c_int;
    fn SSL_client_hello_get0_ext(
        ssl: *mut c_void,
        ext_type: c_uint,
        out: *mut *const u8,
        outlen: *mut usize,
    ) -> c_int;
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut c_void, cb: Option<FindSessionCb>);
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut c_void, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut c_void;
    fn SSL_SESSION_free(sess: *mut c_void);
    fn SSL_SESSION_set1_master_key(sess: *mut c_void, key: *const u8, len: usize) -> c_int;
    fn SSL_SESSION_set_cipher(sess: *mut c_void, cipher: *const c_void) -> c_int;
    fn SSL_SESSION_set_protocol_version(sess: *mut c_void, version: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut c_void, id: *const u8) -> *const c_void;
}

/// Schedules a KeyUpdate on `ssl` (sent by the next write or `SSL_do_handshake`).
pub fn key_update(ssl: &SslRef, request_peer: bool) -> Result<(), ErrorStack> {
    let kind = if request_peer {
        REQUESTED
    } else {
        NOT_REQUESTED
    };
    // SAFETY: `ssl` is a live SSL object owned by its stream for the duration of the call;
    // SSL_key_update only sets a flag in it (ssl_lib.c) and reports errors on the error queue.
    let rc = unsafe { SSL_key_update(ssl.as_ptr().cast(), kind) };
    if rc == 1 {
        Ok(())
    } else {
        Err(ErrorStack::get())
    }
}

/// The body of extension `ext_type` of the ClientHello being processed, or None when the
/// client sent none. Only meaningful inside the client-hello callback (after it OpenSSL no
/// longer holds the ClientHello and reports every extension absent).
pub fn client_hello_ext(ssl: &SslRef, ext_type: u16) -> Option<&[u8]> {
    let mut out = std::ptr::null();
    let mut len = 0usize;
    // SAFETY: `ssl` is a live SSL; OpenSSL stores into `out`/`len` a pointer into the
    // ClientHello it holds for the handshake (alive at least as long as the borrow of `ssl`
    // within the callback) and returns 1 when the extension is present.
    unsafe {
        if SSL_client_hello_get0_ext(ssl.as_ptr().cast(), ext_type.into(), &mut out, &mut len) != 1
            || out.is_null()
        {
            return None;
        }
        Some(std::slice::from_raw_parts(out, len))
    }
}

/// The server's lookup: the TLS PSK and its hash for the identity a client offered, or None.
pub type FindPsk = fn(&SslRef, &[u8]) -> Option<(Zeroizing<Vec<u8>>, PskHash)>;
/// The client's offer: the identity, the TLS PSK and its hash, all owned by the SSL (its ex
/// data), or None to offer no PSK.
pub type UsePsk = for<'a> fn(&'a SslRef) -> Option<(&'a [u8], &'a [u8], PskHash)>;

static FIND_PSK: OnceLock<FindPsk> = OnceLock::new();
static USE_PSK: OnceLock<UsePsk> = OnceLock::new();

/// Makes `ctx` look PSK identities up with `find` (the same function for every context).
pub fn set_find_psk(ctx: &mut SslContextBuilder, find: FindPsk) {
    let _ = FIND_PSK.set(find);
    // SAFETY: `ctx` is a live SSL_CTX being built; the trampoline has the signature of
    // SSL_psk_find_session_cb_func and lives for the whole program.
    unsafe { SSL_CTX_set_psk_find_session_callback(ctx.as_ptr().cast(), Some(find_session)) };
}

/// Makes `ctx` offer the PSK `offer` returns (the same function for every context).
pub fn set_use_psk(ctx: &mut SslContextBuilder, offer: UsePsk) {
    let _ = USE_PSK.set(offer);
    // SAFETY: as in `set_find_psk`, for SSL_psk_use_session_cb_func.
    unsafe { SSL_CTX_set_psk_use_session_callback(ctx.as_ptr().cast(), Some(use_session)) };
}

/// A TLS 1.3 session holding `key` as its external PSK, for the cipher suite of `hash`
/// (RFC 8446 §B.4: {0x13,0x01} TLS_AES_128_GCM_SHA256, {0x13,0x02} TLS_AES_256_GCM_SHA384).
/// Null when OpenSSL refuses (the cipher suite unknown to this build, no memory).
///
/// # Safety
/// `ssl` must be a live SSL object (the one the callback was called for).
unsafe fn psk_session(ssl: *mut c_void, key: &[u8], hash: PskHash) -> *mut c_void {
    let suite: [u8; 2] = match hash {
        PskHash::Sha256 => [0x13, 0x01],
        PskHash::Sha384 => [0x13, 0x02],
    };
    // SAFETY: `ssl` is live (caller); `suite` is the two bytes SSL_CIPHER_find reads.
    let cipher = unsafe { SSL_CIPHER_find(ssl, suite.as_ptr()) };
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a new session is ours until handed to OpenSSL; the setters copy `key` and
    // only read `cipher`, a static table entry.
    unsafe {
        let sess = SSL_SESSION_new();
        if sess.is_null() {
            return sess;
        }
        if SSL_SESSION_set1_master_key(sess, key.as_ptr(), key.len()) != 1
            || SSL_SESSION_set_cipher(sess, cipher) != 1
            || SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION) != 1
        {
            SSL_SESSION_free(sess);
            return std::ptr::null_mut();
        }
        sess
    }
}

/// `SSL_psk_find_session_cb_func`: 1 with `*sess` set (a session, or null for "no such
/// identity": the handshake then fails for want of a certificate), 0 on an internal failure.
unsafe extern "C" fn find_session(
    ssl: *mut c_void,
    identity: *const u8,
    identity_len: usize,
    sess: *mut *mut c_void,
) -> c_int {
    let Some(find) = FIND_PSK.get() else { return 0 };
    // SAFETY: OpenSSL passes the live SSL of this handshake, the identity bytes it received
    // (valid for the call) and a place for the session.
    unsafe {
        *sess = std::ptr::null_mut();
        let ssl_ref = SslRef::from_ptr(ssl.cast());
        let identity = if identity.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(identity, identity_len)
        };
        if let Some((key, hash)) = find(ssl_ref, identity) {
            *sess = psk_session(ssl, &key, hash);
            if (*sess).is_null() {
                return 0;
            }
        }
    }
    1
}

/// `SSL_psk_use_session_cb_func`: the identity to offer (owned by the SSL's ex data, so valid
/// as long as OpenSSL may read it) and a session with its key.
unsafe extern "C" fn use_session(
    ssl: *mut c_void,
    _md: *const c_void,
    id: *mut *const u8,
    idlen: *mut usize,
    sess: *mut *mut c_void,
) -> c_int {
    let Some(offer) = USE_PSK.get() else { return 0 };
    // SAFETY: OpenSSL passes the live SSL of this handshake and places for the results; the
    // identity slice lives in that SSL's ex data, which outlives the handshake.
    unsafe {
        *sess = std::ptr::null_mut();
        *id = std::ptr::null();
        *idlen = 0;
        let ssl_ref = SslRef::from_ptr(ssl.cast());
        let Some((identity, key, hash)) = offer(ssl_ref) else {
            return 1;
        };
        let session = psk_session(ssl, key, hash);
        if session.is_null() {
            return 0;
        }
        *sess = session;
        *id = identity.as_ptr();
        *idlen = identity.len();
    }
    1
}
