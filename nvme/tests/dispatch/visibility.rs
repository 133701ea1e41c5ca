//! Per-host namespace visibility: a namespace shown to host A only is an inactive NSID for
//! host B (Identify, I/O, logs), and a reload that changes a host's view notifies that host's
//! controllers only.

use std::time::Instant;

use nvme::spec::{admin_opcode, lid, nvm_opcode};
use nvme::target::{TargetConfig, Visibility};
use nvme::wire::fabrics::ConnectData;
use nvme::wire::identify::{decode_active_ns_list, IdentifyNamespace};
use nvme::wire::log::{AnaLog, ChangedNsList};
use nvme::wire::Status;

use crate::harness::*;

const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";

fn connect_data_for(hostnqn: &str, cntlid: u16) -> ConnectData {
    ConnectData {
        hostid: [hostnqn.as_bytes()[33]; 16],
        ..connect_data(SUBNQN, hostnqn, cntlid)
    }
}

/// Admin queue of a controller for `hostnqn`, enabled, with one AER held; and an I/O queue.
fn controller(t: &std::sync::Arc<nvme::target::Target>, hostnqn: &str) -> (Host, Host) {
    let mut admin = Host::new(t, peer(nvme::queue::TransportKind::Tcp, 1));
    let r = admin.connect(0, 31, 0, 0, &connect_data_for(hostnqn, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS, "admin connect");
    let cntlid = r.cqe.dw0 as u16;
    assert_eq!(
        admin.property_set(nvme::spec::reg::CC, nvme::spec::cc::ENABLE),
        Status::SUCCESS
    );
    assert!(admin
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    let mut io = Host::new(t, peer(nvme::queue::TransportKind::Tcp, 1));
    let r = io.connect(1, 127, 0, 0, &connect_data_for(hostnqn, cntlid));
    assert_eq!(r.cqe.status, Status::SUCCESS, "I/O connect");
    (admin, io)
}

fn config(ns2_hosts: &[&str]) -> TargetConfig {
    let mut cfg = basic_config();
    let sub = &mut cfg.subsystems[0];
    sub.namespaces.push(ram_ns(2, 1 << 20, 512));
    let mut vis = Visibility::default();
    vis.restrict(2, ns2_hosts.iter().map(|h| h.to_string()));
    sub.visibility = vis;
    cfg
}

fn active_list(h: &mut Host) -> Vec<u32> {
    let mut page = vec![0u8; 4096];
    assert_eq!(h.status(identify(2, 0, 0), &mut page), Status::SUCCESS);
    decode_active_ns_list(&page).unwrap()
}

fn read_status(io: &mut Host, nsid: u32) -> Status {
    io.status(rw(nvm_opcode::READ, nsid, 0, 1), &mut [0u8; 512])
}

fn changed_log(h: &mut Host) -> Vec<u32> {
    let mut page = vec![0u8; 4096];
    assert_eq!(
        h.status(get_log(lid::CHANGED_NS, 4096, 0, false), &mut page),
        Status::SUCCESS
    );
    ChangedNsList::decode(&page).unwrap().nsids
}

fn ana_nsids(h: &mut Host) -> Vec<u32> {
    let mut page = vec![0u8; 4096];
    assert_eq!(
        h.status(get_log(lid::ANA, 4096, 0, true), &mut page),
        Status::SUCCESS
    );
    let log = AnaLog::decode(&page).unwrap();
    log.groups.iter().flat_map(|g| g.nsids.clone()).collect()
}

#[test]
fn a_namespace_shown_to_one_host_is_inactive_for_the_other() {
    let b = Backends::new();
    let t = target_with(config(&[HOST_A]), &b);
    let (mut a, mut a_io) = controller(&t, HOST_A);
    let (mut hb, mut b_io) = controller(&t, HOST_B);

    assert_eq!(active_list(&mut a), [1, 2]);
    assert_eq!(active_list(&mut hb), [1]);

    // Identify Namespace: an inactive NSID reads as a zero-filled structure (NVMe Base 2.0
    // §5.17.2.1; nvmet does the same), which Linux takes as "not active".
    let mut page = vec![0u8; 4096];
    assert_eq!(hb.status(identify(0, 2, 0), &mut page), Status::SUCCESS);
    assert!(page.iter().all(|&x| x == 0));
    assert_eq!(a.status(identify(0, 2, 0), &mut page), Status::SUCCESS);
    assert_eq!(IdentifyNamespace::decode(&page).unwrap().nsze, 2048);
    // Namespace Identification Descriptors: Invalid Namespace, as for an NSID never configured.
    let unknown = hb.status(identify(3, 7, 0), &mut page);
    assert_eq!(unknown, Status::INVALID_NAMESPACE.with_dnr());
    assert_eq!(hb.status(identify(3, 2, 0), &mut page), unknown);
    assert_eq!(a.status(identify(3, 2, 0), &mut page), Status::SUCCESS);

    // I/O: Invalid Namespace or Format, exactly as for an NSID that does not exist.
    let unknown = read_status(&mut b_io, 7);
    assert_eq!(unknown, Status::INVALID_NAMESPACE.with_dnr());
    assert_eq!(read_status(&mut b_io, 2), unknown);
    assert_eq!(read_status(&mut b_io, 1), Status::SUCCESS);
    assert_eq!(read_status(&mut a_io, 2), Status::SUCCESS);

    // SMART per namespace and the ANA log describe attached namespaces only.
    let smart = |nsid| nvme::wire::Sqe {
        nsid,
        ..get_log(lid::SMART, 512, 0, true)
    };
    assert_eq!(
        hb.status(smart(2), &mut page[..512]),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    assert_eq!(a.status(smart(2), &mut page[..512]), Status::SUCCESS);
    assert_eq!(ana_nsids(&mut a), [1, 2]);
    assert_eq!(ana_nsids(&mut hb), [1]);

    // Nothing here raised an event.
    let now = Instant::now();
    assert!(a.poll(now).completions.is_empty());
    assert!(hb.poll(now).completions.is_empty());
}

#[test]
fn reload_showing_a_namespace_notifies_only_the_host_whose_view_changed() {
    let b = Backends::new();
    let t = target_with(config(&[HOST_A]), &b);
    let (mut a, mut a_io) = controller(&t, HOST_A);
    let (mut hb, mut b_io) = controller(&t, HOST_B);
    // B's I/O queue has cached the table without namespace 2.
    assert_eq!(
        read_status(&mut b_io, 2),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    let now = Instant::now();

    // Show namespace 2 to B as well: B hears of it, A (whose view is the same) does not.
    let summary = t
        .apply_with_opener(config(&[HOST_A, HOST_B]), &b.opener())
        .unwrap();
    assert_eq!(
        summary.namespaces_visibility_changed,
        [(SUBNQN.to_string(), 2)]
    );
    assert!(summary.namespaces_added.is_empty() && summary.namespaces_replaced.is_empty());
    assert!(
        a.poll(now).completions.is_empty(),
        "A's view did not change"
    );
    let p = hb.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(
        p.completions[0].cqe.dw0, 0x04_00_02,
        "notice, NS attribute changed, log 04h"
    );
    assert_eq!(changed_log(&mut hb), [2]);
    assert!(changed_log(&mut a).is_empty());
    assert_eq!(active_list(&mut hb), [1, 2]);
    // The I/O queue picks the new view up at its next command; the data is A's.
    assert_eq!(read_status(&mut b_io, 2), Status::SUCCESS);
    assert_eq!(read_status(&mut a_io, 2), Status::SUCCESS);

    // Hide it from B again (B's AER is re-armed after reading the log): B again, A not.
    assert!(hb
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    t.apply_with_opener(config(&[HOST_A]), &b.opener()).unwrap();
    assert!(a.poll(now).completions.is_empty());
    assert_eq!(hb.poll(now).completions.len(), 1);
    assert_eq!(changed_log(&mut hb), [2]);
    assert_eq!(
        read_status(&mut b_io, 2),
        Status::INVALID_NAMESPACE.with_dnr()
    );

    // A namespace added for A only is news to A only.
    let mut cfg = config(&[HOST_A]);
    cfg.subsystems[0].namespaces.push(ram_ns(3, 1 << 20, 512));
    cfg.subsystems[0]
        .visibility
        .restrict(3, [HOST_A.to_string()]);
    assert!(hb
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());
    t.apply_with_opener(cfg, &b.opener()).unwrap();
    assert_eq!(a.poll(now).completions.len(), 1);
    assert_eq!(changed_log(&mut a), [3]);
    assert!(hb.poll(now).completions.is_empty());
    assert!(changed_log(&mut hb).is_empty());
    assert_eq!(active_list(&mut a), [1, 2, 3]);
    assert_eq!(active_list(&mut hb), [1]);
}
