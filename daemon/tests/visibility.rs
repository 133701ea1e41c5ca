//! Per-host namespace visibility through the real binary: namespace 2 is shown to host A
//! only, so host B finds one namespace and gets Invalid Namespace on namespace 2; a SIGHUP
//! reload that shows namespace 2 to B raises Namespace Attribute Changed on B's controller
//! (Changed Namespace List: 2) and nothing on A's; `nvmfd ctl set-namespace-hosts` hides it
//! from B again, live.

mod fixture;

use std::net::SocketAddr;
use std::time::Duration;

use fixture::{free_port, serve, tcp_port, Daemon, TempDir};
use nix::sys::signal::Signal;
use nvme::spec::{admin_opcode, cns, lid, CNTLID_DYNAMIC};
use nvme::wire::identify::decode_active_ns_list;
use nvme::wire::log::ChangedNsList;
use nvme::wire::{Sqe, Status};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:vis";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-1111-4222-8333-000000000001";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-1111-4222-8333-000000000002";

fn config(dir: &TempDir, port: u16, ns2_hosts: &[&str]) -> String {
    let hosts: Vec<String> = ns2_hosts.iter().map(|h| format!("\"{h}\"")).collect();
    format!(
        "[global]\nreactors = 2\ncontrol_socket = \"{socket}\"\n{ports}\n[[subsystems]]\nnqn = \"{SUBNQN}\"\n\
         allowed_hosts = [\"{HOST_A}\", \"{HOST_B}\"]\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"1M\"\n\
         [[subsystems.namespaces]]\nnsid = 2\nram_size = \"1M\"\nhosts = [{}]\n",
        hosts.join(", "),
        ports = tcp_port(1, port),
        socket = dir.join("control.sock").display(),
    )
}

/// Admin and I/O queue of one controller of `hostnqn`.
fn host(address: SocketAddr, hostnqn: &str, hostid: u8) -> (Client, Client) {
    let connect = |qid, cntlid| {
        fixture::connect(
            address,
            ClientOptions::default(),
            (qid, cntlid, 30_000),
            (SUBNQN, hostnqn, [hostid; 16]),
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

fn active(admin: &mut Client) -> Vec<u32> {
    decode_active_ns_list(&admin.identify(cns::ACTIVE_NAMESPACES, 0).unwrap()).unwrap()
}

fn read(io: &mut Client, nsid: u32) -> Status {
    io.execute(Client::read_sqe(nsid, 0, 1), DataOut::Read(512))
        .unwrap()
        .cqe
        .status
}

fn changed(admin: &mut Client) -> Vec<u32> {
    let page = admin
        .get_log_page(lid::CHANGED_NS, u32::MAX, 4096, 0)
        .unwrap();
    ChangedNsList::decode(&page).unwrap().nsids
}

fn aer(admin: &mut Client) -> u16 {
    let sqe = Sqe {
        opcode: admin_opcode::ASYNC_EVENT_REQUEST,
        ..Sqe::default()
    };
    admin.submit(sqe, DataOut::None).unwrap()
}

#[test]
fn hidden_namespace_and_reload_notice_to_the_host_whose_view_changed() {
    let dir = TempDir::new("visibility");
    let port = free_port();
    let config_path = dir.write_config(&config(&dir, port, &[HOST_A]));
    let mut daemon = Daemon::spawn(serve(&config_path));
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    daemon.wait_for_listener(address, Duration::from_secs(10));

    let (mut a, mut a_io) = host(address, HOST_A, 0xa1);
    let (mut b, mut b_io) = host(address, HOST_B, 0xb2);
    assert_eq!(active(&mut a), [1, 2]);
    assert_eq!(active(&mut b), [1]);
    assert_eq!(read(&mut a_io, 2), Status::SUCCESS);
    assert_eq!(read(&mut b_io, 2), Status::INVALID_NAMESPACE.with_dnr());
    // Identify Namespace of the hidden NSID: zero-filled, as for an inactive NSID.
    let id = b.identify(cns::NAMESPACE, 2).unwrap();
    assert!(id.iter().all(|&x| x == 0));

    let a_aer = aer(&mut a);
    let b_aer = aer(&mut b);
    std::fs::write(&config_path, config(&dir, port, &[HOST_A, HOST_B])).unwrap();
    daemon.signal(Signal::SIGHUP);
    let event = b.wait(b_aer).expect("B's AER completes");
    assert_eq!(event.cqe.status, Status::SUCCESS);
    assert_eq!(
        event.cqe.dw0, 0x04_00_02,
        "notice, NS attribute changed, log 04h"
    );
    assert_eq!(changed(&mut b), [2]);
    assert_eq!(active(&mut b), [1, 2]);
    assert_eq!(read(&mut b_io, 2), Status::SUCCESS);

    // A's view did not change: nothing in its log, and its AER is still held (Abort finds
    // it: DW0 bit 0 clear).
    assert!(changed(&mut a).is_empty());
    let abort = Sqe {
        opcode: admin_opcode::ABORT,
        cdw10: u32::from(a_aer) << 16,
        ..Sqe::default()
    };
    let aborted = a.execute(abort, DataOut::None).unwrap();
    assert_eq!(aborted.cqe.status, Status::SUCCESS);
    assert_eq!(aborted.cqe.dw0 & 1, 0, "A's AER was still outstanding");
    assert_eq!(a.wait(a_aer).unwrap().cqe.status, Status::ABORT_REQUESTED);
    let log = daemon
        .wait_log(
            &["shown to other hosts [(\"nqn.2026-12.dev.nvmfd:vis\", 2)]"],
            Duration::from_secs(5),
        )
        .unwrap_or_else(|log| panic!("reload summary missing: {log}"));
    assert!(log.contains("configuration reloaded"));

    // Hidden from B again through the control socket: B hears of it, loses it.
    let b_aer = aer(&mut b);
    let ctl = fixture::nvmfd()
        .arg("ctl")
        .arg("--socket")
        .arg(dir.join("control.sock"))
        .args(["set-namespace-hosts", SUBNQN, "2", "--host", HOST_A])
        .output()
        .unwrap();
    assert!(ctl.status.success(), "{ctl:?}");
    assert_eq!(b.wait(b_aer).unwrap().cqe.dw0, 0x04_00_02);
    assert_eq!(changed(&mut b), [2]);
    assert_eq!(active(&mut b), [1]);
    assert_eq!(read(&mut b_io, 2), Status::INVALID_NAMESPACE.with_dnr());
    assert!(changed(&mut a).is_empty());
    assert_eq!(read(&mut a_io, 2), Status::SUCCESS);

    let (status, _, stderr) = daemon.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");
}
