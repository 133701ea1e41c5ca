use super::*;
use nvme::wire::{SglDescriptor, Status};

const LIMITS: RecvLimits = RecvLimits {
    max_capsule_data: 8192,
    max_data_pdu: 65536,
};

fn all_digests() -> [Digests; 4] {
    [
        Digests::default(),
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
        Digests {
            header: true,
            data: true,
        },
    ]
}

fn sample_sqe() -> Sqe {
    Sqe {
        opcode: 0x01,
        flags: 0x40,
        cid: 0x1234,
        nsid: 1,
        dptr: SglDescriptor::in_capsule(0, 512),
        cdw10: 7,
        cdw12: 0,
        ..Sqe::default()
    }
}

/// One header of every type, with the data length it carries.
fn samples() -> Vec<(PduHeader, Vec<u8>)> {
    let data: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
    vec![
        (
            PduHeader::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                dgst: 3,
                maxr2t: 0,
            }),
            vec![],
        ),
        (
            PduHeader::IcResp(IcResp {
                pfv: 0,
                cpda: 0,
                dgst: 1,
                maxh2cdata: 1 << 20,
            }),
            vec![],
        ),
        (
            PduHeader::H2CTermReq(TermReq::new(Fes::PduSequenceError, 0, &[1, 2, 3])),
            vec![],
        ),
        (
            PduHeader::C2HTermReq(TermReq::new(Fes::InvalidPduHeaderField, 2, &[9u8; 200])),
            vec![],
        ),
        (PduHeader::CapsuleCmd(sample_sqe()), data.clone()),
        (PduHeader::CapsuleCmd(sample_sqe()), vec![]),
        (
            PduHeader::CapsuleResp(Cqe {
                dw0: 5,
                sqhd: 3,
                sqid: 1,
                cid: 0x1234,
                status: Status::INVALID_FIELD.with_dnr(),
                ..Cqe::default()
            }),
            vec![],
        ),
        (
            PduHeader::H2CData {
                hdr: DataHeader {
                    cccid: 0x1234,
                    ttag: 5,
                    datao: 4096,
                    datal: data.len() as u32,
                },
                last: true,
            },
            data.clone(),
        ),
        (
            PduHeader::C2HData {
                hdr: DataHeader {
                    cccid: 9,
                    ttag: 0,
                    datao: 0,
                    datal: data.len() as u32,
                },
                last: true,
                success: true,
            },
            data.clone(),
        ),
        (
            PduHeader::R2T(R2t {
                cccid: 3,
                ttag: 4,
                r2to: 8192,
                r2tl: 65536,
            }),
            vec![],
        ),
    ]
}

/// Decodes a whole PDU the way the receive path does: validate the common header, check the
/// header digest, decode, check the data digest. Returns the header and data.
fn decode_whole(
    bytes: &[u8],
    receiver: Role,
    digests: Digests,
    limits: RecvLimits,
) -> Result<(PduHeader, Vec<u8>), PduError> {
    let ch = CommonHeader::decode(bytes.get(..COMMON_HEADER_LEN).ok_or(
        DecodeError::Truncated {
            needed: COMMON_HEADER_LEN,
            available: bytes.len(),
        },
    )?)?;
    if ch.plen as usize != bytes.len() {
        return Err(PduError::InvalidPlen {
            pdu_type: PduType::from_u8(ch.pdu_type).unwrap(),
            plen: ch.plen,
        });
    }
    let layout = ch.validate(receiver, digests, 4, limits)?;
    let is_term = matches!(layout.pdu_type, PduType::H2CTermReq | PduType::C2HTermReq);
    let hlen = if is_term {
        bytes.len()
    } else {
        layout.pdu_type.header_len()
    };
    if !is_term && layout.header_bytes > hlen {
        let received = u32::from_le_bytes(bytes[hlen..hlen + 4].try_into().unwrap());
        let computed = digest(&bytes[..hlen]);
        if received != computed {
            return Err(PduError::HeaderDigest { received, computed });
        }
    }
    let header = PduHeader::decode(&layout, &bytes[..hlen])?;
    let start = layout.header_bytes + layout.pad;
    let data = bytes[start..start + layout.data_len as usize].to_vec();
    if layout.data_digest {
        let end = start + data.len();
        let received = u32::from_le_bytes(bytes[end..end + 4].try_into().unwrap());
        let computed = digest(&data);
        if received != computed {
            return Err(PduError::DataDigest { received, computed });
        }
    }
    Ok((header, data))
}

fn receiver_of(h: &PduHeader) -> Role {
    match h.pdu_type().sender() {
        Role::Host => Role::Controller,
        Role::Controller => Role::Host,
    }
}

fn effective(h: &PduHeader, d: Digests) -> Digests {
    // IC and termination PDUs never carry digests.
    match h.pdu_type() {
        PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq => {
            Digests::default()
        }
        _ => d,
    }
}

#[test]
fn every_pdu_round_trips_with_every_digest_setting() {
    for digests in all_digests() {
        for (header, data) in samples() {
            let bytes = encode_pdu(&header, &data, effective(&header, digests), 4);
            let (back, back_data) = decode_whole(&bytes, receiver_of(&header), digests, LIMITS)
                .unwrap_or_else(|e| panic!("{header:?} with {digests:?}: {e}"));
            let expected = match &header {
                PduHeader::C2HTermReq(t) => {
                    PduHeader::C2HTermReq(TermReq::new(Fes::InvalidPduHeaderField, 2, &t.data))
                }
                h => h.clone(),
            };
            assert_eq!(back, expected, "{digests:?}");
            assert_eq!(back_data, data);
        }
    }
}

#[test]
fn encoded_sizes_match_the_spec() {
    let d = Digests {
        header: true,
        data: true,
    };
    let sizes: Vec<usize> = samples()
        .iter()
        .map(|(h, data)| encode_pdu(h, data, effective(h, d), 4).len())
        .collect();
    // IC 128; TermReq 24 + data (≤ 128); Cmd 72+4+512+4; Cmd without data 76; Resp 28;
    // data PDUs 24+4+512+4; R2T 28.
    assert_eq!(sizes, vec![128, 128, 27, 152, 592, 76, 28, 544, 544, 28]);
}

#[test]
fn term_req_layout() {
    let bytes = TermReq::new(Fes::InvalidPduHeaderField, 0x0203_0405, &[0xaa; 4])
        .encode(PduType::C2HTermReq);
    assert_eq!(&bytes[..8], &[0x03, 0, 24, 0, 28, 0, 0, 0]);
    assert_eq!(&bytes[8..10], &[1, 0]);
    assert_eq!(&bytes[10..14], &[5, 4, 3, 2]);
    assert_eq!(&bytes[24..], &[0xaa; 4]);
}

#[test]
fn ic_resp_field_offsets() {
    let b = IcResp {
        pfv: 0,
        cpda: 0,
        dgst: 3,
        maxh2cdata: 0x0001_0000,
    }
    .encode();
    assert_eq!(&b[..8], &[1, 0, 128, 0, 128, 0, 0, 0]);
    assert_eq!(b[11], 3);
    assert_eq!(&b[12..16], &[0, 0, 1, 0]);
}

#[test]
fn known_crc32c_vector() {
    // RFC 3720 B.4: 32 bytes of zeroes → 0x8a9136aa.
    assert_eq!(digest(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(digest_append(digest(&[0u8; 16]), &[0u8; 16]), 0x8a91_36aa);
}

#[test]
fn truncated_headers_are_refused() {
    for (header, data) in samples() {
        let bytes = encode_pdu(&header, &data, Digests::default(), 4);
        let hlen = header.pdu_type().header_len().min(bytes.len());
        let layout = CommonHeader::decode(&bytes[..8])
            .unwrap()
            .validate(receiver_of(&header), Digests::default(), 4, LIMITS)
            .unwrap();
        for cut in 0..hlen {
            assert!(
                PduHeader::decode(&layout, &bytes[..cut]).is_err(),
                "{:?} cut at {cut}",
                header.pdu_type()
            );
        }
    }
    assert!(CommonHeader::decode(&[0u8; 7]).is_err());
}

#[test]
fn oversized_data_is_refused_before_reading_it() {
    let data = vec![0u8; 8193];
    let bytes = encode_pdu(
        &PduHeader::CapsuleCmd(sample_sqe()),
        &data,
        Digests::default(),
        4,
    );
    let ch = CommonHeader::decode(&bytes[..8]).unwrap();
    assert_eq!(
        ch.validate(Role::Controller, Digests::default(), 4, LIMITS),
        Err(PduError::DataLimitExceeded {
            pdu_type: PduType::CapsuleCmd,
            len: 8193,
            limit: 8192
        })
    );
    // A huge PLEN in an H2CData header: refused from the 8-byte common header alone.
    let ch = CommonHeader {
        pdu_type: PduType::H2CData as u8,
        flags: flags::LAST_PDU,
        hlen: 24,
        pdo: 24,
        plen: u32::MAX,
    };
    let err = ch
        .validate(Role::Controller, Digests::default(), 4, LIMITS)
        .unwrap_err();
    assert_eq!(err.fes(), Some(Fes::DataTransferLimitExceeded));
}

#[test]
fn oversized_term_req_closes_without_report() {
    let ch = CommonHeader {
        pdu_type: PduType::H2CTermReq as u8,
        flags: 0,
        hlen: 24,
        pdo: 0,
        plen: 153,
    };
    let err = ch
        .validate(Role::Controller, Digests::default(), 4, LIMITS)
        .unwrap_err();
    assert_eq!(err, PduError::InvalidTermReqLength(153));
    assert_eq!(err.fes(), None);
    let mut long = TermReq::new(Fes::PduSequenceError, 0, &[0; 128]).encode(PduType::H2CTermReq);
    long.push(0);
    assert!(TermReq::decode(&long).is_err());
}

#[test]
fn bad_digests_are_detected() {
    let d = Digests {
        header: true,
        data: true,
    };
    let (header, data) = samples().swap_remove(7); // H2CData
    let good = encode_pdu(&header, &data, d, 4);
    let mut bad_h = good.clone();
    bad_h[12] ^= 1;
    assert!(matches!(
        decode_whole(&bad_h, Role::Controller, d, LIMITS),
        Err(PduError::HeaderDigest { .. })
    ));
    assert_eq!(
        PduError::HeaderDigest {
            received: 0,
            computed: 1
        }
        .fes(),
        Some(Fes::HeaderDigestError)
    );
    let mut bad_d = good.clone();
    bad_d[40] ^= 0x80;
    assert!(matches!(
        decode_whole(&bad_d, Role::Controller, d, LIMITS),
        Err(PduError::DataDigest { .. })
    ));
    let mut bad_digest_itself = good;
    let n = bad_digest_itself.len();
    bad_digest_itself[n - 1] ^= 1;
    assert!(matches!(
        decode_whole(&bad_digest_itself, Role::Controller, d, LIMITS),
        Err(PduError::DataDigest { .. })
    ));
}

#[test]
fn header_field_errors_carry_the_field_offset() {
    let base = CommonHeader {
        pdu_type: PduType::CapsuleCmd as u8,
        flags: 0,
        hlen: 72,
        pdo: 0,
        plen: 72,
    };
    let v = |ch: CommonHeader, d: Digests| ch.validate(Role::Controller, d, 4, LIMITS);
    assert!(v(base, Digests::default()).is_ok());
    let cases = [
        // Unknown type, and a controller-to-host type sent to the controller.
        (
            CommonHeader {
                pdu_type: 0x08,
                ..base
            },
            0,
        ),
        (
            CommonHeader {
                pdu_type: 0x05,
                ..base
            },
            0,
        ),
        // Reserved flag, and HDGSTF without negotiated header digests.
        (
            CommonHeader {
                flags: 0x10,
                ..base
            },
            1,
        ),
        (
            CommonHeader {
                flags: 0x01,
                ..base
            },
            1,
        ),
        (CommonHeader { hlen: 71, ..base }, 2),
        (
            CommonHeader {
                pdo: 68,
                plen: 100,
                ..base
            },
            3,
        ),
        (
            CommonHeader {
                pdo: 74,
                plen: 100,
                ..base
            },
            3,
        ),
        (CommonHeader { plen: 70, ..base }, 4),
    ];
    for (ch, fei) in cases {
        let err = v(ch, Digests::default()).unwrap_err();
        assert_eq!(err.fes(), Some(Fes::InvalidPduHeaderField), "{ch:?}");
        assert_eq!(err.fei(), fei, "{ch:?}: {err}");
    }
    // Header digests negotiated but HDGSTF missing.
    let err = v(
        base,
        Digests {
            header: true,
            data: false,
        },
    )
    .unwrap_err();
    assert_eq!(err.fei(), 1);
    // Data digests negotiated but a data-bearing capsule without DDGSTF.
    let err = v(
        CommonHeader {
            pdo: 72,
            plen: 72 + 16,
            ..base
        },
        Digests {
            header: false,
            data: true,
        },
    )
    .unwrap_err();
    assert_eq!(err.fei(), 1);
}

#[test]
fn padding_before_data_is_honoured() {
    let data = vec![0x5a; 100];
    // The peer wants 32-byte alignment: PDO 72 → 96.
    let bytes = encode_pdu(
        &PduHeader::CapsuleCmd(sample_sqe()),
        &data,
        Digests::default(),
        32,
    );
    assert_eq!(bytes[3], 96);
    let ch = CommonHeader::decode(&bytes[..8]).unwrap();
    let layout = ch
        .validate(Role::Controller, Digests::default(), 4, LIMITS)
        .unwrap();
    assert_eq!(layout.pad, 24);
    assert_eq!(layout.data_len, 100);
    assert_eq!(&bytes[96..], &data[..]);
}

#[test]
fn datal_must_match_plen() {
    let (header, data) = samples().swap_remove(7);
    let mut bytes = encode_pdu(&header, &data, Digests::default(), 4);
    bytes[16] ^= 1; // DATAL
    let err = decode_whole(&bytes, Role::Controller, Digests::default(), LIMITS).unwrap_err();
    assert_eq!(err.fes(), Some(Fes::InvalidPduHeaderField));
    assert_eq!(err.fei(), offsets::DATAL);
}

#[test]
fn data_pdu_without_data_is_refused() {
    let h = PduHeader::H2CData {
        hdr: DataHeader {
            cccid: 1,
            ttag: 0,
            datao: 0,
            datal: 0,
        },
        last: true,
    };
    let bytes = encode_pdu(&h, &[], Digests::default(), 4);
    assert_eq!(bytes.len(), DATA_HEADER_LEN);
    let err = decode_whole(&bytes, Role::Controller, Digests::default(), LIMITS).unwrap_err();
    assert_eq!(
        (err.fes(), err.fei()),
        (Some(Fes::InvalidPduHeaderField), offsets::DATAL)
    );
}

/// Header bytes of the PDUs the target sends, as the encoder before the codec rewrite wrote
/// them (digests on, a 16-byte data alignment so the pad shows).
#[test]
fn encoded_header_bytes() {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let d = Digests {
        header: true,
        data: true,
    };
    let hdr = DataHeader {
        cccid: 0x0102,
        ttag: 0x0304,
        datao: 0x0506_0708,
        datal: 4,
    };
    let c2h = PduHeader::C2HData {
        hdr: DataHeader { ttag: 0, ..hdr },
        last: true,
        success: true,
    };
    let r2t = PduHeader::R2T(R2t {
        cccid: 0x0102,
        ttag: 0x0304,
        r2to: 0x0506_0708,
        r2tl: 0x1000,
    });
    let term = TermReq::new(Fes::HeaderDigestError, 0, &[0xaa; 3]);
    let ic = IcResp {
        pfv: 0,
        cpda: 3,
        dgst: 3,
        maxh2cdata: 0x0002_0000,
    };
    let got = [
        hex(encode_header(&c2h, d, 4, 16).as_slice()),
        hex(encode_header(&r2t, d, 0, 16).as_slice()),
        hex(encode_header(&PduHeader::IcResp(ic), d, 0, 16).as_slice()),
        hex(&term.encode(PduType::C2HTermReq)),
    ];
    let ic_bytes = format!("010080008000000000000303{}{}", "00000200", "00".repeat(112));
    let want = [
        "070f1820280000000201000008070605040000000000000027e0d7cf00000000",
        "090118001c000000020104030807060500100000000000008a26be4b",
        &ic_bytes,
        "030018001b00000003000000000000000000000000000000aaaaaa",
    ];
    assert_eq!(got, want);
}
