//! NVMe in-band authentication with DH-HMAC-CHAP, controller side, without I/O.
//!
//! Implements NVMe Base Specification 2.0 §8.13 (in-band authentication, from TP 8006) for the
//! fabrics Authentication Send and Authentication Receive commands (fctype 05h/06h, §6.2 and §6.1):
//! AUTH_Negotiate, DH-HMAC-CHAP_Challenge, _Reply, _Success1, _Success2 and AUTH_Failure1/2
//! (§8.13.5), unidirectional and bidirectional, with SHA-256/384/512 and the NULL, ffdhe2048,
//! ffdhe3072, ffdhe4096, ffdhe6144 and ffdhe8192 DH groups (RFC 7919), and secrets in the
//! `DHHC-1:` interchange format (§8.13.5). Responses are computed byte for byte as Linux
//! (nvmet and the host driver, kernel 6.0 on) computes them. Secure channel concatenation (SC_C,
//! TLS PSK generation) is not implemented and is refused with "concatenation mismatch".
//!
//! - [`key`]: secrets, their interchange format and transformation.
//! - [`wire`]: the constants and the encode/decode of every AUTH message.
//! - [`dh`]: the FFDHE groups.
//! - [`hash`]: HMAC, the augmented challenge and the two responses.
//! - [`controller`]: the per-queue state machine the fabrics command handler drives.
//! - [`host`]: the host side of a transaction (Rust initiators, end-to-end tests).
//!
//! What the fabrics command handler does with it (as Linux nvmet does):
//! - Each queue (admin and I/O) of a host that has a key gets its own [`Controller`], and the
//!   Connect response sets AUTHREQ.ATR (DW0 bit 17 of the Connect response, §6.3) so the host
//!   authenticates that queue.
//! - Authentication Send: [`check_send`], then [`Controller::on_send`] with the TL bytes; the
//!   command completes successfully even when the payload is refused.
//! - Authentication Receive: [`check_receive`], then [`Controller::on_receive`]; the message
//!   goes at the start of the host's buffer, zero-filled up to AL.
//! - Until [`Controller::is_authenticated`], commands other than fabrics commands complete with
//!   Authentication Required (SCT 1h, SC 91h) and DNR; after [`Controller::has_failed`] nvmet
//!   tears the controller down.
#![forbid(unsafe_code)]

pub mod controller;
pub mod dh;
pub mod hash;
pub mod host;
pub mod key;
pub mod wire;

pub use controller::{
    check_receive, check_send, CommandError, CommandStatus, Config, Controller, ReceiveError,
    SendError,
};
pub use dh::DhGroup;
pub use hash::HashId;
pub use key::{KeyError, Secret};
pub use wire::FailureReason;
