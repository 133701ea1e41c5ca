use super::*;
use crate::tcp::pdu::{encode_pdu, flags, DataHeader, Fes, IcReq, TermReq, CAPSULE_CMD_HEADER_LEN};
use nvme::testing::pattern;
use nvme::wire::{SglDescriptor, Sqe};

const LIMITS: RecvLimits = RecvLimits {
    max_capsule_data: 8192,
    max_data_pdu: 16384,
};

fn sqe(cid: u16, len: u32) -> Sqe {
    Sqe {
        opcode: 0x01,
        flags: 0x40,
        cid,
        nsid: 1,
        dptr: SglDescriptor::in_capsule(0, len),
        ..Sqe::default()
    }
}

/// What the receiver produced: events plus, per data PDU, the data it placed.
#[derive(Debug, Default, PartialEq)]
struct Trace {
    events: Vec<Event>,
    data: Vec<Vec<u8>>,
    error: Option<PduError>,
}

struct VecSink<'a>(&'a mut Vec<u8>);

impl DataSink for VecSink<'_> {
    fn write(&mut self, offset: u32, bytes: &[u8]) {
        assert_eq!(offset as usize, self.0.len(), "data arrives in order");
        self.0.extend_from_slice(bytes);
    }
}

/// Feeds `stream` in the given chunks, establishing the connection after an ICReq with the
/// digests it asks for (as the connection layer does).
fn run(stream: &[u8], chunks: &[usize]) -> Trace {
    let mut rx = Receiver::new(Role::Controller, LIMITS);
    let mut trace = Trace::default();
    let mut current: Vec<u8> = Vec::new();
    let mut pos = 0;
    for &len in chunks {
        let mut piece = &stream[pos..pos + len];
        pos += len;
        while !piece.is_empty() {
            let (used, ev) = match rx.feed(piece, &mut VecSink(&mut current)) {
                Ok(r) => r,
                Err(e) => {
                    trace.error = Some(e);
                    return trace;
                }
            };
            piece = &piece[used..];
            if let Some(ev) = ev {
                if let Event::Pdu {
                    header: PduHeader::IcReq(ic),
                    ..
                } = &ev
                {
                    rx.establish(Digests::from_dgst(ic.dgst), 4);
                }
                if let Event::DataComplete { .. } = ev {
                    trace.data.push(std::mem::take(&mut current));
                }
                trace.events.push(ev);
            } else {
                assert!(piece.is_empty(), "feed stops only at events or input end");
            }
        }
    }
    assert!(rx.at_boundary(), "stream ends on a PDU boundary");
    trace
}

fn stream(digests: Digests) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut s = IcReq {
        pfv: 0,
        hpda: 0,
        dgst: digests.to_dgst(),
        maxr2t: 0,
    }
    .encode()
    .to_vec();
    let d1 = pattern(700, 1);
    let d2 = pattern(4096, 2);
    s.extend(encode_pdu(
        &PduHeader::CapsuleCmd(sqe(1, 700)),
        &d1,
        digests,
        4,
    ));
    s.extend(encode_pdu(
        &PduHeader::CapsuleCmd(sqe(2, 0)),
        &[],
        digests,
        4,
    ));
    s.extend(encode_pdu(
        &PduHeader::H2CData {
            hdr: DataHeader {
                cccid: 2,
                ttag: 0,
                datao: 0,
                datal: 4096,
            },
            last: true,
        },
        &d2,
        digests,
        4,
    ));
    s.extend(TermReq::new(Fes::PduSequenceError, 0, &[7; 5]).encode(PduType::H2CTermReq));
    (s, vec![d1, d2])
}

#[test]
fn every_split_point_gives_the_same_events() {
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
        Digests {
            header: false,
            data: true,
        },
    ] {
        let (s, datas) = stream(digests);
        let whole = run(&s, &[s.len()]);
        assert_eq!(whole.error, None);
        assert_eq!(whole.data, datas);
        assert_eq!(whole.events.len(), 7, "{:?}", whole.events);
        assert!(whole
            .events
            .iter()
            .all(|e| !matches!(e, Event::DataComplete { digest_ok: false })));
        for cut in 1..s.len() {
            assert_eq!(run(&s, &[cut, s.len() - cut]), whole, "split at {cut}");
        }
        // And one byte at a time.
        assert_eq!(run(&s, &vec![1; s.len()]), whole);
    }
}

#[test]
fn placing_data_directly_matches_feeding_it() {
    let d = Digests {
        header: true,
        data: true,
    };
    let (s, datas) = stream(d);
    let mut rx = Receiver::new(Role::Controller, LIMITS);
    let mut input = &s[..];
    let mut placed = Vec::new();
    let mut events = 0;
    while !input.is_empty() {
        if let Some(w) = rx.data_window() {
            // Simulate a read straight into the destination, in uneven pieces.
            let n = (w.remaining as usize).min(1000);
            let mut dest = vec![0u8; n];
            dest.copy_from_slice(&input[..n]);
            input = &input[n..];
            placed.extend_from_slice(&dest);
            if let Some(ev) = rx.data_placed(&dest) {
                assert_eq!(ev, Event::DataComplete { digest_ok: true });
                events += 1;
            }
            continue;
        }
        let (used, ev) = rx.feed(input, &mut Discard).unwrap();
        input = &input[used..];
        if let Some(ev) = ev {
            events += 1;
            if let Event::Pdu {
                header: PduHeader::IcReq(ic),
                ..
            } = ev
            {
                rx.establish(Digests::from_dgst(ic.dgst), 4);
            }
        }
    }
    assert_eq!(events, 7);
    assert_eq!(placed, [datas[0].clone(), datas[1].clone()].concat());
}

#[test]
fn data_digest_error_is_reported_and_stream_continues() {
    let d = Digests {
        header: false,
        data: true,
    };
    let (mut s, _) = stream(d);
    // Flip a data byte of the first capsule (IC 128 + header 72).
    s[128 + CAPSULE_CMD_HEADER_LEN + 10] ^= 0xff;
    let t = run(&s, &[s.len()]);
    assert_eq!(t.error, None);
    assert_eq!(t.events[2], Event::DataComplete { digest_ok: false });
    assert_eq!(t.events.len(), 7);
}

#[test]
fn header_digest_error_is_fatal() {
    let d = Digests {
        header: true,
        data: false,
    };
    let (mut s, _) = stream(d);
    s[128 + 20] ^= 1; // inside the first SQE
    for cut in [1, 130, 150, s.len() - 1] {
        let t = run(&s, &[cut, s.len() - cut]);
        assert!(
            matches!(t.error, Some(PduError::HeaderDigest { .. })),
            "{:?}",
            t.error
        );
        assert_eq!(t.events.len(), 1);
    }
}

#[test]
fn pdus_before_icreq_are_refused() {
    let s = encode_pdu(
        &PduHeader::CapsuleCmd(sqe(1, 0)),
        &[],
        Digests::default(),
        4,
    );
    let t = run(&s, &[s.len()]);
    let e = t.error.unwrap();
    assert!(matches!(e, PduError::UnexpectedType { .. }), "{e}");
    assert_eq!((e.fes(), e.fei()), (Some(Fes::PduSequenceError), 0));
}

#[test]
fn second_icreq_is_refused() {
    let ic = IcReq::default().encode();
    let s = [ic, ic].concat();
    let t = run(&s, &[s.len()]);
    assert_eq!(t.events.len(), 1);
    assert!(matches!(t.error, Some(PduError::UnexpectedType { .. })));
}

#[test]
fn bad_common_header_fails_after_eight_bytes() {
    let mut s = IcReq::default().encode().to_vec();
    // A capsule claiming 1 MiB of in-capsule data: refused from its common header, before
    // any of the data is consumed.
    let mut h = encode_pdu(
        &PduHeader::CapsuleCmd(sqe(1, 16)),
        &[0; 16],
        Digests::default(),
        4,
    );
    h[4..8].copy_from_slice(&(72u32 + (1 << 20)).to_le_bytes());
    s.extend_from_slice(&h);
    let mut rx = Receiver::new(Role::Controller, LIMITS);
    let (used, ev) = rx.feed(&s, &mut Discard).unwrap();
    assert_eq!(used, 128);
    assert!(ev.is_some());
    rx.establish(Digests::default(), 4);
    let err = rx.feed(&s[128..], &mut Discard).unwrap_err();
    assert_eq!(err.fes(), Some(Fes::DataTransferLimitExceeded));
    assert_eq!(rx.header_bytes(), &h[..8]);
    // After an error the receiver consumes nothing more.
    assert_eq!(rx.feed(&s[136..], &mut Discard).unwrap(), (0, None));
}

#[test]
fn unknown_type_and_bad_hlen() {
    let ic = IcReq::default().encode().to_vec();
    for (bytes, fei) in [
        (vec![0x0a, 0, 24, 0, 24, 0, 0, 0], 0),
        (vec![0x06, flags::LAST_PDU, 20, 0, 24, 0, 0, 0], 2),
    ] {
        let s = [ic.clone(), bytes].concat();
        let t = run(&s, &[s.len()]);
        let e = t.error.unwrap();
        assert_eq!((e.fes(), e.fei()), (Some(Fes::InvalidPduHeaderField), fei));
    }
}

/// Random and mutated input never panics the receiver, never makes it consume more than it
/// was given, and never places data outside the announced data length.
#[test]
fn random_input_never_panics() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    struct Bounded {
        len: u32,
    }
    impl DataSink for Bounded {
        fn write(&mut self, offset: u32, bytes: &[u8]) {
            assert!(offset as usize + bytes.len() <= self.len as usize);
        }
    }
    let (valid, _) = stream(Digests {
        header: true,
        data: true,
    });
    for round in 0..3000 {
        let mut input: Vec<u8> = if round % 2 == 0 {
            (0..(rnd() % 600) as usize).map(|_| rnd() as u8).collect()
        } else {
            let mut v = valid.clone();
            for _ in 0..1 + rnd() % 4 {
                let at = (rnd() as usize) % v.len();
                v[at] = rnd() as u8;
            }
            v
        };
        if round % 3 == 0 {
            input.truncate((rnd() as usize) % (input.len() + 1));
        }
        let role = if round % 5 == 0 {
            Role::Host
        } else {
            Role::Controller
        };
        let mut rx = Receiver::new(role, LIMITS);
        if round % 2 == 0 && round % 4 != 0 {
            rx.establish(
                Digests {
                    header: rnd() % 2 == 0,
                    data: rnd() % 2 == 0,
                },
                4,
            );
        }
        let mut sink = Bounded { len: 0 };
        let mut pos = 0;
        while pos < input.len() {
            let chunk = 1 + (rnd() as usize) % 64;
            let end = (pos + chunk).min(input.len());
            match rx.feed(&input[pos..end], &mut sink) {
                Ok((used, ev)) => {
                    assert!(used <= end - pos);
                    pos += used;
                    match ev {
                        Some(Event::Pdu {
                            header: PduHeader::IcReq(ic),
                            ..
                        }) => rx.establish(Digests::from_dgst(ic.dgst), 4),
                        Some(Event::Pdu { data_len, .. }) => {
                            assert!(data_len <= LIMITS.max_data_pdu.max(LIMITS.max_capsule_data));
                            sink.len = data_len;
                        }
                        Some(Event::DataComplete { .. }) => sink.len = 0,
                        None => {
                            if used == 0 {
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    // Every error maps to a report or a silent close, and quotes at most
                    // one header.
                    let _ = (e.fes(), e.fei());
                    assert!(rx.header_bytes().len() <= crate::tcp::pdu::MAX_HEADER_BUF);
                    break;
                }
            }
        }
    }
}

#[test]
fn empty_digest_constant_is_the_crc32c_of_nothing() {
    // Data PDUs start their running digest from this constant instead of computing it.
    assert_eq!(super::EMPTY_DIGEST, crate::tcp::pdu::digest(&[]));
}
