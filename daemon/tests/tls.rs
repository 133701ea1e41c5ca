//! NVMe/TCP over TLS 1.3 (NVMe/TCP 1.1 §3.6, TP 8011) against the real binary over loopback,
//! with the Rust client as the host offering a PSK identity as the Linux host builds it. This
//! host's kernel has no TLS ULP, so the daemon keeps each session's record layer in user space
//! and says so; data of 4 KiB to 128 KiB, many commands outstanding, goes both ways intact. A
//! required port refuses plaintext, an optional one serves both. `nvmfd ctl set-tls-key`
//! rotates a key live (here to a SHA-384 one): new connections need the new key, established
//! ones go on; a host binding that SHA-384 PSK to SHA-256 as tlshd 1.0 does gets ChaCha20.

mod fixture;

use std::net::SocketAddr;
use std::time::Duration;

use fixture::{free_port, pattern, private_file, serve, tcp_port, Daemon, TempDir};
use nvmfd_auth::psk::{ConfiguredPsk, Derivation};
use transport::client::{Client, ClientError, ClientOptions, DataOut, HostBinding, TlsParams};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:tls";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:7e7e7e7e-1111-4222-8333-444455556666";
const HOSTID: [u8; 16] = [0x7e; 16];
const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
/// The key rotated to: a SHA-384 one (`NVMe1R02`, TLS_AES_256_GCM_SHA384).
const NEW_KEY: &str =
    "NVMeTLSkey-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
const BLOCK: u32 = 512;
const WAIT: Duration = Duration::from_secs(10);

struct Target {
    process: Daemon,
    required: SocketAddr,
    optional: SocketAddr,
    config: std::path::PathBuf,
    /// Declared after `process`: removed once the daemon is gone.
    _dir: TempDir,
}

fn start(name: &str) -> Target {
    let dir = TempDir::new(&format!("tls-{name}"));
    let key_file = dir.join("host.psk");
    private_file(&key_file, KEY);
    let (required, optional) = (free_port(), free_port());
    let config = format!(
        "[global]\nreactors = 2\nmax_data_transfer = \"128K\"\ncontrol_socket = \"{socket}\"\n\
         {p1}tls = \"required\"\n{p2}tls = \"optional\"\n\
         [[tls_keys]]\nhost = \"{HOSTNQN}\"\nkey_file = \"{key}\"\n\
         [[subsystems]]\nnqn = \"{SUBNQN}\"\nallowed_hosts = [\"{HOSTNQN}\"]\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"8M\"\n",
        socket = dir.join("control.sock").display(),
        p1 = tcp_port(1, required),
        p2 = tcp_port(2, optional),
        key = key_file.display(),
    );
    let config = dir.write_config(&config);
    let mut process = Daemon::spawn(serve(&config));
    let required = ([127, 0, 0, 1], required).into();
    let optional = ([127, 0, 0, 1], optional).into();
    process.wait_for_listener(required, WAIT);
    process.wait_for_listener(optional, WAIT);
    Target {
        process,
        required,
        optional,
        config,
        _dir: dir,
    }
}

impl Target {
    fn ctl(&self, args: &[&str]) -> String {
        let out = fixture::nvmfd()
            .arg("ctl")
            .arg("--socket")
            .arg(self._dir.join("control.sock"))
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "ctl {args:?}: {text}");
        text
    }
}

fn params(key: &str, version_1: bool) -> TlsParams {
    let key = ConfiguredPsk::parse(key).unwrap();
    TlsParams::new(&key, HOSTNQN, SUBNQN, version_1, Derivation::LibnvmeCompat).unwrap()
}

fn options() -> ClientOptions {
    ClientOptions {
        timeout: WAIT,
        ..ClientOptions::default()
    }
}

/// Admin queue (enabled) and one I/O queue of a new controller, both over TLS.
fn controller(addr: SocketAddr, tls: &TlsParams) -> (Client, Client) {
    let mut admin = Client::connect_tls(addr, options(), tls).expect("TLS admin queue");
    let cntlid = admin
        .fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 30_000)
        .expect("admin Connect");
    admin.enable_controller(WAIT).expect("CC.EN");
    let mut io = Client::connect_tls(addr, options(), tls).expect("TLS I/O queue");
    io.fabrics_connect(1, 31, cntlid, SUBNQN, HOSTNQN, HOSTID, 0)
        .expect("I/O Connect");
    (admin, io)
}

/// The kernel of this host offers kernel TLS (then the daemon uses it instead).
fn kernel_tls() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|l| l.split_whitespace().any(|u| u == "tls"))
}

#[test]
fn io_over_tls_with_the_user_space_record_layer() {
    let t = start("io");
    let record_layer = if kernel_tls() {
        "kernel TLS"
    } else {
        "user space"
    };
    t.process
        .wait_log(&["TLS 1.3 port", "port_id=1", record_layer], WAIT)
        .unwrap();
    let tls = params(KEY, true);
    let (mut admin, mut io) = controller(t.required, &tls);
    t.process
        .wait_log(&["TLS 1.3 established", "record_layer", record_layer], WAIT)
        .unwrap();
    // 4K..128K writes, 16 outstanding at a time, then read back the same way.
    let sizes = [4096usize, 8192, 16384, 65536, 131072, 4096, 32768, 131072];
    let mut written = Vec::new();
    let mut slba = 0u64;
    for round in 0..4u32 {
        let mut cids = Vec::new();
        for (i, len) in sizes.iter().enumerate() {
            let data = pattern(*len, round * 100 + i as u32);
            let nlb = (*len as u32) / BLOCK;
            let sqe = Client::write_sqe(1, slba, nlb, false);
            cids.push(io.submit(sqe, DataOut::Write(data.clone())).unwrap());
            written.push((slba, data));
            slba += u64::from(nlb);
        }
        for _ in cids {
            let c = io.reap().unwrap();
            assert!(c.cqe.status.is_success(), "write: {:?}", c.cqe.status);
        }
    }
    for chunk in written.chunks(16) {
        let mut want = std::collections::HashMap::new();
        for (slba, data) in chunk {
            let sqe = Client::read_sqe(1, *slba, data.len() as u32 / BLOCK);
            let cid = io.submit(sqe, DataOut::Read(data.len() as u32)).unwrap();
            want.insert(cid, data);
        }
        for _ in 0..chunk.len() {
            let c = io.reap().unwrap();
            assert!(c.cqe.status.is_success(), "read: {:?}", c.cqe.status);
            assert!(&c.data == want[&c.cid], "read back differs (cid {})", c.cid);
        }
    }
    admin.keep_alive().unwrap();

    // The version 0 identity works as well.
    let (_admin0, mut io0) = controller(t.required, &params(KEY, false));
    assert_eq!(io0.read(1, 0, 8, BLOCK).unwrap(), written[0].1);

    // Required: a plaintext ICReq is not answered. Optional: plaintext and TLS both served.
    match Client::connect(t.required, options()) {
        Err(ClientError::Closed) => {}
        Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("plaintext on a required port: {other:?}"),
    }
    let mut plain = Client::connect(t.optional, options()).expect("plaintext, optional port");
    plain
        .fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 30_000)
        .expect("plaintext Connect on the optional port");
    let (_a, mut io2) = controller(t.optional, &tls);
    assert_eq!(io2.read(1, 0, 8, BLOCK).unwrap(), written[0].1);

    // A wrong key fails the handshake.
    let wrong = TlsParams {
        psk: vec![0x11; 32].into(),
        ..tls.clone()
    };
    assert!(matches!(
        Client::connect_tls(t.required, options(), &wrong),
        Err(ClientError::Tls(_))
    ));
}

/// `nvmfd ctl set-tls-key` replaces the host's key live and in the file; a connection made
/// with the old key keeps working, a new one needs the new key. `--transient` removal stops
/// new connections without touching the file.
#[test]
fn tls_keys_rotate_live() {
    let mut t = start("rotate");
    t.process.wait_until("control socket", WAIT, || {
        t._dir.join("control.sock").exists()
    });
    let (mut old_admin, mut old_io) = controller(t.required, &params(KEY, true));
    old_io.write(1, 0, pattern(4096, 1), BLOCK).unwrap();

    let new_file = t._dir.join("new.psk");
    private_file(&new_file, NEW_KEY);
    t.ctl(&[
        "set-tls-key",
        HOSTNQN,
        "--key-file",
        new_file.to_str().unwrap(),
    ]);
    t.process
        .wait_log(&["TLS keys replaced", "keys=1"], WAIT)
        .unwrap();
    // Established: untouched, both ways.
    assert_eq!(old_io.read(1, 0, 8, BLOCK).unwrap(), pattern(4096, 1));
    old_admin.keep_alive().unwrap();
    // New connections: the old key fails the handshake, the new one works.
    assert!(matches!(
        Client::connect_tls(t.required, options(), &params(KEY, true)),
        Err(ClientError::Tls(_))
    ));
    let (_a, mut io) = controller(t.required, &params(NEW_KEY, true));
    assert_eq!(io.read(1, 0, 8, BLOCK).unwrap(), pattern(4096, 1));
    t.process
        .wait_log(&["NVMe1R02", "TLS_AES_256_GCM_SHA384", "user space"], WAIT)
        .or_else(|e| {
            if kernel_tls() {
                Ok(String::new())
            } else {
                Err(e)
            }
        })
        .unwrap();
    // The Linux host's tlshd 1.0 binds the SHA-384 PSK of `NVMe0R02` to SHA-256 and offers
    // TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256: the PSK runs as a SHA-256 one
    // under ChaCha20, as nvmet runs it, and the log says so; a wrong key still fails.
    let tlshd = TlsParams {
        binding: HostBinding::Tlshd1,
        ..params(NEW_KEY, false)
    };
    let (_b, mut io_b) = controller(t.required, &tlshd);
    assert_eq!(io_b.read(1, 0, 8, BLOCK).unwrap(), pattern(4096, 1));
    t.process
        .wait_log(
            &["NVMe0R02", "bound its SHA-384 PSK identity to SHA-256"],
            WAIT,
        )
        .unwrap();
    t.process
        .wait_log(
            &[
                "NVMe0R02",
                "TLS 1.3 established",
                "TLS_CHACHA20_POLY1305_SHA256",
            ],
            WAIT,
        )
        .unwrap();
    let wrong = TlsParams {
        psk: vec![0x11; 48].into(),
        ..tlshd
    };
    assert!(matches!(
        Client::connect_tls(t.required, options(), &wrong),
        Err(ClientError::Tls(_))
    ));
    // Written through to the configuration file.
    let text = std::fs::read_to_string(&t.config).unwrap();
    assert!(text.contains(new_file.to_str().unwrap()), "{text}");

    // Removed live only (a port with TLS keeps at least one key: another host's first): no
    // new TLS connection for the host, the file still has the key and not the other one.
    const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:7e7e7e7e-1111-4222-8333-000000000000";
    t.ctl(&[
        "--transient",
        "set-tls-key",
        OTHER,
        "--key-file",
        new_file.to_str().unwrap(),
    ]);
    t.ctl(&["--transient", "remove-tls-key", HOSTNQN]);
    assert!(matches!(
        Client::connect_tls(t.required, options(), &params(NEW_KEY, true)),
        Err(ClientError::Tls(_))
    ));
    assert_eq!(io.read(1, 0, 8, BLOCK).unwrap(), pattern(4096, 1));
    let text = std::fs::read_to_string(&t.config).unwrap();
    assert!(
        text.contains(new_file.to_str().unwrap()) && !text.contains(OTHER),
        "{text}"
    );
    // A key file others may read is refused, and nothing changes.
    let loose = t._dir.join("loose.psk");
    std::fs::write(&loose, KEY).unwrap();
    let out = fixture::nvmfd()
        .args(["ctl", "--socket"])
        .arg(t._dir.join("control.sock"))
        .args([
            "set-tls-key",
            HOSTNQN,
            "--key-file",
            loose.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(Client::connect_tls(t.required, options(), &params(KEY, true)).is_err());
}
