//! The DH-HMAC-CHAP controller state machine (`nvmfd_auth::Controller`) fed Authentication
//! Send payloads and Receives, the way the fabrics handler drives it.
//!
//! Input: `[cfg]` then ops `[op][args…]`: a raw Send payload (`[len: u16][bytes]`), a Receive
//! (`[al: u16]`), abandoning the transaction, and — so that the deep states (Reply checked,
//! Success1, Success2) are reachable — a valid AUTH_Negotiate, a valid Reply to the last
//! Challenge and a valid Success2, each with one optional byte flipped (`[at: u16][xor]`).
//!
//! Oracles: no panic; every Receive returns a message that decodes as the Challenge, Success1
//! or AUTH_Failure1, no longer than the allocation length; a returned AUTH_Failure1 leaves the
//! queue unauthenticated and failed; an authenticated queue is never marked failed.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use nvmfd_auth::dh::KeyPair;
use nvmfd_auth::hash::{self, ResponseInput};
use nvmfd_auth::wire::{
    self, Challenge, Failure, MessageKind, Negotiate, ProtocolDescriptor, Reply, Success1, Success2,
};
use nvmfd_auth::{Config, Controller, DhGroup, HashId, Secret};
use nvmfd_fuzz::{Input, HOSTNQN, SUBNQN};

/// Two configurations, both bidirectional: NULL group only, and ffdhe2048 preferred (selector 1
/// only). An FFDHE transaction costs four 2048-bit modular exponentiations, a quarter of a second
/// each under the sanitizers, so those inputs are rare and get fewer ops (see `MAX_OPS_DH`).
fn config(sel: u8) -> Arc<Config> {
    static CFG: OnceLock<[Arc<Config>; 2]> = OnceLock::new();
    let cfgs = CFG.get_or_init(|| {
        let make = |groups: Vec<DhGroup>| {
            Arc::new(Config {
                host_key: Secret::new(Some(HashId::Sha256), vec![0x11; 32]).unwrap(),
                ctrl_key: Some(Secret::new(None, vec![0x22; 48]).unwrap()),
                hashes: HashId::ALL.to_vec(),
                dh_groups: groups,
                host_nqn: HOSTNQN.into(),
                subsys_nqn: SUBNQN.into(),
            })
        };
        [
            make(vec![DhGroup::Null]),
            make(vec![DhGroup::Ffdhe2048, DhGroup::Null]),
        ]
    });
    cfgs[usize::from(sel == 1)].clone()
}

fn flip(msg: &mut [u8], input: &mut Input) {
    let at = usize::from(input.u16());
    let xor = input.u8();
    if let Some(b) = msg.get_mut(at) {
        *b ^= xor;
    }
}

/// A valid Reply from the host to `challenge`, bidirectional when `bidi`.
fn reply(cfg: &Config, challenge: &Challenge, bidi: bool) -> Option<Vec<u8>> {
    let hash = HashId::from_id(challenge.hash_id)?;
    let group = DhGroup::from_id(challenge.dh_group)?;
    let (dh_value, shared) = match group {
        DhGroup::Null => (Vec::new(), None),
        g => {
            let kp = KeyPair::from_private(g, &[0x5a; 28]).ok()?;
            let shared = kp.shared_secret(&challenge.dh_value).ok()?;
            (kp.public().to_vec(), Some(shared))
        }
    };
    let c = match &shared {
        Some(s) => hash::augmented_challenge(hash, s, &challenge.challenge).to_vec(),
        None => challenge.challenge.clone(),
    };
    let r1 = hash::host_response(
        &cfg.host_key.transformed(HOSTNQN),
        &ResponseInput {
            hash,
            challenge: &c,
            seqnum: challenge.seqnum,
            tid: challenge.tid,
            sc_c: 0,
            host_nqn: HOSTNQN,
            subsys_nqn: SUBNQN,
        },
    );
    Reply {
        tid: challenge.tid,
        response: r1.to_vec(),
        challenge: bidi.then(|| vec![0x33; hash.digest_len()]),
        seqnum: u32::from(bidi),
        dh_value,
    }
    .encode()
}

/// Ops per input: enough for several whole transactions; with FFDHE, one transaction (about a
/// second), so that these inputs do not starve the rest of the run.
const MAX_OPS: usize = 64;
const MAX_OPS_DH: usize = 6;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let sel = input.u8();
    let cfg = config(sel);
    let max_ops = if sel == 1 { MAX_OPS_DH } else { MAX_OPS };
    let mut ctrl = Controller::new(cfg.clone());
    let mut last_challenge: Option<Challenge> = None;
    let mut tid = 0u16;
    let mut ops = 0;
    while !input.is_empty() && ops < max_ops {
        ops += 1;
        match input.u8() % 6 {
            0 => {
                let len = usize::from(input.u16()) % 2048;
                let _ = ctrl.on_send(input.take(len));
            }
            1 => {
                let al = u32::from(input.u16());
                let Ok(msg) = ctrl.on_receive(al) else {
                    continue;
                };
                assert!(msg.len() <= al as usize);
                let kind = MessageKind::peek(&msg).expect("a message");
                match (kind.auth_type, kind.auth_id) {
                    (wire::AUTH_TYPE_DHCHAP, wire::MSG_CHALLENGE) => {
                        last_challenge = Some(Challenge::decode(&msg).expect("challenge"));
                    }
                    (wire::AUTH_TYPE_DHCHAP, wire::MSG_SUCCESS1) => {
                        Success1::decode(&msg).expect("success1");
                    }
                    (wire::AUTH_TYPE_COMMON, wire::MSG_FAILURE1) => {
                        Failure::decode(&msg).expect("failure1");
                        assert!(!ctrl.is_authenticated() && ctrl.has_failed());
                    }
                    other => panic!("unexpected message {other:?}"),
                }
            }
            2 => ctrl.abandon(),
            3 => {
                tid = input.u16();
                let mut msg = Negotiate {
                    tid,
                    sc_c: 0,
                    protocols: vec![ProtocolDescriptor {
                        authid: wire::AUTHID_DHCHAP,
                        hash_ids: vec![input.u8() % 4, 1],
                        dh_ids: vec![input.u8() % 6, 0],
                    }],
                }
                .encode()
                .expect("fits");
                flip(&mut msg, &mut input);
                let _ = ctrl.on_send(&msg);
            }
            4 => {
                let bidi = input.u8() & 1 == 1;
                let Some(mut msg) = last_challenge.as_ref().and_then(|c| reply(&cfg, c, bidi))
                else {
                    continue;
                };
                flip(&mut msg, &mut input);
                let _ = ctrl.on_send(&msg);
            }
            _ => {
                let mut msg = Success2 { tid }.encode();
                flip(&mut msg, &mut input);
                let _ = ctrl.on_send(&msg);
            }
        }
        if ctrl.is_authenticated() {
            assert!(!ctrl.has_failed());
        }
    }
});
