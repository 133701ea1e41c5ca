//! Discovery controllers and the Discovery log page (70h).

use nvme::spec::{admin_opcode, cc, fid, lid, reg, DISCOVERY_NQN};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use nvme::queue::TransportKind;
use nvme::target::ReferralConfig;
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
    assert_eq!(header.genctr, 1);
    assert_eq!(header.numrec, 3, "private subsystem filtered out");
    let e0 = &entries[0];
    assert_eq!((e0.trtype, e0.adrfam, e0.subtype), (3, 1, 2));
    assert_eq!(e0.subnqn, SUBNQN);
    assert_eq!(
        e0.traddr, "10.0.0.1",
        "wildcard port reports the connected address"
    );
    assert_eq!(
        (e0.trsvcid.as_str(), e0.portid, e0.cntlid, e0.asqsz),
        ("4420", 1, 0xffff, 32)
    );
    assert_eq!(e0.tsas[0], 0, "TCP sectype none");
    let e1 = &entries[1];
    assert_eq!(
        (e1.trtype, e1.traddr.as_str(), e1.portid),
        (1, "192.168.7.1", 2)
    );
    assert_eq!(
        &e1.tsas[..3],
        &[1, 1, 1],
        "RDMA: RC QP, no provider, RDMA_CM"
    );
    let e2 = &entries[2];
    assert_eq!(
        (e2.subtype, e2.subnqn.as_str(), e2.traddr.as_str()),
        (1, DISCOVERY_NQN, "192.0.2.10")
    );
    assert_eq!(e2.trsvcid, "8009");

    // Partial read: 8 bytes of the header; a read straddling header and first entry.
    let mut g = [0u8; 8];
    assert_eq!(
        h.status(get_log(lid::DISCOVERY, 8, 0, false), &mut g),
        Status::SUCCESS
    );
    assert_eq!(u64::from_le_bytes(g), 1);
    let mut straddle = vec![0u8; 1024];
    assert_eq!(
        h.status(get_log(lid::DISCOVERY, 1024, 512, false), &mut straddle),
        Status::SUCCESS
    );
    assert_eq!(straddle[512], 3, "first entry's TRTYPE at page offset 1024");
    // Offset past the page.
    assert_eq!(
        h.status(
            get_log(lid::DISCOVERY, 1024, 4 * 1024, false),
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
    // An unchanged configuration changes nothing.
    let s = t.apply_with_opener(cfg.clone(), &b.opener()).unwrap();
    assert_eq!(s.discovery_genctr, 1);
    assert!(h.poll(now).completions.is_empty());
    let mut cfg2 = cfg.clone();
    cfg2.subsystems
        .push(subsystem("nqn.x:new", vec![ram_ns(1, 1 << 20, 512)]));
    let s = t.apply_with_opener(cfg2, &b.opener()).unwrap();
    assert_eq!(s.subsystems_added, vec!["nqn.x:new".to_string()]);
    assert_eq!(s.discovery_genctr, 2);
    let p = h.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(
        p.completions[0].cqe.dw0, 0x70_f0_02,
        "notice, discovery change, log 70h"
    );
    let (header, entries) = read_log(&mut h);
    assert_eq!((header.genctr, entries.len()), (2, 2));
}

#[test]
fn host_allow_list_applies_to_discovery_entries() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.subsystems[0].allow_any_host = false;
    cfg.subsystems[0].allowed_hosts = vec![HOSTNQN.into()];
    let t = target_with(cfg, &b);
    let (mut allowed, _) = admin(&t, DISCOVERY_NQN, 0);
    assert_eq!(read_log(&mut allowed).0.numrec, 1);
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
    assert_eq!(read_log(&mut other).0.numrec, 0);
}
