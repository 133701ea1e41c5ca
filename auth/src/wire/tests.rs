use super::*;

#[test]
fn round_trips_and_sizes() {
    let n = Negotiate {
        tid: 0x1234,
        sc_c: 0,
        protocols: vec![ProtocolDescriptor {
            authid: AUTHID_DHCHAP,
            hash_ids: vec![1, 2, 3],
            dh_ids: vec![0, 1, 2, 3, 4, 5],
        }],
    };
    let b = n.encode().unwrap();
    assert_eq!(b.len(), 72);
    assert_eq!(&b[..8], &[0, 0, 0, 0, 0x34, 0x12, 0, 1]);
    assert_eq!(&b[8..15], &[1, 0, 3, 6, 1, 2, 3]);
    assert_eq!(&b[8 + 4 + 30..8 + 4 + 36], &[0, 1, 2, 3, 4, 5]);
    assert_eq!(Negotiate::decode(&b).unwrap(), n);

    let c = Challenge {
        tid: 1,
        hash_id: 1,
        dh_group: 0,
        seqnum: 5,
        challenge: vec![7; 32],
        dh_value: vec![],
    };
    assert_eq!(Challenge::decode(&c.encode().unwrap()).unwrap(), c);
    let r = Reply {
        tid: 1,
        response: vec![1; 48],
        challenge: None,
        seqnum: 0,
        dh_value: vec![3; 256],
    };
    let rb = r.encode().unwrap();
    assert_eq!(rb.len(), 16 + 96 + 256);
    assert_eq!(Reply::decode(&rb).unwrap(), r);
    for s in [
        Success1 {
            tid: 9,
            hash_len: 64,
            response: None,
        },
        Success1 {
            tid: 9,
            hash_len: 64,
            response: Some(vec![4; 64]),
        },
    ] {
        let b = s.encode().unwrap();
        assert_eq!(b.len(), s.encoded_len());
        assert_eq!(Success1::decode(&b).unwrap(), s);
    }
    let s2 = Success2 { tid: 3 };
    assert_eq!(Success2::decode(&s2.encode()).unwrap(), s2);
    let f = Failure {
        auth_id: MSG_FAILURE1,
        tid: 3,
        reason_code: FAILURE_REASON_FAILED,
        explanation: FailureReason::HashUnusable as u8,
    };
    assert_eq!(f.encode(), [0, 0xf1, 0, 0, 3, 0, 1, 4]);
    assert_eq!(Failure::decode(&f.encode()).unwrap(), f);
}

#[test]
fn encoders_refuse_what_does_not_fit() {
    let too_many = ProtocolDescriptor {
        authid: 1,
        hash_ids: vec![1; 31],
        dh_ids: vec![],
    };
    let n = Negotiate {
        tid: 0,
        sc_c: 0,
        protocols: vec![too_many],
    };
    assert_eq!(n.encode(), None);
    let c = Challenge {
        tid: 0,
        hash_id: 1,
        dh_group: 0,
        seqnum: 1,
        challenge: vec![0; 256],
        dh_value: vec![],
    };
    assert_eq!(c.encode(), None);
    let r = Reply {
        tid: 0,
        response: vec![0; 32],
        challenge: Some(vec![0; 31]),
        seqnum: 1,
        dh_value: vec![],
    };
    assert_eq!(r.encode(), None);
}

#[test]
fn every_prefix_of_a_message_is_refused() {
    let r = Reply {
        tid: 1,
        response: vec![1; 32],
        challenge: Some(vec![2; 32]),
        seqnum: 9,
        dh_value: vec![3; 256],
    }
    .encode()
    .unwrap();
    for n in 0..r.len() {
        assert!(Reply::decode(&r[..n]).is_err(), "{n}");
    }
    let s = Success1 {
        tid: 1,
        hash_len: 32,
        response: Some(vec![1; 32]),
    }
    .encode()
    .unwrap();
    for n in 0..s.len() {
        assert!(Success1::decode(&s[..n]).is_err(), "{n}");
    }
    assert!(FailureReason::from_u8(0).is_none() && FailureReason::from_u8(8).is_none());
    assert_eq!(
        FailureReason::from_u8(7),
        Some(FailureReason::IncorrectMessage)
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every message as the encoder before the codec rewrite wrote it, byte for byte (the same
/// layouts as Linux `struct nvmf_auth_dhchap_*_data`), and decoded back.
#[test]
fn bytes_of_every_message() {
    let n = Negotiate {
        tid: 0x1234,
        sc_c: 0,
        protocols: vec![
            ProtocolDescriptor {
                authid: 1,
                hash_ids: vec![1, 2, 3],
                dh_ids: vec![0, 1, 5],
            },
            ProtocolDescriptor {
                authid: 9,
                hash_ids: vec![],
                dh_ids: vec![],
            },
        ],
    };
    let b = n.encode().unwrap();
    let mut d1 = format!("01000303010203{}", "00".repeat(27));
    d1 += &format!("000105{}", "00".repeat(27));
    let want = format!("0000000034120002{d1}09{}", "00".repeat(63));
    assert_eq!(hex(&b), want);
    assert_eq!(Negotiate::decode(&b).unwrap(), n);

    let c = Challenge {
        tid: 0x0102,
        hash_id: 2,
        dh_group: 3,
        seqnum: 0x0a0b_0c0d,
        challenge: vec![0x11; 4],
        dh_value: vec![0x22; 3],
    };
    let b = c.encode().unwrap();
    assert_eq!(hex(&b), "0101000002010400020303000d0c0b0a11111111222222");
    assert_eq!(Challenge::decode(&b).unwrap(), c);

    let r = Reply {
        tid: 0x0102,
        response: vec![0x11; 4],
        challenge: Some(vec![0x33; 4]),
        seqnum: 0x0a0b_0c0d,
        dh_value: vec![0x22; 3],
    };
    let b = r.encode().unwrap();
    assert_eq!(
        hex(&b),
        "0102000002010400010003000d0c0b0a1111111133333333222222"
    );
    assert_eq!(Reply::decode(&b).unwrap(), r);
    let r = Reply {
        tid: 0x0102,
        response: vec![0x11; 4],
        challenge: None,
        seqnum: 0,
        dh_value: vec![],
    };
    let b = r.encode().unwrap();
    assert_eq!(hex(&b), "010200000201040000000000000000001111111100000000");
    assert_eq!(Reply::decode(&b).unwrap(), r);

    let s = Success1 {
        tid: 0x0102,
        hash_len: 4,
        response: Some(vec![0x44; 4]),
    };
    let b = s.encode().unwrap();
    assert_eq!(hex(&b), "0103000002010400010000000000000044444444");
    assert_eq!(Success1::decode(&b).unwrap(), s);
    let s = Success1 {
        tid: 0x0102,
        hash_len: 48,
        response: None,
    };
    let b = s.encode().unwrap();
    assert_eq!(hex(&b), "01030000020130000000000000000000");
    assert_eq!(Success1::decode(&b).unwrap(), s);

    let s2 = Success2 { tid: 0x0102 };
    assert_eq!(hex(&s2.encode()), "01040000020100000000000000000000");
    let f = Failure {
        auth_id: MSG_FAILURE2,
        tid: 0x0102,
        reason_code: 1,
        explanation: 6,
    };
    assert_eq!(hex(&f.encode()), "00f0000002010106");
    assert_eq!(Failure::decode(&f.encode()).unwrap(), f);
}

/// Every message, cut at every byte or with a byte added, is refused with a typed error that
/// names it; a descriptor list longer than its 30 slots is refused by field.
#[test]
fn every_cut_and_every_extension_is_refused_by_name() {
    type Decode = fn(&[u8]) -> Result<(), WireError>;
    let n = Negotiate {
        tid: 1,
        sc_c: 0,
        protocols: vec![ProtocolDescriptor {
            authid: AUTHID_DHCHAP,
            hash_ids: vec![1, 2],
            dh_ids: vec![0],
        }],
    };
    let c = Challenge {
        tid: 1,
        hash_id: 1,
        dh_group: 1,
        seqnum: 2,
        challenge: vec![5; 32],
        dh_value: vec![6; 256],
    };
    let f = Failure {
        auth_id: MSG_FAILURE2,
        tid: 1,
        reason_code: 1,
        explanation: 1,
    };
    let cases: [(Vec<u8>, &str, Decode); 4] = [
        (n.encode().unwrap(), Negotiate::WHAT, |p| {
            Negotiate::decode(p).map(drop)
        }),
        (c.encode().unwrap(), Challenge::WHAT, |p| {
            Challenge::decode(p).map(drop)
        }),
        (Success2 { tid: 1 }.encode(), Success2::WHAT, |p| {
            Success2::decode(p).map(drop)
        }),
        (f.encode(), Failure::WHAT, |p| Failure::decode(p).map(drop)),
    ];
    for (bytes, what, decode) in cases {
        assert_eq!(decode(&bytes), Ok(()));
        for cut in 0..bytes.len() {
            let e = decode(&bytes[..cut]).unwrap_err();
            assert_eq!(e.what, what);
            assert!(matches!(e.source, DecodeError::Truncated { .. }), "{e}");
        }
        let mut long = bytes.clone();
        long.push(0);
        let e = decode(&long).unwrap_err();
        assert_eq!((e.what, e.source), (what, DecodeError::TrailingData(1)));
    }
    let mut b = n.encode().unwrap();
    b[NEGOTIATE_HEADER_LEN + 2] = 31;
    assert_eq!(
        Negotiate::decode(&b).unwrap_err().source,
        DecodeError::InvalidValue {
            field: "HALEN",
            value: 31
        }
    );
}
