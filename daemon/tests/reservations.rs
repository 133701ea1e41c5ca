//! Reservations with Persist Through Power Loss through the real binary: two hosts register
//! (one with CPTPL = 11b), one acquires Write Exclusive; nvmfd is killed with SIGKILL and
//! started again on the same configuration; the report, and the conflict on the other host's
//! write, are the same as before the kill.

mod fixture;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fixture::{free_port, one_subsystem, serve, Daemon, TempDir};
use nix::sys::signal::Signal;
use nvme::spec::nvm_opcode::{RESERVATION_ACQUIRE, RESERVATION_REGISTER, RESERVATION_REPORT};
use nvme::spec::resv::{ACQUIRE_PREEMPT_ABORT, CPTPL_SET, RESCAP_PTPL};
use nvme::spec::{admin_opcode, cns, fid, CNTLID_DYNAMIC};
use nvme::wire::{Sqe, Status};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:resv";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-777755556666";
const HOST_A: [u8; 16] = [0xa1; 16];
const HOST_B: [u8; 16] = [0xb2; 16];

fn start(dir: &TempDir, port: u16) -> (Daemon, SocketAddr) {
    start_with(dir, port, "")
}

/// [`start`] with more lines for namespace 1.
fn start_with(dir: &TempDir, port: u16, ns_lines: &str) -> (Daemon, SocketAddr) {
    let global = format!(
        "state_dir = \"{}\"\ncontrol_socket = \"{}\"",
        dir.join("state").display(),
        dir.join("control.sock").display()
    );
    let ns = format!("[[subsystems.namespaces]]\nnsid = 1\nram_size = \"4M\"\n{ns_lines}");
    let config = one_subsystem(port, &global, (SUBNQN, HOSTNQN), &ns);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    (daemon, address)
}

/// Admin and I/O queue of one controller of host `hostid`.
fn host(address: SocketAddr, hostid: [u8; 16]) -> (Client, Client) {
    let connect = |qid, cntlid| {
        fixture::connect(
            address,
            ClientOptions::default(),
            (qid, cntlid, 30_000),
            (SUBNQN, HOSTNQN, hostid),
        )
        .expect("Connect")
    };
    let (mut admin, cntlid) = connect(0, CNTLID_DYNAMIC);
    admin
        .enable_controller(Duration::from_secs(5))
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

fn report(io: &mut Client) -> Vec<u8> {
    let (st, page) = command(io, RESERVATION_REPORT, 4096 / 4 - 1, DataOut::Read(4096));
    assert_eq!(st, Status::SUCCESS, "report");
    page
}

fn write_status(io: &mut Client) -> Status {
    let w = Client::write_sqe(1, 0, 1, false);
    io.execute(w, DataOut::Write(vec![0x5a; 512]))
        .expect("write")
        .cqe
        .status
}

#[test]
fn ptpl_reservation_survives_kill_9() {
    let dir = TempDir::new("resv");
    let port = free_port();
    let (daemon, address) = start(&dir, port);
    let (mut admin_a, mut a) = host(address, HOST_A);
    let (_admin_b, mut b) = host(address, HOST_B);
    let ns = admin_a.identify(cns::NAMESPACE, 1).expect("Identify");
    assert_eq!(ns[31], 0xff, "RESCAP: PTPL, six types, IEKEY");
    assert_eq!(ns[31] & RESCAP_PTPL, RESCAP_PTPL);

    let register_ptpl = CPTPL_SET << 30;
    let r = command(&mut a, RESERVATION_REGISTER, register_ptpl, keys(0, 0xaaaa));
    assert_eq!(r.0, Status::SUCCESS);
    let r = command(&mut b, RESERVATION_REGISTER, 0, keys(0, 0xbbbb));
    assert_eq!(r.0, Status::SUCCESS);
    let r = command(&mut a, RESERVATION_ACQUIRE, 1 << 8, keys(0xaaaa, 0));
    assert_eq!(r.0, Status::SUCCESS);
    // Get Features Reservation Persistence: PTPL set.
    let get = Sqe {
        opcode: admin_opcode::GET_FEATURES,
        nsid: 1,
        cdw10: fid::RESERVATION_PERSISTENCE as u32,
        ..Sqe::default()
    };
    let done = admin_a.execute(get, DataOut::None).expect("Get Features");
    assert_eq!((done.cqe.status, done.cqe.dw0 & 1), (Status::SUCCESS, 1));
    let conflict = Status::RESERVATION_CONFLICT.with_dnr();
    assert_eq!(write_status(&mut b), conflict);
    let before = report(&mut b);
    assert_eq!((before[4], before[5], before[9]), (1, 2, 1));

    daemon.signal(Signal::SIGKILL);
    drop((admin_a, a, b, _admin_b, daemon));
    let (_daemon, address) = start(&dir, port);

    let (_admin_b, mut b) = host(address, HOST_B);
    let after = report(&mut b);
    assert_eq!(
        after[..64 + 2 * 64],
        before[..64 + 2 * 64],
        "report after kill -9"
    );
    let holder = after[64..]
        .chunks_exact(64)
        .take(2)
        .find(|e| e[2] & 1 == 1)
        .expect("a holder");
    assert_eq!(
        (&holder[16..32], &holder[8..16]),
        (&HOST_A[..], &0xaaaau64.to_le_bytes()[..])
    );
    assert_eq!(write_status(&mut b), conflict);
    let (_admin_a, mut a) = host(address, HOST_A);
    assert_eq!(write_status(&mut a), Status::SUCCESS);
}

/// How long writes to LBAs 0..8 of namespace 1 wait (an injected fault) in the Preempt and
/// Abort tests: long enough to be in flight when the other host preempts.
const SLOW_WRITE: Duration = Duration::from_millis(1500);

/// Host A holds Write Exclusive and has a write in flight (delayed by the fault backend) when
/// host B preempts it with Preempt and Abort: B's command completes only after A's write did
/// (no write of the fenced host may land after the fence), A's write itself succeeds (it was
/// admitted before the preemption), and A's next write is a reservation conflict. `ptpl`: A
/// registered with Persist Through Power Loss, so the change runs on the persistence thread
/// and the drain starts from the command's completion.
fn preempt_and_abort_waits_for_writes_in_flight(ptpl: bool) {
    let dir = TempDir::new(if ptpl { "resv-pa-ptpl" } else { "resv-pa" });
    let port = free_port();
    let faults = format!(
        "faults = [{{ slba = 0, blocks = 8, on = \"write\", latency_ms = {} }}]\n",
        SLOW_WRITE.as_millis()
    );
    let (_daemon, address) = start_with(&dir, port, &faults);
    let (_admin_a, mut a) = host(address, HOST_A);
    let (_admin_b, mut b) = host(address, HOST_B);
    let cptpl = if ptpl { CPTPL_SET << 30 } else { 0 };
    let r = command(&mut a, RESERVATION_REGISTER, cptpl, keys(0, 0xaaaa));
    assert_eq!(r.0, Status::SUCCESS);
    let r = command(&mut b, RESERVATION_REGISTER, 0, keys(0, 0xbbbb));
    assert_eq!(r.0, Status::SUCCESS);
    let write_exclusive = 1 << 8;
    let r = command(
        &mut a,
        RESERVATION_ACQUIRE,
        write_exclusive,
        keys(0xaaaa, 0),
    );
    assert_eq!(r.0, Status::SUCCESS);

    let (waited, a_status, b_status) = std::thread::scope(|scope| {
        let slow = scope.spawn(|| {
            let w = Client::write_sqe(1, 0, 8, false);
            a.execute(w, DataOut::Write(vec![0xa5; 4096]))
                .expect("write")
                .cqe
                .status
        });
        // Let A's write reach the target and start waiting.
        let head_start = Duration::from_millis(300);
        std::thread::sleep(head_start);
        let t0 = Instant::now();
        let preempt_abort = ACQUIRE_PREEMPT_ABORT | write_exclusive;
        let r = command(
            &mut b,
            RESERVATION_ACQUIRE,
            preempt_abort,
            keys(0xbbbb, 0xaaaa),
        );
        let waited = t0.elapsed();
        // A's write ends SLOW_WRITE after it arrived, about `head_start` before t0 (the two
        // answers travel on different sockets, so which client reads its own first says
        // nothing about the order at the target).
        assert!(
            waited >= SLOW_WRITE - head_start - Duration::from_millis(150),
            "Preempt and Abort completed after {waited:?}, while A's write was in flight"
        );
        (waited, slow.join().unwrap(), r.0)
    });
    eprintln!("Preempt and Abort waited {waited:?} for the write in flight");
    assert_eq!(b_status, Status::SUCCESS, "Preempt and Abort");
    assert_eq!(
        a_status,
        Status::SUCCESS,
        "A's write was admitted before the preemption"
    );
    let conflict = Status::RESERVATION_CONFLICT.with_dnr();
    assert_eq!(write_status(&mut a), conflict, "A is fenced");
    assert_eq!(
        write_status(&mut b),
        Status::SUCCESS,
        "B holds the reservation"
    );
    let page = report(&mut b);
    assert_eq!(
        (page[4], page[5]),
        (1, 1),
        "Write Exclusive, one registrant (B)"
    );
}

#[test]
fn preempt_and_abort_waits_for_writes_in_flight_inline() {
    preempt_and_abort_waits_for_writes_in_flight(false);
}

#[test]
fn preempt_and_abort_waits_for_writes_in_flight_with_ptpl() {
    preempt_and_abort_waits_for_writes_in_flight(true);
}
