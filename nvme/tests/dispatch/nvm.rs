//! NVM command set I/O through an I/O queue: data path, range and length checks, backend
//! error translation, SMART accounting.

use nvme::queue::Direction;
use nvme::spec::nvm_opcode::{self, COMPARE, READ, WRITE};
use nvme::spec::{admin_opcode, fid, nvm_bits};
use nvme::wire::log::{ErrorLogEntry, SmartLog};
use nvme::wire::{Sqe, Status};

use crate::harness::*;

fn setup(cfg: nvme::target::TargetConfig) -> (Backends, Host, Host) {
    let b = Backends::new();
    let t = target_with(cfg, &b);
    let (a, cntlid) = admin(&t, SUBNQN, 0);
    let q = io_queue(&t, cntlid, 1);
    (b, a, q)
}

#[test]
fn write_read_compare_round_trip_and_smart() {
    let (_b, mut a, mut q) = setup(basic_config());
    let mut data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let w = q.run(rw(WRITE, 1, 8, 8), &mut data);
    assert_eq!(
        (w.cqe.status, w.cqe.sqid, w.data_len),
        (Status::SUCCESS, 1, 0)
    );
    let mut back = vec![0u8; 4096];
    let r = q.run(rw(READ, 1, 8, 8), &mut back);
    assert_eq!((r.cqe.status, r.data_len), (Status::SUCCESS, 4096));
    assert_eq!(back, data);
    // Compare: equal, then one byte off.
    assert_eq!(
        q.status(rw(COMPARE, 1, 8, 8), &mut data.clone()),
        Status::SUCCESS
    );
    data[100] ^= 1;
    let c = q.status(rw(COMPARE, 1, 8, 8), &mut data);
    assert_eq!(c, Status::COMPARE_FAILURE.with_dnr());
    assert_eq!(c.sct, 2);
    // SMART: 1 write, 1 read of 4096 bytes → 1 data unit each (rounded up).
    let mut page = vec![0u8; 512];
    assert_eq!(
        a.status(get_log(2, 512, 0, false), &mut page),
        Status::SUCCESS
    );
    let s = SmartLog::decode(&page).unwrap();
    assert_eq!((s.host_read_commands, s.host_write_commands), (1, 1));
    assert_eq!((s.data_units_read, s.data_units_written), (1, 1));
}

#[test]
fn range_length_namespace_and_protection_checks() {
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces.push({
        let mut n = ram_ns(2, 1 << 20, 4096);
        n.read_only = true;
        n
    });
    let (_b, mut a, mut q) = setup(cfg);
    let blocks = (1u64 << 20) / 512;
    let mut buf = vec![0u8; 512];
    // Last block is fine; one past the end, and an SLBA that wraps, are out of range.
    assert_eq!(
        q.status(rw(READ, 1, blocks - 1, 1), &mut buf),
        Status::SUCCESS
    );
    assert_eq!(
        q.q.prepare(&rw(READ, 1, blocks, 1), 512),
        Err(Status::LBA_OUT_OF_RANGE.with_dnr())
    );
    assert_eq!(
        q.status(rw(WRITE, 1, u64::MAX, 1), &mut buf),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    assert_eq!(
        q.status(rw(READ, 1, blocks - 1, 2), &mut [0u8; 1024]),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    // Transfer length must equal NLB × block size.
    assert_eq!(
        q.q.prepare(&rw(WRITE, 1, 0, 2), 512),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    assert_eq!(
        q.q.prepare(&rw(WRITE, 1, 0, 2), 1024),
        Ok(Direction::HostToController)
    );
    // Beyond MDTS.
    assert_eq!(
        q.q.prepare(&rw(READ, 1, 0, 4096), 4096 * 512),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    // NSID 0, broadcast, inactive.
    for nsid in [0, 0xffff_ffff, 7] {
        assert_eq!(
            q.status(rw(READ, nsid, 0, 1), &mut buf),
            Status::INVALID_NAMESPACE.with_dnr(),
            "nsid {nsid}"
        );
    }
    // Read-only namespace: reads work, writes are refused.
    let mut b4k = vec![0u8; 4096];
    assert_eq!(q.status(rw(READ, 2, 0, 1), &mut b4k), Status::SUCCESS);
    assert_eq!(
        q.status(rw(WRITE, 2, 0, 1), &mut b4k),
        Status::NAMESPACE_WRITE_PROTECTED.with_dnr()
    );
    assert_eq!(
        q.q.prepare(&sqe(nvm_opcode::WRITE_ZEROES, 2), 0),
        Err(Status::NAMESPACE_WRITE_PROTECTED.with_dnr())
    );
    // Unknown I/O opcode; admin opcodes are not I/O opcodes.
    assert_eq!(
        q.q.prepare(&sqe(0x7e, 1), 0),
        Err(Status::INVALID_OPCODE.with_dnr())
    );
    assert_eq!(
        q.q.prepare(&identify(1, 0, 0), 4096),
        Err(Status::INVALID_OPCODE.with_dnr())
    );
    // Every failure above is in the error log, newest first, with the I/O queue's SQID.
    let mut page = vec![0u8; 64];
    a.status(get_log(1, 64, 0, false), &mut page);
    let e = ErrorLogEntry::decode(&page).unwrap();
    assert_eq!(
        (e.sqid, e.status),
        (1, Status::NAMESPACE_WRITE_PROTECTED.with_dnr())
    );
}

#[test]
fn write_zeroes_and_deallocate_read_back_zero() {
    let (_b, _a, mut q) = setup(basic_config());
    let mut ones = vec![0xffu8; 8192];
    assert_eq!(q.status(rw(WRITE, 1, 0, 16), &mut ones), Status::SUCCESS);
    // Write Zeroes on blocks 0..2, then with DEAC on 2..4.
    let wz = |slba: u64, nlb: u32, deac: bool| Sqe {
        cdw10: slba as u32,
        cdw12: (nlb - 1) | (deac as u32) << 25,
        ..sqe(nvm_opcode::WRITE_ZEROES, 1)
    };
    assert_eq!(q.status(wz(0, 2, false), &mut []), Status::SUCCESS);
    assert_eq!(q.status(wz(2, 2, true), &mut []), Status::SUCCESS);
    // DSM deallocate of blocks 6..8 and 10..11 (two ranges, NR = 1).
    let mut ranges = nvme::wire::dsm::encode_ranges(&[(6, 2), (10, 1)]);
    let dsm = Sqe {
        cdw10: 1,
        cdw11: nvm_bits::DSM_AD,
        ..sqe(nvm_opcode::DATASET_MANAGEMENT, 1)
    };
    assert_eq!(q.status(dsm, &mut ranges), Status::SUCCESS);
    let mut back = vec![0u8; 8192];
    q.run(rw(READ, 1, 0, 16), &mut back);
    let zero_blocks: Vec<usize> = (0..16)
        .filter(|b| back[b * 512..(b + 1) * 512].iter().all(|&x| x == 0))
        .collect();
    assert_eq!(zero_blocks, vec![0, 1, 2, 3, 6, 7, 10]);
    // A range past the end fails the whole command before anything is deallocated.
    ranges[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    ranges[8..16].copy_from_slice(&12u64.to_le_bytes());
    assert_eq!(
        q.status(dsm, &mut ranges),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    q.run(rw(READ, 1, 12, 1), &mut back[..512]);
    assert!(back[..512].iter().all(|&x| x == 0xff));
    // Fewer range bytes than NR asks for.
    assert_eq!(
        q.q.prepare(&dsm, 16),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    assert_eq!(
        q.status(sqe(nvm_opcode::FLUSH, 1), &mut []),
        Status::SUCCESS,
        "flush"
    );
}

#[test]
fn a_fenced_backend_answers_ana_inaccessible_so_the_host_tries_another_path() {
    // Ceph's EBLOCKLISTED (= ESHUTDOWN): a gateway-group peer fenced this process.
    let (b, _a, mut q) = setup(basic_config());
    let mut buf = vec![0u8; 512];
    *b.last().fail_with.lock().unwrap() = Some(libc::ESHUTDOWN);
    let status = q.status(rw(WRITE, 1, 4, 1), &mut buf);
    assert_eq!(status, Status::ANA_INACCESSIBLE);
    assert!(!status.dnr, "a path error the host may retry elsewhere");
    assert_eq!(
        q.status(rw(READ, 1, 4, 1), &mut buf),
        Status::ANA_INACCESSIBLE
    );
}

#[test]
fn backend_errors_are_translated_logged_and_counted() {
    let (b, mut a, mut q) = setup(basic_config());
    let mem = b.last();
    let mut buf = vec![0u8; 512];
    *mem.fail_with.lock().unwrap() = Some(libc::EIO);
    assert_eq!(
        q.status(rw(READ, 1, 3, 1), &mut buf),
        Status::UNRECOVERED_READ_ERROR
    );
    assert_eq!(q.status(rw(WRITE, 1, 4, 1), &mut buf), Status::WRITE_FAULT);
    *mem.fail_with.lock().unwrap() = Some(libc::ENOSPC);
    assert_eq!(
        q.status(rw(WRITE, 1, 4, 1), &mut buf),
        Status::CAPACITY_EXCEEDED.with_dnr()
    );
    *mem.fail_with.lock().unwrap() = Some(libc::EBADF);
    assert_eq!(
        q.status(rw(WRITE, 1, 4, 1), &mut buf),
        Status::INTERNAL_ERROR
    );
    *mem.fail_with.lock().unwrap() = None;
    let mut page = vec![0u8; 256];
    a.status(get_log(1, 256, 0, false), &mut page);
    let entries: Vec<ErrorLogEntry> = page
        .chunks(64)
        .map(|c| ErrorLogEntry::decode(c).unwrap())
        .collect();
    assert_eq!(entries[3].status, Status::UNRECOVERED_READ_ERROR);
    assert_eq!((entries[3].lba, entries[3].nsid), (3, 1));
    assert_eq!(entries[0].status, Status::INTERNAL_ERROR);
    assert!(entries[0].error_count > entries[1].error_count);
    let mut smart = vec![0u8; 512];
    a.status(get_log(2, 512, 0, false), &mut smart);
    let s = SmartLog::decode(&smart).unwrap();
    assert_eq!(s.media_errors, 2);
    assert_eq!(s.error_log_entries, 4);
}

#[test]
fn file_namespace_goes_through_io_submit_and_finish() {
    let dir = std::env::temp_dir().join(format!("nvmfd-core-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns.img");
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces = vec![nvme::namespace::NamespaceConfig {
        nsid: 1,
        backend: nvme::namespace::BackendConfig::File {
            path: path.clone(),
            size: Some(1 << 20),
            direct_io: false,
        },
        block_size: 512,
        read_only: false,
        uuid: None,
        nguid: None,
        ana_group: 1,
    }];
    let (_b, mut a, mut q) = setup(cfg);
    let mut data: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(q.status(rw(WRITE, 1, 100, 2), &mut data), Status::SUCCESS);
    let mut back = vec![0u8; 1024];
    let r = q.run(rw(READ, 1, 100, 2), &mut back);
    assert_eq!((r.cqe.status, r.data_len), (Status::SUCCESS, 1024));
    assert_eq!(back, data);
    assert_eq!(
        q.status(sqe(nvm_opcode::FLUSH, 1), &mut []),
        Status::SUCCESS
    );
    assert!(q.submitted >= 2, "file I/O is submitted, not inline");
    // Compare against the file: the stored data is read through the submit path (never
    // inline), then compared on completion.
    let before = q.submitted;
    assert_eq!(q.status(rw(COMPARE, 1, 100, 2), &mut data), Status::SUCCESS);
    assert_eq!(q.submitted, before + 1, "Compare reads through the engine");
    let mut off_by_one = data.clone();
    off_by_one[700] ^= 1;
    assert_eq!(
        q.status(rw(COMPARE, 1, 100, 2), &mut off_by_one),
        Status::COMPARE_FAILURE.with_dnr()
    );
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[100 * 512..102 * 512], &data[..]);
    // Write Zeroes and a two-range Deallocate, each one submitted op and one completion.
    assert_eq!(q.status(rw(WRITE, 1, 200, 2), &mut data), Status::SUCCESS);
    let before = q.submitted;
    let wz = Sqe {
        cdw10: 100,
        cdw12: 0,
        ..sqe(nvm_opcode::WRITE_ZEROES, 1)
    };
    assert_eq!(q.status(wz, &mut []), Status::SUCCESS);
    let mut ranges = nvme::wire::dsm::encode_ranges(&[(101, 1), (200, 2)]);
    let dsm = Sqe {
        cdw10: 1,
        cdw11: nvm_bits::DSM_AD,
        ..sqe(nvm_opcode::DATASET_MANAGEMENT, 1)
    };
    assert_eq!(q.status(dsm, &mut ranges), Status::SUCCESS);
    assert_eq!(q.submitted, before + 2);
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[100 * 512..102 * 512].iter().all(|&b| b == 0));
    assert!(on_disk[200 * 512..202 * 512].iter().all(|&b| b == 0));
    let mut smart = vec![0u8; 512];
    a.status(get_log(2, 512, 0, false), &mut smart);
    assert_eq!(SmartLog::decode(&smart).unwrap().host_write_commands, 2);
    // A durable Write Zeroes on a cached (file) namespace: FUA, or the host's write cache
    // turned off (feature 06h), makes the zeroing be followed by a Flush before it completes
    // (two ops; a plain one above was one).
    assert_eq!(q.status(rw(WRITE, 1, 300, 2), &mut data), Status::SUCCESS);
    let before = q.submitted;
    let wz_fua = Sqe {
        cdw10: 300,
        cdw12: 1 | nvm_bits::FUA,
        ..sqe(nvm_opcode::WRITE_ZEROES, 1)
    };
    assert_eq!(q.status(wz_fua, &mut []), Status::SUCCESS);
    assert_eq!(q.submitted, before + 2, "zeroing, then a Flush");
    let wce_off = Sqe {
        cdw10: fid::VOLATILE_WRITE_CACHE as u32,
        cdw11: 0,
        ..sqe(admin_opcode::SET_FEATURES, 0)
    };
    assert_eq!(a.status(wce_off, &mut []), Status::SUCCESS);
    let before = q.submitted;
    assert_eq!(q.status(wz, &mut []), Status::SUCCESS);
    assert_eq!(
        q.submitted,
        before + 2,
        "write cache off: zeroing, then a Flush"
    );
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[300 * 512..302 * 512].iter().all(|&b| b == 0));
    // The CID of a finished durable Write Zeroes leaves no mark: a Write with it writes.
    assert_eq!(q.status(rw(WRITE, 1, 300, 2), &mut data), Status::SUCCESS);
    assert_eq!(
        &std::fs::read(&path).unwrap()[300 * 512..302 * 512],
        &data[..]
    );
    drop(q);
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fua_passes_through_and_write_cache_off_means_write_through() {
    let (b, mut a, mut q) = setup(basic_config());
    let mem = b.last();
    let set_wce = |on: u32| Sqe {
        cdw10: fid::VOLATILE_WRITE_CACHE as u32,
        cdw11: on,
        ..sqe(admin_opcode::SET_FEATURES, 0)
    };
    assert_eq!(
        q.status(rw(WRITE, 1, 0, 1), &mut [1u8; 512]),
        Status::SUCCESS
    );
    assert_eq!(*mem.last_fua.lock().unwrap(), Some(false));
    let mut fua = rw(WRITE, 1, 0, 1);
    fua.cdw12 |= 1 << 30;
    assert_eq!(q.status(fua, &mut [1u8; 512]), Status::SUCCESS);
    assert_eq!(*mem.last_fua.lock().unwrap(), Some(true));
    assert_eq!(a.status(set_wce(0), &mut []), Status::SUCCESS);
    assert_eq!(
        q.status(rw(WRITE, 1, 0, 1), &mut [1u8; 512]),
        Status::SUCCESS
    );
    assert_eq!(
        *mem.last_fua.lock().unwrap(),
        Some(true),
        "cache off: every write durable"
    );
}

#[test]
fn vwc_follows_the_backends_and_a_controller_keeps_its_answer_across_reloads() {
    // NVMe Base 2.0 §5.17.2.1 VWC, §7.1 Flush: without a volatile write cache the host
    // sends neither Flush nor FUA and takes every completed write as durable.
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    b.last().caps.lock().unwrap().volatile_cache = false;
    let (mut a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let vwc = |h: &mut Host| {
        let mut page = vec![0u8; 4096];
        h.run(identify(1, 0, 0), &mut page);
        nvme::wire::identify::IdentifyController::decode(&page)
            .unwrap()
            .vwc
            & 1
    };
    assert_eq!(vwc(&mut a), 0, "no namespace has a cache");
    // Feature 06h exists only for a cache that is present (§5.27.1.4).
    let wce = |opcode: u8, on: u32| Sqe {
        cdw10: fid::VOLATILE_WRITE_CACHE as u32,
        cdw11: on,
        ..sqe(opcode, 0)
    };
    for opcode in [admin_opcode::SET_FEATURES, admin_opcode::GET_FEATURES] {
        assert_eq!(
            a.status(wce(opcode, 1), &mut [0u8; 4096]),
            Status::INVALID_FIELD.with_dnr()
        );
    }

    // A reload adds namespace 2 with a cache. This controller told its host "no cache" and
    // the host does not ask again: its writes there are made durable (FUA) instead.
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces.push(ram_ns(2, 1 << 20, 512));
    t.apply_with_opener(cfg, &b.opener()).unwrap();
    let cached = b.last();
    assert!(cached.caps.lock().unwrap().volatile_cache);
    assert_eq!(vwc(&mut a), 0, "the controller's answer does not change");
    assert_eq!(
        q.status(rw(WRITE, 2, 0, 1), &mut [1u8; 512]),
        Status::SUCCESS
    );
    assert_eq!(*cached.last_fua.lock().unwrap(), Some(true));

    // A controller created now reports the cache, and its plain writes stay plain.
    let (mut a2, cntlid2) = admin(&t, SUBNQN, 0);
    let mut q2 = io_queue(&t, cntlid2, 1);
    assert_eq!(vwc(&mut a2), 1);
    assert_eq!(
        q2.status(rw(WRITE, 2, 0, 1), &mut [1u8; 512]),
        Status::SUCCESS
    );
    assert_eq!(*cached.last_fua.lock().unwrap(), Some(false));
    assert_eq!(
        a2.status(wce(admin_opcode::GET_FEATURES, 0), &mut [0u8; 4096]),
        Status::SUCCESS
    );
}

#[test]
fn real_ram_backend_through_target_new() {
    // The production opener, `storage::open`.
    let t = nvme::target::Target::with_opener(basic_config(), &storage::open).expect("target");
    let (_a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(
        q.status(rw(WRITE, 1, 2040, 8), &mut data.clone()),
        Status::SUCCESS
    );
    let mut back = vec![0u8; 4096];
    assert_eq!(q.status(rw(READ, 1, 2040, 8), &mut back), Status::SUCCESS);
    assert_eq!(back, data);
    // Deallocate the first four of those blocks: they read back as zeroes.
    let mut range = nvme::wire::dsm::encode_ranges(&[(2040, 4)]);
    let dsm = Sqe {
        cdw11: nvm_bits::DSM_AD,
        ..sqe(nvm_opcode::DATASET_MANAGEMENT, 1)
    };
    assert_eq!(q.status(dsm, &mut range), Status::SUCCESS);
    assert_eq!(q.status(rw(READ, 1, 2040, 8), &mut back), Status::SUCCESS);
    assert!(back[..2048].iter().all(|&b| b == 0));
    assert_eq!(back[2048..], data[2048..]);
    assert_eq!(
        q.status(rw(COMPARE, 1, 2044, 4), &mut data[2048..].to_vec()),
        Status::SUCCESS
    );
}

/// Per-namespace counters (control socket): commands counted when started, bytes only for
/// successful transfers, on the inline (RAM-like) and the submitted (file) path alike; each
/// namespace counts only its own I/O.
#[test]
fn namespace_counters_follow_reads_and_writes() {
    let dir = std::env::temp_dir().join(format!("nvmfd-core-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = basic_config();
    let mut file_ns = ram_ns(2, 1 << 20, 512);
    file_ns.backend = nvme::namespace::BackendConfig::File {
        path: dir.join("ns2.img"),
        size: Some(1 << 20),
        direct_io: false,
    };
    cfg.subsystems[0].namespaces.push(file_ns);
    let b = Backends::new();
    let t = target_with(cfg, &b);
    let (_a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let stats = |nsid: u32| {
        t.subsystem(SUBNQN)
            .unwrap()
            .namespaces()
            .get(nsid)
            .unwrap()
            .stats
            .snapshot()
    };

    let mut four = vec![7u8; 2048];
    assert_eq!(q.status(rw(WRITE, 1, 0, 4), &mut four), Status::SUCCESS);
    assert_eq!(
        q.status(rw(READ, 1, 0, 2), &mut four[..1024]),
        Status::SUCCESS
    );
    assert_eq!(
        q.status(rw(READ, 1, 8, 1), &mut four[..512]),
        Status::SUCCESS
    );
    // A failing read is a command but moves no bytes.
    *b.last().fail_with.lock().unwrap() = Some(libc::EIO);
    assert_ne!(
        q.status(rw(READ, 1, 0, 1), &mut four[..512]),
        Status::SUCCESS
    );
    *b.last().fail_with.lock().unwrap() = None;
    let ns1 = stats(1);
    assert_eq!(
        (
            ns1.write_commands,
            ns1.bytes_written,
            ns1.read_commands,
            ns1.bytes_read
        ),
        (1, 2048, 3, 1536)
    );

    let before = q.submitted;
    assert_eq!(
        q.status(rw(WRITE, 2, 10, 3), &mut four[..1536]),
        Status::SUCCESS
    );
    assert_eq!(
        q.status(rw(READ, 2, 10, 3), &mut four[..1536]),
        Status::SUCCESS
    );
    assert_eq!(q.submitted, before + 2, "file I/O completes through finish");
    let ns2 = stats(2);
    assert_eq!(
        (
            ns2.write_commands,
            ns2.bytes_written,
            ns2.read_commands,
            ns2.bytes_read
        ),
        (1, 1536, 1, 1536)
    );
    assert_eq!(
        stats(1),
        ns1,
        "namespace 2's I/O is not counted on namespace 1"
    );
    drop(q);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SMART command and data unit counters live with the namespaces, as in Linux nvmet: a host
/// that reconnects (a new controller, a new cntlid) sees them keep growing instead of
/// restarting at 0. Per namespace with the NSID (LPA bit 0), the sum with FFFFFFFFh or 0h.
#[test]
fn smart_counters_survive_a_reconnect_and_exist_per_namespace() {
    let mut cfg = basic_config();
    cfg.subsystems[0].namespaces.push(ram_ns(2, 1 << 20, 4096));
    let b = Backends::new();
    let t = target_with(cfg, &b);
    let smart = |a: &mut Host, nsid: u32| -> SmartLog {
        let mut page = vec![0u8; 512];
        let mut sqe = get_log(2, 512, 0, false);
        sqe.nsid = nsid;
        assert_eq!(a.status(sqe, &mut page), Status::SUCCESS, "nsid {nsid:#x}");
        SmartLog::decode(&page).unwrap()
    };
    let counts = |s: SmartLog| {
        (
            s.host_read_commands,
            s.host_write_commands,
            s.data_units_read,
            s.data_units_written,
        )
    };
    {
        let (mut a, cntlid) = admin(&t, SUBNQN, 0);
        let mut q = io_queue(&t, cntlid, 1);
        // Namespace 1: two 512-byte writes; namespace 2: one 4 KiB write and read.
        for slba in [0, 1] {
            assert_eq!(
                q.status(rw(WRITE, 1, slba, 1), &mut [7u8; 512]),
                Status::SUCCESS
            );
        }
        assert_eq!(
            q.status(rw(WRITE, 2, 0, 1), &mut [8u8; 4096]),
            Status::SUCCESS
        );
        assert_eq!(
            q.status(rw(READ, 2, 0, 1), &mut [0u8; 4096]),
            Status::SUCCESS
        );
        assert_eq!(counts(smart(&mut a, 1)), (0, 2, 0, 1));
        assert_eq!(counts(smart(&mut a, 2)), (1, 1, 1, 1));
        // 1024 + 4096 bytes written: 10 units of 512 bytes, 1 data unit (rounded up).
        assert_eq!(counts(smart(&mut a, u32::MAX)), (1, 3, 1, 1));
        assert_eq!(counts(smart(&mut a, 0)), (1, 3, 1, 1));
    }
    // The host comes back: a new controller, the same counters; its I/O adds to them.
    let (mut a, cntlid) = admin(&t, SUBNQN, 0);
    assert_eq!(counts(smart(&mut a, u32::MAX)), (1, 3, 1, 1));
    let mut q = io_queue(&t, cntlid, 1);
    assert_eq!(
        q.status(rw(READ, 1, 0, 1), &mut [0u8; 512]),
        Status::SUCCESS
    );
    // 4096 + 512 bytes read: still within the first data unit (1000 × 512 bytes).
    assert_eq!(counts(smart(&mut a, u32::MAX)), (2, 3, 1, 1));
    assert_eq!(counts(smart(&mut a, 1)), (1, 2, 1, 1));
    // An NSID that is not active has no SMART log.
    let mut sqe = get_log(2, 512, 0, false);
    sqe.nsid = 9;
    assert_eq!(
        a.status(sqe, &mut [0u8; 512]),
        Status::INVALID_NAMESPACE.with_dnr()
    );
}

/// Media errors and the read-only critical warning belong to the subsystem's health, not to
/// a controller: a reconnect keeps them, and a reload that reopens the namespace (here: made
/// read-only) keeps its command counters too.
#[test]
fn health_survives_reconnects_and_reopening() {
    let cfg = basic_config();
    let b = Backends::new();
    let t = target_with(cfg.clone(), &b);
    let smart = |a: &mut Host| -> SmartLog {
        let mut page = vec![0u8; 512];
        assert_eq!(
            a.status(get_log(2, 512, 0, false), &mut page),
            Status::SUCCESS
        );
        SmartLog::decode(&page).unwrap()
    };
    {
        let (mut a, cntlid) = admin(&t, SUBNQN, 0);
        let mut q = io_queue(&t, cntlid, 1);
        let mut buf = vec![0u8; 512];
        assert_eq!(q.status(rw(WRITE, 1, 0, 1), &mut buf), Status::SUCCESS);
        *b.last().fail_with.lock().unwrap() = Some(libc::EIO);
        assert_eq!(q.status(rw(WRITE, 1, 1, 1), &mut buf), Status::WRITE_FAULT);
        *b.last().fail_with.lock().unwrap() = Some(libc::EROFS);
        assert_eq!(
            q.status(rw(WRITE, 1, 1, 1), &mut buf),
            Status::NAMESPACE_WRITE_PROTECTED.with_dnr()
        );
        *b.last().fail_with.lock().unwrap() = None;
        let s = smart(&mut a);
        assert_eq!((s.media_errors, s.critical_warning), (1, 1 << 3));
        assert_eq!(s.host_write_commands, 3);
        assert_eq!(s.power_cycles, 1);
    }
    let (mut a, _) = admin(&t, SUBNQN, 0);
    let s = smart(&mut a);
    assert_eq!(
        (s.media_errors, s.critical_warning, s.host_write_commands),
        (1, 1 << 3, 3),
        "a new controller reports the same health"
    );
    let mut reopened = cfg;
    reopened.subsystems[0].namespaces[0].read_only = true;
    let summary = t.apply_with_opener(reopened, &b.opener()).unwrap();
    assert_eq!(summary.namespaces_replaced, vec![(SUBNQN.to_string(), 1)]);
    assert_eq!(smart(&mut a).host_write_commands, 3);
    let mut sqe = get_log(2, 512, 0, false);
    sqe.nsid = 1;
    let mut page = vec![0u8; 512];
    assert_eq!(a.status(sqe, &mut page), Status::SUCCESS);
    assert_eq!(SmartLog::decode(&page).unwrap().host_write_commands, 3);
}
