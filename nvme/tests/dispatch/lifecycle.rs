//! Keep-alive expiry, controller deletion and reset, subsystem removal.

use nvme::spec::{admin_opcode, nvm_opcode, reg};
use std::time::{Duration, Instant};

use nvme::queue::TerminateReason;
use nvme::wire::Status;

use crate::harness::*;

#[test]
fn keep_alive_expiry_with_fake_time_terminates_all_queues() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    // 4500 ms is rounded up to 5 s.
    let (mut a, cntlid) = admin(&t, SUBNQN, 4500);
    let mut q = io_queue(&t, cntlid, 1);
    let t0 = Instant::now();
    assert_eq!(a.poll(t0).terminate, None, "timer armed");
    assert_eq!(a.poll(t0 + Duration::from_millis(4900)).terminate, None);
    // Traffic on any queue restarts the timer (traffic based keep alive).
    q.run(rw(nvm_opcode::READ, 1, 0, 1), &mut [0u8; 512]);
    assert_eq!(q.poll(t0 + Duration::from_secs(9)).terminate, None);
    assert_eq!(a.poll(t0 + Duration::from_secs(13)).terminate, None);
    // No command for 5 s after the restart at t0 + 9 s.
    assert_eq!(
        a.poll(t0 + Duration::from_millis(14_001)).terminate,
        Some(TerminateReason::KeepAliveTimeout)
    );
    assert_eq!(
        q.poll(t0 + Duration::from_millis(14_001)).terminate,
        Some(TerminateReason::KeepAliveTimeout)
    );
    // I/O on the dead controller is aborted.
    assert_eq!(
        q.status(rw(nvm_opcode::READ, 1, 0, 1), &mut [0u8; 512]),
        Status::ABORTED_SQ_DELETION
    );
}

#[test]
fn keep_alive_command_and_kato_zero() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut a, _) = admin(&t, SUBNQN, 1000);
    let t0 = Instant::now();
    a.poll(t0);
    for i in 1..5u64 {
        assert_eq!(
            a.status(sqe(admin_opcode::KEEP_ALIVE, 0), &mut []),
            Status::SUCCESS
        );
        assert_eq!(a.poll(t0 + Duration::from_millis(900 * i)).terminate, None);
    }
    let (mut never, _) = admin(&t, SUBNQN, 0);
    never.poll(t0);
    assert_eq!(never.poll(t0 + Duration::from_secs(86_400)).terminate, None);
}

#[test]
fn admin_queue_drop_deletes_the_controller() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    drop(a);
    assert_eq!(
        q.poll(Instant::now()).terminate,
        Some(TerminateReason::AdminQueueGone)
    );
    // The cntlid is gone: an I/O Connect to it fails.
    let mut late = Host::new(&t, peer(nvme::queue::TransportKind::Tcp, 1));
    let r = late.connect(2, 127, 0, 0, &connect_data(SUBNQN, HOSTNQN, cntlid));
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
}

#[test]
fn controller_reset_ends_io_queues() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    assert_eq!(a.property_set(reg::CC, 0), Status::SUCCESS);
    assert_eq!(
        q.status(rw(nvm_opcode::READ, 1, 0, 1), &mut [0u8; 512]),
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );
    assert_eq!(
        q.poll(Instant::now()).terminate,
        Some(TerminateReason::ControllerReset)
    );
    assert_eq!(
        a.poll(Instant::now()).terminate,
        None,
        "admin queue survives a reset"
    );
}

#[test]
fn removing_a_subsystem_on_reload_ends_its_controllers() {
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let (mut a, _) = admin(&t, SUBNQN, 0);
    let mut empty = cfg.clone();
    empty.subsystems.clear();
    let s = t.apply_with_opener(empty, &b.opener()).unwrap();
    assert_eq!(s.subsystems_removed, vec![SUBNQN.to_string()]);
    assert_eq!(
        a.poll(Instant::now()).terminate,
        Some(TerminateReason::SubsystemRemoved)
    );
    let mut h = Host::new(&t, peer(nvme::queue::TransportKind::Tcp, 1));
    let r = h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
}

#[test]
fn invalid_reload_changes_nothing() {
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let genctr = t.discovery_genctr();
    let mut bad = cfg.clone();
    bad.subsystems[0].namespaces.push(ram_ns(2, 1 << 20, 1000));
    assert!(t.apply_with_opener(bad, &b.opener()).is_err());
    let mut dup = cfg.clone();
    dup.subsystems.push(cfg.subsystems[0].clone());
    assert!(t.apply_with_opener(dup, &b.opener()).is_err());
    assert_eq!(t.discovery_genctr(), genctr);
    let (mut a, _) = admin(&t, SUBNQN, 0);
    let mut page = vec![0u8; 4096];
    a.status(identify(2, 0, 0), &mut page);
    assert_eq!(
        nvme::wire::identify::decode_active_ns_list(&page).unwrap(),
        vec![1]
    );
}

#[test]
fn resized_namespace_is_replaced_and_announced() {
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let (mut a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    assert!(a
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    let mut bigger = cfg.clone();
    bigger.subsystems[0].namespaces[0] = ram_ns(1, 2 << 20, 512);
    let s = t.apply_with_opener(bigger, &b.opener()).unwrap();
    assert_eq!(s.namespaces_replaced, vec![(SUBNQN.to_string(), 1)]);
    assert!(s.namespaces_added.is_empty() && s.namespaces_removed.is_empty());
    assert_eq!(a.poll(Instant::now()).completions.len(), 1);
    // The I/O queue sees the new capacity on its next command.
    let blocks = (2u64 << 20) / 512;
    assert_eq!(
        q.status(rw(nvm_opcode::READ, 1, blocks - 1, 1), &mut [0u8; 512]),
        Status::SUCCESS
    );
}

#[test]
fn io_keeps_working_while_namespaces_come_and_go() {
    let b = Backends::new();
    let cfg = basic_config();
    let t = target_with(cfg.clone(), &b);
    let (_a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let worker = std::thread::spawn(move || {
        let mut buf = vec![0u8; 512];
        let (mut ok, mut gone) = (0, 0);
        for i in 0..4000u64 {
            let nsid = 1 + (i % 2) as u32;
            match q.status(rw(nvm_opcode::WRITE, nsid, i % 64, 1), &mut buf) {
                s if s == Status::SUCCESS => ok += 1,
                s if s == Status::INVALID_NAMESPACE.with_dnr() => gone += 1,
                s => panic!("unexpected {s}"),
            }
        }
        (ok, gone)
    });
    let mut with2 = cfg.clone();
    with2.subsystems[0].namespaces.push(ram_ns(2, 1 << 20, 512));
    for i in 0..50 {
        let c = if i % 2 == 0 { &with2 } else { &cfg };
        t.apply_with_opener(c.clone(), &b.opener()).unwrap();
    }
    let (ok, gone) = worker.join().unwrap();
    assert_eq!(ok + gone, 4000);
    assert!(ok >= 2000, "namespace 1 never disappears");
}
