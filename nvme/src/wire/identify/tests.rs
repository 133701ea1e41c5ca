use super::*;

fn sample_ctrl() -> IdentifyController {
    IdentifyController {
        vid: 0,
        ssvid: 0,
        sn: space_padded("abc"),
        mn: space_padded("nvmfd"),
        fr: space_padded("0.1.0"),
        rab: 6,
        ieee: [1, 2, 3],
        cmic: 3,
        mdts: 8,
        cntlid: 7,
        ver: 0x0001_0300,
        oaes: ctrl_bits::OAES_NS_ATTR,
        ctratt: ctrl_bits::CTRATT_TBKAS,
        cntrltype: cntrltype::IO,
        oacs: 0,
        acl: 3,
        aerl: 3,
        frmw: 3,
        lpa: 7,
        elpe: 63,
        npss: 0,
        wctemp: 343,
        cctemp: 373,
        kas: 10,
        anatt: 10,
        anacap: 0x1f,
        anagrpmax: 128,
        nanagrpid: 128,
        sqes: 0x66,
        cqes: 0x44,
        maxcmd: 128,
        nn: 4,
        oncs: 0x4d,
        fuses: 0,
        ocfs: 1,
        fna: 0,
        vwc: 1,
        awun: 0,
        awupf: 0,
        sgls: 0x10_0001,
        mnan: 4,
        subnqn: "nqn.2026-12.dev.nvmfd:ram0".into(),
        ioccsz: (64 + 8192) / 16,
        iorcsz: 1,
        icdoff: 0,
        fcatt: 0,
        msdbd: 1,
        psd0_max_power: 0x9c4,
        psd0_entry_lat: 0x10,
        psd0_exit_lat: 0x4,
    }
}

#[test]
fn identify_controller_nvm_layout() {
    let id = IdentifyControllerNvm {
        wzsl: 8,
        dmrl: 0,
        dmrsl: 0x0102_0304,
        dmsl: 0,
    };
    let b = id.encode();
    // Figure 100: VSL @0, WZSL @1, WUSL @2, DMRL @3, DMRSL @4..8, DMSL @8..16.
    assert_eq!(&b[..16], &[0, 8, 0, 0, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert!(b[16..].iter().all(|&x| x == 0));
    assert_eq!(IdentifyControllerNvm::decode(&b[..]).unwrap(), id);
    assert!(IdentifyControllerNvm::decode(&b[..100]).is_err());
}
#[test]
fn controller_round_trip_and_offsets() {
    let c = sample_ctrl();
    let b = c.encode();
    assert_eq!(IdentifyController::decode(&b[..]), Ok(c.clone()));
    assert_eq!(&b[4..8], b"abc ");
    assert_eq!(b[512], 0x66);
    assert_eq!(u32_at(&b, 1792), 516);
    assert_eq!(&b[534..536], &[1, 0], "OCFS");
    // ANATT, ANACAP, ANAGRPMAX, NANAGRPID at 342..352 (NVMe Base 2.0 Figure 275).
    assert_eq!(&b[342..344], &[10, 0x1f]);
    assert_eq!(u32_at(&b, 344), 128);
    assert_eq!(u32_at(&b, 348), 128);
    // subnqn is NUL-terminated, never space-padded.
    assert_eq!(b[768 + c.subnqn.len()], 0);
    assert!(IdentifyController::decode(&b[..4095]).is_err());
}

#[test]
fn namespace_round_trip() {
    let ns = IdentifyNamespace {
        nsze: 1 << 21,
        ncap: 1 << 21,
        nuse: 1 << 21,
        nsfeat: ns_bits::NSFEAT_DEALLOC_ERROR,
        nlbaf: 0,
        flbas: 0,
        nmic: 1,
        rescap: 0xfe,
        dlfeat: 9,
        npwg: 7,
        npwa: 7,
        npdg: 7,
        npda: 7,
        nows: 7,
        mssrl: 0x0102,
        mcl: 0x0304_0506,
        msrc: 127,
        anagrpid: 3,
        nsattr: 1,
        nguid: [9; 16],
        eui64: [0; 8],
        lbaf0_lbads: 9,
    };
    let b = ns.encode();
    assert_eq!(b[130], 9);
    assert_eq!(u32_at(&b, 92), 3, "ANAGRPID");
    // MSSRL @74, MCL @76, MSRC @80 (NVM Command Set 1.0 Figure 97).
    assert_eq!(&b[74..81], &[2, 1, 6, 5, 4, 3, 127]);
    assert_eq!(IdentifyNamespace::decode(&b[..]), Ok(ns));
}

#[test]
fn active_list_round_trip_and_cap() {
    let mut page = vec![0xffu8; IDENTIFY_DATA_SIZE];
    encode_active_ns_list([1u32, 2, 9].into_iter(), &mut page);
    assert_eq!(decode_active_ns_list(&page), Ok(vec![1, 2, 9]));
    encode_active_ns_list(1..5000u32, &mut page);
    assert_eq!(decode_active_ns_list(&page).unwrap().len(), 1024);
}

#[test]
fn descriptor_list_round_trip() {
    let list = [
        NsDescriptor::Nguid([1; 16]),
        NsDescriptor::Uuid([2; 16]),
        NsDescriptor::Csi(0),
        NsDescriptor::Eui64([3; 8]),
    ];
    let b = NsDescriptor::encode_list(&list);
    assert_eq!(&b[0..4], &[2, 16, 0, 0]);
    assert_eq!(NsDescriptor::decode_list(&b[..]), Ok(list.to_vec()));
    let mut bad = b.clone();
    bad[1] = 15;
    assert!(NsDescriptor::decode_list(&bad[..]).is_err());
}

#[test]
fn space_padding_sanitises() {
    let f: [u8; 8] = space_padded("a\u{1}b");
    assert_eq!(&f, b"a?b     ");
}
