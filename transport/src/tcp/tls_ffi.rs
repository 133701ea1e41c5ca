//! OpenSSL calls the `openssl` crate does not wrap (declared here against the libssl it
//! links): `SSL_key_update` (RFC 8446 §4.6.3 KeyUpdate, OpenSSL 1.1.1+).

use std::os::raw::{c_int, c_void};

use foreign_types::ForeignTypeRef;
use openssl::error::ErrorStack;
use openssl::ssl::SslRef;

/// `SSL_KEY_UPDATE_NOT_REQUESTED` / `SSL_KEY_UPDATE_REQUESTED` (ssl.h).
const NOT_REQUESTED: c_int = 0;
const REQUESTED: c_int = 1;

extern "C" {
    fn SSL_key_update(ssl: *mut c_void, updatetype: c_int) -> c_int;
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
