use super::*;

fn sample() -> State {
    super::super::tests::golden_state()
}

#[test]
fn omap_round_trip_keeps_registration_order() {
    for s in [State::default(), sample()] {
        assert_eq!(from_omap(&to_omap(&s)).unwrap(), s);
    }
    let m = to_omap(&sample());
    // B registered first although A's key sorts first.
    assert_eq!(
        m.keys()
            .filter(|k| k.starts_with(REGISTRANT_PREFIX))
            .count(),
        2
    );
    assert_eq!(m[RESERVATION_KEY][0], 5);
    assert_eq!(from_omap(&BTreeMap::new()).unwrap(), State::default());
}

#[test]
fn damaged_omap_is_refused() {
    let good = to_omap(&sample());
    let edits: [(&str, Option<&[u8]>); 9] = [
        (FORMAT_KEY, Some(b"nvmfd-reservations-2")),
        (FORMAT_KEY, None),
        (GENERATION_KEY, Some(&[1, 2, 3])),
        (PTPL_KEY, Some(&[2])),
        (RESERVATION_KEY, Some(&[9; 17])),
        // The holder must be registered.
        (
            RESERVATION_KEY,
            Some(&[
                1, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc, 0xc,
            ]),
        ),
        ("registrant.zz", Some(&[0; 12])),
        (
            "registrant.0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a",
            Some(&[0; 11]),
        ),
        ("surprise", Some(b"x")),
    ];
    for (k, v) in edits {
        let mut m = good.clone();
        match v {
            Some(v) => m.insert(k.to_owned(), v.to_vec()),
            None => m.remove(k),
        };
        assert!(from_omap(&m).is_err(), "{k} {v:?}");
    }
    // Two registrants claiming one place.
    let mut m = good.clone();
    for v in m.values_mut().filter(|v| v.len() == 12) {
        v[8..].copy_from_slice(&0u32.to_le_bytes());
    }
    assert!(from_omap(&m).is_err());
}

/// The stored key/values and a change message as the encoder before the codec rewrite
/// wrote them (RADOS objects written then must still load).
#[test]
fn omap_and_change_bytes_of_earlier_versions() {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let s = sample();
    let m = to_omap(&s);
    let got: Vec<(&str, String)> = m.iter().map(|(k, v)| (k.as_str(), hex(v))).collect();
    let a = "registrant.0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a";
    let b = "registrant.0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b";
    let want = [
        ("format", hex(b"nvmfd-reservations-1")),
        ("generation", "0d0c0b0a".to_owned()),
        ("ptpl", "01".to_owned()),
        (a, "080706050403020101000000".to_owned()),
        (b, "020000000000000000000000".to_owned()),
        ("reservation", format!("05{}", "0a".repeat(16))),
    ];
    assert_eq!(
        got,
        want.iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(from_omap(&m).unwrap(), s);

    let notices = two_notices();
    let change = encode_change(0x1122_3344_5566_7788, true, &notices);
    let want = format!(
        "4e564d4644524331{}{}{}{}{}{}",
        "8877665544332211",
        "01",
        "0200",
        "01".repeat(17),
        "02".repeat(16),
        "02"
    );
    assert_eq!(hex(&change), want);
    assert_eq!(decode_change(&change).unwrap().notices, notices);
}

fn two_notices() -> Vec<Notice> {
    vec![
        Notice {
            host: [1; 16],
            kind: NoticeKind::RegistrationPreempted,
        },
        Notice {
            host: [2; 16],
            kind: NoticeKind::ReservationReleased,
        },
    ]
}

#[test]
fn change_message_round_trip_and_bounds() {
    let notices = two_notices();
    let b = encode_change(42, true, &notices);
    assert_eq!(b.len(), CHANGE_FIXED + 2 * CHANGE_ENTRY);
    let want = Change {
        version: 42,
        abort: true,
        notices,
    };
    assert_eq!(decode_change(&b).unwrap(), want);
    let none = Change {
        version: 1,
        abort: false,
        notices: vec![],
    };
    assert_eq!(decode_change(&encode_change(1, false, &[])).unwrap(), none);
    let mut flags = b.clone();
    flags[16] = 2;
    assert!(decode_change(&flags).is_err(), "unknown flag");
    // Every truncation and an extra byte are refused; so is an unknown notice type.
    for n in 0..b.len() {
        assert!(decode_change(&b[..n]).is_err(), "{n}");
    }
    let mut long = b.clone();
    long.push(0);
    assert!(decode_change(&long).is_err());
    let mut kind = b.clone();
    *kind.last_mut().unwrap() = 9;
    assert!(decode_change(&kind).is_err());
}
