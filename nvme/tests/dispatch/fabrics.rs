//! Connect validation (NVMe-oF 1.1 §3.3.1) and Property Get/Set.

use nvme::spec::{cc, fctype, reg, DISCOVERY_NQN};
use std::time::Instant;

use nvme::queue::{Direction, TransportKind};
use nvme::wire::fabrics::PropertySize;
use nvme::wire::Status;

use crate::harness::*;

#[test]
fn admin_connect_allocates_unique_cntlids_and_sets_queue_parameters() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let mut h1 = Host::new(&t, peer(TransportKind::Tcp, 1));
    assert_eq!(h1.q.qid(), None);
    assert_eq!(h1.q.sq_entries(), 0);
    let r1 = h1.connect(0, 31, 0, 5000, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r1.cqe.status, Status::SUCCESS);
    assert_eq!(h1.q.qid(), Some(0));
    assert_eq!(h1.q.sq_entries(), 32);
    assert!(!h1.q.flow_control_disabled());
    assert_eq!(r1.cqe.sqhd, 1, "the Connect itself was consumed");
    let mut h2 = Host::new(&t, peer(TransportKind::Tcp, 1));
    // CATTR bit 2: SQ flow control disabled → SQHD reported as 0xFFFF.
    let r2 = h2.connect(0, 31, 1 << 2, 5000, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r2.cqe.status, Status::SUCCESS);
    assert!(h2.q.flow_control_disabled());
    assert_eq!(r2.cqe.sqhd, 0xffff);
    let (c1, c2) = (r1.cqe.dw0 as u16, r2.cqe.dw0 as u16);
    assert_ne!(c1, c2);
    assert!((1..=0xffef).contains(&c1) && (1..=0xffef).contains(&c2));
    // SQHD wraps at the queue size.
    for _ in 0..40 {
        h1.property_get(0x08, PropertySize::Four);
    }
    assert_eq!(h1.property_get(0x08, PropertySize::Four).cqe.sqhd, 42 % 32);
}

fn connect_status(
    t: &std::sync::Arc<nvme::target::Target>,
    qid: u16,
    sqsize: u16,
    subnqn: &str,
    hostnqn: &str,
    cntlid: u16,
) -> (Status, u32) {
    let mut h = Host::new(t, peer(TransportKind::Tcp, 1));
    let r = h.connect(qid, sqsize, 0, 0, &connect_data(subnqn, hostnqn, cntlid));
    (r.cqe.status, r.cqe.dw0)
}

#[test]
fn connect_rejections_carry_status_and_invalid_parameter_offset() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.subsystems[0].allow_any_host = false;
    cfg.subsystems[0].allowed_hosts = vec![HOSTNQN.into()];
    let t = target_with(cfg, &b);
    let invalid = Status::CONNECT_INVALID_PARAMETERS.with_dnr();
    // Unknown subsystem: IATTR=1 (Connect data), IPO = 256 (SUBNQN).
    assert_eq!(
        connect_status(&t, 0, 31, "nqn.x:nope", HOSTNQN, 0xffff),
        (invalid, 1 << 16 | 256)
    );
    // Host not on the allow list: Connect Invalid Host, IPO = 512 (HOSTNQN).
    let (s, dw0) = connect_status(&t, 0, 31, SUBNQN, "nqn.x:intruder", 0xffff);
    assert_eq!(s, Status::CONNECT_INVALID_HOST.with_dnr());
    assert_eq!(s.to_field() >> 1, 0x4184);
    assert_eq!(dw0, 1 << 16 | 512);
    // SQSIZE 0 (one entry) and beyond the admin queue limit: IATTR=0 (SQE), IPO = 44.
    assert_eq!(
        connect_status(&t, 0, 0, SUBNQN, HOSTNQN, 0xffff),
        (invalid, 44)
    );
    assert_eq!(
        connect_status(&t, 0, 32, SUBNQN, HOSTNQN, 0xffff),
        (invalid, 44)
    );
    // Admin Connect must request a dynamic controller.
    assert_eq!(
        connect_status(&t, 0, 31, SUBNQN, HOSTNQN, 1),
        (invalid, 1 << 16 | 16)
    );
    // Record format other than 0.
    let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
    let mut s = nvme::wire::fabrics::ConnectCommand {
        recfmt: 1,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(0);
    s.cid = 0;
    let mut data = connect_data(SUBNQN, HOSTNQN, 0xffff).encode().to_vec();
    assert_eq!(
        h.run(s, &mut data).cqe.status,
        Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr()
    );
    // I/O Connect to a controller that does not exist.
    assert_eq!(
        connect_status(&t, 1, 127, SUBNQN, HOSTNQN, 77),
        (invalid, 1 << 16 | 16)
    );
}

#[test]
fn io_connect_rules() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.limits.max_io_queues = 2;
    let t = target_with(cfg, &b);
    let mut admin_q = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = admin_q.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    let cntlid = r.cqe.dw0 as u16;
    let invalid = Status::CONNECT_INVALID_PARAMETERS.with_dnr();
    // Before CC.EN the controller has no I/O queues.
    assert_eq!(
        connect_status(&t, 1, 127, SUBNQN, HOSTNQN, cntlid).0,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );
    assert_eq!(admin_q.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    // Another host cannot join this controller.
    assert_eq!(
        connect_status(&t, 1, 127, SUBNQN, "nqn.x:other", cntlid),
        (invalid, 1 << 16 | 16)
    );
    // SQSIZE beyond MQES.
    assert_eq!(
        connect_status(&t, 1, 128, SUBNQN, HOSTNQN, cntlid),
        (invalid, 44)
    );
    // QID beyond the granted count (2).
    assert_eq!(
        connect_status(&t, 3, 127, SUBNQN, HOSTNQN, cntlid),
        (invalid, 42)
    );
    let q1 = io_queue(&t, cntlid, 1);
    assert_eq!(q1.q.qid(), Some(1));
    assert_eq!(q1.q.sq_entries(), 128);
    // The same QID twice.
    assert_eq!(
        connect_status(&t, 1, 127, SUBNQN, HOSTNQN, cntlid).0,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );
    // After the queue goes away its QID can be connected again.
    drop(q1);
    let _q1 = io_queue(&t, cntlid, 1);
    // Discovery controllers have no I/O queues.
    let (mut d, dcntlid) = admin(&t, DISCOVERY_NQN, 0);
    let _ = d.poll(Instant::now());
    assert_eq!(
        connect_status(&t, 1, 127, DISCOVERY_NQN, HOSTNQN, dcntlid),
        (invalid, 42)
    );
}

#[test]
fn subsystem_is_only_reachable_through_its_ports() {
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.ports
        .push(port(2, TransportKind::Tcp, "127.0.0.2".parse().unwrap()));
    cfg.subsystems[0].ports = vec![2];
    let t = target_with(cfg, &b);
    let mut on1 = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = on1.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
    let mut on2 = Host::new(&t, peer(TransportKind::Tcp, 2));
    let r = on2.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
}

#[test]
fn only_connect_before_connect_and_not_twice() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
    assert_eq!(
        h.q.prepare(&identify(1, 0, 0), 4096),
        Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr())
    );
    assert_eq!(
        h.status(fabrics_sqe(fctype::PROPERTY_GET), &mut []),
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );
    // The Connect data must be exactly what the SGL says: 1024 bytes at most.
    let c = nvme::wire::fabrics::ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(1);
    assert_eq!(h.q.prepare(&c, 1024), Ok(Direction::HostToController));
    assert_eq!(
        h.q.prepare(&c, 2048),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    let r = h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    let r = h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    // Fused commands and non-SGL PSDT are refused.
    let mut fused = identify(1, 0, 0);
    fused.flags |= 1;
    assert_eq!(
        h.q.prepare(&fused, 4096),
        Err(Status::INVALID_FIELD.with_dnr())
    );
}

#[test]
fn properties_and_enable_shutdown_handshakes() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
    h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    let cap = h.property_get(0x00, PropertySize::Eight).cqe;
    let cap = cap.dw0 as u64 | (cap.dw1 as u64) << 32;
    assert_eq!(cap & 0xffff, 127, "MQES = max_queue_size - 1");
    assert_ne!(cap & 1 << 16, 0, "CQR");
    assert_ne!(cap & 1 << 37, 0, "CSS NVM");
    assert_eq!((cap >> 24) & 0xff, 15, "TO");
    let lo = h.property_get(0x00, PropertySize::Four).cqe.dw0 as u64;
    let hi = h.property_get(0x04, PropertySize::Four).cqe.dw0 as u64;
    assert_eq!(lo | hi << 32, cap, "CAP in two 4-byte halves");
    assert_eq!(
        h.property_get(0x08, PropertySize::Four).cqe.dw0,
        0x0001_0300
    );
    assert_eq!(
        h.property_get(reg::CSTS, PropertySize::Four).cqe.dw0,
        0,
        "not ready"
    );
    // Admin commands need CSTS.RDY.
    assert_eq!(
        h.q.prepare(&identify(1, 0, 0), 4096),
        Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr())
    );
    // Read-only registers and unknown offsets.
    for off in [0x00, 0x08, 0x1c, 0x20, 0x44] {
        assert_eq!(
            h.property_set(off, 1),
            Status::INVALID_FIELD.with_dnr(),
            "{off:#x}"
        );
    }
    // Enabling with unsupported queue entry sizes sets CSTS.CFS, not RDY.
    assert_eq!(h.property_set(reg::CC, 1), Status::SUCCESS);
    assert_eq!(h.property_get(reg::CSTS, PropertySize::Four).cqe.dw0, 0b10);
    assert_eq!(h.property_set(reg::CC, 0), Status::SUCCESS);
    assert_eq!(h.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    assert_eq!(
        h.property_get(reg::CSTS, PropertySize::Four).cqe.dw0,
        1,
        "RDY follows EN"
    );
    assert_eq!(
        h.property_get(reg::CC, PropertySize::Four).cqe.dw0,
        cc::ENABLE
    );
    assert_eq!(
        h.q.prepare(&identify(1, 0, 0), 4096),
        Ok(Direction::ControllerToHost)
    );
    // Normal shutdown (SHN = 01b) completes at once: SHST = 10b.
    assert_eq!(
        h.property_set(reg::CC, cc::ENABLE | 1 << 14),
        Status::SUCCESS
    );
    assert_eq!(
        h.property_get(reg::CSTS, PropertySize::Four).cqe.dw0 & 0b1100,
        0b1000
    );
    // Property Get with a reserved size attribute.
    let mut bad = fabrics_sqe(fctype::PROPERTY_GET);
    bad.cdw10 = 3;
    assert_eq!(h.status(bad, &mut []), Status::INVALID_FIELD.with_dnr());
    // 8-byte access to a 4-byte register.
    assert_eq!(
        h.property_get(reg::CC, PropertySize::Eight).cqe.status,
        Status::INVALID_FIELD.with_dnr()
    );
}

#[test]
fn property_commands_are_admin_queue_only_and_disconnect_terminates() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (_a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    assert_eq!(
        q.q.prepare(&fabrics_sqe(fctype::PROPERTY_GET), 0),
        Err(Status::INVALID_OPCODE.with_dnr())
    );
    assert_eq!(
        q.status(fabrics_sqe(fctype::DISCONNECT), &mut []),
        Status::SUCCESS
    );
    assert_eq!(
        q.poll(Instant::now()).terminate,
        Some(nvme::queue::TerminateReason::HostDisconnect)
    );
}
