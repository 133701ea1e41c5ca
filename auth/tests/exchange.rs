//! Whole exchanges between the controller state machine and a host written here from the spec
//! (NVMe Base 2.0 §8.13.5, as the Linux host driver does it), plus every malformed-message case.

use std::sync::Arc;

use nvmfd_auth::controller::MAX_SEND_LEN;
use nvmfd_auth::dh::KeyPair;
use nvmfd_auth::hash::{self, ResponseInput};
use nvmfd_auth::wire::{
    self, Challenge, Failure, Negotiate, ProtocolDescriptor, Reply, Success1, Success2,
};
use nvmfd_auth::{
    check_receive, check_send, CommandError, CommandStatus, Config, Controller, DhGroup,
    FailureReason, HashId, ReceiveError, Secret, SendError,
};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6b1f0c3e-8d3a-4c55-9a43-3f2a0b7c1d10";
const SUBNQN: &str = "nqn.2026-12.io.nvmfd:test";
/// What the Linux host passes as AL for every Authentication Receive (CHAP_BUF_SIZE).
const AL: u32 = 4096;

fn config(hashes: &[HashId], groups: &[DhGroup], bidirectional: bool) -> Arc<Config> {
    Arc::new(Config {
        host_key: Secret::generate(Some(HashId::Sha256), 32).unwrap(),
        ctrl_key: bidirectional.then(|| Secret::generate(Some(HashId::Sha512), 64).unwrap()),
        hashes: hashes.to_vec(),
        dh_groups: groups.to_vec(),
        host_nqn: HOSTNQN.into(),
        subsys_nqn: SUBNQN.into(),
    })
}

/// The host side of one transaction.
struct Host {
    host_key: Secret,
    ctrl_key: Option<Secret>,
    tid: u16,
    hashes: Vec<u8>,
    groups: Vec<u8>,
}

/// What the host keeps between its Reply and the controller's Success1.
struct Pending {
    hash: HashId,
    c2: Option<(Vec<u8>, u32)>,
    shared: Option<Vec<u8>>,
}

impl Host {
    fn for_config(cfg: &Config, bidirectional: bool) -> Self {
        Self {
            host_key: cfg.host_key.clone(),
            ctrl_key: if bidirectional {
                cfg.ctrl_key.clone()
            } else {
                None
            },
            tid: 7,
            // The Linux host offers every hash and every group.
            hashes: HashId::ALL.iter().map(|h| h.id()).collect(),
            groups: DhGroup::ALL.iter().map(|g| g.id()).collect(),
        }
    }

    fn negotiate(&self) -> Vec<u8> {
        Negotiate {
            tid: self.tid,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor {
                authid: wire::AUTHID_DHCHAP,
                hash_ids: self.hashes.clone(),
                dh_ids: self.groups.clone(),
            }],
        }
        .encode()
        .unwrap()
    }

    fn reply(&self, challenge: &[u8]) -> (Vec<u8>, Pending) {
        let ch = Challenge::decode(challenge).expect("challenge");
        assert_eq!(ch.tid, self.tid);
        let hash = HashId::from_id(ch.hash_id).expect("hash");
        assert_eq!(ch.challenge.len(), hash.digest_len());
        let group = DhGroup::from_id(ch.dh_group).expect("group");
        let (dh_value, shared) = match group {
            DhGroup::Null => {
                assert!(ch.dh_value.is_empty());
                (Vec::new(), None)
            }
            g => {
                assert_eq!(ch.dh_value.len(), g.key_size());
                let kp = KeyPair::generate(g).unwrap();
                let shared = kp.shared_secret(&ch.dh_value).unwrap().to_vec();
                (kp.public().to_vec(), Some(shared))
            }
        };
        let aug = |c: &[u8]| match &shared {
            Some(s) => hash::augmented_challenge(hash, s, c).to_vec(),
            None => c.to_vec(),
        };
        let r1 = hash::host_response(
            &self.host_key.transformed(HOSTNQN),
            &ResponseInput {
                hash,
                challenge: &aug(&ch.challenge),
                seqnum: ch.seqnum,
                tid: self.tid,
                sc_c: 0,
                host_nqn: HOSTNQN,
                subsys_nqn: SUBNQN,
            },
        );
        let c2 = self.ctrl_key.as_ref().map(|_| {
            let c2: Vec<u8> = (0..hash.digest_len()).map(|i| (i * 7 + 3) as u8).collect();
            (c2, 0x1234_5678u32)
        });
        let reply = Reply {
            tid: self.tid,
            response: r1.to_vec(),
            challenge: c2.as_ref().map(|(c, _)| c.clone()),
            seqnum: c2.as_ref().map_or(0, |(_, s)| *s),
            dh_value,
        };
        let pending = Pending { hash, c2, shared };
        (reply.encode().unwrap(), pending)
    }

    /// Checks Success1; true when R2 (if asked for) verifies.
    fn check_success1(&self, msg: &[u8], p: &Pending) -> bool {
        let s = Success1::decode(msg).expect("success1");
        assert_eq!(s.tid, self.tid);
        assert_eq!(usize::from(s.hash_len), p.hash.digest_len());
        match (&p.c2, s.response) {
            (None, None) => true,
            (Some((c2, s2)), Some(r2)) => {
                let challenge = match &p.shared {
                    Some(sh) => hash::augmented_challenge(p.hash, sh, c2).to_vec(),
                    None => c2.clone(),
                };
                let expected = hash::controller_response(
                    &self.ctrl_key.as_ref().unwrap().transformed(SUBNQN),
                    &ResponseInput {
                        hash: p.hash,
                        challenge: &challenge,
                        seqnum: *s2,
                        tid: self.tid,
                        sc_c: 0,
                        host_nqn: HOSTNQN,
                        subsys_nqn: SUBNQN,
                    },
                );
                *expected == r2
            }
            _ => false,
        }
    }

    fn success2(&self) -> Vec<u8> {
        Success2 { tid: self.tid }.encode()
    }
}

/// Runs one whole transaction; returns the negotiated hash and group from the Challenge.
fn run(ctrl: &mut Controller, host: &Host) -> (u8, u8) {
    ctrl.on_send(&host.negotiate()).expect("negotiate");
    let challenge = ctrl.on_receive(AL).expect("challenge");
    let ch = Challenge::decode(&challenge).unwrap();
    let (reply, pending) = host.reply(&challenge);
    ctrl.on_send(&reply).expect("reply");
    let success1 = ctrl.on_receive(AL).expect("success1");
    assert!(host.check_success1(&success1, &pending), "R2 verifies");
    if pending.c2.is_some() {
        assert!(!ctrl.is_authenticated() || ctrl.in_progress());
        ctrl.on_send(&host.success2()).expect("success2");
    }
    assert!(ctrl.is_authenticated());
    assert!(!ctrl.in_progress());
    assert!(!ctrl.has_failed());
    (ch.hash_id, ch.dh_group)
}

#[test]
fn every_hash_null_and_ffdhe2048_both_directions() {
    for hash in HashId::ALL {
        for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
            for bidirectional in [false, true] {
                let cfg = config(&[hash], &[group], bidirectional);
                let mut ctrl = Controller::new(cfg.clone());
                assert!(!ctrl.is_authenticated());
                let host = Host::for_config(&cfg, bidirectional);
                assert_eq!(run(&mut ctrl, &host), (hash.id(), group.id()));
            }
        }
    }
}

#[test]
fn ffdhe8192_bidirectional() {
    let cfg = config(&[HashId::Sha512], &[DhGroup::Ffdhe8192], true);
    let mut ctrl = Controller::new(cfg.clone());
    let host = Host::for_config(&cfg, true);
    assert_eq!(run(&mut ctrl, &host), (3, 5));
}

#[test]
fn other_groups_unidirectional() {
    for group in [DhGroup::Ffdhe3072, DhGroup::Ffdhe4096, DhGroup::Ffdhe6144] {
        let cfg = config(&[HashId::Sha384], &[group], false);
        let mut ctrl = Controller::new(cfg.clone());
        assert_eq!(run(&mut ctrl, &Host::for_config(&cfg, false)).1, group.id());
    }
}

#[test]
fn preference_order_is_the_controllers() {
    let cfg = config(
        &[HashId::Sha384, HashId::Sha256],
        &[DhGroup::Ffdhe3072, DhGroup::Null],
        false,
    );
    let mut ctrl = Controller::new(cfg.clone());
    let mut host = Host::for_config(&cfg, false);
    assert_eq!(run(&mut ctrl, &host), (2, 2));
    // A host that offers less gets the best of what it offers.
    host.hashes = vec![1, 3];
    host.groups = vec![0, 4];
    assert_eq!(run(&mut ctrl, &host), (1, 0));
}

#[test]
fn transformed_and_plain_keys_of_every_length() {
    for (transform, len) in [
        (None, 32),
        (None, 48),
        (None, 64),
        (Some(HashId::Sha256), 32),
        (Some(HashId::Sha384), 48),
        (Some(HashId::Sha512), 64),
    ] {
        let mut cfg = (*config(&[HashId::Sha256], &[DhGroup::Null], true)).clone();
        cfg.host_key = Secret::generate(transform, len).unwrap();
        cfg.ctrl_key = Some(Secret::generate(transform, len).unwrap());
        let cfg = Arc::new(cfg);
        let mut ctrl = Controller::new(cfg.clone());
        run(&mut ctrl, &Host::for_config(&cfg, true));
    }
}

#[test]
fn reauthentication_on_a_live_queue() {
    let cfg = config(&[HashId::Sha256], &[DhGroup::Ffdhe2048], true);
    let mut ctrl = Controller::new(cfg.clone());
    let mut host = Host::for_config(&cfg, true);
    run(&mut ctrl, &host);
    host.tid = 8;
    // The queue stays authenticated while the new transaction runs.
    ctrl.on_send(&host.negotiate()).unwrap();
    assert!(ctrl.is_authenticated() && ctrl.in_progress());
    ctrl.abandon();
    assert!(ctrl.is_authenticated() && !ctrl.in_progress());
    run(&mut ctrl, &host);
    // A failed re-authentication ends it.
    host.tid = 9;
    ctrl.on_send(&host.negotiate()).unwrap();
    let ch = ctrl.on_receive(AL).unwrap();
    let (mut reply, _) = host.reply(&ch);
    reply[wire::DHCHAP_HEADER_LEN] ^= 1;
    ctrl.on_send(&reply).unwrap_err();
    // Unauthenticated at once, failed (fatal for nvmet) once the host has the reason.
    assert!(!ctrl.is_authenticated() && !ctrl.has_failed());
    let f = Failure::decode(&ctrl.on_receive(AL).unwrap()).unwrap();
    assert_eq!(f.explanation, FailureReason::Failed as u8);
    assert!(ctrl.has_failed());
}

#[test]
fn negotiate_restarts_midway() {
    let cfg = config(&[HashId::Sha256], &[DhGroup::Null], false);
    let mut ctrl = Controller::new(cfg.clone());
    let mut host = Host::for_config(&cfg, false);
    ctrl.on_send(&host.negotiate()).unwrap();
    let first = ctrl.on_receive(AL).unwrap();
    host.tid = 99;
    run(&mut ctrl, &host);
    // The first transaction's Reply is stale now.
    let mut old = Host::for_config(&cfg, false);
    old.tid = 7;
    let (reply, _) = old.reply(&first);
    expect_failure1(&mut ctrl, &reply, FailureReason::IncorrectMessage);
}

/// Sends `payload`, expects it refused with `reason`, and the next Receive to be AUTH_Failure1.
fn expect_failure1(ctrl: &mut Controller, payload: &[u8], reason: FailureReason) {
    match ctrl.on_send(payload) {
        Err(SendError::Failure1 { reason: r, .. }) => assert_eq!(r, reason, "{payload:02x?}"),
        other => panic!("expected Failure1 {reason:?}, got {other:?}"),
    }
    let msg = ctrl.on_receive(AL).expect("failure1");
    let f = Failure::decode(&msg).expect("failure1 layout");
    assert_eq!(msg[0], wire::AUTH_TYPE_COMMON);
    assert_eq!(f.auth_id, wire::MSG_FAILURE1);
    assert_eq!(f.reason_code, wire::FAILURE_REASON_FAILED);
    assert_eq!(f.explanation, reason as u8);
    assert!(!ctrl.is_authenticated());
    assert!(ctrl.has_failed());
    assert!(!ctrl.in_progress());
}

fn negotiated(bidirectional_cfg: bool) -> (Controller, Host) {
    let cfg = config(&HashId::ALL, &[DhGroup::Ffdhe2048], bidirectional_cfg);
    let mut ctrl = Controller::new(cfg.clone());
    let host = Host::for_config(&cfg, bidirectional_cfg);
    ctrl.on_send(&host.negotiate()).unwrap();
    (ctrl, host)
}

/// A controller waiting for the Reply, the Challenge it sent, and the host's valid Reply.
fn challenged(bidirectional: bool) -> (Controller, Host, Vec<u8>, Vec<u8>) {
    let (mut ctrl, host) = negotiated(bidirectional);
    let ch = ctrl.on_receive(AL).unwrap();
    let (reply, _) = host.reply(&ch);
    (ctrl, host, ch, reply)
}

#[test]
fn malformed_negotiate() {
    let cfg = config(&[HashId::Sha256], &[DhGroup::Null], false);
    let host = Host::for_config(&cfg, false);
    let good = host.negotiate();
    let mut cases: Vec<(Vec<u8>, FailureReason)> = vec![
        (vec![], FailureReason::IncorrectPayload),
        (vec![0], FailureReason::IncorrectPayload),
        (good[..7].to_vec(), FailureReason::IncorrectPayload),
        (
            good[..good.len() - 1].to_vec(),
            FailureReason::IncorrectPayload,
        ),
        ([&good[..], &[0]].concat(), FailureReason::IncorrectPayload),
    ];
    let mut edit = |at: usize, v: u8, reason| {
        let mut m = good.clone();
        m[at] = v;
        cases.push((m, reason));
    };
    edit(7, 2, FailureReason::IncorrectPayload); // NAPD says 2, one descriptor follows
    edit(7, 0, FailureReason::IncorrectPayload); // NAPD 0 with a descriptor
    edit(8 + 2, 31, FailureReason::IncorrectPayload); // HALEN > 30
    edit(8 + 3, 31, FailureReason::IncorrectPayload); // DHLEN > 30
    edit(8, 2, FailureReason::ProtocolNotUsable); // AUTHID not DH-HMAC-CHAP
    edit(6, 1, FailureReason::ConcatMismatch); // SC_C
    edit(6, 2, FailureReason::ConcatMismatch);
    edit(8 + 2, 0, FailureReason::HashUnusable); // no hash offered
    edit(8 + 3, 0, FailureReason::DhGroupUnusable); // no group offered
    cases.push((good[..8].to_vec(), FailureReason::IncorrectPayload)); // NAPD 1, no descriptor
    let mut napd0 = good[..8].to_vec();
    napd0[7] = 0;
    cases.push((napd0, FailureReason::IncorrectPayload));
    for (payload, reason) in cases {
        let mut ctrl = Controller::new(cfg.clone());
        expect_failure1(&mut ctrl, &payload, reason);
    }
    // Offers the controller does not allow.
    let mut ctrl = Controller::new(config(&[HashId::Sha512], &[DhGroup::Null], false));
    let mut h = Host::for_config(&cfg, false);
    h.hashes = vec![1, 2, 0x7f];
    expect_failure1(&mut ctrl, &h.negotiate(), FailureReason::HashUnusable);
    let mut ctrl = Controller::new(config(&[HashId::Sha256], &[DhGroup::Ffdhe2048], false));
    h.groups = vec![0, 2, 5, 0x40];
    expect_failure1(&mut ctrl, &h.negotiate(), FailureReason::DhGroupUnusable);
}

/// A change to a valid message.
type Edit = Box<dyn Fn(&mut Vec<u8>)>;

#[test]
fn malformed_reply() {
    let hl = HashId::Sha256.digest_len();
    let edits: Vec<(&str, Edit, FailureReason)> = vec![
        (
            "wrong T_ID",
            Box::new(|m| m[4] ^= 1),
            FailureReason::IncorrectPayload,
        ),
        (
            "HL larger than sent",
            Box::new(|m| m[6] = 0xff),
            FailureReason::IncorrectPayload,
        ),
        (
            "HL 0",
            Box::new(|m| m[6] = 0),
            FailureReason::IncorrectPayload,
        ),
        (
            "HL of another hash, lengths consistent",
            Box::new(move |m| {
                m[6] = 48;
                m.splice(16 + 2 * hl..16 + 2 * hl, vec![0; 32]);
            }),
            FailureReason::IncorrectPayload,
        ),
        (
            "CVALID 2",
            Box::new(|m| m[8] = 2),
            FailureReason::IncorrectPayload,
        ),
        (
            "DHVLEN larger",
            Box::new(|m| m[10] = m[10].wrapping_add(1)),
            FailureReason::IncorrectPayload,
        ),
        (
            "DHVLEN smaller",
            Box::new(|m| m[11] -= 1),
            FailureReason::IncorrectPayload,
        ),
        (
            "truncated",
            Box::new(|m| {
                m.pop();
            }),
            FailureReason::IncorrectPayload,
        ),
        (
            "trailing byte",
            Box::new(|m| m.push(0)),
            FailureReason::IncorrectPayload,
        ),
        (
            "header only",
            Box::new(|m| m.truncate(16)),
            FailureReason::IncorrectPayload,
        ),
        (
            "15 bytes",
            Box::new(|m| m.truncate(15)),
            FailureReason::IncorrectPayload,
        ),
        (
            "response wrong",
            Box::new(|m| m[16] ^= 0x80),
            FailureReason::Failed,
        ),
        (
            "response last byte",
            Box::new(move |m| m[16 + hl - 1] ^= 1),
            FailureReason::Failed,
        ),
        (
            "DH value 1",
            Box::new(move |m| {
                let n = m.len();
                m[16 + 2 * hl..].fill(0);
                m[n - 1] = 1;
            }),
            FailureReason::DhGroupUnusable,
        ),
        (
            "DH value 0",
            Box::new(move |m| m[16 + 2 * hl..].fill(0)),
            FailureReason::DhGroupUnusable,
        ),
        (
            "DH value p-1",
            Box::new(move |m| {
                let n = m.len();
                m[16 + 2 * hl..].fill(0xff);
                m[n - 1] = 0xfe;
            }),
            FailureReason::DhGroupUnusable,
        ),
        (
            "DH value above p",
            Box::new(move |m| m[16 + 2 * hl..].fill(0xff)),
            FailureReason::DhGroupUnusable,
        ),
        (
            "DH value missing",
            Box::new(move |m| {
                m.truncate(16 + 2 * hl);
                m[10] = 0;
                m[11] = 0;
            }),
            FailureReason::IncorrectPayload,
        ),
        (
            "DH value of the wrong size, lengths consistent",
            Box::new(move |m| {
                m.truncate(m.len() - 1);
                m[10..12].copy_from_slice(&255u16.to_le_bytes());
            }),
            FailureReason::IncorrectPayload,
        ),
    ];
    for (what, edit, reason) in edits {
        let (mut ctrl, _, _, mut reply) = challenged(false);
        edit(&mut reply);
        println!("{what}");
        expect_failure1(&mut ctrl, &reply, reason);
    }
}

#[test]
fn reply_refusals_beyond_the_layout() {
    // A DH value with the NULL group.
    let cfg = config(&[HashId::Sha256], &[DhGroup::Null], false);
    let mut ctrl = Controller::new(cfg.clone());
    let host = Host::for_config(&cfg, false);
    ctrl.on_send(&host.negotiate()).unwrap();
    let ch = ctrl.on_receive(AL).unwrap();
    let (reply, _) = host.reply(&ch);
    let mut r = Reply::decode(&reply).unwrap();
    r.dh_value = vec![2; 256];
    expect_failure1(
        &mut ctrl,
        &r.encode().unwrap(),
        FailureReason::IncorrectPayload,
    );

    // Bidirectional requested, no controller key configured.
    let cfg_nokey = config(&[HashId::Sha256], &[DhGroup::Null], false);
    let mut ctrl = Controller::new(cfg_nokey);
    let mut host = Host::for_config(&cfg, false);
    host.ctrl_key = Some(Secret::generate(None, 32).unwrap());
    ctrl.on_send(&host.negotiate()).unwrap();
    let ch = ctrl.on_receive(AL).unwrap();
    let (reply, _) = host.reply(&ch);
    expect_failure1(&mut ctrl, &reply, FailureReason::Failed);

    // C2 = C1 (a reflection).
    let (mut ctrl, _, ch, reply) = challenged(true);
    let c1 = Challenge::decode(&ch).unwrap().challenge;
    let mut r = Reply::decode(&reply).unwrap();
    r.challenge = Some(c1);
    expect_failure1(&mut ctrl, &r.encode().unwrap(), FailureReason::Failed);

    // The wrong host key.
    let (mut ctrl, mut host, ch, _) = challenged(false);
    host.host_key = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let (reply, _) = host.reply(&ch);
    expect_failure1(&mut ctrl, &reply, FailureReason::Failed);

    // C2 with S2 = 0 is not a request to authenticate the controller.
    let (mut ctrl, _, _, reply) = challenged(false);
    let mut r = Reply::decode(&reply).unwrap();
    r.challenge = Some(vec![9; r.response.len()]);
    ctrl.on_send(&r.encode().unwrap()).unwrap();
    let s1 = Success1::decode(&ctrl.on_receive(AL).unwrap()).unwrap();
    assert_eq!(s1.response, None);
    assert!(ctrl.is_authenticated());
}

#[test]
fn messages_out_of_order_and_replayed() {
    let cfg = config(&[HashId::Sha256], &[DhGroup::Null], true);
    let host = Host::for_config(&cfg, true);

    // Reply before any Negotiate.
    let (_, _, _, reply) = challenged(false);
    let mut ctrl = Controller::new(cfg.clone());
    expect_failure1(&mut ctrl, &reply, FailureReason::IncorrectMessage);

    // Reply twice: before and after Success1 was fetched.
    let (mut ctrl, _, _, reply) = challenged(false);
    ctrl.on_send(&reply).unwrap();
    expect_failure1(&mut ctrl, &reply, FailureReason::IncorrectMessage);
    let (mut ctrl, _, _, reply) = challenged(false);
    ctrl.on_send(&reply).unwrap();
    ctrl.on_receive(AL).unwrap();
    assert!(ctrl.is_authenticated());
    expect_failure1(&mut ctrl, &reply, FailureReason::IncorrectMessage);

    // Reply while the Challenge has not been fetched.
    let (mut ctrl, _) = negotiated(false);
    expect_failure1(&mut ctrl, &reply, FailureReason::IncorrectMessage);

    // Success2 without bidirectional authentication, and replayed after it.
    let (mut ctrl, host1, _, reply) = challenged(false);
    ctrl.on_send(&reply).unwrap();
    ctrl.on_receive(AL).unwrap();
    expect_failure1(
        &mut ctrl,
        &host1.success2(),
        FailureReason::IncorrectMessage,
    );
    let mut ctrl = Controller::new(cfg.clone());
    run(&mut ctrl, &host);
    expect_failure1(&mut ctrl, &host.success2(), FailureReason::IncorrectMessage);

    // Success2 with the wrong T_ID or the wrong size.
    for (edit, reason) in [
        (
            Box::new(|m: &mut Vec<u8>| m[5] ^= 1) as Edit,
            FailureReason::IncorrectPayload,
        ),
        (
            Box::new(|m: &mut Vec<u8>| m.push(0)),
            FailureReason::IncorrectPayload,
        ),
        (
            Box::new(|m: &mut Vec<u8>| m.truncate(6)),
            FailureReason::IncorrectPayload,
        ),
    ] {
        let (mut ctrl, host, _, reply) = challenged(true);
        ctrl.on_send(&reply).unwrap();
        ctrl.on_receive(AL).unwrap();
        let mut s2 = host.success2();
        edit(&mut s2);
        expect_failure1(&mut ctrl, &s2, reason);
    }

    // Messages a host never sends, and unknown types.
    for (t, id) in [
        (wire::AUTH_TYPE_DHCHAP, wire::MSG_CHALLENGE),
        (wire::AUTH_TYPE_DHCHAP, wire::MSG_SUCCESS1),
        (wire::AUTH_TYPE_DHCHAP, wire::MSG_NEGOTIATE),
        (wire::AUTH_TYPE_COMMON, wire::MSG_FAILURE1),
        (wire::AUTH_TYPE_COMMON, wire::MSG_REPLY),
        (2, 0),
        (0xff, 0xff),
    ] {
        let (mut ctrl, _) = negotiated(false);
        let mut m = vec![0u8; 16];
        m[0] = t;
        m[1] = id;
        m[4] = 7;
        expect_failure1(&mut ctrl, &m, FailureReason::IncorrectMessage);
    }
}

#[test]
fn host_failure2_ends_the_transaction() {
    // The host rejects our R2.
    let (mut ctrl, host, _, reply) = challenged(true);
    ctrl.on_send(&reply).unwrap();
    ctrl.on_receive(AL).unwrap();
    let f2 = Failure {
        auth_id: wire::MSG_FAILURE2,
        tid: host.tid,
        reason_code: wire::FAILURE_REASON_FAILED,
        explanation: FailureReason::Failed as u8,
    };
    match ctrl.on_send(&f2.encode()) {
        Err(SendError::HostFailure { explanation }) => assert_eq!(explanation, 1),
        other => panic!("{other:?}"),
    }
    assert!(!ctrl.is_authenticated() && ctrl.has_failed() && !ctrl.in_progress());
    // A malformed Failure2.
    let (mut ctrl, _) = negotiated(false);
    let mut bad = f2.encode();
    bad.push(0);
    expect_failure1(&mut ctrl, &bad, FailureReason::IncorrectPayload);
}

#[test]
fn receive_buffers_and_stray_receives() {
    let (mut ctrl, host) = negotiated(true);
    let need = 16 + 32 + 256; // SHA-256 challenge, ffdhe2048 value
    match ctrl.on_receive(need as u32 - 1) {
        Err(e @ ReceiveError::AllocationLength { .. }) => {
            assert_eq!(e.status(), CommandStatus::InvalidField)
        }
        other => panic!("{other:?}"),
    }
    // Nothing changed: the host may retry with a large enough buffer.
    let ch = ctrl.on_receive(need as u32).unwrap();
    assert_eq!(ch.len(), need);
    let (reply, pending) = host.reply(&ch);
    ctrl.on_send(&reply).unwrap();
    assert!(ctrl.on_receive(16 + 31).is_err());
    let s1 = ctrl.on_receive(16 + 32).unwrap();
    assert!(host.check_success1(&s1, &pending));
    ctrl.on_send(&host.success2()).unwrap();
    assert!(ctrl.is_authenticated());

    // A Receive with nothing to return: Failure1 "failed", as nvmet.
    let msg = ctrl.on_receive(AL).unwrap();
    let f = Failure::decode(&msg).unwrap();
    assert_eq!((f.auth_id, f.explanation), (wire::MSG_FAILURE1, 1));
    assert!(!ctrl.is_authenticated() && ctrl.has_failed());

    // Failure1 needs 8 bytes.
    let mut ctrl = Controller::new(config(&[HashId::Sha256], &[DhGroup::Null], false));
    ctrl.on_send(&[0xff]).unwrap_err();
    assert!(ctrl.on_receive(7).is_err());
    assert_eq!(ctrl.on_receive(8).unwrap().len(), 8);
}

#[test]
fn command_fields() {
    assert_eq!(check_send(0xe9, 1, 1, 72), Ok(()));
    assert_eq!(check_send(0xe9, 1, 1, MAX_SEND_LEN), Ok(()));
    assert_eq!(check_send(0xea, 1, 1, 72), Err(CommandError::Secp(0xea)));
    assert_eq!(check_send(0xe9, 0, 1, 72), Err(CommandError::Spsp0(0)));
    assert_eq!(check_send(0xe9, 1, 2, 72), Err(CommandError::Spsp1(2)));
    assert_eq!(check_send(0xe9, 1, 1, 0), Err(CommandError::Length(0)));
    let big = MAX_SEND_LEN + 1;
    assert_eq!(check_send(0xe9, 1, 1, big), Err(CommandError::Length(big)));
    assert_eq!(check_receive(0xe9, 1, 1, u32::MAX), Ok(()));
    assert_eq!(check_receive(0xe9, 1, 1, 0), Err(CommandError::Length(0)));
    assert_eq!(check_receive(0x00, 1, 1, 8), Err(CommandError::Secp(0)));
    assert_eq!(check_receive(0xe9, 2, 1, 8), Err(CommandError::Spsp0(2)));
    assert_eq!(check_receive(0xe9, 1, 0, 8), Err(CommandError::Spsp1(0)));
    assert_eq!(CommandError::Secp(0).status(), CommandStatus::InvalidField);
}

/// Mutations of valid messages at every step never panic and always leave a consistent state.
#[test]
fn mutated_messages_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let cfg = config(&HashId::ALL, &[DhGroup::Null], true);
    let host = Host::for_config(&cfg, true);
    let negotiate = host.negotiate();
    for _ in 0..2000 {
        let mut ctrl = Controller::new(cfg.clone());
        let step = rand() % 3;
        let mut msg = negotiate.clone();
        if step >= 1 {
            ctrl.on_send(&negotiate).unwrap();
            let ch = ctrl.on_receive(AL).unwrap();
            msg = host.reply(&ch).0;
        }
        if step == 2 {
            ctrl.on_send(&msg).unwrap();
            ctrl.on_receive(AL).unwrap();
            msg = host.success2();
        }
        for _ in 0..1 + rand() % 4 {
            let r = rand();
            match r % 4 {
                0 if !msg.is_empty() => {
                    let at = (r >> 8) as usize % msg.len();
                    msg[at] = (r >> 32) as u8;
                }
                1 => msg.truncate((r >> 8) as usize % (msg.len() + 1)),
                2 => msg.push((r >> 8) as u8),
                _ => msg.extend_from_slice(&[0; 64]),
            }
        }
        let _ = ctrl.on_send(&msg);
        let _ = ctrl.on_receive(AL);
        let _ = ctrl.on_receive(1);
    }
}

/// The exponentiations leave the state machine as `Work`: one after the Negotiate (the key
/// pair) and one after the Reply (the shared secret), run here on another thread as a server's
/// worker pool does; none for the NULL group. Commands arriving while a Work is out fail the
/// transaction instead of starting a second one, and a result that comes back for a step that
/// is no longer current changes nothing.
#[test]
fn exponentiations_are_handed_out_as_work() {
    let cfg = config(&[HashId::Sha512], &[DhGroup::Ffdhe2048], true);
    let host = Host::for_config(&cfg, true);
    let mut ctrl = Controller::new(Arc::clone(&cfg));
    let work = ctrl
        .start_send(&host.negotiate())
        .expect("negotiate")
        .expect("a key pair to compute");
    assert_eq!(work.group(), DhGroup::Ffdhe2048);
    assert!(ctrl.is_computing() && ctrl.in_progress());
    let done = std::thread::spawn(move || work.run()).join().unwrap();
    ctrl.computed(done).expect("key pair");
    assert!(!ctrl.is_computing());
    let challenge = ctrl.on_receive(AL).expect("challenge");
    let (reply, pending) = host.reply(&challenge);
    let work = ctrl
        .start_send(&reply)
        .expect("reply form")
        .expect("the shared secret to compute");
    let done = std::thread::spawn(move || work.run()).join().unwrap();
    ctrl.computed(done).expect("R1 verifies");
    let success1 = ctrl.on_receive(AL).expect("success1");
    assert!(host.check_success1(&success1, &pending));
    assert!(ctrl.start_send(&host.success2()).unwrap().is_none());
    assert!(ctrl.is_authenticated());

    // NULL group: nothing to compute.
    let cfg = config(&[HashId::Sha256], &[DhGroup::Null], false);
    let host = Host::for_config(&cfg, false);
    let mut ctrl = Controller::new(Arc::clone(&cfg));
    assert!(ctrl.start_send(&host.negotiate()).unwrap().is_none());
    let (reply, _) = host.reply(&ctrl.on_receive(AL).unwrap());
    assert!(ctrl.start_send(&reply).unwrap().is_none());

    // A Send while a Work is out fails the transaction; the late result is ignored.
    let cfg = config(&[HashId::Sha256], &[DhGroup::Ffdhe2048], false);
    let host = Host::for_config(&cfg, false);
    let mut ctrl = Controller::new(Arc::clone(&cfg));
    let work = ctrl.start_send(&host.negotiate()).unwrap().unwrap();
    match ctrl.start_send(&host.negotiate()) {
        Err(SendError::Failure1 { reason, .. }) => {
            assert_eq!(reason, FailureReason::IncorrectMessage)
        }
        other => panic!("{other:?}"),
    }
    ctrl.computed(work.run())
        .expect("a stale result is dropped");
    let f = Failure::decode(&ctrl.on_receive(AL).unwrap()).unwrap();
    assert_eq!(f.auth_id, wire::MSG_FAILURE1);
    assert!(ctrl.has_failed() && !ctrl.is_authenticated());
}
