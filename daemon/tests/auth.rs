//! In-band authentication (DH-HMAC-CHAP) against the real binary over loopback NVMe/TCP, with
//! the Rust client as the host and nvmfd-auth's host role computing its messages: a keyed host
//! is asked to authenticate every queue (AUTHREQ.ATR), gets Authentication Required before it,
//! authenticates both ways; `nvmfd ctl set-host-key` rotates the key live; `remove-host`
//! disconnects it; a key file others may read is refused by check-config. Failures are counted
//! in `ctl status` and on the metrics endpoint.

mod fixture;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fixture::{free_port, serve, tcp_port, Daemon, TempDir};
use nvme::auth::CONNECT_AUTHREQ_ATR;
use nvme::spec::fctype;
use nvme::wire::fabrics::{ConnectCommand, ConnectData};
use nvme::wire::{Sqe, Status};
use nvmfd_auth::host::{Host, HostError};
use nvmfd_auth::wire;
use nvmfd_auth::{FailureReason, HashId, Secret};
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:auth";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-1111-4222-8333-444455556666";
const HOSTID: [u8; 16] = [0x5a; 16];
const WAIT: Duration = Duration::from_secs(10);
const AL: u32 = 4096;

struct Target {
    process: Daemon,
    socket: PathBuf,
    address: SocketAddr,
    metrics: SocketAddr,
    dir: TempDir,
}

fn private_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn start(name: &str, host_key: &Secret, ctrl_key: &Secret) -> Target {
    let dir = TempDir::new(&format!("auth-{name}"));
    let socket = dir.join("control.sock");
    let key_file = dir.join("host.key");
    private_file(&key_file, &host_key.to_interchange());
    let port = free_port();
    let metrics_port = free_port();
    let config = format!(
        "[global]\nreactors = 2\ncontrol_socket = \"{socket}\"\n{ports}\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\
         [[subsystems]]\nnqn = \"{SUBNQN}\"\n\
         [[subsystems.hosts]]\nnqn = \"{HOSTNQN}\"\ndhchap_key_file = \"{key}\"\n\
         dhchap_ctrl_key = \"{ctrl}\"\ndhchap_dhgroups = [\"ffdhe2048\", \"null\"]\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"4M\"\n",
        socket = socket.display(),
        ports = tcp_port(1, port),
        key = key_file.display(),
        ctrl = &*ctrl_key.to_interchange(),
    );
    let path = dir.write_config(&config);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut process = Daemon::spawn(serve(&path));
    let address = ([127, 0, 0, 1], port).into();
    process.wait_for_listener(address, WAIT);
    let metrics = ([127, 0, 0, 1], metrics_port).into();
    process.wait_for_listener(metrics, WAIT);
    process.wait_until("control socket", WAIT, || socket.exists());
    Target {
        process,
        socket,
        address,
        metrics,
        dir,
    }
}

impl Target {
    /// The metrics endpoint's body.
    fn scrape(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).expect("connect to the metrics endpoint");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").expect("HTTP head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_owned()
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        fixture::nvmfd()
            .arg("ctl")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A connected queue; returns the client and the Connect CQE DW0.
    fn connect(&self, qid: u16, cntlid: u16) -> (Client, u32) {
        let opts = ClientOptions {
            timeout: WAIT,
            ..ClientOptions::default()
        };
        let mut c = Client::connect(self.address, opts).expect("ICReq");
        let r = c
            .fabrics_connect_raw(
                ConnectCommand {
                    recfmt: 0,
                    qid,
                    sqsize: 31,
                    cattr: 0,
                    kato: if qid == 0 { 30_000 } else { 0 },
                },
                &ConnectData {
                    hostid: HOSTID,
                    cntlid,
                    subnqn: SUBNQN.into(),
                    hostnqn: HOSTNQN.into(),
                },
            )
            .expect("Connect");
        assert_eq!(r.cqe.status, Status::SUCCESS, "Connect");
        (c, r.cqe.dw0)
    }
}

fn auth_sqe(fct: u8, length: u32) -> Sqe {
    Sqe {
        opcode: nvme::spec::FABRICS_OPCODE,
        flags: 0x40,
        nsid: u32::from(fct),
        cdw10: u32::from_le_bytes([0, wire::SPSP0_AUTH, wire::SPSP1_AUTH, wire::SECP_AUTH]),
        cdw11: length,
        ..Sqe::default()
    }
}

fn send(c: &mut Client, payload: Vec<u8>) {
    let sqe = auth_sqe(fctype::AUTHENTICATION_SEND, payload.len() as u32);
    let r = c.execute(sqe, DataOut::Write(payload)).expect("Auth Send");
    assert_eq!(r.cqe.status, Status::SUCCESS, "Authentication Send");
}

fn receive(c: &mut Client) -> Vec<u8> {
    let sqe = auth_sqe(fctype::AUTHENTICATION_RECEIVE, AL);
    let r = c.execute(sqe, DataOut::Read(AL)).expect("Auth Receive");
    assert_eq!(r.cqe.status, Status::SUCCESS, "Authentication Receive");
    r.data
}

/// One DH-HMAC-CHAP transaction over the wire.
fn authenticate(c: &mut Client, host: &mut Host, tid: u16) -> Result<(), HostError> {
    send(c, host.negotiate(tid));
    let reply = host.reply(&receive(c))?;
    send(c, reply);
    match host.success1(&receive(c)) {
        Ok(Some(success2)) => send(c, success2),
        Ok(None) => {}
        Err(e @ HostError::ControllerResponse) => {
            send(c, host.failure2(FailureReason::Failed as u8));
            return Err(e);
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

fn identify_status(c: &mut Client) -> Status {
    let sqe = Sqe {
        opcode: 0x06,
        flags: 0x40,
        cdw10: 1,
        dptr: nvme::wire::SglDescriptor::transport_data_block(0),
        ..Sqe::default()
    };
    c.execute(sqe, DataOut::Read(4096))
        .expect("Identify")
        .cqe
        .status
}

#[test]
fn keyed_host_authenticates_every_queue_and_keys_rotate_live() {
    let hk = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let ck = Secret::generate(Some(HashId::Sha512), 64).unwrap();
    let t = start("rotate", &hk, &ck);
    let (mut admin, dw0) = t.connect(0, 0xffff);
    assert_eq!(
        dw0 & CONNECT_AUTHREQ_ATR,
        CONNECT_AUTHREQ_ATR,
        "AUTHREQ.ATR"
    );
    let cntlid = dw0 as u16;
    admin
        .enable_controller(WAIT)
        .expect("CC.EN before authentication");
    assert_eq!(
        identify_status(&mut admin),
        Status::AUTHENTICATION_REQUIRED.with_dnr()
    );
    let mut host = Host::new(hk.clone(), Some(ck.clone()), HOSTNQN, SUBNQN);
    authenticate(&mut admin, &mut host, 1).expect("bidirectional");
    assert_eq!(identify_status(&mut admin), Status::SUCCESS);

    // An I/O queue authenticates on its own before it reads.
    admin
        .set_features(0x07, 0x0000_0000)
        .expect("one I/O queue");
    let (mut io, dw0) = t.connect(1, cntlid);
    assert_eq!(dw0, u32::from(cntlid) | CONNECT_AUTHREQ_ATR);
    let read = Client::read_sqe(1, 0, 1);
    let r = io.execute(read, DataOut::Read(512)).unwrap();
    assert_eq!(r.cqe.status, Status::AUTHENTICATION_REQUIRED.with_dnr());
    let mut uni = Host::new(hk.clone(), None, HOSTNQN, SUBNQN);
    authenticate(&mut io, &mut uni, 2).expect("unidirectional");
    let r = io
        .execute(Client::read_sqe(1, 0, 1), DataOut::Read(512))
        .unwrap();
    assert_eq!(r.cqe.status, Status::SUCCESS);

    // A wrong controller key on the host: R2 does not verify, the host ends the transaction.
    let mut impostor_check = Host::new(
        hk.clone(),
        Some(Secret::generate(None, 32).unwrap()),
        HOSTNQN,
        SUBNQN,
    );
    assert!(matches!(
        authenticate(&mut admin, &mut impostor_check, 3),
        Err(HostError::ControllerResponse)
    ));
    authenticate(&mut admin, &mut host, 4).expect("again");

    // Rotate the host key live through the control socket (a new private key file).
    let new = Secret::generate(None, 48).unwrap();
    let new_file = t.dir.join("host-new.key");
    private_file(&new_file, &new.to_interchange());
    let out = t.ctl(&[
        "set-host-key",
        SUBNQN,
        HOSTNQN,
        "--key-file",
        new_file.to_str().unwrap(),
        "--ctrl-key",
        &ck.to_interchange(),
    ]);
    assert!(out.status.success(), "{out:?}");
    // Live queues keep working; the next transaction needs the new key.
    let r = io
        .execute(Client::read_sqe(1, 0, 1), DataOut::Read(512))
        .unwrap();
    assert_eq!(r.cqe.status, Status::SUCCESS);
    match authenticate(&mut io, &mut uni, 5) {
        Err(HostError::Failure1(e)) => assert_eq!(e, FailureReason::Failed as u8),
        other => panic!("old key after rotation: {other:?}"),
    }
    let mut rotated = Host::new(new.clone(), Some(ck.clone()), HOSTNQN, SUBNQN);
    authenticate(&mut io, &mut rotated, 6).expect("new key");
    authenticate(&mut admin, &mut rotated, 7).expect("new key on the admin queue");
    let status = t.ctl(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("failed authentications: 2"), "{status}");
    let scrape = t.scrape();
    assert!(
        scrape.contains("\nnvmfd_auth_failures_total 2\n"),
        "the endpoint counts the same two failures:\n{scrape}"
    );
    let log = t.process.log();
    assert!(
        log.contains("authentication failed") && log.contains(HOSTNQN) && log.contains("127.0.0.1"),
        "failures are logged with host NQN and address:\n{log}"
    );
    assert!(
        !log.contains(&*new.to_interchange()),
        "a secret reached the log"
    );

    // Removing the host disconnects its controller.
    let out = t.ctl(&["remove-host", SUBNQN, HOSTNQN]);
    assert!(out.status.success(), "{out:?}");
    admin.expect_close().expect("admin queue closed");
}

#[test]
fn check_config_refuses_a_key_file_others_can_read() {
    let dir = TempDir::new("auth-keyfile");
    let key_file = dir.join("host.key");
    private_file(
        &key_file,
        &Secret::generate(None, 32).unwrap().to_interchange(),
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.write_config(&format!(
        "{}\n[[subsystems]]\nnqn = \"{SUBNQN}\"\n[[subsystems.hosts]]\nnqn = \"{HOSTNQN}\"\n\
         dhchap_key_file = \"{}\"\n",
        tcp_port(1, 4420),
        key_file.display()
    ));
    let out = fixture::nvmfd()
        .arg("check-config")
        .arg("-c")
        .arg(&config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "key file {} is readable by group or others",
            key_file.display()
        )),
        "{text}"
    );
}
