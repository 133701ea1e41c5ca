//! The control socket against the real binary: `nvmfd ctl` lists what a host sees and does
//! (per-namespace counters, controllers with their queues), and its changes reach a connected
//! host live (Namespace Attribute Changed AEN, namespaces appearing and going, host allow
//! lists, ports), `reload` reports a refused file, `write-config` round-trips, peers of
//! another uid are refused, and the socket goes away with the daemon.

mod fixture;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use fixture::{free_port, one_subsystem, serve, Daemon, TempDir};
use nvme::wire::Sqe;
use transport::client::{Client, ClientOptions, DataOut};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:ctl";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-1111-4222-8333-444455556666";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0c0d0e-9999-4222-8333-444455556666";
const BLOCK: u32 = 512;

/// nvmfd with its control socket in a folder of the test's own.
struct Ctl {
    process: Daemon,
    socket: PathBuf,
    config: PathBuf,
    address: SocketAddr,
    dir: TempDir,
}

fn config_text(port: u16, socket: &Path, global: &str) -> String {
    one_subsystem(
        port,
        &format!("control_socket = \"{}\"\n{global}", socket.display()),
        (SUBNQN, HOSTNQN),
        "\n[[subsystems.namespaces]]\nnsid = 1\nram_size = \"16M\"\n",
    )
}

fn start(name: &str) -> Ctl {
    start_with(name, "")
}

/// [`start`] with more `[global]` lines.
fn start_with(name: &str, global: &str) -> Ctl {
    let dir = TempDir::new(&format!("ctl-{name}"));
    // Made world-traversable so the foreign-uid check below reaches the socket's own checks.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.join("run/control.sock");
    let port = free_port();
    let config = dir.write_config(&config_text(port, &socket, global));
    let mut process = Daemon::spawn(serve(&config));
    let address = ([127, 0, 0, 1], port).into();
    process.wait_for_listener(address, Duration::from_secs(10));
    process.wait_until("control socket", Duration::from_secs(10), || {
        socket.exists()
    });
    Ctl {
        process,
        socket,
        config,
        address,
        dir,
    }
}

impl Ctl {
    fn ctl_command(&self, args: &[&str]) -> Command {
        let mut command = fixture::nvmfd();
        command
            .arg("ctl")
            .arg("--socket")
            .arg(&self.socket)
            .args(args);
        command
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_command(args).output().unwrap()
    }

    /// Runs a command that must succeed; returns its standard output.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "nvmfd ctl {args:?}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `--json` answer of a command that must succeed: its `result`.
    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let answer: serde_json::Value = serde_json::from_str(&self.ok(&all)).unwrap();
        assert_eq!(answer["ok"], true, "{answer}");
        answer["result"].clone()
    }

    /// A command the daemon must refuse (exit 1); returns its standard error.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "nvmfd ctl {args:?} was not refused"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn connect(&self, qid: u16, cntlid: u16, hostnqn: &str) -> Result<(Client, u16), String> {
        fixture::connect(
            self.address,
            ClientOptions::default(),
            (qid, cntlid, 30_000),
            (SUBNQN, hostnqn, [7; 16]),
        )
        .map_err(|e| e.to_string())
    }

    /// A controller of `HOSTNQN`: its admin queue, enabled, and its CNTLID.
    fn admin(&self) -> (Client, u16) {
        let (mut admin, cntlid) = self
            .connect(0, nvme::spec::CNTLID_DYNAMIC, HOSTNQN)
            .expect("admin connect");
        admin.enable_controller(Duration::from_secs(5)).unwrap();
        (admin, cntlid)
    }

    /// Adds namespace `nsid` on an 8 MiB image file in the test directory, not saved to the
    /// configuration file; returns the image's path.
    fn add_transient_file_namespace(&self, nsid: u32) -> PathBuf {
        let image = self.dir.join(format!("ns{nsid}.img"));
        self.ok(&[
            "add-namespace",
            SUBNQN,
            "--nsid",
            &nsid.to_string(),
            "--path",
            image.to_str().unwrap(),
            "--size",
            "8M",
            "--transient",
        ]);
        image
    }
}

fn namespace(list: &serde_json::Value, nsid: u64) -> &serde_json::Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|n| n["nsid"] == nsid)
        .unwrap_or_else(|| panic!("no namespace {nsid} in {list}"))
}

#[test]
fn controllers_show_the_reactor_serving_each_queue() {
    // A two-reactor nvmfd (the fixture's `reactors = 2`) places new connections on the least
    // loaded reactor: with the admin queue on one, the two I/O queues end up on different
    // reactors, and `ctl controllers` says which.
    let daemon = start("reactors");
    let (_admin, cntlid) = daemon.admin();
    let (mut io1, _) = daemon.connect(1, cntlid, HOSTNQN).expect("I/O queue 1");
    let (mut io2, _) = daemon.connect(2, cntlid, HOSTNQN).expect("I/O queue 2");
    io1.read(1, 0, 1, BLOCK).unwrap();
    io2.read(1, 0, 1, BLOCK).unwrap();
    let controllers = daemon.json(&["controllers", SUBNQN]);
    let ours = controllers
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cntlid"] == cntlid)
        .unwrap_or_else(|| panic!("controller {cntlid} not listed: {controllers}"));
    let placed: Vec<(u64, u64)> = ours["queue_reactors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["qid"].as_u64().unwrap(), q["reactor"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        placed.iter().map(|p| p.0).collect::<Vec<_>>(),
        [0, 1, 2],
        "{ours}"
    );
    assert!(placed.iter().all(|p| p.1 < 2), "{ours}");
    assert_ne!(
        placed[1].1, placed[2].1,
        "I/O queues on different reactors: {ours}"
    );
    // The table has the same, `qid:reactor` per queue.
    let table = daemon.ok(&["controllers", SUBNQN]);
    let list = placed
        .iter()
        .map(|(q, r)| format!("{q}:{r}"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        table.lines().next().unwrap().ends_with("REACTORS"),
        "{table}"
    );
    assert!(table.contains(&list), "{list} in\n{table}");
}

#[test]
fn ctl_lists_and_changes_the_running_target() {
    let daemon = start("changes");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&daemon.socket), 0o600);
    assert_eq!(mode(daemon.socket.parent().unwrap()), 0o700);

    let status = daemon.json(&["status"]);
    assert_eq!(status["subsystems"], 1);
    assert_eq!(status["namespaces"], 1);
    assert_eq!(status["pid"], daemon.process.pid());

    // A host with an admin and one I/O queue, one write and two reads.
    let (mut admin, cntlid) = daemon.admin();
    let (mut io, _) = daemon.connect(1, cntlid, HOSTNQN).expect("I/O connect");
    io.write(1, 0, vec![0x5a; 4096], BLOCK).unwrap();
    io.read(1, 0, 2, BLOCK).unwrap();
    io.read(1, 8, 1, BLOCK).unwrap();
    let ns1 = namespace(&daemon.json(&["namespaces", SUBNQN]), 1).clone();
    assert_eq!(
        (
            &ns1["write_commands"],
            &ns1["bytes_written"],
            &ns1["read_commands"],
            &ns1["bytes_read"]
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!(4096),
            &serde_json::json!(2),
            &serde_json::json!(1536)
        )
    );
    assert_eq!(ns1["backend"], "ram");
    assert_eq!(ns1["size_bytes"], 16 << 20);
    let table = daemon.ok(&["namespaces"]);
    assert!(
        table.lines().next().unwrap().starts_with("NQN"),
        "header: {table}"
    );
    assert!(
        table.contains(&format!("{SUBNQN}  1     ram      16M")),
        "{table}"
    );

    let controllers = daemon.json(&["controllers"]);
    let ours = controllers
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cntlid"] == cntlid)
        .unwrap_or_else(|| panic!("controller {cntlid} not listed: {controllers}"));
    assert_eq!(ours["host_nqn"], HOSTNQN);
    assert_eq!(ours["queues"], 2, "admin + 1 I/O queue");
    assert_eq!(ours["transport"], "tcp");
    let local = io.local_addr().unwrap();
    assert!(
        ours["host_address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{ours} (one of our sockets is {local})"
    );
    assert!(daemon.ok(&["controllers"]).contains(HOSTNQN));

    // add-namespace: the waiting Asynchronous Event Request completes with Namespace
    // Attribute Changed (notice, log page 04h: NVMe Base 2.0 Figure 151) and the namespace
    // serves I/O at once.
    let aer = admin
        .submit(
            Sqe {
                opcode: nvme::spec::admin_opcode::ASYNC_EVENT_REQUEST,
                ..Sqe::default()
            },
            DataOut::None,
        )
        .unwrap();
    let out = daemon.ok(&["add-namespace", SUBNQN, "--nsid", "2", "--ram-size", "8M"]);
    assert!(out.starts_with("applied: "), "{out}");
    let event = admin.wait(aer).expect("AEN");
    assert_eq!(event.cqe.dw0, 0x0004_0002, "{:#x}", event.cqe.dw0);
    io.write(2, 0, vec![1; 512], BLOCK)
        .expect("write to the new namespace");
    assert_eq!(daemon.json(&["status"])["namespaces"], 2);
    let err = daemon.refused(&["add-namespace", SUBNQN, "--nsid", "2", "--ram-size", "8M"]);
    assert!(err.contains("already has namespace 2"), "{err}");

    daemon.ok(&["remove-namespace", SUBNQN, "2"]);
    assert!(io.read(2, 0, 1, BLOCK).is_err(), "namespace 2 still served");
    assert!(daemon
        .refused(&["remove-namespace", SUBNQN, "2"])
        .contains("no namespace 2"));
    assert!(daemon
        .refused(&["namespaces", "nqn.2026-12.dev.nvmfd:nope"])
        .contains("no subsystem"));

    // Hosts: OTHER is refused, allowed after add-host, refused again after remove-host.
    assert!(daemon
        .connect(0, nvme::spec::CNTLID_DYNAMIC, OTHER)
        .is_err());
    daemon.ok(&["add-host", SUBNQN, OTHER]);
    let hosts = daemon.json(&["subsystem", SUBNQN])["allowed_hosts"].clone();
    assert_eq!(hosts, serde_json::json!([HOSTNQN, OTHER]));
    daemon
        .connect(0, nvme::spec::CNTLID_DYNAMIC, OTHER)
        .expect("allowed after add-host");
    daemon.ok(&["remove-host", SUBNQN, OTHER]);
    assert!(daemon
        .connect(0, nvme::spec::CNTLID_DYNAMIC, OTHER)
        .is_err());

    // Ports: a TCP port added through the socket listens at once and stops on removal.
    let extra = free_port();
    let extra_text = extra.to_string();
    daemon.ok(&[
        "add-port",
        "2",
        "--address",
        "127.0.0.1",
        "--service",
        &extra_text,
    ]);
    TcpStream::connect(("127.0.0.1", extra)).expect("added port listens");
    let ports = daemon.ok(&["ports"]);
    assert!(
        ports.contains(&extra_text) && ports.contains(SUBNQN),
        "{ports}"
    );
    daemon.ok(&["remove-port", "2"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", extra)).is_ok() {
        assert!(Instant::now() < deadline, "removed port still listens");
        std::thread::sleep(Duration::from_millis(50));
    }

    // write-config: the running configuration (with a namespace added live) as a file that
    // loads back to the same subsystems.
    let out = daemon.ok(&[
        "add-namespace",
        SUBNQN,
        "--nsid",
        "3",
        "--ram-size",
        "4M",
        "--transient",
    ]);
    assert!(out.contains("not saved (--transient)"), "{out}");
    let saved = daemon.dir.join("saved.toml");
    let out = daemon.ok(&["write-config", saved.to_str().unwrap()]);
    assert!(out.starts_with("wrote "), "{out}");
    let back = conf::Config::load_with_env(Some(saved.as_path()), conf::EnvSource::None).unwrap();
    let nsids: Vec<u32> = back.subsystems[0]
        .namespaces
        .iter()
        .map(|n| n.nsid)
        .collect();
    assert_eq!(nsids, [1, 3]);
    assert_eq!(back.subsystems[0].allowed_hosts, [HOSTNQN]);

    // reload: a broken file is refused with its reasons and nothing changes; the file as it
    // was makes namespace 3 (added only live, --transient) go away again.
    let good = std::fs::read_to_string(&daemon.config).unwrap();
    assert!(
        !good.contains("nsid = 3"),
        "a --transient edit reached the file:\n{good}"
    );
    std::fs::write(&daemon.config, good.replace(SUBNQN, "not/an-nqn")).unwrap();
    let err = daemon.refused(&["reload"]);
    assert!(err.contains("not/an-nqn"), "{err}");
    io.read(1, 0, 1, BLOCK)
        .expect("still serving after a refused reload");
    io.read(3, 0, 1, BLOCK).expect("namespace 3 kept");
    std::fs::write(&daemon.config, good).unwrap();
    let out = daemon.ok(&["reload"]);
    assert!(out.contains("applied"), "{out}");
    assert!(
        io.read(3, 0, 1, BLOCK).is_err(),
        "namespace 3 outlived the reload"
    );

    // An unknown command on the raw socket gets an error answer, not a crash.
    {
        use std::io::{BufRead, BufReader, Write};
        let mut raw = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        raw.write_all(b"{\"command\":\"format\"}\n").unwrap();
        let mut line = String::new();
        BufReader::new(&raw).read_line(&mut line).unwrap();
        assert!(line.contains("\"ok\":false"), "{line}");
    }
    io.read(1, 0, 1, BLOCK).expect("still serving");
}

#[test]
fn peers_of_another_uid_are_refused_and_the_socket_goes_with_the_daemon() {
    let mut daemon = start("uid");
    if nix::unistd::geteuid().is_root() {
        // Make the socket reachable by anyone, as a careless chmod would: the SO_PEERCRED
        // check must still turn a non-root client away.
        let socket_dir = daemon.socket.parent().unwrap();
        std::fs::set_permissions(socket_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        use std::os::unix::process::CommandExt;
        let out = daemon
            .ctl_command(&["status"])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("uid 65534") && stderr.contains("not allowed"),
            "{stderr}"
        );
    } else {
        eprintln!("not root: the foreign-uid refusal needs a second uid; checked as root only");
    }
    daemon.ok(&["status"]);

    // SIGTERM: the socket file is removed, and ctl then says the daemon is not running.
    let (status, _, log) = daemon.process.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!daemon.socket.exists(), "control socket left behind");
    let out = daemon.ctl(&["status"]);
    assert_eq!(out.status.code(), Some(3));
}

/// Edits are written through to the configuration file (atomically, keeping its mode, without
/// the `NVMFD_*` overrides of the running process), so a reload and a restart keep them;
/// `--transient` ones are not; the answer says which happened.
#[test]
fn ctl_edits_are_saved_to_the_file_unless_transient() {
    let dir = TempDir::new("ctl-saved");
    let socket = dir.join("run/control.sock");
    let port = free_port();
    let config = dir.write_config(&config_text(port, &socket, ""));
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o640)).unwrap();
    let spawn = || {
        let mut command = serve(&config);
        // An override of the running process only: it must not be baked into the file.
        command.env("NVMFD_GLOBAL__KATO_DEFAULT_MS", "4321");
        let mut process = Daemon::spawn(command);
        process.wait_for_listener(([127, 0, 0, 1], port).into(), Duration::from_secs(10));
        process.wait_until("control socket", Duration::from_secs(10), || {
            socket.exists()
        });
        process
    };
    let leftovers = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains(".tmp-"))
            .collect()
    };
    let config_dir = config.parent().unwrap().to_owned();
    let mut daemon = Ctl {
        process: spawn(),
        socket: socket.clone(),
        config: config.clone(),
        address: ([127, 0, 0, 1], port).into(),
        dir,
    };

    let answer = daemon.json(&["add-namespace", SUBNQN, "--nsid", "2", "--ram-size", "8M"]);
    assert_eq!(answer["saved"]["state"], "written", "{answer}");
    assert_eq!(answer["saved"]["path"], config.to_str().unwrap());
    let out = daemon.ok(&["add-host", SUBNQN, OTHER]);
    assert!(
        out.contains(&format!("saved to {}", config.display())),
        "{out}"
    );
    let answer = daemon.json(&[
        "--transient",
        "add-namespace",
        SUBNQN,
        "--nsid",
        "3",
        "--ram-size",
        "4M",
    ]);
    assert_eq!(answer["saved"]["state"], "transient", "{answer}");

    let text = std::fs::read_to_string(&config).unwrap();
    let file = conf::Config::parse_toml(&text).unwrap();
    let nsids: Vec<u32> = file.subsystems[0]
        .namespaces
        .iter()
        .map(|n| n.nsid)
        .collect();
    assert_eq!(nsids, [1, 2], "{text}");
    assert_eq!(file.subsystems[0].allowed_hosts, [HOSTNQN, OTHER]);
    assert_eq!(
        file.global.kato_default_ms, 120_000,
        "override baked in:\n{text}"
    );
    assert_eq!(
        std::fs::metadata(&config).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(leftovers(&config_dir), Vec::<String>::new());

    // A reload keeps the saved edits and drops the transient one.
    daemon.ok(&["reload"]);
    let nsids = |list: serde_json::Value| -> Vec<u64> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|n| n["nsid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(nsids(daemon.json(&["namespaces", SUBNQN])), [1, 2]);

    // So does a restart.
    let (status, _, log) = daemon.process.terminate();
    assert!(status.success(), "{log}");
    daemon.process = spawn();
    assert_eq!(nsids(daemon.json(&["namespaces", SUBNQN])), [1, 2]);
    let hosts = daemon.json(&["subsystem", SUBNQN])["allowed_hosts"].clone();
    assert_eq!(hosts, serde_json::json!([HOSTNQN, OTHER]));

    // An edit the file cannot take (here: the file lost the subsystem since it was loaded)
    // is applied live and the answer says it was not saved.
    std::fs::write(
        &config,
        text.replace(SUBNQN, "nqn.2026-12.dev.nvmfd:renamed"),
    )
    .unwrap();
    let answer = daemon.json(&["remove-namespace", SUBNQN, "2"]);
    assert_eq!(answer["saved"]["state"], "failed", "{answer}");
    let reason = answer["saved"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("no subsystem {SUBNQN}")),
        "{reason}"
    );
    assert_eq!(nsids(daemon.json(&["namespaces", SUBNQN])), [1]);
    daemon.process.terminate();
}

/// The `index: value` lines after `table` (`UserFiles:`, `UserBufs:`) in the fdinfo of each of
/// the process's io_uring descriptors, as `(index, value)`; `None` when no ring's listing was
/// readable (the kernel prints the tables only when it got the ring's lock: ask again).
fn ring_table_entries(pid: u32, table: &str) -> Option<Vec<(String, String)>> {
    let mut entries = Vec::new();
    let mut rings = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()? {
        let Ok(info) = std::fs::read_to_string(entry.ok()?.path()) else {
            continue;
        };
        if !info.contains("SqThreadCpu") {
            continue; // not an io_uring descriptor
        }
        rings += 1;
        let mut lines = info.lines().skip_while(|l| !l.starts_with(table));
        lines.next()?;
        entries.extend(
            lines
                .map_while(|l| l.trim_start().split_once(": "))
                .filter(|(index, _)| index.chars().all(|c| c.is_ascii_digit()))
                .map(|(index, value)| (index.to_owned(), value.to_owned())),
        );
    }
    (rings > 0).then_some(entries)
}

/// The files in the registered-file tables of the process's io_uring instances (`UserFiles:`,
/// one `slot: path` line per filled slot).
fn ring_registered_files(pid: u32) -> Option<Vec<String>> {
    let entries = ring_table_entries(pid, "UserFiles:")?;
    Some(entries.into_iter().map(|(_, path)| path).collect())
}

#[test]
fn a_removed_file_namespace_is_not_held_open_by_a_reactor_ring() {
    // The reactor's ring registers a file namespace's file on its first I/O (README,
    // registered files); removing the namespace must close the file — no descriptor, no
    // ring slot — while the host stays connected: the ring empties the slot on the turn
    // after the backend goes.
    let daemon = start("regfile");
    let pid = daemon.process.pid();
    let (_admin, cntlid) = daemon.admin();
    let (mut io, _) = daemon.connect(1, cntlid, HOSTNQN).expect("I/O connect");
    let image = daemon.add_transient_file_namespace(2);
    let image_text = image.to_str().unwrap();
    io.write(2, 0, vec![0x3c; 4096], BLOCK).unwrap();
    let holders = || {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(files) = ring_registered_files(pid) {
                let descriptors = std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .unwrap()
                    .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter(|p| p == &image)
                    .count();
                let slots = files.iter().filter(|f| f.as_str() == image_text).count();
                return (descriptors, slots);
            }
            assert!(
                Instant::now() < deadline,
                "io_uring fdinfo never listed its files"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(
        holders(),
        (1, 1),
        "the backend's descriptor and its ring slot"
    );
    daemon.ok(&["remove-namespace", SUBNQN, "2"]);
    // The I/O queue stays idle: it lets go of the namespace table it cached at its next poll
    // (`nvm.rs`, `refresh_idle`, every reactor tick), not only at its next command.
    let deadline = Instant::now() + Duration::from_secs(5);
    while holders() != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "the removed namespace's file is still open: {:?}",
            holders()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(io.read(2, 0, 1, BLOCK).is_err(), "namespace 2 still served");
}

/// The lengths of the registered buffers of the process's io_uring instances (`UserBufs:`,
/// one `index: 0xADDR/LEN` line per filled entry, and per empty one `index: <none>`, or before
/// Linux 6.13 the kernel's dummy buffer, address all ones).
fn ring_registered_buffers(pid: u32) -> Option<Vec<u32>> {
    let entries = ring_table_entries(pid, "UserBufs:")?;
    Some(
        entries
            .iter()
            .filter_map(|(_, value)| value.split_once('/'))
            .filter(|(addr, _)| *addr != "0xffffffffffffffff")
            .filter_map(|(_, len)| len.parse().ok())
            .collect(),
    )
}

#[test]
fn file_namespace_io_runs_on_registered_buffers_released_with_the_connection() {
    // With fixed buffers on, reads and writes of a file namespace go through the reactor's
    // ring on a registration of the command slot's buffer (README, fixed buffers), sized to
    // the largest transfer
    // seen in that slot; when the connection goes, so do its registrations (the ring's turn
    // after the slot mapping is dropped), while other connections keep theirs.
    let daemon = start_with("fixedbuf", "uring_fixed_buffers = \"1M\"");
    let pid = daemon.process.pid();
    let (mut admin, cntlid) = daemon.admin();
    daemon.add_transient_file_namespace(2);
    let registered = || {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(mut lengths) = ring_registered_buffers(pid) {
                lengths.sort();
                return lengths;
            }
            assert!(
                Instant::now() < deadline,
                "io_uring fdinfo never listed its buffers"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(registered(), Vec::<u32>::new(), "nothing before any I/O");
    let (mut io, _) = daemon.connect(1, cntlid, HOSTNQN).expect("I/O connect");
    // One command at a time: each runs in the slot the last one freed.
    io.write(2, 0, vec![0x5a; 4096], BLOCK).unwrap();
    assert_eq!(registered(), vec![4096], "one slot, one page");
    let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    io.write(2, 8, data.clone(), BLOCK).unwrap();
    assert_eq!(io.read(2, 8, 128, BLOCK).unwrap(), data);
    assert_eq!(io.read(2, 0, 8, BLOCK).unwrap(), vec![0x5a; 4096]);
    assert_eq!(
        registered(),
        vec![65536],
        "the same slot, registered again larger"
    );
    // A RAM namespace's data never reaches the ring.
    io.write(1, 0, vec![1; 65536 * 2], BLOCK).unwrap();
    assert_eq!(registered(), vec![65536]);
    let (mut other, _) = daemon
        .connect(2, cntlid, HOSTNQN)
        .expect("second I/O connect");
    other.read(2, 0, 1, BLOCK).unwrap();
    assert_eq!(
        registered(),
        vec![4096, 65536],
        "a page for the other's 512-byte read"
    );
    drop(io);
    // The reactor turns at least once more for the admin queue's commands.
    let deadline = Instant::now() + Duration::from_secs(5);
    while registered() != vec![4096] {
        assert!(
            Instant::now() < deadline,
            "the closed connection's buffers are still registered: {:?}",
            registered()
        );
        admin.keep_alive().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(other.read(2, 0, 8, BLOCK).unwrap(), vec![0x5a; 4096]);
    assert_eq!(
        registered(),
        vec![4096],
        "the other connection's slot stays"
    );
}

#[test]
fn reads_sent_zero_copy_arrive_intact_and_free_their_slots() {
    // With `zerocopy_send_threshold` the data of reads at least that large goes out with
    // MSG_ZEROCOPY, and each command slot stays busy until the kernel's notification (on
    // loopback the kernel copies, but still notifies). Far more reads than the queue has
    // slots: if a notification were lost or misread, the slots would run out and the reads
    // stall; if a buffer were reused before it, the data would differ.
    let daemon = start_with("zerocopy", "zerocopy_send_threshold = \"4K\"");
    let (_admin, cntlid) = daemon.admin();
    daemon.add_transient_file_namespace(2);
    let (mut io, _) = daemon.connect(1, cntlid, HOSTNQN).expect("I/O connect");
    let blocks = 65536 / BLOCK as usize;
    for nsid in [1, 2] {
        for k in 0..4u32 {
            let data: Vec<u8> = (0..65536u32).map(|i| ((i + k * 7) % 251) as u8).collect();
            io.write(nsid, u64::from(k) * blocks as u64, data, BLOCK)
                .unwrap();
        }
        for round in 0..300u32 {
            let k = round % 4;
            let want: Vec<u8> = (0..65536u32).map(|i| ((i + k * 7) % 251) as u8).collect();
            let got = io
                .read(nsid, u64::from(k) * blocks as u64, blocks as u32, BLOCK)
                .unwrap();
            assert!(got == want, "namespace {nsid}, read {round}: data differs");
            // Below the threshold: copied as before.
            assert_eq!(io.read(nsid, 0, 1, BLOCK).unwrap().len(), BLOCK as usize);
        }
    }
}
