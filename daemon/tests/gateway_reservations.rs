//! Reservations shared by the gateways of a gateway group: a real single-node Ceph cluster on
//! loopback (scripts/ceph-test-cluster.sh), two `nvmfd` processes (gateways g1 and g2, own
//! ports and controller ID ranges, one `[gateway_group]`) exporting one RBD image as the same
//! namespace, and the host-side NVMe/TCP client as hosts A (through g1) and B (through g2).
//!
//! A registers (with PTPL) and acquires Write Exclusive through g1; B registers through g2
//! and its write there is a Reservation Conflict; the report is the same through both; B
//! preempts A through g2, and by the time that command completes A's controller on g1 has the
//! Reservation Log Page Available event and log 80h page, and A's write through g1 is refused;
//! after SIGKILL of both gateways and a restart the report is unchanged.
//!
//! Compiled (and so run) only with `--features rbd`:
//!   cargo test -p nvmfd --features rbd --test gateway_reservations -- --nocapture
#![cfg(feature = "rbd")]

mod fixture;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fixture::ceph::Cluster;
use fixture::{free_port, pattern, serve, Daemon};
use nix::sys::signal::Signal;
use nvme::spec::nvm_opcode::{
    READ, RESERVATION_ACQUIRE, RESERVATION_REGISTER, RESERVATION_REPORT, WRITE,
};
use nvme::spec::resv::{
    ACQUIRE_PREEMPT, ACQUIRE_PREEMPT_ABORT, CPTPL_CLEAR, CPTPL_SET, NOTICE_REGISTRATION_PREEMPTED,
};
use nvme::spec::{admin_opcode, cns, CNTLID_DYNAMIC};
use nvme::wire::{Sqe, Status};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:group";
const IMAGE: &str = "rbd/nvmfd-group-resv";
const HOST_A: ([u8; 16], &str) = (
    [0xa1; 16],
    "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-0000000000a1",
);
const HOST_B: ([u8; 16], &str) = (
    [0xb2; 16],
    "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-0000000000b2",
);
const BLOCK: u32 = 512;

/// Gateway `id` of the group on `port`, controller IDs `cntlids`.
fn gateway(cluster: &Cluster, id: &str, port: u16, cntlids: (u16, u16)) -> (Daemon, SocketAddr) {
    let conf = cluster.conf.display();
    let config = format!(
        r#"
[global]
cntlid_min = {min}
cntlid_max = {max}

[gateway_group]
name = "it"
gateway = "{id}"
pool = "rbd"
ceph_conf = "{conf}"
client_id = "admin"
lease_ms = 5000
renew_ms = 1000
standby_state = "non-optimized"
members = [{{ id = "g1" }}, {{ id = "g2" }}]

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = {port}

[[subsystems]]
nqn = "{SUBNQN}"
allowed_hosts = ["{a}", "{b}"]

[[subsystems.namespaces]]
nsid = 1
rbd = "{IMAGE}"
ceph_conf = "{conf}"
"#,
        min = cntlids.0,
        max = cntlids.1,
        a = HOST_A.1,
        b = HOST_B.1,
    );
    let path = cluster.dir.join(format!("{id}.toml"));
    std::fs::write(&path, config).unwrap();
    let mut daemon = Daemon::spawn(serve(&path));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(60));
    (daemon, address)
}

/// Admin and I/O queue of one controller of `host` through the gateway at `address`.
fn host(address: SocketAddr, host: ([u8; 16], &str)) -> (Client, Client) {
    let opts = || ClientOptions {
        timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    let connect = |qid, cntlid| {
        fixture::connect(
            address,
            opts(),
            (qid, cntlid, 60_000),
            (SUBNQN, host.1, host.0),
        )
        .expect("Connect")
    };
    let (mut admin, cntlid) = connect(0, CNTLID_DYNAMIC);
    admin
        .enable_controller(Duration::from_secs(10))
        .expect("CC.EN");
    let (io, _) = connect(1, cntlid);
    (admin, io)
}

fn command(c: &mut Client, opcode: u8, cdw10: u32, data: DataOut) -> (Status, Vec<u8>) {
    let sqe = Sqe {
        opcode,
        nsid: 1,
        cdw10,
        cdw11: if opcode == RESERVATION_REPORT { 1 } else { 0 },
        ..Sqe::default()
    };
    let done = c.execute(sqe, data).expect("completion");
    (done.cqe.status, done.data)
}

fn keys(a: u64, b: u64) -> DataOut {
    DataOut::Write([a.to_le_bytes(), b.to_le_bytes()].concat())
}

/// The Reservation Status header and the registrant entries in use.
fn report(io: &mut Client) -> Vec<u8> {
    let (st, page) = command(io, RESERVATION_REPORT, 4096 / 4 - 1, DataOut::Read(4096));
    assert_eq!(st, Status::SUCCESS, "report");
    let n = u16::from_le_bytes([page[5], page[6]]) as usize;
    page[..64 + 64 * n].to_vec()
}

fn io_status(io: &mut Client, opcode: u8) -> Status {
    let sqe = Sqe {
        opcode,
        nsid: 1,
        cdw10: 64,
        cdw12: 0,
        ..Sqe::default()
    };
    let data = if opcode == WRITE {
        DataOut::Write(pattern(BLOCK as usize, 5))
    } else {
        DataOut::Read(BLOCK)
    };
    io.execute(sqe, data).expect("completion").cqe.status
}

/// The holder's (Host Identifier, key) in a report.
fn holder(report: &[u8]) -> Option<([u8; 16], u64)> {
    report[64..]
        .chunks_exact(64)
        .find(|e| e[2] & 1 == 1)
        .map(|e| {
            (
                e[16..32].try_into().unwrap(),
                u64::from_le_bytes(e[8..16].try_into().unwrap()),
            )
        })
}

#[test]
fn reservations_are_one_state_through_two_gateways() {
    let t0 = Instant::now();
    let cluster = Cluster::start("group-resv");
    cluster.rbd(&["create", IMAGE, "--size", "16M"]);
    let (p1, p2) = (free_port(), free_port());
    let (g1, a1) = gateway(&cluster, "g1", p1, (1, 999));
    let (g2, a2) = gateway(&cluster, "g2", p2, (1000, 1999));
    let t_up = t0.elapsed();

    let (mut admin_a, mut a) = host(a1, HOST_A);
    let (_admin_b, mut b) = host(a2, HOST_B);
    // Reservations are served through a gateway with a restricted controller ID range.
    let ns = admin_a.identify(cns::NAMESPACE, 1).expect("Identify");
    assert_eq!(ns[31], 0xff, "RESCAP: PTPL, six types, IEKEY");

    let conflict = Status::RESERVATION_CONFLICT.with_dnr();
    let t1 = Instant::now();
    // A through g1: register with PTPL, acquire Write Exclusive.
    let r = command(
        &mut a,
        RESERVATION_REGISTER,
        CPTPL_SET << 30,
        keys(0, 0xaaaa),
    );
    assert_eq!(r.0, Status::SUCCESS);
    let r = command(&mut a, RESERVATION_ACQUIRE, 1 << 8, keys(0xaaaa, 0));
    assert_eq!(r.0, Status::SUCCESS);
    // B through g2: registering with another key works (g2 reads A's registration first).
    let r = command(&mut b, RESERVATION_REGISTER, 0, keys(0, 0xbbbb));
    assert_eq!(r.0, Status::SUCCESS);
    assert_eq!(io_status(&mut b, WRITE), conflict, "B's write through g2");
    assert_eq!(
        io_status(&mut b, READ),
        Status::SUCCESS,
        "B's read through g2"
    );
    assert_eq!(
        io_status(&mut a, WRITE),
        Status::SUCCESS,
        "A's write through g1"
    );
    let t_cmds = t1.elapsed();
    let through_g1 = report(&mut a);
    let through_g2 = report(&mut b);
    assert_eq!(through_g1, through_g2, "report through g1 and g2");
    // GEN 2 (two registrations), Write Exclusive, two registrants, PTPL, holder A.
    assert_eq!(
        (through_g1[0], through_g1[4], through_g1[5], through_g1[9]),
        (2, 1, 2, 1)
    );
    assert_eq!(holder(&through_g1), Some((HOST_A.0, 0xaaaa)));
    let omap = String::from_utf8_lossy(&cluster.tool("rados", &["-p", "rbd", "ls"])).into_owned();
    assert!(
        omap.contains("it.reservations."),
        "reservation object in RADOS: {omap}"
    );

    // A waits for events on g1; B preempts A through g2.
    let aer = admin_a
        .submit(
            Sqe {
                opcode: admin_opcode::ASYNC_EVENT_REQUEST,
                ..Sqe::default()
            },
            DataOut::None,
        )
        .expect("AER");
    let t2 = Instant::now();
    let r = command(
        &mut b,
        RESERVATION_ACQUIRE,
        ACQUIRE_PREEMPT | 1 << 8,
        keys(0xbbbb, 0xaaaa),
    );
    let t_preempt = t2.elapsed();
    assert_eq!(r.0, Status::SUCCESS, "preempt through g2");
    // g2 completed the preempt only once g1 applied it: A is refused at once.
    assert_eq!(
        io_status(&mut a, WRITE),
        conflict,
        "A's write through g1 after the preempt"
    );
    assert_eq!(
        io_status(&mut b, WRITE),
        Status::SUCCESS,
        "B's write through g2"
    );
    let event = admin_a.wait(aer).expect("AER completion");
    // Type 6h (I/O command specific), information 00h, log page 80h.
    assert_eq!(event.cqe.dw0, 0x0080_0006, "AEN dw0 {:#x}", event.cqe.dw0);
    let page = admin_a.get_log_page(0x80, 1, 64, 0).expect("log 80h");
    assert_eq!(page[8], NOTICE_REGISTRATION_PREEMPTED, "log 80h type");
    assert_eq!(
        u32::from_le_bytes(page[12..16].try_into().unwrap()),
        1,
        "log 80h NSID"
    );
    let before = report(&mut b);
    assert_eq!(before, report(&mut a));
    assert_eq!((before[0], before[4], before[5]), (3, 1, 1));
    assert_eq!(holder(&before), Some((HOST_B.0, 0xbbbb)));

    // Every gateway killed, then both started again: the state (PTPL) is still there.
    for g in [&g1, &g2] {
        g.signal(Signal::SIGKILL);
    }
    drop((a, b, admin_a, _admin_b, g1, g2));
    let t3 = Instant::now();
    let (g1, a1) = gateway(&cluster, "g1", p1, (1, 999));
    let (g2, a2) = gateway(&cluster, "g2", p2, (1000, 1999));
    let t_restart = t3.elapsed();
    let (_admin_a, mut a) = host(a1, HOST_A);
    let (_admin_b, mut b) = host(a2, HOST_B);
    assert_eq!(
        report(&mut a),
        before,
        "report through g1 after kill -9 of both"
    );
    assert_eq!(
        report(&mut b),
        before,
        "report through g2 after kill -9 of both"
    );
    assert_eq!(io_status(&mut a, WRITE), conflict);
    assert_eq!(io_status(&mut b, WRITE), Status::SUCCESS);

    // Preempt and Abort through g2 of A registered again through g1: g1 drains its writes
    // on the namespace before it acknowledges, and A is refused at once.
    let r = command(&mut a, RESERVATION_REGISTER, 0, keys(0, 0xaaaa));
    assert_eq!(r.0, Status::SUCCESS);
    let t4 = Instant::now();
    let abort = ACQUIRE_PREEMPT_ABORT | 1 << 8;
    let r = command(&mut b, RESERVATION_ACQUIRE, abort, keys(0xbbbb, 0xaaaa));
    let t_abort = t4.elapsed();
    assert_eq!(r.0, Status::SUCCESS, "preempt and abort through g2");
    assert_eq!(io_status(&mut a, WRITE), conflict);
    let r = command(&mut a, RESERVATION_ACQUIRE, 1 << 8, keys(0xaaaa, 0));
    assert_eq!(r.0, conflict, "A's registration is gone");
    assert_eq!(report(&mut a), report(&mut b));
    // Every change was acknowledged by the other gateway within the lease.
    let log = g2.log();
    assert!(
        log.contains("reservation state shared through RADOS"),
        "g2's log:\n{log}"
    );
    assert!(
        !log.contains("not acknowledged by every gateway"),
        "g2's log:\n{log}"
    );

    // PTPL cleared (B registers again with the same key and CPTPL 10b). A restart of one
    // gateway while the other serves is no power loss of the group: the state stays. When
    // every gateway is gone, the first to open the namespace drops it (§8.19.10).
    let r = command(
        &mut b,
        RESERVATION_REGISTER,
        CPTPL_CLEAR << 30,
        keys(0, 0xbbbb),
    );
    assert_eq!(r.0, Status::SUCCESS);
    let kept = report(&mut b);
    assert_eq!((kept[4], kept[9]), (1, 0), "Write Exclusive, PTPL off");
    g1.signal(Signal::SIGKILL);
    drop((a, _admin_a, g1));
    let (g1, a1) = gateway(&cluster, "g1", p1, (1, 999));
    let (_admin_a, mut a) = host(a1, HOST_A);
    assert_eq!(report(&mut a), kept, "g1 restarted while g2 serves");
    for g in [&g1, &g2] {
        g.signal(Signal::SIGKILL);
    }
    drop((a, b, _admin_a, _admin_b, g1, g2));
    let t5 = Instant::now();
    let (_g1, a1) = gateway(&cluster, "g1", p1, (1, 999));
    let t_power_on = t5.elapsed();
    let (_g2, a2) = gateway(&cluster, "g2", p2, (1000, 1999));
    let (_admin_a, mut a) = host(a1, HOST_A);
    let (_admin_b, mut b) = host(a2, HOST_B);
    let empty = report(&mut a);
    assert_eq!(
        (empty[4], empty[5], empty[9]),
        (0, 0, 0),
        "state dropped at the group's power-on"
    );
    assert_eq!(report(&mut b), empty);
    assert_eq!(io_status(&mut a, WRITE), Status::SUCCESS);
    eprintln!(
        "group reservations: cluster + 2 gateways up {t_up:.1?}; register/acquire/register/IO \
         {t_cmds:.1?}; preempt through g2 (incl. g1's ack) {t_preempt:.1?}; restart of both \
         {t_restart:.1?}; preempt and abort through g2 {t_abort:.1?}; first gateway up after \
         every gateway died (PTPL off) {t_power_on:.1?}; total {:.1?}",
        t0.elapsed()
    );
}
