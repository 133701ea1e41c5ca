//! Abort (NVMe Base 2.0 §5.1) through the real binary and the host-side client: a write whose
//! data the host withholds is aborted from the admin queue (another connection, possibly
//! another reactor), completes once with Abort Requested, and the data the host sends late
//! for it is dropped; an Abort of a command that is not outstanding says "not aborted".

mod fixture;

use std::net::SocketAddr;
use std::time::Duration;

use fixture::{free_port, one_subsystem, serve, Daemon, TempDir};
use nvme::spec::{admin_opcode, CNTLID_DYNAMIC};
use nvme::wire::{SglDescriptor, Sqe, Status};
use transport::client::{Client, ClientOptions, DataOut};
use transport::tcp::pdu::{DataHeader, PduHeader};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:abort";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-444455558888";
const BLOCK: u32 = 512;

fn connect(address: SocketAddr, qid: u16, cntlid: u16) -> (Client, u16) {
    fixture::connect(
        address,
        ClientOptions::default(),
        (qid, cntlid, 30_000),
        (SUBNQN, HOSTNQN, [8; 16]),
    )
    .expect("Connect")
}

fn abort_sqe(sqid: u16, cid: u16) -> Sqe {
    Sqe {
        opcode: admin_opcode::ABORT,
        cdw10: u32::from(sqid) | u32::from(cid) << 16,
        ..Sqe::default()
    }
}

#[test]
fn abort_completes_a_write_waiting_for_its_data_once() {
    let dir = TempDir::new("abort");
    let port = free_port();
    let namespaces = format!(
        "[[subsystems.namespaces]]\nnsid = 1\npath = \"{}\"\nsize = \"1M\"\n",
        dir.join("ns1.img").display()
    );
    let config = one_subsystem(port, "", (SUBNQN, HOSTNQN), &namespaces);
    let mut daemon = Daemon::spawn(serve(&dir.write_config(&config)));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));
    let (mut admin, cntlid) = connect(address, 0, CNTLID_DYNAMIC);
    admin
        .enable_controller(Duration::from_secs(5))
        .expect("CC.EN");
    let (mut q, _) = connect(address, 1, cntlid);
    let before = q.read(1, 0, 8, BLOCK).expect("Read");

    // A 4 KiB write by R2T whose data the host keeps back.
    let mut w = Client::write_sqe(1, 0, 8, false);
    w.cid = 0x77;
    w.flags = (w.flags & 0x3f) | 0x40;
    w.dptr = SglDescriptor::transport_data_block(4096);
    q.submit_exact(w, &[], 0).expect("Write capsule");
    let r2t = match q.recv_pdu().expect("R2T").header {
        PduHeader::R2T(r2t) => r2t,
        other => panic!("expected an R2T, got {other:?}"),
    };
    assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (0x77, 0, 4096));

    // Abort from the admin queue: the I/O queue's connection completes the write.
    let c = admin
        .execute(abort_sqe(1, 0x77), DataOut::None)
        .expect("Abort");
    assert_eq!(c.cqe.status, Status::SUCCESS);
    assert_eq!(c.cqe.dw0 & 1, 0, "aborted");
    let done = q.wait(0x77).expect("the write's completion");
    assert_eq!(done.cqe.status, Status::ABORT_REQUESTED);

    // The host's late answer to the R2T is dropped: nothing is written, nothing completes
    // twice (the client fails on a completion for a CID it does not wait for), the
    // connection stays up.
    let late = q.encode(
        &PduHeader::H2CData {
            hdr: DataHeader {
                cccid: 0x77,
                ttag: r2t.ttag,
                datao: 0,
                datal: 4096,
            },
            last: true,
        },
        &vec![0xa5; 4096],
    );
    q.send_raw(&late).expect("late H2CData");
    let after = q.read(1, 0, 8, BLOCK).expect("Read after the Abort");
    assert!(after == before, "the aborted write changed the namespace");
    q.write(1, 0, vec![0x5a; 4096], BLOCK).expect("Write");
    assert_eq!(q.read(1, 0, 8, BLOCK).expect("Read"), vec![0x5a; 4096]);

    // Nothing outstanding with that CID, a queue that does not exist: not aborted.
    for (sqid, cid) in [(1, 0x77), (1, 0x1234), (5, 1), (0, 0x4321)] {
        let c = admin
            .execute(abort_sqe(sqid, cid), DataOut::None)
            .expect("Abort");
        assert_eq!(c.cqe.status, Status::SUCCESS, "Abort of {sqid}/{cid:#x}");
        assert_eq!(
            c.cqe.dw0 & 1,
            1,
            "Abort of {sqid}/{cid:#x} says not aborted"
        );
    }
    daemon.terminate();
}
