//! Hostile hosts of a subsystem that requires in-band authentication (NVMe Base 2.0 §8.13,
//! DH-HMAC-CHAP): commands other than Fabrics ones before a queue authenticated fail with
//! Authentication Required (SCT 1h, SC 91h, DNR) and have no effect (§8.13.1); malformed,
//! out-of-order, replayed or unacceptable AUTH messages end the transaction with AUTH_Failure1
//! at the next Authentication Receive, bad command fields fail the command (§6.1, §6.2).
//!
//! Failures from one address are throttled after a few (nvme::auth::FailureLimiter): that
//! changes nothing for these cases (a refused AUTH_Negotiate is answered by AUTH_Failure1 too),
//! but the cases that must succeed or need a Challenge run first.

use nvme::auth::CONNECT_AUTHREQ_ATR;
use nvme::spec::admin_opcode::IDENTIFY;
use nvme::spec::fctype;
use nvme::wire::{SglDescriptor, Status};
use nvmfd_auth::host::Host;
use nvmfd_auth::wire::{self as auth_wire, Negotiate};
use nvmfd_auth::{DhGroup, HashId};
use transport::client::{Client, ClientError, DataOut};

use crate::fixture::{self, auth_receive, auth_send, auth_sqe, authenticate, AUTH_AL};
use crate::support::*;

const REQUIRED: Status = Status::AUTHENTICATION_REQUIRED;

/// A queue of [`KEYED_NQN`] connected (not authenticated); checks AUTHREQ.ATR in DW0.
fn keyed_queue(d: &Daemon, qid: u16, cntlid: u16) -> Result<(Client, u16), String> {
    let mut c = established(d);
    let r = fixture::connect_raw(&mut c, (qid, cntlid), (KEYED_NQN, HOSTNQN, HOSTID))
        .map_err(|e| format!("Connect: {e}"))?;
    expect_status("Connect", r.cqe.status, Status::SUCCESS)?;
    expect(r.cqe.dw0 & CONNECT_AUTHREQ_ATR != 0, || {
        format!("Connect DW0 {:#x} without AUTHREQ.ATR", r.cqe.dw0)
    })?;
    Ok((c, r.cqe.dw0 as u16))
}

/// An enabled admin queue of a new controller of [`KEYED_NQN`], not authenticated.
fn keyed_admin(d: &Daemon) -> Result<(Client, u16), String> {
    let (mut c, cntlid) = keyed_queue(d, 0, 0xffff)?;
    // Property Get/Set are Fabrics commands: allowed before authentication.
    c.enable_controller(WAIT)
        .map_err(|e| format!("CC.EN before authentication: {e}"))?;
    Ok((c, cntlid))
}

/// The host role with the right key, offering SHA-256 and the NULL DH group.
fn host(d: &Daemon) -> Host {
    let mut h = Host::new(d.host_key.clone().unwrap(), None, HOSTNQN, KEYED_NQN);
    h.hashes = vec![HashId::Sha256];
    h.dh_groups = vec![DhGroup::Null];
    h
}

fn send_ok(c: &mut Client, payload: Vec<u8>) -> Result<(), String> {
    expect_status(
        "Authentication Send",
        auth_send(c, payload),
        Status::SUCCESS,
    )
}

/// The next Authentication Receive succeeds and returns AUTH_Failure1 for transaction `tid`.
fn expect_failure1(c: &mut Client, tid: u16) -> Result<(), String> {
    let (status, msg) = auth_receive(c);
    expect_status("Authentication Receive", status, Status::SUCCESS)?;
    let f = auth_wire::Failure::decode(&msg[..auth_wire::FAILURE_LEN])
        .map_err(|e| format!("not an AUTH_Failure1: {e}"))?;
    expect(
        msg[0] == auth_wire::AUTH_TYPE_COMMON
            && f.auth_id == auth_wire::MSG_FAILURE1
            && f.tid == tid,
        || format!("expected AUTH_Failure1 for T_ID {tid}, got {f:?}"),
    )
}

fn identify(c: &mut Client) -> Result<Status, String> {
    let s = sqe(IDENTIFY, 0, 0x11, SglDescriptor::transport_data_block(4096));
    let mut s = s;
    s.cdw10 = 1;
    status_of(c, s, &[], 4096)
}

/// The queue is still unauthenticated: Identify fails with Authentication Required.
fn still_required(c: &mut Client) -> Result<(), String> {
    expect_status("Identify", identify(c)?, REQUIRED.with_dnr())
}

/// Admin and I/O commands before authentication: 4191h with DNR, no effect; after it they
/// work, and the write sent before never reached the namespace.
pub fn commands_before_authentication(d: &Daemon) -> Result<(), String> {
    let (mut admin, cntlid) = keyed_admin(d)?;
    still_required(&mut admin)?;
    match admin.set_features(0x07, 0) {
        Err(ClientError::Status(status)) => {
            expect_status("Set Features", status, REQUIRED.with_dnr())?
        }
        other => return Err(format!("Set Features before authentication: {other:?}")),
    }
    authenticate(&mut admin, &mut host(d), 1).map_err(|e| format!("admin: {e}"))?;
    expect_status("Identify after", identify(&mut admin)?, Status::SUCCESS)?;
    let sf = admin
        .set_features(0x07, 0)
        .map_err(|e| format!("Set Features: {e}"))?;
    expect_status("Set Features after", sf.status, Status::SUCCESS)?;

    // The I/O queue authenticates on its own (§8.13.1: per queue).
    let (mut io, _) = keyed_queue(d, 1, cntlid)?;
    io.in_capsule_limit = IN_CAPSULE;
    let data = pattern(4096, 0x4191);
    let w = write_sqe(1, 0, 8, 0x21, SglDescriptor::in_capsule(0, 4096));
    expect_status(
        "Write before",
        status_of(&mut io, w, &data, 0)?,
        REQUIRED.with_dnr(),
    )?;
    expect_status(
        "Read before",
        status_of(&mut io, read_sqe(1, 0, 8, 0x22), &[], 4096)?,
        REQUIRED.with_dnr(),
    )?;
    authenticate(&mut io, &mut host(d), 2).map_err(|e| format!("I/O queue: {e}"))?;
    let back = read_back(&mut io, 1, 0, 8)?;
    expect(back.iter().all(|&b| b == 0), || {
        "the write sent before authentication reached the namespace".to_owned()
    })
}

/// The messages of a completed transaction sent again in a new one: the old Reply does not
/// answer the new challenge.
pub fn replayed_reply(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = keyed_admin(d)?;
    let mut h = host(d);
    let negotiate = h.negotiate(7);
    send_ok(&mut c, negotiate.clone())?;
    let (status, challenge) = auth_receive(&mut c);
    expect_status("Receive Challenge", status, Status::SUCCESS)?;
    let reply = h.reply(&challenge).map_err(|e| format!("reply: {e}"))?;
    send_ok(&mut c, reply.clone())?;
    let (status, success1) = auth_receive(&mut c);
    expect_status("Receive Success1", status, Status::SUCCESS)?;
    h.success1(&success1)
        .map_err(|e| format!("success1: {e}"))?;
    expect_status("Identify", identify(&mut c)?, Status::SUCCESS)?;

    // Replay: same Negotiate (same T_ID), a fresh challenge is issued, the old Reply fails.
    send_ok(&mut c, negotiate)?;
    let (status, _) = auth_receive(&mut c);
    expect_status("Receive Challenge again", status, Status::SUCCESS)?;
    send_ok(&mut c, reply)?;
    expect_failure1(&mut c, 7)
}

/// The Reply carries another transaction's T_ID.
pub fn reply_wrong_transaction_id(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = keyed_admin(d)?;
    let mut h = host(d);
    send_ok(&mut c, h.negotiate(3))?;
    let (status, challenge) = auth_receive(&mut c);
    expect_status("Receive Challenge", status, Status::SUCCESS)?;
    let mut reply = h.reply(&challenge).map_err(|e| format!("reply: {e}"))?;
    reply[4..6].copy_from_slice(&4u16.to_le_bytes());
    send_ok(&mut c, reply)?;
    expect_failure1(&mut c, 3)?;
    still_required(&mut c)
}

/// Length fields inside the messages that do not match the payload.
pub fn lying_message_lengths(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = keyed_admin(d)?;
    // Reply: DHVLEN claims 65535 bytes of DH value, HL 255 bytes of response.
    for (offset, value) in [(10usize, 0xffu8), (6, 0xff)] {
        let mut h = host(d);
        send_ok(&mut c, h.negotiate(9))?;
        let (status, challenge) = auth_receive(&mut c);
        expect_status("Receive Challenge", status, Status::SUCCESS)?;
        let mut reply = h.reply(&challenge).map_err(|e| format!("reply: {e}"))?;
        reply[offset] = value;
        if offset == 10 {
            reply[11] = 0xff;
        }
        send_ok(&mut c, reply)?;
        expect_failure1(&mut c, 9)?;
    }
    // AUTH_Negotiate: NAPD claims five descriptors, one is there.
    let mut neg = host(d).negotiate(5);
    neg[7] = 5;
    send_ok(&mut c, neg)?;
    expect_failure1(&mut c, 5)?;
    still_required(&mut c)?;
    // HALEN beyond the 30 hash identifiers a descriptor holds.
    let mut neg = host(d).negotiate(6);
    neg[auth_wire::NEGOTIATE_HEADER_LEN + 2] = 200;
    send_ok(&mut c, neg)?;
    expect_failure1(&mut c, 6)?;
    // A message shorter than its header.
    send_ok(
        &mut c,
        vec![auth_wire::AUTH_TYPE_COMMON, auth_wire::MSG_NEGOTIATE],
    )?;
    let (status, msg) = auth_receive(&mut c);
    expect_status("Receive after a short Negotiate", status, Status::SUCCESS)?;
    expect(msg[1] == auth_wire::MSG_FAILURE1, || {
        format!("expected AUTH_Failure1, got {:02x?}", &msg[..8])
    })?;
    still_required(&mut c)
}

/// Command fields: TL beyond the largest message, TL 0, TL not the data length, AL 0, wrong
/// SECP; each fails the command alone and the queue stays usable for a good transaction.
pub fn lying_command_lengths(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = keyed_admin(d)?;
    let neg = host(d).negotiate(1);
    let huge = nvmfd_auth::controller::MAX_SEND_LEN + 1;
    let cases = [
        (
            "TL above the largest message",
            auth_sqe(fctype::AUTHENTICATION_SEND, huge),
            neg.clone(),
            Status::INVALID_FIELD.with_dnr(),
        ),
        (
            "TL 0",
            auth_sqe(fctype::AUTHENTICATION_SEND, 0),
            neg.clone(),
            Status::INVALID_FIELD.with_dnr(),
        ),
        (
            "TL not the data length",
            auth_sqe(fctype::AUTHENTICATION_SEND, neg.len() as u32 + 8),
            neg.clone(),
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
        ),
    ];
    for (what, mut s, data, want) in cases {
        s.cid = 0x31;
        s.flags = nvme::spec::sqe_flags::PSDT_SGL;
        s.dptr = SglDescriptor::in_capsule(0, data.len() as u32);
        expect_status(what, status_of(&mut c, s, &data, 0)?, want)?;
    }
    let mut s = auth_sqe(fctype::AUTHENTICATION_RECEIVE, 0);
    s.cid = 0x32;
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::transport_data_block(0);
    expect_status(
        "AL 0",
        status_of(&mut c, s, &[], 0)?,
        Status::INVALID_FIELD.with_dnr(),
    )?;
    let mut s = auth_sqe(fctype::AUTHENTICATION_RECEIVE, AUTH_AL);
    s.cdw10 = (s.cdw10 & 0x00ff_ffff) | 0xea << 24;
    s.cid = 0x33;
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::transport_data_block(AUTH_AL);
    expect_status(
        "SECP EAh",
        status_of(&mut c, s, &[], AUTH_AL)?,
        Status::INVALID_FIELD.with_dnr(),
    )?;
    still_required(&mut c)
}

/// A hash or DH group the host's settings do not allow, an unknown hash identifier, a
/// descriptor of another protocol: AUTH_Failure1.
pub fn unacceptable_parameters(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = keyed_admin(d)?;
    let offers: [(&str, Vec<HashId>, Vec<DhGroup>); 2] = [
        ("SHA-512 only", vec![HashId::Sha512], vec![DhGroup::Null]),
        (
            "ffdhe4096 only",
            vec![HashId::Sha256],
            vec![DhGroup::Ffdhe4096],
        ),
    ];
    for (tid, (what, hashes, groups)) in (20u16..).zip(offers) {
        let mut h = host(d);
        h.hashes = hashes;
        h.dh_groups = groups;
        send_ok(&mut c, h.negotiate(tid))?;
        expect_failure1(&mut c, tid).map_err(|e| format!("{what}: {e}"))?;
    }
    let mut neg = host(d).negotiate(30);
    neg[auth_wire::NEGOTIATE_HEADER_LEN + 4] = 0x77; // hash identifier 77h: none such
    send_ok(&mut c, neg)?;
    expect_failure1(&mut c, 30)?;
    let mut neg = host(d).negotiate(31);
    neg[auth_wire::NEGOTIATE_HEADER_LEN] = 0x02; // AUTHID 02h: not DH-HMAC-CHAP
    send_ok(&mut c, neg)?;
    expect_failure1(&mut c, 31)?;
    // Secure channel concatenation (SC_C) is not supported.
    let mut neg = Negotiate::decode(&host(d).negotiate(32)).map_err(|e| e.to_string())?;
    neg.sc_c = 0x01;
    send_ok(&mut c, neg.encode().unwrap())?;
    expect_failure1(&mut c, 32)?;
    still_required(&mut c)
}

/// Messages out of sequence: a Receive with no transaction, a Reply or Success2 before any
/// Negotiate, a Negotiate sent where the Reply is due.
pub fn messages_out_of_sequence(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = keyed_admin(d)?;
    let (status, msg) = auth_receive(&mut c);
    expect_status("Receive without a transaction", status, Status::SUCCESS)?;
    expect(msg[1] == auth_wire::MSG_FAILURE1, || {
        format!("expected AUTH_Failure1, got {:02x?}", &msg[..8])
    })?;
    let success2 = vec![
        auth_wire::AUTH_TYPE_DHCHAP,
        auth_wire::MSG_SUCCESS2,
        0,
        0,
        40,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    send_ok(&mut c, success2)?;
    expect_failure1(&mut c, 40)?;
    let mut h = host(d);
    send_ok(&mut c, h.negotiate(41))?;
    let (status, _) = auth_receive(&mut c);
    expect_status("Receive Challenge", status, Status::SUCCESS)?;
    send_ok(&mut c, h.negotiate(41))?;
    let (status, msg) = auth_receive(&mut c);
    expect_status("Receive", status, Status::SUCCESS)?;
    // A Negotiate restarts the transaction (§8.13.5: the host may start over) or fails it;
    // either way no Success1 can follow without a Reply.
    expect(msg[1] != auth_wire::MSG_SUCCESS1, || {
        "Success1 without a Reply".to_owned()
    })?;
    still_required(&mut c)
}

/// Authentication Send/Receive on a queue of a subsystem without authentication: Invalid
/// Field in Command.
pub fn auth_commands_without_keys(d: &Daemon) -> Result<(), String> {
    let (mut c, _) = admin(d);
    let neg = host(d).negotiate(1);
    let mut s = auth_sqe(fctype::AUTHENTICATION_SEND, neg.len() as u32);
    s.cid = 0x41;
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::in_capsule(0, neg.len() as u32);
    expect_status(
        "Authentication Send",
        status_of(&mut c, s, &neg, 0)?,
        Status::INVALID_FIELD.with_dnr(),
    )?;
    let r = c
        .execute(
            auth_sqe(fctype::AUTHENTICATION_RECEIVE, AUTH_AL),
            DataOut::Read(AUTH_AL),
        )
        .map_err(|e| format!("Authentication Receive: {e}"))?;
    expect_status(
        "Authentication Receive",
        r.cqe.status,
        Status::INVALID_FIELD.with_dnr(),
    )
}

/// An I/O queue of a controller that never authenticated is refused like its admin queue,
/// after all the failures above.
pub fn io_queue_never_authenticated(d: &Daemon) -> Result<(), String> {
    let (mut admin, cntlid) = keyed_admin(d)?;
    still_required(&mut admin)?;
    let (mut io, _) = keyed_queue(d, 1, cntlid)?;
    expect_status(
        "Read",
        status_of(&mut io, read_sqe(1, 0, 1, 0x51), &[], BLOCK)?,
        REQUIRED.with_dnr(),
    )
}

pub const CASES: &[(&str, CaseFn)] = &[
    (
        "commands_before_authentication",
        commands_before_authentication,
    ),
    ("replayed_reply", replayed_reply),
    ("reply_wrong_transaction_id", reply_wrong_transaction_id),
    ("lying_message_lengths", lying_message_lengths),
    ("lying_command_lengths", lying_command_lengths),
    ("unacceptable_parameters", unacceptable_parameters),
    ("messages_out_of_sequence", messages_out_of_sequence),
    ("auth_commands_without_keys", auth_commands_without_keys),
    ("io_queue_never_authenticated", io_queue_never_authenticated),
];
