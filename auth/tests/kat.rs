//! Known-answer tests against `vectors.txt`, which `kat.py` computes with Python's hashlib/hmac
//! from the Linux kernel's algorithm (see that script).

use std::collections::HashMap;

use nvmfd_auth::dh::KeyPair;
use nvmfd_auth::hash::{self, ResponseInput};
use nvmfd_auth::wire::{Challenge, Reply, Success1};
use nvmfd_auth::{DhGroup, HashId, Secret};

fn hex(s: &str) -> Vec<u8> {
    let pairs = s.as_bytes().chunks_exact(2);
    assert!(pairs.remainder().is_empty(), "odd hex length");
    pairs
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).expect("hex"))
        .collect()
}

fn cases() -> Vec<(String, HashMap<String, String>)> {
    let mut out = Vec::new();
    for line in include_str!("vectors.txt").lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once(' ').expect("key value");
        if k == "case" {
            out.push((v.to_owned(), HashMap::new()));
        } else {
            out.last_mut()
                .expect("a case first")
                .1
                .insert(k.to_owned(), v.to_owned());
        }
    }
    assert_eq!(out.len(), 7, "vectors.txt has every case");
    out
}

#[test]
fn vectors_match() {
    for (name, v) in cases() {
        let get = |k: &str| {
            v.get(k)
                .unwrap_or_else(|| panic!("{name}: no {k}"))
                .as_str()
        };
        let num = |k: &str| get(k).parse::<u32>().expect("number");
        let hash = HashId::from_id(num("hash") as u8).expect("hash");
        let group = DhGroup::from_id(num("dhgroup") as u8).expect("group");
        let (host_nqn, subsys_nqn) = (get("hostnqn"), get("subsysnqn"));
        let tid = num("tid") as u16;

        // Interchange format: parse, and format back to the same text.
        let host_key = Secret::parse(get("host_key")).expect("host key");
        let ctrl_key = Secret::parse(get("ctrl_key")).expect("ctrl key");
        assert_eq!(*host_key.to_interchange(), get("host_key"), "{name}");
        assert_eq!(*ctrl_key.to_interchange(), get("ctrl_key"), "{name}");
        let kh = host_key.transformed(host_nqn);
        let kc = ctrl_key.transformed(subsys_nqn);
        assert_eq!(
            *kh,
            hex(get("host_key_transformed")),
            "{name}: host key transform"
        );
        assert_eq!(
            *kc,
            hex(get("ctrl_key_transformed")),
            "{name}: ctrl key transform"
        );

        let (c1, c2) = (hex(get("c1")), hex(get("c2")));
        let (mut a1, mut a2) = (c1.clone(), c2.clone());
        if group != DhGroup::Null {
            let ctrl = KeyPair::from_private(group, &hex(get("ctrl_priv"))).expect("ctrl dh");
            let host = KeyPair::from_private(group, &hex(get("host_priv"))).expect("host dh");
            assert_eq!(ctrl.public(), hex(get("ctrl_pub")), "{name}: ctrl public");
            assert_eq!(host.public(), hex(get("host_pub")), "{name}: host public");
            let shared = ctrl.shared_secret(host.public()).expect("shared");
            assert_eq!(*shared, hex(get("shared")), "{name}: shared secret");
            assert_eq!(*host.shared_secret(ctrl.public()).expect("shared"), *shared);
            a1 = hash::augmented_challenge(hash, &shared, &c1).to_vec();
            a2 = hash::augmented_challenge(hash, &shared, &c2).to_vec();
            assert_eq!(a1, hex(get("c1_augmented")), "{name}: augmented C1");
            assert_eq!(a2, hex(get("c2_augmented")), "{name}: augmented C2");
        }
        let r1 = hash::host_response(
            &kh,
            &ResponseInput {
                hash,
                challenge: &a1,
                seqnum: num("s1"),
                tid,
                sc_c: 0,
                host_nqn,
                subsys_nqn,
            },
        );
        let r2 = hash::controller_response(
            &kc,
            &ResponseInput {
                hash,
                challenge: &a2,
                seqnum: num("s2"),
                tid,
                sc_c: 0,
                host_nqn,
                subsys_nqn,
            },
        );
        assert_eq!(*r1, hex(get("r1")), "{name}: R1");
        assert_eq!(*r2, hex(get("r2")), "{name}: R2");

        // The message layouts.
        let challenge = Challenge {
            tid,
            hash_id: hash.id(),
            dh_group: group.id(),
            seqnum: num("s1"),
            challenge: c1.clone(),
            dh_value: hex(get("ctrl_pub")),
        };
        assert_eq!(
            challenge.encode().unwrap(),
            hex(get("challenge_msg")),
            "{name}"
        );
        assert_eq!(
            Challenge::decode(&hex(get("challenge_msg"))).unwrap(),
            challenge
        );
        let reply = Reply::decode(&hex(get("reply_msg"))).expect("reply");
        assert_eq!(
            reply,
            Reply {
                tid,
                response: r1.to_vec(),
                challenge: Some(c2.clone()),
                seqnum: num("s2"),
                dh_value: hex(get("host_pub")),
            },
            "{name}"
        );
        assert_eq!(reply.encode().unwrap(), hex(get("reply_msg")));
        let success1 = Success1 {
            tid,
            hash_len: hash.digest_len() as u8,
            response: Some(r2.to_vec()),
        };
        assert_eq!(
            success1.encode().unwrap(),
            hex(get("success1_msg")),
            "{name}"
        );
    }
}
