//! Reservations (NVMe Base 2.0 §8.19) through I/O queues of several controllers: host
//! identity by Host Identifier, conflicts on I/O, report, hostile fields, and the refusal on a
//! multi-gateway subsystem.

use nvme::ana::MultipathConfig;
use nvme::queue::TransportKind;
use nvme::spec::nvm_opcode::{self, READ, WRITE};
use nvme::spec::resv::{
    NOTICE_REGISTRATION_PREEMPTED, NOTICE_RESERVATION_RELEASED, ONCS_RESERVATIONS, RESCAP_TYPES,
};
use nvme::spec::{admin_opcode, fid, lid};
use nvme::wire::identify::{IdentifyController, IdentifyNamespace};
use nvme::wire::log::ReservationNotificationLog;
use nvme::wire::{Sqe, Status};
use std::sync::Arc;

use crate::harness::*;

/// One controller of host `hostid` through `transport`: its admin and first I/O queue.
fn controller(t: &Arc<nvme::target::Target>, hostid: u8, transport: TransportKind) -> (Host, Host) {
    let data = |cntlid| nvme::wire::fabrics::ConnectData {
        hostid: [hostid; 16],
        ..connect_data(SUBNQN, HOSTNQN, cntlid)
    };
    let mut a = Host::new(t, peer(transport, 1));
    let r = a.connect(0, 31, 0, 0, &data(0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    let cntlid = r.cqe.dw0 as u16;
    assert_eq!(
        a.property_set(nvme::spec::reg::CC, nvme::spec::cc::ENABLE),
        Status::SUCCESS
    );
    let mut q = Host::new(t, peer(transport, 1));
    assert_eq!(
        q.connect(1, 127, 0, 0, &data(cntlid)).cqe.status,
        Status::SUCCESS
    );
    (a, q)
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

fn resv(opcode: u8, nsid: u32, cdw10: u32) -> Sqe {
    Sqe {
        cdw10,
        ..sqe(opcode, nsid)
    }
}

fn register(q: &mut Host, key: u64) -> Status {
    q.status(
        resv(nvm_opcode::RESERVATION_REGISTER, 1, 0),
        &mut keys(0, key),
    )
}

fn acquire(q: &mut Host, key: u64, rtype: u32) -> Status {
    q.status(
        resv(nvm_opcode::RESERVATION_ACQUIRE, 1, rtype << 8),
        &mut keys(key, 0),
    )
}

fn report(q: &mut Host) -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    let s = Sqe {
        cdw11: 1,
        ..resv(nvm_opcode::RESERVATION_REPORT, 1, 4096 / 4 - 1)
    };
    let r = q.run(s, &mut page);
    assert_eq!((r.cqe.status, r.data_len), (Status::SUCCESS, 4096));
    page
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();

#[test]
fn two_hosts_one_namespace_write_exclusive_then_preempt() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (_a1, mut h1) = controller(&t, 1, TransportKind::Tcp);
    // Host 1 again through RDMA: the same host, the same registration.
    let (_a1r, mut h1r) = controller(&t, 1, TransportKind::Rdma);
    let (_a2, mut h2) = controller(&t, 2, TransportKind::Tcp);
    assert_eq!(register(&mut h1, 0x11), Status::SUCCESS);
    assert_eq!(register(&mut h1r, 0x11), Status::SUCCESS);
    assert_eq!(register(&mut h2, 0x22), Status::SUCCESS);
    assert_eq!(acquire(&mut h1r, 0x11, 1), Status::SUCCESS);
    let mut block = vec![7u8; 512];
    // Write Exclusive: the holder writes through either controller, the other host reads only.
    assert_eq!(h1.status(rw(WRITE, 1, 0, 1), &mut block), Status::SUCCESS);
    assert_eq!(h2.status(rw(WRITE, 1, 0, 1), &mut block), CONFLICT);
    assert_eq!(h2.status(sqe(nvm_opcode::FLUSH, 1), &mut []), CONFLICT);
    assert_eq!(h2.status(rw(READ, 1, 0, 1), &mut block), Status::SUCCESS);
    assert_eq!(block, vec![7u8; 512]);
    let page = report(&mut h2);
    assert_eq!((page[4], page[5]), (1, 2));
    assert_eq!(&page[64 + 16..64 + 32], &[1u8; 16]);
    assert_eq!(page[64 + 2], 1, "host 1 holds");
    // Host 2 preempts host 1 into Exclusive Access: host 1 loses registration and access.
    let preempt = resv(nvm_opcode::RESERVATION_ACQUIRE, 1, 1 | 2 << 8);
    assert_eq!(h2.status(preempt, &mut keys(0x22, 0x11)), Status::SUCCESS);
    assert_eq!(h1.status(rw(READ, 1, 0, 1), &mut block), CONFLICT);
    assert_eq!(h1r.status(rw(WRITE, 1, 0, 1), &mut block), CONFLICT);
    assert_eq!(h2.status(rw(WRITE, 1, 0, 1), &mut block), Status::SUCCESS);
    let page = report(&mut h1);
    assert_eq!((page[4], page[5]), (2, 1));
    // Release by the holder opens the namespace again.
    let release = resv(nvm_opcode::RESERVATION_RELEASE, 1, 2 << 8);
    assert_eq!(h2.status(release, &mut keys(0x22, 0)[..8]), Status::SUCCESS);
    assert_eq!(h1.status(rw(WRITE, 1, 0, 1), &mut block), Status::SUCCESS);
}

#[test]
fn hostile_reservation_commands() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (_a, mut h) = controller(&t, 3, TransportKind::Tcp);
    let invalid = Status::INVALID_FIELD.with_dnr();
    for nsid in [0, 2, u32::MAX] {
        let s = resv(nvm_opcode::RESERVATION_REGISTER, nsid, 0);
        assert_eq!(
            h.status(s, &mut keys(0, 1)),
            Status::INVALID_NAMESPACE.with_dnr()
        );
    }
    // More data than the command carries; less; a bad action; CPTPL (PTPL unsupported).
    let reg = |cdw10| resv(nvm_opcode::RESERVATION_REGISTER, 1, cdw10);
    assert_eq!(
        h.status(reg(0), &mut [0u8; 32]),
        Status::DATA_SGL_LENGTH_INVALID.with_dnr()
    );
    assert_eq!(
        h.status(reg(0), &mut [0u8; 8]),
        Status::DATA_SGL_LENGTH_INVALID.with_dnr()
    );
    assert_eq!(h.status(reg(7), &mut keys(0, 1)), invalid);
    assert_eq!(h.status(reg(3 << 30), &mut keys(0, 1)), invalid);
    // Not registered: every key is wrong.
    assert_eq!(acquire(&mut h, 1, 1), CONFLICT);
    assert_eq!(register(&mut h, 5), Status::SUCCESS);
    assert_eq!(acquire(&mut h, 6, 1), CONFLICT);
    for rtype in [0, 7, 0xff] {
        assert_eq!(acquire(&mut h, 5, rtype), invalid);
    }
    // Report: without EDS (64-bit host IDs cannot carry fabrics host IDs), too short.
    let mut page = vec![0u8; 64];
    let s = resv(nvm_opcode::RESERVATION_REPORT, 1, 15);
    assert_eq!(
        h.status(s, &mut page),
        Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr()
    );
    let s = Sqe {
        cdw11: 1,
        ..resv(nvm_opcode::RESERVATION_REPORT, 1, 7)
    };
    assert_eq!(h.status(s, &mut page[..32]), invalid);
}

#[test]
fn advertised_only_on_a_single_gateway() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut a, mut q) = controller(&t, 4, TransportKind::Tcp);
    let mut page = vec![0u8; 4096];
    a.status(identify(1, 0, 0), &mut page);
    let oncs = IdentifyController::decode(&page).unwrap().oncs;
    assert_eq!(oncs & ONCS_RESERVATIONS, ONCS_RESERVATIONS);
    a.status(identify(0, 1, 0), &mut page);
    assert_eq!(
        IdentifyNamespace::decode(&page).unwrap().rescap & RESCAP_TYPES,
        RESCAP_TYPES
    );
    assert_eq!(register(&mut q, 1), Status::SUCCESS);

    // A gateway of several (restricted controller ID range): not advertised, not served.
    let mut cfg = basic_config();
    cfg.multipath = MultipathConfig {
        cntlid_min: 100,
        cntlid_max: 199,
        ..MultipathConfig::default()
    };
    let t = target_with(cfg, &b);
    let (mut a, mut q) = controller(&t, 4, TransportKind::Tcp);
    a.status(identify(1, 0, 0), &mut page);
    assert_eq!(
        IdentifyController::decode(&page).unwrap().oncs & ONCS_RESERVATIONS,
        0
    );
    a.status(identify(0, 1, 0), &mut page);
    assert_eq!(IdentifyNamespace::decode(&page).unwrap().rescap, 0);
    assert_eq!(register(&mut q, 1), Status::INVALID_OPCODE.with_dnr());
}

fn features(opcode: u8, fid: u8, nsid: u32, cdw10_high: u32, cdw11: u32) -> Sqe {
    Sqe {
        cdw10: fid as u32 | cdw10_high,
        cdw11,
        ..sqe(opcode, nsid)
    }
}

fn notification(a: &mut Host, offset: u64) -> ReservationNotificationLog {
    let mut page = vec![0u8; 64];
    let s = Sqe {
        nsid: 0,
        ..get_log(lid::RESERVATION_NOTIFICATION, 64, offset, false)
    };
    assert_eq!(a.status(s, &mut page), Status::SUCCESS);
    ReservationNotificationLog::decode(&page).unwrap()
}

/// Preempt and release through I/O queues reach the other hosts' controllers as log 80h
/// pages and the Reservation Log Page Available event; the issuer hears nothing; feature 82h
/// masks per namespace.
#[test]
fn notifications_reach_every_controller_of_the_other_hosts() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut a1, mut h1) = controller(&t, 1, TransportKind::Tcp);
    // Host 1's second controller, through RDMA: told too.
    let (mut a1r, _h1r) = controller(&t, 1, TransportKind::Rdma);
    let (mut a2, mut h2) = controller(&t, 2, TransportKind::Tcp);
    let now = std::time::Instant::now();
    for a in [&mut a1, &mut a1r, &mut a2] {
        assert!(a
            .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
            .is_none());
    }
    assert_eq!(register(&mut h1, 0x11), Status::SUCCESS);
    assert_eq!(register(&mut h2, 0x22), Status::SUCCESS);
    // Registrants Only: releasing it tells the other registrants.
    assert_eq!(acquire(&mut h1, 0x11, 4), Status::SUCCESS);
    let release = resv(nvm_opcode::RESERVATION_RELEASE, 1, 4 << 8);
    assert_eq!(h1.status(release, &mut keys(0x11, 0)[..8]), Status::SUCCESS);
    let p = a2.poll(now);
    assert_eq!(p.completions.len(), 1);
    // Type 6h (I/O command specific), information 00h, log page 80h.
    assert_eq!(p.completions[0].cqe.dw0, 0x0080_0006);
    assert!(
        a1.poll(now).completions.is_empty(),
        "the issuer is not told"
    );
    // Host 2 preempts host 1: both of host 1's controllers get the page and the event.
    assert_eq!(acquire(&mut h1, 0x11, 1), Status::SUCCESS);
    let preempt = resv(nvm_opcode::RESERVATION_ACQUIRE, 1, 1 | 2 << 8);
    assert_eq!(h2.status(preempt, &mut keys(0x22, 0x11)), Status::SUCCESS);
    for a in [&mut a1, &mut a1r] {
        let p = a.poll(now);
        assert_eq!(p.completions.len(), 1);
        assert_eq!(p.completions[0].cqe.dw0, 0x0080_0006);
        // A read at an offset leaves the page; the read from 0 removes it.
        let mut tail = vec![0u8; 56];
        let at8 = Sqe {
            nsid: 0,
            ..get_log(lid::RESERVATION_NOTIFICATION, 56, 8, false)
        };
        assert_eq!(a.status(at8, &mut tail), Status::SUCCESS);
        assert_eq!(
            (tail[0], &tail[4..8]),
            (NOTICE_REGISTRATION_PREEMPTED, &[1, 0, 0, 0][..])
        );
        assert_eq!(notification(a, 0).count, 1);
        let page = notification(a, 0);
        assert_eq!(
            (page.count, page.kind, page.nsid, page.available),
            (0, 0, 0, 0),
            "read once, then empty"
        );
    }
    let page = notification(&mut a2, 0);
    assert_eq!(
        (page.count, page.kind, page.nsid),
        (1, NOTICE_RESERVATION_RELEASED, 1)
    );

    // Feature 82h: host 1 masks Registration Preempted on namespace 1 (through FFFFFFFFh).
    let set = |nsid, v| {
        features(
            admin_opcode::SET_FEATURES,
            fid::RESERVATION_NOTIFICATION_MASK,
            nsid,
            0,
            v,
        )
    };
    let get = |nsid, sel: u32| {
        features(
            admin_opcode::GET_FEATURES,
            fid::RESERVATION_NOTIFICATION_MASK,
            nsid,
            sel << 8,
            0,
        )
    };
    assert_eq!(a1.status(set(u32::MAX, 1 << 1), &mut []), Status::SUCCESS);
    assert_eq!(a1.run(get(1, 0), &mut []).cqe.dw0, 1 << 1);
    assert_eq!(a1.run(get(1, 3), &mut []).cqe.dw0, 0b110);
    assert_eq!(a1r.run(get(1, 0), &mut []).cqe.dw0, 0, "per controller");
    let invalid = Status::INVALID_FIELD.with_dnr();
    assert_eq!(a1.status(set(1, 1), &mut []), invalid, "bit 0 is reserved");
    assert_eq!(a1.status(set(1, 1 << 4), &mut []), invalid);
    for nsid in [0, 2] {
        assert_eq!(
            a1.status(set(nsid, 0), &mut []),
            Status::INVALID_NAMESPACE.with_dnr()
        );
    }
    assert_eq!(
        a1.status(get(u32::MAX, 0), &mut []),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    assert_eq!(
        a1.status(
            features(
                admin_opcode::SET_FEATURES,
                fid::RESERVATION_NOTIFICATION_MASK,
                1,
                1 << 31,
                0
            ),
            &mut []
        ),
        Status::FEATURE_NOT_SAVEABLE.with_dnr()
    );
    // Host 1 registers again and is preempted again: only the unmasked controller hears.
    assert_eq!(register(&mut h1, 0x11), Status::SUCCESS);
    let preempt = resv(nvm_opcode::RESERVATION_ACQUIRE, 1, 1 | 2 << 8);
    assert_eq!(h2.status(preempt, &mut keys(0x22, 0x11)), Status::SUCCESS);
    assert_eq!(notification(&mut a1, 0).count, 0, "masked");
    let page = notification(&mut a1r, 0);
    assert_eq!((page.count, page.kind), (2, NOTICE_REGISTRATION_PREEMPTED));
}

/// The submitter of a reactor whose namespaces complete inline (RAM) but which has a channel
/// for completions made on other threads, as the daemon's io_uring engine has.
struct OffloadingReactor {
    done: Arc<storage::ExternalCompletions>,
}

impl storage::IoSubmit for OffloadingReactor {
    fn submit(&mut self, _op: storage::BlockOp, tag: u64) {
        panic!("a RAM namespace submitted an op (tag {tag:#x})");
    }
    fn submit_group(&mut self, _ops: &[storage::BlockOp], tag: u64) {
        panic!("a RAM namespace submitted ops (tag {tag:#x})");
    }
    fn external(&mut self) -> Option<&Arc<storage::ExternalCompletions>> {
        Some(&self.done)
    }
}

/// Runs `sqe` on `q` with `io`: it must be handed off (Submitted), and completes once the
/// other thread posts its tag.
fn run_offloaded(q: &mut Host, io: &mut OffloadingReactor, sqe: Sqe, data: &mut [u8]) -> Status {
    let tag = 0x5157_0000 | sqe.cid as u64;
    match q.q.execute(&sqe, data, tag, io) {
        nvme::queue::Outcome::Submitted => {}
        _ => panic!("a reservation change with a state file ran on the calling thread"),
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut got = None;
        io.done.drain(|t, r| got = Some((t, r)));
        if let Some((t, r)) = got {
            assert_eq!((t, r), (tag, 0));
            return q.q.finish(&sqe, r).expect("completed").cqe.status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no completion from the persistence thread"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// With a state file, a reservation change that must be saved (open, write, fsync, rename)
/// runs on the persistence thread, never on the reactor: the "reactor" here is a thread that
/// cannot make any storage system call (seccomp; an fsync on it fails the save, and so the
/// command with Internal Error). Register with CPTPL set, Acquire and Set Features PTPL off
/// succeed, the I/O check and the report work on that thread meanwhile, and the state file
/// holds what was saved.
#[test]
fn ptpl_saves_run_off_the_reactor_thread() {
    let dir = std::env::temp_dir().join(format!("nvmfd-ptpl-offload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = Backends::new();
    let mut cfg = basic_config();
    cfg.state_dir = Some(dir.clone());
    let t = target_with(cfg, &b);
    let (mut admin, mut q) = controller(&t, 1, TransportKind::Tcp);
    std::thread::scope(|s| {
        s.spawn(|| {
            storage::uring::forbid_blocking_storage_calls_on_this_thread();
            let (_rx, tx) = nix::unistd::pipe().unwrap();
            let mut io = OffloadingReactor {
                done: Arc::new(storage::ExternalCompletions::new(tx)),
            };
            // Register, CPTPL = 11b: set PTPL (NVMe Base 2.0 Figure 391).
            let mut r = resv(nvm_opcode::RESERVATION_REGISTER, 1, 3 << 30);
            r.cid = 0x101;
            assert_eq!(
                run_offloaded(&mut q, &mut io, r, &mut keys(0, 0x77)),
                Status::SUCCESS
            );
            let mut a = resv(nvm_opcode::RESERVATION_ACQUIRE, 1, 1 << 8);
            a.cid = 0x102;
            assert_eq!(
                run_offloaded(&mut q, &mut io, a, &mut keys(0x77, 0)),
                Status::SUCCESS
            );
            // Reports and I/O checks stay on the reactor (they never save).
            let page = report(&mut q);
            assert_eq!(
                (page[4], page[9]),
                (1, 1),
                "Write Exclusive held, PTPLS set"
            );
            let mut block = vec![0u8; 512];
            assert_eq!(q.status(rw(WRITE, 1, 0, 1), &mut block), Status::SUCCESS);
            // Set Features Reservation Persistence, PTPL off: a save too, on the admin queue.
            let mut f = features(
                admin_opcode::SET_FEATURES,
                fid::RESERVATION_PERSISTENCE,
                1,
                0,
                0,
            );
            f.cid = 0x103;
            assert_eq!(
                run_offloaded(&mut admin, &mut io, f, &mut []),
                Status::SUCCESS
            );
            assert_eq!(report(&mut q)[9], 0, "PTPLS cleared");
        });
    });
    // The last save was the state with PTPL off (saved because PTPL was on before it).
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        files
            .iter()
            .any(|p| p.to_string_lossy().contains("reservations-")),
        "{files:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A gateway's handle on the group's in-memory store (the daemon's is RADOS).
#[derive(Debug)]
struct GroupOpener(Arc<nvme::testing::MemStore>, usize);

impl nvme::reservation::OpenStore for GroupOpener {
    fn open(
        &self,
        _subsystem: &str,
        _nsid: u32,
        _nguid: &[u8; 16],
    ) -> Result<Arc<dyn nvme::reservation::Store>, nvme::reservation::StoreError> {
        Ok(self.0.gateway(self.1))
    }
}

/// Gateway `id` of a two-gateway group on `store`: its own controller ID range, and what the
/// daemon's watch thread does when another gateway publishes a change (read the state again,
/// deliver the notices to this gateway's controllers).
fn gateway(
    store: &Arc<nvme::testing::MemStore>,
    id: usize,
    b: &Backends,
) -> Arc<nvme::target::Target> {
    let mut cfg = basic_config();
    cfg.multipath = MultipathConfig {
        cntlid_min: id as u16 * 1000,
        cntlid_max: id as u16 * 1000 + 999,
        ..MultipathConfig::default()
    };
    cfg.reservation_stores = Some(nvme::reservation::SharedStores(Arc::new(GroupOpener(
        Arc::clone(store),
        id,
    ))));
    let t = target_with(cfg, b);
    let weak = Arc::downgrade(&t);
    store.subscribe(id, move |_version, notices, _abort| {
        let Some(t) = weak.upgrade() else { return };
        let sub = t.subsystem(SUBNQN).unwrap();
        sub.namespaces()
            .get(1)
            .unwrap()
            .reservations
            .refresh()
            .unwrap();
        sub.notify_reservation(1, notices);
    });
    t
}

/// Two gateways (two targets) sharing one store: host 1 registers and acquires Write
/// Exclusive through gateway 1, host 2's write through gateway 2 is a conflict, the report
/// is the same through both, host 2's preempt through gateway 2 reaches host 1's controller
/// on gateway 1, and a change that loses a race with another writer is applied again.
#[test]
fn two_gateways_one_reservation_state() {
    let b = Backends::new();
    let store = nvme::testing::MemStore::new();
    let g1 = gateway(&store, 1, &b);
    let g2 = gateway(&store, 2, &b);
    let (mut a1, mut h1) = controller(&g1, 1, TransportKind::Tcp);
    let (_a2, mut h2) = controller(&g2, 2, TransportKind::Tcp);
    // Served and advertised although each gateway's controller ID range is restricted.
    let mut page = vec![0u8; 4096];
    a1.status(identify(1, 0, 0), &mut page);
    let oncs = IdentifyController::decode(&page).unwrap().oncs;
    assert_eq!(oncs & ONCS_RESERVATIONS, ONCS_RESERVATIONS);
    let now = std::time::Instant::now();
    assert!(a1
        .try_run(sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0), &mut [])
        .is_none());

    assert_eq!(register(&mut h1, 0x11), Status::SUCCESS);
    assert_eq!(acquire(&mut h1, 0x11, 1), Status::SUCCESS);
    assert_eq!(register(&mut h2, 0x22), Status::SUCCESS);
    let mut block = vec![7u8; 512];
    assert_eq!(h2.status(rw(WRITE, 1, 0, 1), &mut block), CONFLICT);
    assert_eq!(h2.status(rw(READ, 1, 0, 1), &mut block), Status::SUCCESS);
    assert_eq!(h1.status(rw(WRITE, 1, 0, 1), &mut block), Status::SUCCESS);
    let (r1, r2) = (report(&mut h1), report(&mut h2));
    assert_eq!(r1, r2, "one report through both gateways");
    assert_eq!((r1[0], r1[4], r1[5]), (2, 1, 2));

    // Host 2 preempts host 1 through gateway 2: host 1's controller on gateway 1 is told.
    let preempt = resv(nvm_opcode::RESERVATION_ACQUIRE, 1, 1 | 1 << 8);
    assert_eq!(h2.status(preempt, &mut keys(0x22, 0x11)), Status::SUCCESS);
    let p = a1.poll(now);
    assert_eq!(p.completions.len(), 1);
    assert_eq!(p.completions[0].cqe.dw0, 0x0080_0006);
    let page = notification(&mut a1, 0);
    assert_eq!(
        (page.count, page.kind, page.nsid),
        (1, NOTICE_REGISTRATION_PREEMPTED, 1)
    );
    assert_eq!(h1.status(rw(WRITE, 1, 0, 1), &mut block), CONFLICT);
    assert_eq!(h2.status(rw(WRITE, 1, 0, 1), &mut block), Status::SUCCESS);
    assert_eq!(report(&mut h1), report(&mut h2));

    // Host 1 registers again through gateway 1 while another writer replaces the state
    // between gateway 1's read and its write: refused as stale, read again, applied.
    let (_, _, refused) = store.counts();
    store.before_next_replace(|s| {
        *s = nvme::reservation::State::default();
    });
    assert_eq!(register(&mut h1, 0x11), Status::SUCCESS);
    assert_eq!(store.counts().2, refused + 1, "one stale write, retried");
    let r = report(&mut h2);
    assert_eq!(
        (r[4], r[5]),
        (0, 1),
        "the other writer's clear, then host 1's registration"
    );
    assert_eq!(&r[64 + 16..64 + 32], &[1u8; 16]);
    assert_eq!(r, report(&mut h1));
}
