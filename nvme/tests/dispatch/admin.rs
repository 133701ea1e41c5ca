//! Admin commands on an I/O controller: Identify, Get Log Page, features, AER, Abort.

use nvme::spec::{admin_opcode, cc, fid, lid, nvm_opcode, reg, FABRICS_OPCODE};
use std::time::Instant;

use nvme::queue::{Direction, TransportKind};
use nvme::wire::identify::{
    decode_active_ns_list, IdentifyController, IdentifyControllerNvm, IdentifyNamespace,
    NsDescriptor,
};
use nvme::wire::log::{ChangedNsList, CommandEffectsLog, ErrorLogEntry, SmartLog};
use nvme::wire::{Sqe, Status};
use storage::Capabilities;

use crate::harness::*;

fn identify_ctrl(h: &mut Host) -> IdentifyController {
    let mut page = vec![0u8; 4096];
    let r = h.run(identify(1, 0, 0), &mut page);
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(r.data_len, 4096);
    IdentifyController::decode(&page).unwrap()
}

#[test]
fn identify_controller_fields_the_linux_host_checks() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.limits.in_capsule_data_size = 8192;
    cfg.limits.max_data_transfer = 1 << 20;
    cfg.subsystems[0].serial = "SERIAL42".into();
    let t = target_with(cfg, &b);
    let (mut h, cntlid) = admin(&t, SUBNQN, 0);
    let mut page = vec![0u8; 4096];
    h.run(identify(1, 0, 0), &mut page);
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(id.cntlid, cntlid, "must match the Connect response");
    assert_eq!(id.ioccsz, (64 + 8192) / 16);
    assert_eq!(id.iorcsz, 1);
    assert_eq!(id.icdoff, 0);
    assert_eq!(id.msdbd, 1);
    assert_eq!(id.vwc & 1, 1, "volatile write cache present");
    assert_ne!(id.oaes & 1 << 8, 0, "namespace attribute notices");
    assert_eq!(id.mdts, 8, "1 MiB = 2^8 * 4 KiB");
    assert_eq!(id.nn, id.mnan);
    assert!(id.nn >= 1);
    assert_eq!(id.subnqn, SUBNQN);
    assert_eq!(page[768 + SUBNQN.len()], 0, "subnqn NUL-terminated");
    assert_eq!(&id.sn[..10], b"SERIAL42  ");
    assert_eq!(&id.mn[..12], b"nvmfd-test  ");
    assert_eq!(id.kas, 10);
    assert_ne!(id.ctratt & 1 << 6, 0, "TBKAS");
    assert_eq!(id.sqes, 0x66);
    assert_eq!(id.cqes, 0x44);
    assert_eq!(id.maxcmd, 128);
    assert_eq!(id.cmic & 0b11, 0b11);
    assert_eq!(id.ver, 0x0001_0300);
    assert_eq!(id.cntrltype, 1);
    assert_eq!(id.oncs & 0b1101, 0b1101, "compare, DSM, write zeroes");
    assert_eq!(id.fuses, 1, "fused Compare and Write");
    assert_eq!(id.sgls, 1 | 1 << 20, "TCP: SGLs + offset, no keyed SGL");
    assert_eq!(id.lpa & 0b110, 0b110);
    // RDMA controllers advertise keyed SGL data blocks.
    let mut r = Host::new(&t, peer(TransportKind::Rdma, 1));
    r.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    r.property_set(reg::CC, cc::ENABLE);
    assert_eq!(identify_ctrl(&mut r).sgls, 1 | 1 << 2 | 1 << 20);
}

#[test]
fn identify_reports_what_the_backends_can_do() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces = vec![ram_ns(1, 1 << 20, 512), ram_ns(3, 1 << 21, 4096)];
    let t = target_with(cfg, &b);
    let made = b.made.lock().unwrap().clone();
    // Namespace 1: a discard-only device (dm-thin) with queue limits; namespace 3 promises
    // zeroes and reports no limits.
    *made[0].caps.lock().unwrap() = Capabilities {
        deallocate: true,
        zeroes_after_deallocate: false,
        write_zeroes_deallocates: false,
        max_deallocate_bytes: 1 << 20,
        max_write_zeroes_bytes: 256 << 10,
        physical_block_bytes: 8192,
        optimal_io_bytes: 1 << 20,
        volatile_cache: true,
    };
    let (mut h, _) = admin(&t, SUBNQN, 0);
    let mut page = vec![0u8; 4096];
    h.status(identify(0, 1, 0), &mut page);
    let id = IdentifyNamespace::decode(&page).unwrap();
    assert_eq!(id.dlfeat, 0, "nothing promised");
    // 8 KiB physical blocks, 1 MiB optimal writes, in 512-byte LBAs, 0's based.
    assert_eq!(
        (id.npwg, id.npwa, id.npdg, id.npda, id.nows),
        (15, 15, 15, 15, 2047)
    );
    h.status(identify(0, 3, 0), &mut page);
    let id = IdentifyNamespace::decode(&page).unwrap();
    assert_eq!(id.dlfeat, 0b1001);
    // Not known: 4 KiB (one 4096-byte LBA).
    assert_eq!((id.npwg, id.nows), (0, 0));
    assert_ne!(identify_ctrl(&mut h).oncs & 1 << 2, 0, "DSM");
    // CNS 06h: 1 MiB per range = 2048 blocks of 512; 256 KiB = 2^6 × 4 KiB.
    assert_eq!(h.status(identify(6, 0, 0), &mut page), Status::SUCCESS);
    let nvm = IdentifyControllerNvm::decode(&page).unwrap();
    assert_eq!((nvm.dmrsl, nvm.wzsl, nvm.dmrl, nvm.dmsl), (2048, 6, 0, 0));
    // No namespace can give space back: Dataset Management is not advertised.
    for m in &made {
        *m.caps.lock().unwrap() = Capabilities::default();
    }
    let oncs = identify_ctrl(&mut h).oncs;
    assert_eq!(oncs & 0b1101, 0b1001, "compare and write zeroes, no DSM");
    h.status(identify(6, 0, 0), &mut page);
    assert!(
        page.iter().all(|&b| b == 0),
        "no limits known, none invented"
    );
}

#[test]
fn identify_namespace_and_lists() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces = vec![ram_ns(1, 1 << 20, 512), ram_ns(3, 1 << 21, 4096)];
    cfg.subsystems[0].namespaces[1].read_only = true;
    cfg.subsystems[0].namespaces[1].nguid = Some([7; 16]);
    let t = target_with(cfg, &b);
    let (mut h, _) = admin(&t, SUBNQN, 0);
    let mut page = vec![0u8; 4096];
    assert_eq!(h.status(identify(0, 1, 0), &mut page), Status::SUCCESS);
    let ns = IdentifyNamespace::decode(&page).unwrap();
    assert_eq!((ns.nsze, ns.ncap, ns.nuse), (2048, 2048, 2048));
    assert_eq!(ns.lbaf0_lbads, 9);
    assert_eq!(ns.nmic, 1);
    assert_eq!(ns.nsattr, 0);
    assert_eq!(ns.dlfeat, 0b1001);
    assert_eq!(ns.nguid, nvme::namespace::derived_nguid(SUBNQN, 1));
    assert_eq!(h.status(identify(0, 3, 0), &mut page), Status::SUCCESS);
    let ns3 = IdentifyNamespace::decode(&page).unwrap();
    assert_eq!((ns3.nsze, ns3.lbaf0_lbads, ns3.nsattr), (512, 12, 1));
    assert_eq!(ns3.nguid, [7; 16]);
    // Inactive NSID: zero-filled; NSID 0 / broadcast: Invalid Namespace.
    assert_eq!(h.status(identify(0, 2, 0), &mut page), Status::SUCCESS);
    assert!(page.iter().all(|&b| b == 0));
    for nsid in [0, 0xffff_ffff] {
        assert_eq!(
            h.status(identify(0, nsid, 0), &mut page),
            Status::INVALID_NAMESPACE.with_dnr()
        );
    }
    // Active namespace list, starting after the given NSID.
    h.status(identify(2, 0, 0), &mut page);
    assert_eq!(decode_active_ns_list(&page).unwrap(), vec![1, 3]);
    h.status(identify(2, 1, 0), &mut page);
    assert_eq!(decode_active_ns_list(&page).unwrap(), vec![3]);
    assert_eq!(
        h.status(identify(2, 0xffff_fffe, 0), &mut page),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    // Namespace identification descriptors: NGUID, UUID, CSI.
    h.status(identify(3, 1, 0), &mut page);
    let d = NsDescriptor::decode_list(&page).unwrap();
    assert_eq!(
        d,
        vec![
            NsDescriptor::Nguid(nvme::namespace::derived_nguid(SUBNQN, 1)),
            NsDescriptor::Uuid(nvme::namespace::derived_uuid(SUBNQN, 1)),
            NsDescriptor::Csi(0),
        ]
    );
    assert_eq!(
        h.status(identify(3, 2, 0), &mut page),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    // CNS 05h/06h for the NVM command set: no backend reports limits here, so all zero
    // ("no limit reported"); other CSIs: Invalid Field.
    page.fill(1);
    assert_eq!(h.status(identify(6, 0, 0), &mut page), Status::SUCCESS);
    assert!(page.iter().all(|&b| b == 0));
    assert_eq!(h.status(identify(5, 1, 0), &mut page), Status::SUCCESS);
    assert_eq!(
        h.status(identify(6, 0, 2), &mut page),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        h.status(identify(0x1f, 0, 0), &mut page),
        Status::INVALID_FIELD.with_dnr()
    );
}

#[test]
fn unknown_admin_opcode_and_mdts() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut h, _) = admin(&t, SUBNQN, 0);
    assert_eq!(
        h.q.prepare(&sqe(0x80, 0), 0),
        Err(Status::INVALID_OPCODE.with_dnr())
    );
    // Keep Alive carries no data.
    assert_eq!(
        h.q.prepare(&sqe(admin_opcode::KEEP_ALIVE, 0), 512),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    assert_eq!(
        h.q.prepare(&get_log(2, 512, 0, false), (1 << 20) + 4),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    assert_eq!(
        h.q.prepare(&get_log(2, 512, 0, false), 512),
        Ok(Direction::ControllerToHost)
    );
}

#[test]
fn log_pages_partial_and_offset_reads() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut h, cntlid) = admin(&t, SUBNQN, 0);
    // A failed command lands in the error log.
    let mut page = vec![0u8; 4096];
    let failed = identify(0, 0, 0);
    assert_eq!(
        h.status(failed, &mut page),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    let mut buf = vec![0u8; 128];
    assert_eq!(
        h.status(get_log(1, 128, 0, false), &mut buf),
        Status::SUCCESS
    );
    let e = ErrorLogEntry::decode(&buf[..64]).unwrap();
    assert_eq!(e.error_count, 1);
    assert_eq!(e.status, Status::INVALID_NAMESPACE.with_dnr());
    assert_eq!(e.sqid, 0);
    assert_eq!(e.param_error_location, 4);
    assert_eq!(ErrorLogEntry::decode(&buf[64..]).unwrap().error_count, 0);
    // Offset read of the second half of the SMART log equals the tail of a full read.
    let mut full = vec![0u8; 512];
    assert_eq!(
        h.status(get_log(2, 512, 0, false), &mut full),
        Status::SUCCESS
    );
    SmartLog::decode(&full).unwrap();
    let mut half = vec![0u8; 256];
    let r = h.run(get_log(2, 256, 256, false), &mut half);
    assert_eq!((r.cqe.status, r.data_len), (Status::SUCCESS, 256));
    assert_eq!(half, full[256..]);
    // Past the end of the page, or unaligned: Invalid Field.
    assert_eq!(
        h.status(get_log(2, 4, 512, false), &mut [0u8; 4]),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        h.status(get_log(2, 4, 2, false), &mut [0u8; 4]),
        Status::INVALID_FIELD.with_dnr()
    );
    // Reading past the end within one command zero-fills.
    let mut over = vec![0xffu8; 1024];
    assert_eq!(
        h.status(get_log(3, 1024, 0, false), &mut over),
        Status::SUCCESS
    );
    assert_eq!(over[0], 1, "active firmware slot 1");
    assert!(over[512..].iter().all(|&b| b == 0));
    // The SGL must hold what NUMD asks for.
    assert_eq!(
        h.status(get_log(2, 512, 0, false), &mut [0u8; 256]),
        Status::DATA_SGL_LENGTH_INVALID.with_dnr()
    );
    // Commands Supported and Effects.
    assert_eq!(
        h.status(get_log(5, 4096, 0, false), &mut page),
        Status::SUCCESS
    );
    let eff = CommandEffectsLog::decode(&page).unwrap();
    assert_eq!(eff.admin[admin_opcode::IDENTIFY as usize], 1);
    assert_eq!(eff.io[nvm_opcode::WRITE as usize], 0b11);
    // Every NVM command the table implements, and only those; LBCC on those that write.
    for op in [
        nvm_opcode::FLUSH,
        nvm_opcode::READ,
        nvm_opcode::COMPARE,
        nvm_opcode::VERIFY,
    ] {
        assert_eq!(eff.io[op as usize], 1, "opcode {op:#x}");
    }
    for op in [
        nvm_opcode::WRITE_ZEROES,
        nvm_opcode::DATASET_MANAGEMENT,
        nvm_opcode::COPY,
    ] {
        assert_eq!(eff.io[op as usize], 0b11, "opcode {op:#x}");
    }
    let listed = eff.io.iter().filter(|&&e| e != 0).count();
    assert!(listed == 8 || listed == 12, "{listed} I/O commands listed");
    assert_eq!(eff.io[FABRICS_OPCODE as usize], 0);
    // The discovery log does not exist on an I/O controller.
    assert_eq!(
        h.status(get_log(0x70, 1024, 0, false), &mut page[..1024]),
        Status::INVALID_LOG_PAGE.with_dnr()
    );
    let _ = cntlid;
}

fn set_features(fid: u8, cdw11: u32) -> Sqe {
    Sqe {
        cdw10: fid as u32,
        cdw11,
        ..sqe(admin_opcode::SET_FEATURES, 0)
    }
}

fn get_features(fid: u8, sel: u32, cdw11: u32) -> Sqe {
    Sqe {
        cdw10: fid as u32 | sel << 8,
        cdw11,
        ..sqe(admin_opcode::GET_FEATURES, 0)
    }
}

#[test]
fn features() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.limits.max_io_queues = 4;
    let t = target_with(cfg, &b);
    let (mut h, cntlid) = admin(&t, SUBNQN, 15_500);
    // Number of Queues: min(requested, max), 0's based in both halves.
    let r = h.run(set_features(fid::NUMBER_OF_QUEUES, 1 | 1 << 16), &mut []);
    assert_eq!((r.cqe.status, r.cqe.dw0), (Status::SUCCESS, 1 | 1 << 16));
    let r = h.run(set_features(fid::NUMBER_OF_QUEUES, 63 | 63 << 16), &mut []);
    assert_eq!(r.cqe.dw0, 3 | 3 << 16);
    assert_eq!(
        h.run(get_features(fid::NUMBER_OF_QUEUES, 0, 0), &mut [])
            .cqe
            .dw0,
        3 | 3 << 16
    );
    assert_eq!(
        h.status(set_features(fid::NUMBER_OF_QUEUES, 0xffff), &mut []),
        Status::INVALID_FIELD.with_dnr()
    );
    let _q = io_queue(&t, cntlid, 1);
    assert_eq!(
        h.status(set_features(fid::NUMBER_OF_QUEUES, 0), &mut []),
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );
    // KATO from Connect rounded up to seconds; Set Features changes it.
    assert_eq!(
        h.run(get_features(fid::KEEP_ALIVE_TIMER, 0, 0), &mut [])
            .cqe
            .dw0,
        16_000
    );
    h.run(set_features(fid::KEEP_ALIVE_TIMER, 30_000), &mut []);
    assert_eq!(
        h.run(get_features(fid::KEEP_ALIVE_TIMER, 0, 0), &mut [])
            .cqe
            .dw0,
        30_000
    );
    // Error Recovery (05h): TLER is kept; DULBE is not supported (NSFEAT bit 2 clear), so
    // setting it is an Invalid Field and leaves TLER unchanged.
    let get_er = |h: &mut Host| h.run(get_features(fid::ERROR_RECOVERY, 0, 0), &mut []).cqe;
    assert_eq!(
        (get_er(&mut h).status, get_er(&mut h).dw0),
        (Status::SUCCESS, 0)
    );
    assert_eq!(
        h.status(set_features(fid::ERROR_RECOVERY, 50), &mut []),
        Status::SUCCESS
    );
    assert_eq!(get_er(&mut h).dw0, 50);
    assert_eq!(
        h.status(set_features(fid::ERROR_RECOVERY, 1 << 16 | 7), &mut []),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(get_er(&mut h).dw0, 50);
    assert_eq!(
        h.run(get_features(fid::ERROR_RECOVERY, 1, 0), &mut [])
            .cqe
            .dw0,
        0,
        "default"
    );
    // Volatile write cache.
    assert_eq!(
        h.run(get_features(fid::VOLATILE_WRITE_CACHE, 0, 0), &mut [])
            .cqe
            .dw0,
        1
    );
    h.run(set_features(fid::VOLATILE_WRITE_CACHE, 0), &mut []);
    assert_eq!(
        h.run(get_features(fid::VOLATILE_WRITE_CACHE, 0, 0), &mut [])
            .cqe
            .dw0,
        0
    );
    assert_eq!(
        h.run(get_features(fid::VOLATILE_WRITE_CACHE, 1, 0), &mut [])
            .cqe
            .dw0,
        1,
        "default"
    );
    // Temperature threshold: over (THSEL 0) and under (THSEL 1) for the composite sensor.
    // No sensor, so no invented default: 0 like the Composite Temperature SMART reports.
    assert_eq!(
        h.run(get_features(fid::TEMPERATURE_THRESHOLD, 1, 0), &mut [])
            .cqe
            .dw0,
        0,
        "default"
    );
    assert_eq!(
        h.run(get_features(fid::TEMPERATURE_THRESHOLD, 0, 0), &mut [])
            .cqe
            .dw0,
        0,
        "current"
    );
    let mut smart = [0u8; 512];
    assert_eq!(
        h.status(get_log(lid::SMART, 512, 0, false), &mut smart),
        Status::SUCCESS
    );
    assert_eq!(SmartLog::decode(&smart).unwrap().composite_temperature, 0);
    h.run(set_features(fid::TEMPERATURE_THRESHOLD, 350), &mut []);
    h.run(
        set_features(fid::TEMPERATURE_THRESHOLD, 250 | 1 << 20),
        &mut [],
    );
    assert_eq!(
        h.run(get_features(fid::TEMPERATURE_THRESHOLD, 0, 0), &mut [])
            .cqe
            .dw0,
        350
    );
    assert_eq!(
        h.run(
            get_features(fid::TEMPERATURE_THRESHOLD, 0, 1 << 20),
            &mut []
        )
        .cqe
        .dw0,
        250
    );
    assert_eq!(
        h.status(set_features(fid::TEMPERATURE_THRESHOLD, 1 << 16), &mut []),
        Status::INVALID_FIELD.with_dnr()
    );
    // Async event config: only supported bits.
    assert_eq!(
        h.status(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8), &mut []),
        Status::SUCCESS
    );
    assert_eq!(
        h.status(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 9), &mut []),
        Status::INVALID_FIELD.with_dnr()
    );
    // Host identifier: the Connect hostid, 128-bit form only; not settable.
    let mut hostid = [0u8; 16];
    assert_eq!(
        h.status(get_features(fid::HOST_IDENTIFIER, 0, 1), &mut hostid),
        Status::SUCCESS
    );
    assert_eq!(hostid, [0x42; 16]);
    assert_eq!(
        h.status(get_features(fid::HOST_IDENTIFIER, 0, 0), &mut hostid),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        h.status(set_features(fid::HOST_IDENTIFIER, 1), &mut []),
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );
    // Timestamp set by the host comes back with origin 001b.
    let mut ts = [0u8; 8];
    ts[..6].copy_from_slice(&1_700_000_000_000u64.to_le_bytes()[..6]);
    assert_eq!(
        h.status(set_features(fid::TIMESTAMP, 0), &mut ts),
        Status::SUCCESS
    );
    let mut out = [0u8; 8];
    assert_eq!(
        h.status(get_features(fid::TIMESTAMP, 0, 0), &mut out),
        Status::SUCCESS
    );
    let mut ms = [0u8; 8];
    ms[..6].copy_from_slice(&out[..6]);
    let ms = u64::from_le_bytes(ms);
    assert!((1_700_000_000_000..1_700_000_010_000).contains(&ms));
    assert_eq!((out[6] >> 1) & 0x7, 1);
    // Saving is not supported; unknown features are invalid.
    assert_eq!(
        h.status(set_features(fid::ARBITRATION, 0), &mut []),
        Status::SUCCESS
    );
    let mut sv = set_features(fid::ARBITRATION, 0);
    sv.cdw10 |= 1 << 31;
    assert_eq!(
        h.status(sv, &mut []),
        Status::FEATURE_NOT_SAVEABLE.with_dnr()
    );
    assert_eq!(
        h.status(get_features(0x7e, 0, 0), &mut []),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        h.run(get_features(fid::VOLATILE_WRITE_CACHE, 3, 0), &mut [])
            .cqe
            .dw0,
        1 << 2
    );
}

#[test]
fn aer_limit_abort_and_changed_namespace_events() {
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let (mut h, _) = admin(&t, SUBNQN, 0);
    let now = Instant::now();
    // Up to AERL + 1 = 4 AERs are held; the fifth exceeds the limit.
    for _ in 0..4 {
        assert!(h
            .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
            .is_none());
    }
    assert_eq!(
        h.status(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut []),
        Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED.with_dnr()
    );
    // Abort the first AER (cid 3, after Connect and Property Set): it completes with Abort
    // Requested via poll.
    let abort = Sqe {
        cdw10: 3 << 16,
        ..sqe(admin_opcode::ABORT, 0)
    };
    assert_eq!(h.run(abort, &mut []).cqe.dw0, 0, "aborted");
    let p = h.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(p.completions[0].cqe.cid, 3);
    assert_eq!(p.completions[0].cqe.status, Status::ABORT_REQUESTED);
    // Abort of anything else: honestly "not aborted".
    let abort_io = Sqe {
        cdw10: 1 | 5 << 16,
        ..sqe(admin_opcode::ABORT, 0)
    };
    assert_eq!(h.run(abort_io, &mut []).cqe.dw0, 1);
    assert!(h.poll(now).completions.is_empty());

    // Hot-add namespace 2 and remove nothing: one Namespace Attribute Changed event.
    let mut cfg2 = cfg.clone();
    cfg2.subsystems[0].namespaces.push(ram_ns(2, 1 << 20, 512));
    let summary = t.apply_with_opener(cfg2.clone(), &b.opener()).unwrap();
    assert_eq!(summary.namespaces_added, vec![(SUBNQN.to_string(), 2)]);
    let p = h.poll(now);
    assert_eq!(p.completions.len(), 1);
    let aen = p.completions[0].cqe;
    assert_eq!(aen.status, Status::SUCCESS);
    assert_eq!(aen.dw0, 0x04_00_02, "notice, NS attribute changed, log 04h");
    // Another change before the log is read stays masked (but is recorded).
    let mut cfg3 = cfg2.clone();
    cfg3.subsystems[0].namespaces.push(ram_ns(9, 1 << 20, 512));
    t.apply_with_opener(cfg3.clone(), &b.opener()).unwrap();
    assert!(h.poll(now).completions.is_empty());
    let mut page = vec![0u8; 4096];
    assert_eq!(
        h.status(get_log(4, 4096, 0, false), &mut page),
        Status::SUCCESS
    );
    assert_eq!(ChangedNsList::decode(&page).unwrap().nsids, vec![2, 9]);
    // Read again: cleared.
    h.status(get_log(4, 4096, 0, false), &mut page);
    assert!(ChangedNsList::decode(&page).unwrap().nsids.is_empty());
    // Unmasked now: removing namespace 2 raises the next event on a held AER.
    t.apply_with_opener(
        {
            let mut c = cfg3.clone();
            c.subsystems[0].namespaces.retain(|n| n.nsid != 2);
            c
        },
        &b.opener(),
    )
    .unwrap();
    let p = h.poll(now);
    assert_eq!(p.completions.len(), 1);
    h.status(get_log(4, 4096, 0, true), &mut page);
    assert_eq!(ChangedNsList::decode(&page).unwrap().nsids, vec![2]);
    let mut idp = vec![0u8; 4096];
    h.status(identify(2, 0, 0), &mut idp);
    assert_eq!(decode_active_ns_list(&idp).unwrap(), vec![1, 9]);
}
