//! Copy and Verify (NVM Command Set 1.0 §3.3.1, §3.3.5) through the real binary and the
//! host-side client: ranges copied on a file namespace (every step through a reactor's
//! io_uring) read back as the sources; bad formats, too many or too long ranges and ranges
//! outside the namespace get their statuses; Verify of a range whose read fails (fault
//! backend, EIO) reports the media error.

mod fixture;

use std::net::SocketAddr;
use std::time::Duration;

use fixture::{free_port, one_subsystem, serve, Daemon, TempDir};
use nvme::spec::{cns, nvm_opcode, CNTLID_DYNAMIC};
use nvme::wire::copy::encode_ranges;
use nvme::wire::identify::{ctrl_bits, IdentifyController, IdentifyNamespace};
use nvme::wire::{Sqe, Status};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:copy";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-444455559999";
const BLOCK: u32 = 512;
/// Namespace 1: a 1 MiB file. Namespace 2: 1 MiB of RAM whose reads of LBAs 16..24 fail.
const FILE_NS: u32 = 1;
const FAULT_NS: u32 = 2;

fn connect(address: SocketAddr, qid: u16, cntlid: u16) -> (Client, u16) {
    fixture::connect(
        address,
        ClientOptions::default(),
        (qid, cntlid, 30_000),
        (SUBNQN, HOSTNQN, [6; 16]),
    )
    .expect("Connect")
}

fn pattern(blocks: u32, seed: u8) -> Vec<u8> {
    (0..blocks as usize * BLOCK as usize)
        .map(|i| (i / 7) as u8 ^ seed)
        .collect()
}

/// A command and its data.
type Command = (Sqe, Vec<u8>);

/// A Copy of `ranges` (SLBA, blocks) to `sdlba`, descriptor format `format`, `nr` ranges
/// announced (0's based; normally `ranges.len() - 1`).
fn copy_cmd(nsid: u32, sdlba: u64, ranges: &[(u64, u32)], format: u32, nr: u32) -> Command {
    let list = encode_ranges(ranges);
    let sqe = Sqe {
        opcode: nvm_opcode::COPY,
        nsid,
        cdw10: sdlba as u32,
        cdw11: (sdlba >> 32) as u32,
        cdw12: nr | format << 8,
        ..Sqe::default()
    };
    (sqe, list)
}

fn copy(q: &mut Client, sdlba: u64, ranges: &[(u64, u32)]) -> Status {
    let (sqe, list) = copy_cmd(FILE_NS, sdlba, ranges, 0, ranges.len() as u32 - 1);
    q.execute(sqe, DataOut::Write(list))
        .expect("Copy")
        .cqe
        .status
}

fn verify(q: &mut Client, nsid: u32, slba: u64, blocks: u32) -> Status {
    let sqe = Sqe {
        opcode: nvm_opcode::VERIFY,
        nsid,
        cdw10: slba as u32,
        cdw11: (slba >> 32) as u32,
        cdw12: blocks - 1,
        ..Sqe::default()
    };
    q.execute(sqe, DataOut::None).expect("Verify").cqe.status
}

#[test]
fn copy_and_verify_move_and_check_data() {
    let dir = TempDir::new("copy");
    let port = free_port();
    let namespaces = format!(
        "[[subsystems.namespaces]]\nnsid = {FILE_NS}\npath = \"{}\"\nsize = \"1M\"\n\
         [[subsystems.namespaces]]\nnsid = {FAULT_NS}\nram_size = \"1M\"\n\
         faults = [{{ slba = 16, blocks = 8, on = \"read\", error = \"eio\" }}]\n",
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
    let id = IdentifyController::decode(&admin.identify(cns::CONTROLLER, 0).unwrap()).unwrap();
    assert_ne!(id.oncs & ctrl_bits::ONCS_COPY, 0, "ONCS Copy");
    assert_ne!(id.oncs & ctrl_bits::ONCS_VERIFY, 0, "ONCS Verify");
    assert_eq!(id.ocfs, ctrl_bits::OCFS_FORMAT_0);
    let ns = IdentifyNamespace::decode(&admin.identify(cns::NAMESPACE, FILE_NS).unwrap()).unwrap();
    assert_eq!(ns.msrc, 127);
    assert_eq!((ns.mcl, ns.mssrl), (2048, 2048), "1 MiB of 512-byte blocks");
    let (mut q, _) = connect(address, 1, cntlid);

    // Two sources, one of them longer than a single backend step would need, copied behind
    // each other; then the copy is read back.
    let (a, b) = (pattern(40, 0x11), pattern(5, 0x22));
    q.write(FILE_NS, 0, a.clone(), BLOCK).expect("Write");
    q.write(FILE_NS, 100, b.clone(), BLOCK).expect("Write");
    assert_eq!(copy(&mut q, 1000, &[(0, 40), (100, 5)]), Status::SUCCESS);
    let back = q.read(FILE_NS, 1000, 45, BLOCK).expect("Read");
    assert!(
        back[..a.len()] == a[..] && back[a.len()..] == b[..],
        "copied data"
    );
    // Overlapping source and destination: the sources are read before anything is written.
    assert_eq!(copy(&mut q, 20, &[(0, 40)]), Status::SUCCESS);
    assert!(
        q.read(FILE_NS, 20, 40, BLOCK).expect("Read") == a,
        "overlapping copy"
    );
    // The largest copy MCL allows, from 128 ranges (MSRC).
    let ranges: Vec<(u64, u32)> = (0..128).map(|i| (i * 16, 16)).collect();
    assert_eq!(copy(&mut q, 0, &ranges), Status::SUCCESS);
    assert!(
        verify(&mut q, FILE_NS, 0, 2048) == Status::SUCCESS,
        "Verify of 1 MiB"
    );

    // Refusals (NVM Command Set 1.0 §3.3.1.1).
    let cases: [(&str, Command, Status); 5] = [
        (
            "format 1",
            copy_cmd(FILE_NS, 0, &[(0, 1)], 1, 0),
            Status::INVALID_FIELD.with_dnr(),
        ),
        (
            "129 ranges",
            copy_cmd(FILE_NS, 0, &[(0, 1); 129], 0, 128),
            Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(),
        ),
        (
            "a range beyond MSSRL",
            copy_cmd(FILE_NS, 0, &[(0, 2049)], 0, 0),
            Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(),
        ),
        (
            "a source beyond the namespace",
            copy_cmd(FILE_NS, 0, &[(2040, 9)], 0, 0),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            "a destination beyond the namespace",
            copy_cmd(FILE_NS, 2047, &[(0, 2)], 0, 0),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
    ];
    for (what, (sqe, list), want) in cases {
        let c = q.execute(sqe, DataOut::Write(list)).expect("Copy");
        assert_eq!(c.cqe.status, want, "{what}");
    }
    let mut over = copy_cmd(FILE_NS, 0, &[(0, 1024); 3], 0, 2);
    let c = q
        .execute(over.0, DataOut::Write(std::mem::take(&mut over.1)))
        .unwrap();
    assert_eq!(
        c.cqe.status,
        Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(),
        "beyond MCL"
    );
    // Range entries shorter than NR announces.
    let (sqe, mut list) = copy_cmd(FILE_NS, 0, &[(0, 1), (1, 1)], 0, 1);
    list.truncate(32);
    let c = q.execute(sqe, DataOut::Write(list)).unwrap();
    assert_eq!(c.cqe.status, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    for nsid in [0, 0xffff_ffff, 9] {
        let (sqe, list) = copy_cmd(nsid, 0, &[(0, 1)], 0, 0);
        let c = q.execute(sqe, DataOut::Write(list)).unwrap();
        assert_eq!(
            c.cqe.status,
            Status::INVALID_NAMESPACE.with_dnr(),
            "Copy on nsid {nsid:#x}"
        );
        assert_eq!(
            verify(&mut q, nsid, 0, 1),
            Status::INVALID_NAMESPACE.with_dnr()
        );
    }

    // Verify: a readable range, one that touches the failing LBAs, one outside.
    assert_eq!(verify(&mut q, FAULT_NS, 0, 16), Status::SUCCESS);
    assert_eq!(
        verify(&mut q, FAULT_NS, 10, 8),
        Status::UNRECOVERED_READ_ERROR
    );
    assert_eq!(
        verify(&mut q, FAULT_NS, 2047, 2),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    daemon.terminate();
}
