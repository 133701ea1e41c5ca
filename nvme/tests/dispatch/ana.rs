//! Asymmetric Namespace Access through the queue contract: Identify fields, the ANA log page
//! per port (RGO, offsets), path status on I/O, ANA change events on reload, controller ID
//! ranges.

use nvme::spec::nvm_opcode::{FLUSH, READ, WRITE};
use nvme::spec::{admin_opcode, cc, lid, reg, DISCOVERY_NQN};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use nvme::queue::TransportKind;
use nvme::target::{AnaGroupConfig, AnaState, MultipathConfig, Target, TargetConfig};
use nvme::wire::identify::{IdentifyController, IdentifyNamespace};
use nvme::wire::log::AnaLog;
use nvme::wire::{Sqe, Status};

use crate::harness::*;

/// Two ports; namespaces 1 (group 1) and 2, 3 (group 2); group 2 is `g2_on_port2` on port 2
/// and optimized on port 1.
fn config(g2_on_port2: AnaState) -> TargetConfig {
    let mut cfg = basic_config();
    cfg.ports
        .push(port(2, TransportKind::Tcp, IpAddr::V4(Ipv4Addr::LOCALHOST)));
    cfg.ports[1].service = 4421;
    let mut ns2 = ram_ns(2, 1 << 20, 512);
    ns2.ana_group = 2;
    let mut ns3 = ram_ns(3, 1 << 20, 512);
    ns3.ana_group = 2;
    cfg.subsystems[0].namespaces.extend([ns2, ns3]);
    cfg.multipath.ana_groups = vec![AnaGroupConfig {
        id: 2,
        state: AnaState::Optimized,
        port_states: BTreeMap::from([(2, g2_on_port2)]),
    }];
    cfg
}

/// Admin queue (enabled) on `port_id`, and its cntlid.
fn admin_on(t: &std::sync::Arc<Target>, port_id: u16) -> (Host, u16) {
    let mut h = Host::new(t, peer(TransportKind::Tcp, port_id));
    let r = h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS, "admin connect");
    assert_eq!(h.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    (h, r.cqe.dw0 as u16)
}

fn io_on(t: &std::sync::Arc<Target>, port_id: u16, cntlid: u16) -> Host {
    let mut h = Host::new(t, peer(TransportKind::Tcp, port_id));
    let r = h.connect(1, 127, 0, 0, &connect_data(SUBNQN, HOSTNQN, cntlid));
    assert_eq!(r.cqe.status, Status::SUCCESS, "I/O connect");
    h
}

/// Get Log Page 0Ch with LSP (RGO in bit 0) and RAE.
fn ana_log_sqe(len: u32, offset: u64, rgo: bool, rae: bool) -> Sqe {
    let mut s = get_log(lid::ANA, len, offset, rae);
    s.cdw10 |= (rgo as u32) << 8;
    s
}

fn read_ana_log(h: &mut Host, rgo: bool, rae: bool) -> AnaLog {
    let mut page = vec![0u8; 8192];
    let r = h.run(ana_log_sqe(8192, 0, rgo, rae), &mut page);
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(r.data_len, 8192);
    AnaLog::decode(&page).unwrap()
}

fn states(log: &AnaLog) -> Vec<(u32, u8, Vec<u32>)> {
    log.groups
        .iter()
        .map(|g| (g.grpid, g.state, g.nsids.clone()))
        .collect()
}

#[test]
fn identify_reports_ana_the_way_the_linux_host_needs() {
    let b = Backends::new();
    let t = target_with(config(AnaState::NonOptimized), &b);
    let (mut h, _) = admin_on(&t, 1);
    let mut page = vec![0u8; 4096];
    assert_eq!(h.status(identify(1, 0, 0), &mut page), Status::SUCCESS);
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(
        id.cmic, 0b1011,
        "multi-port, multi-controller, ANA reporting"
    );
    assert_ne!(id.oaes & 1 << 11, 0, "ANA change notices");
    assert_eq!(id.anacap & 0x1f, 0x1f, "all five states reported");
    assert_eq!(id.anacap & 1 << 6, 0, "ANAGRPID may change on reload");
    assert!(id.anatt > 0);
    assert_eq!(id.anagrpmax, 128);
    assert_eq!(id.nanagrpid, 128);
    // nvme_mpath_init_identify: MNAN must be within 1..=NN, and the log buffer it sizes from
    // NANAGRPID and MNAN must fit MDTS or the host turns ANA off.
    assert!(id.mnan >= 1 && id.mnan <= id.nn);
    let ana_log_size = 16 + id.nanagrpid as usize * 32 + id.mnan as usize * 4;
    assert!(ana_log_size <= 4096 << id.mdts, "{ana_log_size}");
    for (nsid, group) in [(1, 1), (2, 2), (3, 2)] {
        assert_eq!(h.status(identify(0, nsid, 0), &mut page), Status::SUCCESS);
        let ns = IdentifyNamespace::decode(&page).unwrap();
        assert_eq!(ns.anagrpid, group, "nsid {nsid}");
        assert_eq!(ns.nmic & 1, 1, "shared");
    }
    // Discovery controllers report no ANA.
    let mut d = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = d.connect(0, 31, 0, 0, &connect_data(DISCOVERY_NQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(d.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    d.status(identify(1, 0, 0), &mut page);
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(
        (id.cmic & 1 << 3, id.anagrpmax, id.oaes & 1 << 11),
        (0, 0, 0)
    );
}

#[test]
fn ana_log_page_per_port_with_rgo_and_offsets() {
    let b = Backends::new();
    let t = target_with(config(AnaState::Inaccessible), &b);
    let (mut p1, _) = admin_on(&t, 1);
    let (mut p2, _) = admin_on(&t, 2);
    let log1 = read_ana_log(&mut p1, false, true);
    assert_eq!(
        states(&log1),
        vec![(1, 0x01, vec![1]), (2, 0x01, vec![2, 3])]
    );
    let log2 = read_ana_log(&mut p2, false, true);
    assert_eq!(
        states(&log2),
        vec![(1, 0x01, vec![1]), (2, 0x03, vec![2, 3])]
    );
    assert_eq!(log1.chgcnt, log2.chgcnt);
    assert!(log1.chgcnt > 0);
    // Return Groups Only: the same descriptors without NSID lists.
    let rgo = read_ana_log(&mut p2, true, true);
    assert_eq!(states(&rgo), vec![(1, 0x01, vec![]), (2, 0x03, vec![])]);
    // Header first, then the rest at an offset (how nvme-cli and hosts page through logs):
    // the pieces are the whole page.
    let mut whole = vec![0u8; 8192];
    p2.run(ana_log_sqe(8192, 0, false, true), &mut whole);
    let mut head = vec![0u8; 16];
    assert_eq!(
        p2.status(ana_log_sqe(16, 0, false, true), &mut head),
        Status::SUCCESS
    );
    assert_eq!(&head[..], &whole[..16]);
    let mut rest = vec![0u8; 64];
    assert_eq!(
        p2.status(ana_log_sqe(64, 16, false, true), &mut rest),
        Status::SUCCESS
    );
    assert_eq!(&rest[..], &whole[16..80]);
    // nvme-cli reads the page in 4 KiB pieces up to the size it computes from Identify
    // (16 + NANAGRPID * 32 + MNAN * 4): past the descriptors, that is zeroes, not an error.
    let mut tail = vec![0xffu8; 4096];
    assert_eq!(
        p2.status(ana_log_sqe(4096, 4096, false, true), &mut tail),
        Status::SUCCESS
    );
    assert!(tail.iter().all(|&b| b == 0));
    let mut last = vec![0xffu8; 16];
    assert_eq!(
        p2.status(
            ana_log_sqe(16, 16 + 128 * 32 + 1024 * 4 - 16, false, true),
            &mut last
        ),
        Status::SUCCESS
    );
    // An offset beyond that size is an invalid field.
    let mut buf = vec![0u8; 4];
    assert_eq!(
        p2.status(ana_log_sqe(4, 1 << 20, false, true), &mut buf),
        Status::INVALID_FIELD.with_dnr()
    );
}

#[test]
fn io_to_an_unusable_group_gets_path_status_without_dnr() {
    for (state, expected) in [
        (AnaState::Inaccessible, Status::ANA_INACCESSIBLE),
        (AnaState::PersistentLoss, Status::ANA_PERSISTENT_LOSS),
        (AnaState::Change, Status::ANA_TRANSITION),
    ] {
        let b = Backends::new();
        let t = target_with(config(state), &b);
        let (_a2, c2) = admin_on(&t, 2);
        let mut q2 = io_on(&t, 2, c2);
        let mut buf = vec![0u8; 512];
        for s in [rw(READ, 2, 0, 1), rw(WRITE, 3, 0, 1)] {
            let st = q2.status(s, &mut buf);
            assert_eq!(st, expected, "{state:?}");
            assert!(!st.dnr, "the host must be free to retry elsewhere");
        }
        assert_eq!(q2.status(sqe(FLUSH, 2), &mut []), expected);
        // Group 1 is optimized on port 2; group 2 is optimized on port 1.
        assert_eq!(q2.status(rw(READ, 1, 0, 1), &mut buf), Status::SUCCESS);
        let (_a1, c1) = admin_on(&t, 1);
        let mut q1 = io_on(&t, 1, c1);
        assert_eq!(q1.status(rw(WRITE, 2, 0, 1), &mut buf), Status::SUCCESS);
    }
    // Non-optimized paths serve I/O.
    let b = Backends::new();
    let t = target_with(config(AnaState::NonOptimized), &b);
    let (_a2, c2) = admin_on(&t, 2);
    let mut q2 = io_on(&t, 2, c2);
    assert_eq!(
        q2.status(rw(WRITE, 2, 0, 1), &mut [7u8; 512]),
        Status::SUCCESS
    );
}

#[test]
fn reload_changes_state_raises_ana_event_and_io_follows() {
    let b = Backends::new();
    let t = target_with(config(AnaState::Optimized), &b);
    let (mut a1, c1) = admin_on(&t, 1);
    let (mut a2, c2) = admin_on(&t, 2);
    let mut q2 = io_on(&t, 2, c2);
    let now = Instant::now();
    assert!(
        a1.try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
            .is_none(),
        "AER held"
    );
    assert!(
        a2.try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
            .is_none(),
        "AER held"
    );
    let before = read_ana_log(&mut a2, false, false).chgcnt;
    let mut buf = vec![0u8; 512];
    assert_eq!(q2.status(rw(READ, 2, 0, 1), &mut buf), Status::SUCCESS);

    // Group 2 becomes inaccessible on port 2.
    let summary = t
        .apply_with_opener(config(AnaState::Inaccessible), &b.opener())
        .unwrap();
    assert!(summary.ana_chgcnt > before);
    let p = a2.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(p.completions[0].cqe.status, Status::SUCCESS);
    assert_eq!(
        p.completions[0].cqe.dw0, 0x000c_0302,
        "notice, ANA change, log 0Ch"
    );
    assert!(
        a1.poll(now).completions.is_empty(),
        "nothing changed on port 1"
    );
    // The I/O queue sees the new state at its next command.
    assert_eq!(
        q2.status(rw(READ, 2, 0, 1), &mut buf),
        Status::ANA_INACCESSIBLE
    );
    let log = read_ana_log(&mut a2, false, false);
    assert_eq!(log.chgcnt, summary.ana_chgcnt);
    assert_eq!(log.groups[1].state, 0x03);
    assert_eq!(log.groups[1].chgcnt, summary.ana_chgcnt);
    assert!(
        log.groups[0].chgcnt < summary.ana_chgcnt,
        "group 1 unchanged"
    );

    // The log was read without RAE: the next change raises the next event.
    assert!(a2
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    t.apply_with_opener(config(AnaState::Change), &b.opener())
        .unwrap();
    assert_eq!(a2.poll(now).completions.len(), 1);
    // Read with RAE: still masked, so a further change waits for an unmasking read.
    assert_eq!(read_ana_log(&mut a2, false, true).groups[1].state, 0x0f);
    assert!(a2
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    t.apply_with_opener(config(AnaState::Optimized), &b.opener())
        .unwrap();
    assert!(a2.poll(now).completions.is_empty(), "masked until read");
    assert_eq!(read_ana_log(&mut a2, false, false).groups[1].state, 0x01);
    assert_eq!(q2.status(rw(READ, 2, 0, 1), &mut buf), Status::SUCCESS);
    // Applying the same configuration again changes nothing and raises nothing.
    let again = t
        .apply_with_opener(config(AnaState::Optimized), &b.opener())
        .unwrap();
    assert_eq!(again.ana_chgcnt, read_ana_log(&mut a2, false, false).chgcnt);
    assert!(a2.poll(now).completions.is_empty());
    let _ = c1;
}

#[test]
fn moving_a_namespace_between_groups_keeps_its_data() {
    let b = Backends::new();
    let cfg = config(AnaState::Inaccessible);
    let t = target_with(cfg.clone(), &b);
    let (mut a1, c1) = admin_on(&t, 1);
    let mut q1 = io_on(&t, 1, c1);
    let data = [0x5au8; 512];
    assert_eq!(
        q1.status(rw(WRITE, 1, 4, 1), &mut data.clone()),
        Status::SUCCESS
    );
    let (mut a2, c2) = admin_on(&t, 2);
    let mut q2 = io_on(&t, 2, c2);
    let before = read_ana_log(&mut a2, false, false).chgcnt;
    // Namespace 1 joins group 2, which is inaccessible on port 2.
    let mut moved = cfg.clone();
    moved.subsystems[0].namespaces[0].ana_group = 2;
    let s = t.apply_with_opener(moved, &b.opener()).unwrap();
    assert_eq!(s.namespaces_replaced, vec![(SUBNQN.to_string(), 1)]);
    assert!(s.ana_chgcnt > before);
    let log = read_ana_log(&mut a2, false, false);
    assert_eq!(states(&log), vec![(1, 1, vec![]), (2, 3, vec![1, 2, 3])]);
    assert_eq!(log.groups[0].chgcnt, s.ana_chgcnt, "group 1 lost a member");
    let mut buf = [0u8; 512];
    assert_eq!(
        q2.status(rw(READ, 1, 4, 1), &mut buf),
        Status::ANA_INACCESSIBLE
    );
    // Same backend: the data written before the move is still there.
    assert_eq!(q1.status(rw(READ, 1, 4, 1), &mut buf), Status::SUCCESS);
    assert_eq!(buf, data);
    let mut page = vec![0u8; 4096];
    a1.status(identify(0, 1, 0), &mut page);
    assert_eq!(IdentifyNamespace::decode(&page).unwrap().anagrpid, 2);
}

#[test]
fn invalid_multipath_settings_are_refused() {
    let b = Backends::new();
    let mut bad = config(AnaState::Optimized);
    bad.subsystems[0].namespaces[0].ana_group = 7;
    assert!(matches!(
        Target::with_opener(bad, &b.opener()),
        Err(nvme::target::TargetError::UnknownAnaGroup {
            nsid: 1,
            group: 7,
            ..
        })
    ));
    let mut bad = config(AnaState::Optimized);
    bad.multipath.ana_groups[0]
        .port_states
        .insert(9, AnaState::Change);
    assert!(Target::with_opener(bad, &b.opener()).is_err());
    let mut bad = config(AnaState::Optimized);
    bad.multipath.cntlid_min = 200;
    bad.multipath.cntlid_max = 100;
    assert!(Target::with_opener(bad, &b.opener()).is_err());
    // A failed reload changes nothing.
    let t = target_with(config(AnaState::Optimized), &b);
    let (mut a2, _) = admin_on(&t, 2);
    let mut bad = config(AnaState::Inaccessible);
    bad.subsystems[0].namespaces[0].ana_group = 0;
    assert!(t.apply_with_opener(bad, &b.opener()).is_err());
    assert_eq!(read_ana_log(&mut a2, false, false).groups[1].state, 0x01);
}

#[test]
fn controller_ids_come_from_the_configured_range() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.multipath = MultipathConfig {
        cntlid_min: 101,
        cntlid_max: 103,
        ..MultipathConfig::default()
    };
    let t = target_with(cfg.clone(), &b);
    let mut held = Vec::new();
    for expected in 101..=103 {
        let (h, cntlid) = admin(&t, SUBNQN, 0);
        assert_eq!(cntlid, expected);
        held.push(h);
    }
    // All three in use: the fourth Connect is refused as busy.
    let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::CONNECT_CONTROLLER_BUSY.with_dnr());
    // A freed ID is handed out again (after wrapping around the range).
    held.remove(1);
    let (_h, cntlid) = admin(&t, SUBNQN, 0);
    assert_eq!(cntlid, 102);
    // A reload moves the range for new controllers; live ones keep their IDs.
    cfg.multipath.cntlid_min = 1;
    cfg.multipath.cntlid_max = 100;
    t.apply_with_opener(cfg, &b.opener()).unwrap();
    let (_n, cntlid) = admin(&t, SUBNQN, 0);
    assert_eq!(cntlid, 1);
    let mut page = vec![0u8; 4096];
    held[0].status(identify(1, 0, 0), &mut page);
    assert_eq!(IdentifyController::decode(&page).unwrap().cntlid, 101);
}
