use super::*;
use crate::spec::{disc, effects};

#[test]
fn error_entry_round_trip() {
    let e = ErrorLogEntry {
        error_count: 5,
        sqid: 1,
        cid: 9,
        status: Status::LBA_OUT_OF_RANGE.with_dnr(),
        param_error_location: 40,
        lba: 1 << 40,
        nsid: 1,
        trtype: disc::TRTYPE_TCP,
        command_specific: 3,
    };
    let b = e.encode();
    assert_eq!(u16::from_le_bytes([b[12], b[13]]), 0x8100);
    assert_eq!(ErrorLogEntry::decode(&b), Ok(e));
}

#[test]
fn smart_round_trip_and_units() {
    let s = SmartLog {
        data_units_read: 3,
        host_write_commands: 1 << 70,
        power_on_hours: 2,
        error_log_entries: 9,
        ..SmartLog::default()
    };
    let b = s.encode();
    assert_eq!(b[32], 3);
    assert_eq!(b[176], 9);
    assert_eq!(SmartLog::decode(&b), Ok(s));
    assert_eq!(SmartLog::data_units(0), 0);
    assert_eq!(SmartLog::data_units(1), 1);
    assert_eq!(SmartLog::data_units(512_000), 1);
    assert_eq!(SmartLog::data_units(512_001), 2);
}

#[test]
fn firmware_and_effects_round_trip() {
    let mut f = FirmwareSlotLog {
        afi: 1,
        ..Default::default()
    };
    f.frs[0] = *b"0.1.0   ";
    assert_eq!(FirmwareSlotLog::decode(&f.encode()), Ok(f));
    let mut e = CommandEffectsLog::default();
    e.admin[6] = effects::CSUPP;
    e.io[1] = effects::CSUPP | effects::LBCC;
    let b = e.encode();
    assert_eq!(b[24], 1);
    assert_eq!(b[1024 + 4], 3);
    assert_eq!(CommandEffectsLog::decode(&b[..]), Ok(e));
}

#[test]
fn changed_ns_list_overflow() {
    let l = ChangedNsList { nsids: vec![1, 5] };
    assert_eq!(ChangedNsList::decode(&l.encode()[..]), Ok(l));
    let many = ChangedNsList {
        nsids: (1..=1025).collect(),
    };
    assert_eq!(
        ChangedNsList::decode(&many.encode()[..]).unwrap().nsids,
        vec![ChangedNsList::OVERFLOW]
    );
}

#[test]
fn discovery_round_trip_and_padding() {
    let mut tsas = [0u8; 256];
    tsas[0] = disc::RDMA_QPTYPE_CONNECTED;
    let e = DiscoveryLogEntry {
        trtype: disc::TRTYPE_TCP,
        adrfam: disc::ADRFAM_IPV4,
        subtype: disc::SUBTYPE_NVM,
        treq: disc::TREQ_DISABLE_SQFLOW,
        portid: 1,
        cntlid: 0xffff,
        asqsz: 32,
        eflags: 0,
        trsvcid: "4420".into(),
        subnqn: "nqn.2026-12.dev.nvmfd:ram0".into(),
        traddr: "127.0.0.1".into(),
        tsas,
    };
    let b = e.encode();
    assert_eq!(&b[32..38], b"4420  ");
    assert_eq!(b[512 + 9], b' ');
    assert_eq!(b[256 + 26], 0);
    assert_eq!(DiscoveryLogEntry::decode(&b), Ok(e));
    let h = DiscoveryLogHeader {
        genctr: 7,
        numrec: 2,
        recfmt: 0,
    };
    assert_eq!(DiscoveryLogHeader::decode(&h.encode()), Ok(h));
}

#[test]
fn ana_log_layout_and_round_trip() {
    let log = AnaLog {
        chgcnt: 7,
        groups: vec![
            AnaGroupDescriptor {
                grpid: 1,
                chgcnt: 3,
                state: 0x01,
                nsids: vec![1, 2, 9],
            },
            AnaGroupDescriptor {
                grpid: 5,
                chgcnt: 7,
                state: 0x0f,
                nsids: vec![],
            },
        ],
    };
    let b = log.encode();
    assert_eq!(b.len(), 16 + 32 + 12 + 32);
    assert_eq!(b.len(), log.encoded_len());
    assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 7);
    assert_eq!(u16::from_le_bytes([b[8], b[9]]), 2, "NGRPS");
    // First descriptor at 16: ANAGRPID, NNSIDS, CHGCNT, state at byte 16 of it.
    assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 3);
    assert_eq!(b[16 + 16], 0x01);
    assert_eq!(u32::from_le_bytes(b[56..60].try_into().unwrap()), 9);
    // Second descriptor right after the first one's NSID list.
    assert_eq!(u32::from_le_bytes(b[60..64].try_into().unwrap()), 5);
    assert_eq!(b[60 + 16], 0x0f);
    // A host buffer larger than the page: trailing zeros are not descriptors.
    let mut padded = b.clone();
    padded.resize(4096, 0);
    assert_eq!(AnaLog::decode(&padded), Ok(log));
}

#[test]
fn ana_log_decode_bounds_nnsids() {
    let mut b = AnaLog {
        chgcnt: 1,
        groups: vec![AnaGroupDescriptor {
            grpid: 1,
            chgcnt: 1,
            state: 1,
            nsids: vec![1],
        }],
    }
    .encode();
    // NNSIDS claims far more than the page holds.
    b[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(AnaLog::decode(&b).is_err());
    // NGRPS beyond the descriptors present.
    let mut short = AnaLog::default().encode();
    short[8] = 3;
    assert!(AnaLog::decode(&short).is_err());
}
