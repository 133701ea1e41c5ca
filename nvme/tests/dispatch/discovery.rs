//! Discovery controllers and the Discovery log page (70h).

use nvme::spec::{admin_opcode, cc, fid, lid, reg, DISCOVERY_NQN};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use nvme::queue::{TerminateReason, TransportKind};
use nvme::target::{ReferralConfig, SecureChannel};
use nvme::wire::identify::IdentifyController;
use nvme::wire::log::{DiscoveryLogEntry, DiscoveryLogHeader};
use nvme::wire::Status;

use crate::harness::*;

fn read_log(h: &mut Host) -> (DiscoveryLogHeader, Vec<DiscoveryLogEntry>) {
    // The way hosts do it: header first, then the entries at offset 1024.
    let mut hdr = vec![0u8; 1024];
    assert_eq!(
        h.status(get_log(lid::DISCOVERY, 1024, 0, false), &mut hdr),
        Status::SUCCESS
    );
    let header = DiscoveryLogHeader::decode(&hdr).unwrap();
    let n = header.numrec as usize;
    if n == 0 {
        return (header, vec![]);
    }
    let mut body = vec![0u8; n * 1024];
    let r = h.run(
        get_log(lid::DISCOVERY, (n * 1024) as u32, 1024, false),
        &mut body,
    );
    assert_eq!(
        (r.cqe.status, r.data_len as usize),
        (Status::SUCCESS, n * 1024)
    );
    let entries = body
        .chunks(1024)
        .map(|c| DiscoveryLogEntry::decode(c).unwrap())
        .collect();
    (header, entries)
}

#[test]
fn discovery_log_lists_allowed_subsystems_per_port_and_referrals() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.ports = vec![
        port(1, TransportKind::Tcp, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        port(2, TransportKind::Rdma, "192.168.7.1".parse().unwrap()),
    ];
    cfg.subsystems
        .push(subsystem("nqn.x:private", vec![ram_ns(1, 1 << 20, 512)]));
    cfg.subsystems[1].allow_any_host = false;
    cfg.subsystems[1].allowed_hosts = vec!["nqn.x:someone-else".into()];
    cfg.referrals = vec![ReferralConfig {
        transport: TransportKind::Tcp,
        address: "192.0.2.10".parse().unwrap(),
        service: 8009,
    }];
    let t = target_with(cfg, &b);
    let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
    // The Linux discovery Connect: KATO 0, SQ flow control disabled.
    let r = h.connect(
        0,
        31,
        1 << 2,
        0,
        &connect_data(DISCOVERY_NQN, HOSTNQN, 0xffff),
    );
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(r.cqe.sqhd, 0xffff);
    assert_eq!(h.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    let mut page = vec![0u8; 4096];
    assert_eq!(h.status(identify(1, 0, 0), &mut page), Status::SUCCESS);
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(id.subnqn, DISCOVERY_NQN);
    assert_eq!(id.cntrltype, 2);
    assert_ne!(id.oaes & 1 << 31, 0, "discovery log change notices");
    // KATO 0 on a discovery controller gets the configured default.
    let kato = h.run(
        nvme::wire::Sqe {
            cdw10: fid::KEEP_ALIVE_TIMER as u32,
            ..sqe(admin_opcode::GET_FEATURES, 0)
        },
        &mut [],
    );
    assert_eq!(kato.cqe.dw0, 120_000);

    let (header, entries) = read_log(&mut h);
    assert_eq!(header.genctr, t.discovery_genctr());
    assert_eq!(
        header.numrec, 5,
        "two current discovery entries, two NVM entries (private filtered out), one referral"
    );
    // TP 8013: the current discovery subsystem on each port, first, under its own NQN.
    for (e, (trtype, traddr, portid)) in entries[..2]
        .iter()
        .zip([(3, "10.0.0.1", 1), (1, "192.168.7.1", 2)])
    {
        assert_eq!(
            (e.trtype, e.subtype, e.subnqn.as_str(), e.traddr.as_str()),
            (trtype, 3, DISCOVERY_NQN, traddr)
        );
        assert_eq!((e.portid, e.cntlid, e.eflags), (portid, 0xffff, 0b11));
    }
    let e0 = &entries[2];
    assert_eq!((e0.trtype, e0.adrfam, e0.subtype), (3, 1, 2));
    assert_eq!(e0.subnqn, SUBNQN);
    assert_eq!(
        e0.traddr, "10.0.0.1",
        "wildcard port reports the connected address"
    );
    assert_eq!(
        (
            e0.trsvcid.as_str(),
            e0.portid,
            e0.cntlid,
            e0.asqsz,
            e0.eflags
        ),
        ("4420", 1, 0xffff, 32, 0)
    );
    assert_eq!(e0.tsas[0], 0, "TCP sectype none");
    let e1 = &entries[3];
    assert_eq!(
        (e1.trtype, e1.traddr.as_str(), e1.portid),
        (1, "192.168.7.1", 2)
    );
    assert_eq!(
        &e1.tsas[..3],
        &[1, 1, 1],
        "RDMA: RC QP, no provider, RDMA_CM"
    );
    let e2 = &entries[4];
    assert_eq!(
        (e2.subtype, e2.subnqn.as_str(), e2.traddr.as_str()),
        (1, DISCOVERY_NQN, "192.0.2.10")
    );
    assert_eq!((e2.trsvcid.as_str(), e2.eflags), ("8009", 0));

    // Partial read: 8 bytes of the header; a read straddling header and first entry.
    let mut g = [0u8; 8];
    assert_eq!(
        h.status(get_log(lid::DISCOVERY, 8, 0, false), &mut g),
        Status::SUCCESS
    );
    assert_eq!(u64::from_le_bytes(g), t.discovery_genctr());
    let mut straddle = vec![0u8; 1024];
    assert_eq!(
        h.status(get_log(lid::DISCOVERY, 1024, 512, false), &mut straddle),
        Status::SUCCESS
    );
    assert_eq!(straddle[512], 3, "first entry's TRTYPE at page offset 1024");
    // Offset past the page.
    assert_eq!(
        h.status(
            get_log(lid::DISCOVERY, 1024, 6 * 1024, false),
            &mut straddle
        ),
        Status::INVALID_FIELD.with_dnr()
    );
    // Other log pages and I/O-only commands do not exist here.
    assert_eq!(
        h.status(get_log(2, 512, 0, false), &mut page[..512]),
        Status::INVALID_LOG_PAGE.with_dnr()
    );
    assert_eq!(
        h.q.prepare(&sqe(admin_opcode::ABORT, 0), 0),
        Err(Status::INVALID_OPCODE.with_dnr())
    );
    assert_eq!(
        h.status(identify(0, 1, 0), &mut page),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        h.status(sqe(admin_opcode::KEEP_ALIVE, 0), &mut []),
        Status::SUCCESS,
        "keep alive"
    );
}

/// TLS ports report TREQ secure channel "required" (01b) or "not required" (10b) and TSAS
/// SECTYPE TLS 1.3 (02h), as nvmet's entries do (FINDINGS R-tls-2: nvme-cli prints "required,
/// sq flow control disable supported" and "tls13"); plain ports "not specified" and none.
#[test]
fn tls_ports_report_treq_and_sectype() {
    let b = Backends::new();
    let mut cfg = basic_config();
    let mut required = port(1, TransportKind::Tcp, "127.0.0.1".parse().unwrap());
    required.secure_channel = SecureChannel::TlsRequired;
    let mut optional = port(2, TransportKind::Tcp, "127.0.0.2".parse().unwrap());
    optional.secure_channel = SecureChannel::TlsOptional;
    let plain = port(3, TransportKind::Tcp, "127.0.0.3".parse().unwrap());
    cfg.ports = vec![required, optional, plain];
    let t = target_with(cfg, &b);
    let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = h.connect(
        0,
        31,
        1 << 2,
        0,
        &connect_data(DISCOVERY_NQN, HOSTNQN, 0xffff),
    );
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(h.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    let (_, entries) = read_log(&mut h);
    let seen: Vec<(u8, u16, u8, u8)> = entries
        .iter()
        .map(|e| (e.subtype, e.portid, e.treq, e.tsas[0]))
        .collect();
    assert_eq!(
        seen,
        [
            (3, 1, 0b101, 2),
            (3, 2, 0b110, 2),
            (3, 3, 0b100, 0),
            (2, 1, 0b101, 2),
            (2, 2, 0b110, 2),
            (2, 3, 0b100, 0)
        ]
    );
}

#[test]
fn reload_bumps_genctr_and_raises_discovery_change_event() {
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let (mut h, _) = admin(&t, DISCOVERY_NQN, 0);
    let now = Instant::now();
    assert!(
        h.try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
            .is_none(),
        "AER held"
    );
    assert!(h.poll(now).completions.is_empty());
    let start = t.discovery_genctr();
    // An unchanged configuration changes nothing.
    let s = t.apply_with_opener(cfg.clone(), &b.opener()).unwrap();
    assert_eq!(s.discovery_genctr, start);
    assert!(h.poll(now).completions.is_empty());
    let mut cfg2 = cfg.clone();
    cfg2.subsystems
        .push(subsystem("nqn.x:new", vec![ram_ns(1, 1 << 20, 512)]));
    let s = t.apply_with_opener(cfg2, &b.opener()).unwrap();
    assert_eq!(s.subsystems_added, vec!["nqn.x:new".to_string()]);
    assert_eq!(s.discovery_genctr, start + 1);
    let p = h.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(
        p.completions[0].cqe.dw0, 0x70_f0_02,
        "notice, discovery change, log 70h"
    );
    let (header, entries) = read_log(&mut h);
    assert_eq!((header.genctr, entries.len()), (start + 1, 3));
}

#[test]
fn host_allow_list_applies_to_discovery_entries() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.subsystems[0].allow_any_host = false;
    cfg.subsystems[0].allowed_hosts = vec![HOSTNQN.into()];
    let t = target_with(cfg, &b);
    let (mut allowed, _) = admin(&t, DISCOVERY_NQN, 0);
    assert_eq!(read_log(&mut allowed).0.numrec, 2);
    let mut other = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = other.connect(
        0,
        31,
        0,
        0,
        &connect_data(DISCOVERY_NQN, "nqn.x:other", 0xffff),
    );
    assert_eq!(r.cqe.status, Status::SUCCESS, "anyone may discover");
    other.property_set(reg::CC, cc::ENABLE);
    let (_, entries) = read_log(&mut other);
    assert_eq!(
        entries.iter().map(|e| e.subtype).collect::<Vec<_>>(),
        [3],
        "only the discovery subsystem itself"
    );
}

/// TP 8013 unique discovery NQN: Identify and the current discovery entries report it, Connect
/// takes it and the well-known NQN, referrals keep the well-known one, no NVM subsystem may
/// take it, and a reload cannot change it.
#[test]
fn unique_discovery_nqn() {
    const UNIQUE: &str = "nqn.2026-12.dev.nvmfd:discovery-a";
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.discovery_nqn = Some(UNIQUE.into());
    cfg.referrals = vec![ReferralConfig {
        transport: TransportKind::Tcp,
        address: "192.0.2.10".parse().unwrap(),
        service: 8009,
    }];
    let t = target_with(cfg.clone(), &b);
    for nqn in [UNIQUE, DISCOVERY_NQN] {
        let (mut h, _) = admin(&t, nqn, 0);
        let mut page = vec![0u8; 4096];
        assert_eq!(h.status(identify(1, 0, 0), &mut page), Status::SUCCESS);
        let id = IdentifyController::decode(&page).unwrap();
        assert_eq!((id.subnqn.as_str(), id.cntrltype), (UNIQUE, 2), "via {nqn}");
        let (_, entries) = read_log(&mut h);
        let seen: Vec<(u8, &str)> = entries
            .iter()
            .map(|e| (e.subtype, e.subnqn.as_str()))
            .collect();
        assert_eq!(seen, [(3, UNIQUE), (2, SUBNQN), (1, DISCOVERY_NQN)]);
    }
    // The unique NQN is not an NVM subsystem's, at start or on reload.
    let mut clash = cfg.clone();
    clash.subsystems.push(subsystem(UNIQUE, vec![]));
    assert!(matches!(
        nvme::target::Target::with_opener(clash.clone(), &b.opener()),
        Err(nvme::target::TargetError::ReservedNqn(_))
    ));
    assert!(matches!(
        t.apply_with_opener(clash, &b.opener()),
        Err(nvme::target::TargetError::ReservedNqn(_))
    ));
    let mut renamed = cfg.clone();
    renamed.discovery_nqn = None;
    assert!(matches!(
        t.apply_with_opener(renamed, &b.opener()),
        Err(nvme::target::TargetError::DiscoveryNqnChanged)
    ));
    let mut bad = cfg;
    bad.discovery_nqn = Some(String::new());
    assert!(matches!(
        nvme::target::Target::with_opener(bad, &b.opener()),
        Err(nvme::target::TargetError::InvalidDiscoveryNqn { .. })
    ));
}

/// GENCTR never goes back: with a state directory it continues above the stored value after a
/// restart and is stored on every change; without one it starts at the clock (µs), above
/// anything a run that started earlier could have reached by reloads.
#[test]
fn genctr_survives_restarts() {
    let dir = std::env::temp_dir().join(format!("nvmfd-disc-genctr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.state_dir = Some(dir.clone());
    let t = target_with(cfg.clone(), &b);
    assert_eq!(t.discovery_genctr(), 1, "first start");
    let mut more = cfg.clone();
    more.subsystems
        .push(subsystem("nqn.x:new", vec![ram_ns(1, 1 << 20, 512)]));
    assert_eq!(
        t.apply_with_opener(more.clone(), &b.opener())
            .unwrap()
            .discovery_genctr,
        2
    );
    let file = nvme::genctr::file(&dir);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "2\n");
    // Unchanged: nothing bumped, nothing written.
    t.apply_with_opener(more.clone(), &b.opener()).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "2\n");
    drop(t);
    let restarted = target_with(more, &b);
    assert_eq!(restarted.discovery_genctr(), 3);
    drop(restarted);
    std::fs::remove_dir_all(&dir).unwrap();

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let clocked = target_with(basic_config(), &b);
    assert!(clocked.discovery_genctr() >= before);
}

/// A persistent discovery controller (`nvme discover --persistent`, TP 8013): KATO is kept and
/// honoured — Keep Alive commands keep it past KATO, silence ends it.
#[test]
fn persistent_discovery_controller_keeps_alive() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut h, _) = admin(&t, DISCOVERY_NQN, 5000);
    let kato = h.run(
        nvme::wire::Sqe {
            cdw10: fid::KEEP_ALIVE_TIMER as u32,
            ..sqe(admin_opcode::GET_FEATURES, 0)
        },
        &mut [],
    );
    assert_eq!(kato.cqe.dw0, 5000);
    let t0 = Instant::now();
    h.poll(t0);
    for i in 1..=6u64 {
        assert_eq!(
            h.status(sqe(admin_opcode::KEEP_ALIVE, 0), &mut []),
            Status::SUCCESS
        );
        assert_eq!(h.poll(t0 + Duration::from_secs(4 * i)).terminate, None);
    }
    // 24 s alive with KATO 5 s; then no command for longer than KATO.
    assert_eq!(
        h.poll(t0 + Duration::from_millis(29_001)).terminate,
        Some(TerminateReason::KeepAliveTimeout)
    );
}

/// The Discovery Log Page Change notice goes to the discovery controllers whose host sees
/// other entries: a subsystem only host A may use concerns A alone; a new port concerns both.
#[test]
fn change_notice_only_where_the_hosts_page_changed() {
    const HOST_B: &str = "nqn.x:host-b";
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let (mut a, _) = admin(&t, DISCOVERY_NQN, 0);
    let mut other = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = other.connect(0, 31, 0, 0, &connect_data(DISCOVERY_NQN, HOST_B, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(other.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    let now = Instant::now();
    for h in [&mut a, &mut other] {
        assert!(h
            .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
            .is_none());
    }
    let mut only_a = cfg.clone();
    only_a
        .subsystems
        .push(subsystem("nqn.x:only-a", vec![ram_ns(1, 1 << 20, 512)]));
    only_a.subsystems[1].allow_any_host = false;
    only_a.subsystems[1].allowed_hosts = vec![HOSTNQN.into()];
    t.apply_with_opener(only_a.clone(), &b.opener()).unwrap();
    assert_eq!(
        a.poll(now).completions.len(),
        1,
        "host A sees a new subsystem"
    );
    assert!(
        other.poll(now).completions.is_empty(),
        "host B's page is unchanged"
    );
    assert_eq!(
        read_log(&mut other).1.len(),
        2,
        "B: own entry and the open subsystem"
    );
    // A new port changes both pages (B's AER is still held; A reads the page, which unmasks
    // the notice, and asks again).
    assert_eq!(read_log(&mut a).1.len(), 3);
    assert!(a
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    let mut two_ports = only_a;
    two_ports
        .ports
        .push(port(2, TransportKind::Tcp, "127.0.0.2".parse().unwrap()));
    t.apply_with_opener(two_ports, &b.opener()).unwrap();
    assert_eq!(a.poll(now).completions.len(), 1);
    let p = other.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(p.completions[0].cqe.dw0, 0x70_f0_02);
}
