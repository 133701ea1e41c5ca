//! The attack suite's harness: the real `nvmfd` binary on 127.0.0.1 (reactors, listeners,
//! io_uring included), its log captured, its RSS read from /proc, a "canary" connection doing
//! verified I/O on its own controller while the attacks run, and small helpers that turn the
//! target's reaction into a precise yes/no.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvme::wire::fabrics::{ConnectCommand, ConnectData};
use nvme::wire::{Cqe, SglDescriptor, Sqe, Status};
use nvmfd_auth::psk::{ConfiguredPsk, Derivation};
use nvmfd_auth::{HashId, Secret};
use transport::client::{Client, ClientError, ClientOptions, TlsParams};
use transport::tcp::pdu::{Fes, PduHeader};

use crate::fixture::{self, free_port, private_file, serve, tcp_port, TempDir};

pub const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:attack";
/// Allows only [`OTHER_HOSTNQN`].
pub const RESTRICTED_NQN: &str = "nqn.2026-12.dev.nvmfd:restricted";
pub use nvme::spec::DISCOVERY_NQN;
/// With `Options::keyed_subsystem`: [`HOSTNQN`] must authenticate (NVMe Base 2.0 §8.13).
pub const KEYED_NQN: &str = "nqn.2026-12.dev.nvmfd:keyed";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5e1f0000-0000-4000-8000-00000000a77a";
pub const OTHER_HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:5e1f0000-0000-4000-8000-00000000b0b0";
pub const HOSTID: [u8; 16] = [0xa7; 16];
pub const BLOCK: u32 = 512;
pub const RAM_NSID: u32 = 1;
pub const FILE_NSID: u32 = 2;
pub const READ_ONLY_NSID: u32 = 3;
/// With `Options::fault_namespace`: a RAM namespace whose reads of LBAs 16..24 fail with EIO
/// and whose writes to LBAs 64..72 fail with ENOSPC (the `faults` key).
pub const FAULT_NSID: u32 = 4;
/// Injected delay on reads of LBAs 128..136 of the fault namespace.
pub const FAULT_LATENCY: Duration = Duration::from_millis(1500);
/// Blocks of the 16 MiB RAM namespace.
pub const RAM_BLOCKS: u64 = (16 << 20) / BLOCK as u64;
pub const FILE_SIZE: u64 = 8 << 20;
pub const MDTS: u32 = 128 * 1024;
pub const IN_CAPSULE: u32 = 4096;
pub const MAX_QUEUE_SIZE: u16 = 32;
pub const MAX_IO_QUEUES: u16 = 2;
/// How long a client waits for the target's reaction.
pub const WAIT: Duration = Duration::from_secs(5);

/// What varies between the daemons of the groups.
#[derive(Clone, Default)]
pub struct Options {
    pub connect_timeout_ms: Option<u32>,
    /// A namespace 3 on a 1 MiB tmpfs of its own (ENOSPC); needs root (a private mount
    /// namespace for the daemon), replaces the read-only namespace.
    pub tmpfs_namespace: bool,
    /// Namespace `FAULT_NSID` with injected faults.
    pub fault_namespace: bool,
    /// Namespace `qos::QOS_NSID` (16 MiB of RAM) for the QoS cases.
    pub qos_namespace: bool,
    /// Subsystem [`KEYED_NQN`]: [`HOSTNQN`] must authenticate with DH-HMAC-CHAP (a random
    /// key in `Daemon::host_key`, SHA-256, NULL or ffdhe2048 only).
    pub keyed_subsystem: bool,
    /// A second port, `tls = "required"`, with a TLS PSK for [`HOSTNQN`] ([`TLS_KEY`]); the
    /// canary then runs over TLS there.
    pub tls: bool,
}

/// With `Options::tls`: [`HOSTNQN`]'s configured PSK (SHA-256).
pub const TLS_KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

/// The TLS port of a daemon with `Options::tls`: its address and what [`HOSTNQN`] offers.
pub struct TlsPort {
    pub addr: SocketAddr,
    pub params: TlsParams,
}

/// The suite's nvmfd: the fixture's process plus what the cases need to know about it.
pub struct Daemon {
    process: fixture::Daemon,
    /// Namespace 3 is a file on a 1 MiB tmpfs (instead of a read-only RAM namespace).
    pub tmpfs: bool,
    /// [`HOSTNQN`]'s DH-HMAC-CHAP key on [`KEYED_NQN`], with `Options::keyed_subsystem`.
    pub host_key: Option<Secret>,
    pub addr: SocketAddr,
    /// With `Options::tls`.
    pub tls: Option<TlsPort>,
    /// Declared after `process`: dropped (removed) once the daemon is gone.
    pub dir: TempDir,
}

impl Deref for Daemon {
    type Target = fixture::Daemon;

    fn deref(&self) -> &fixture::Daemon {
        &self.process
    }
}

impl DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut fixture::Daemon {
        &mut self.process
    }
}

/// Runs `cmd` in a private mount namespace with a 1 MiB tmpfs on `mountpoint` (it exists
/// for that process only and disappears with it).
fn private_tmpfs(cmd: &mut Command, mountpoint: &std::path::Path) {
    let mountpoint =
        std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes().to_vec()).unwrap();
    // SAFETY: only async-signal-safe system calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing mounted here may propagate back to the host's namespace.
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let tmpfs = c"tmpfs".as_ptr();
            if libc::mount(
                tmpfs,
                mountpoint.as_ptr(),
                tmpfs,
                0,
                c"size=1m".as_ptr().cast(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether this process may give a child a private tmpfs (root with CAP_SYS_ADMIN; not in
/// an unprivileged container): probed with `true` before relying on it.
pub fn private_tmpfs_available() -> bool {
    let dir = std::env::temp_dir().join(format!("nvmfd-attack-probe-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        return false;
    }
    let mut cmd = Command::new("true");
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    private_tmpfs(&mut cmd, &dir);
    let ok = cmd.status().map(|s| s.success()).unwrap_or(false);
    let _ = std::fs::remove_dir_all(&dir);
    ok
}

pub fn start(name: &str, opts: Options) -> Daemon {
    let dir = TempDir::new(&format!("attack-{name}"));
    let port = free_port();
    let ns3 = if opts.tmpfs_namespace {
        std::fs::create_dir_all(dir.join("tmpfs")).unwrap();
        format!(
            "path = \"{}\"\nsize = \"4M\"\ndirect_io = false",
            dir.join("tmpfs/ns3.img").display()
        )
    } else {
        "ram_size = \"1M\"\nread_only = true".to_owned()
    };
    let mut config = format!(
        r#"
[global]
reactors = 2
max_queue_size = {MAX_QUEUE_SIZE}
max_io_queues = {MAX_IO_QUEUES}
in_capsule_data_size = {IN_CAPSULE}
max_data_transfer = "128K"
connect_timeout_ms = {ct}
log_level = "info"
control_socket = "{dir}/control.sock"
{ports}
[[subsystems]]
nqn = "{SUBNQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = {RAM_NSID}
ram_size = "16M"

[[subsystems.namespaces]]
nsid = {FILE_NSID}
path = "{dir}/ns2.img"
size = "8M"

[[subsystems.namespaces]]
nsid = {READ_ONLY_NSID}
{ns3}

{ns4}{ns5}
[[subsystems]]
nqn = "{RESTRICTED_NQN}"
allow_any_host = false
allowed_hosts = ["{OTHER_HOSTNQN}"]

[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
"#,
        ct = opts.connect_timeout_ms.unwrap_or(30_000),
        ns4 = if opts.fault_namespace {
            format!(
                r#"[[subsystems.namespaces]]
nsid = {FAULT_NSID}
ram_size = "1M"
faults = [
  {{ slba = 16, blocks = 8, on = "read", error = "eio" }},
  {{ slba = 64, blocks = 8, on = "write", error = "enospc" }},
  {{ slba = 128, blocks = 8, on = "read", latency_ms = {latency} }},
]
"#,
                latency = FAULT_LATENCY.as_millis()
            )
        } else {
            String::new()
        },
        ns5 = if opts.qos_namespace {
            format!(
                "[[subsystems.namespaces]]\nnsid = {}\nram_size = \"16M\"\n",
                crate::qos::QOS_NSID
            )
        } else {
            String::new()
        },
        ports = tcp_port(1, port),
        dir = dir.path().display(),
    );
    let host_key = opts.keyed_subsystem.then(|| {
        let key = Secret::generate(Some(HashId::Sha256), 32).unwrap();
        let key_file = dir.join("host.key");
        private_file(&key_file, &key.to_interchange());
        config.push_str(&format!(
            r#"
[[subsystems]]
nqn = "{KEYED_NQN}"

[[subsystems.hosts]]
nqn = "{HOSTNQN}"
dhchap_key_file = "{}"
dhchap_hashes = ["hmac(sha256)"]
dhchap_dhgroups = ["null", "ffdhe2048"]

[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
"#,
            key_file.display()
        ));
        key
    });
    let tls = opts.tls.then(|| {
        let service = free_port();
        let key_file = dir.join("tls.psk");
        private_file(&key_file, TLS_KEY);
        config.push_str(&format!(
            "{port}tls = \"required\"\n\n[[tls_keys]]\nhost = \"{HOSTNQN}\"\nkey_file = \"{}\"\n",
            key_file.display(),
            port = tcp_port(2, service),
        ));
        let key = ConfiguredPsk::parse(TLS_KEY).unwrap();
        TlsPort {
            addr: ([127, 0, 0, 1], service).into(),
            params: TlsParams::new(&key, HOSTNQN, SUBNQN, true, Derivation::LibnvmeCompat).unwrap(),
        }
    });
    let mut cmd = serve(&dir.write_config(&config));
    if opts.tmpfs_namespace {
        private_tmpfs(&mut cmd, &dir.join("tmpfs"));
    }
    let mut process = fixture::Daemon::spawn(cmd);
    let addr = ([127, 0, 0, 1], port).into();
    process.wait_for_listener(addr, Duration::from_secs(20));
    if let Some(tls) = &tls {
        process.wait_for_listener(tls.addr, Duration::from_secs(20));
    }
    Daemon {
        process,
        tmpfs: opts.tmpfs_namespace,
        host_key,
        addr,
        tls,
        dir,
    }
}

impl Daemon {
    /// Resident set size of the daemon, KiB (/proc/PID/status VmRSS).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("daemon /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

// ---- clients -------------------------------------------------------------------------------

pub fn options() -> ClientOptions {
    ClientOptions {
        timeout: WAIT,
        ..ClientOptions::default()
    }
}

/// A TCP connection with nothing sent yet.
pub fn raw(d: &Daemon) -> Client {
    Client::connect_raw(d.addr, WAIT).expect("TCP connect")
}

/// ICReq/ICResp done, nothing else.
pub fn established(d: &Daemon) -> Client {
    Client::connect(d.addr, options()).expect("ICReq")
}

/// An enabled admin queue (KATO 30 s) of a new controller.
pub fn admin(d: &Daemon) -> (Client, u16) {
    admin_with(d, options(), 30_000)
}

/// ICReq/ICResp done: over TLS on a daemon with `Options::tls`, else in plaintext.
pub fn connected(d: &Daemon, opts: ClientOptions) -> Client {
    match &d.tls {
        Some(tls) => Client::connect_tls(tls.addr, opts, &tls.params).expect("TLS and ICReq"),
        None => Client::connect(d.addr, opts).expect("ICReq"),
    }
}

pub fn admin_with(d: &Daemon, opts: ClientOptions, kato_ms: u32) -> (Client, u16) {
    let mut c = connected(d, opts);
    let cntlid = c
        .fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, kato_ms)
        .expect("admin Connect");
    c.enable_controller(WAIT).expect("CC.EN");
    (c, cntlid)
}

/// An I/O queue (32 entries) of controller `cntlid`.
pub fn io_queue(d: &Daemon, opts: ClientOptions, cntlid: u16, qid: u16) -> Client {
    let mut c = connected(d, opts);
    c.fabrics_connect(qid, MAX_QUEUE_SIZE - 1, cntlid, SUBNQN, HOSTNQN, HOSTID, 0)
        .expect("I/O Connect");
    c.in_capsule_limit = IN_CAPSULE;
    c
}

/// The completion of an I/O queue 1 Connect (32 entries) to controller `cntlid`.
pub fn io_connect(d: &Daemon, cntlid: u16) -> Result<Cqe, String> {
    let mut c = established(d);
    c.fabrics_connect_raw(
        ConnectCommand {
            recfmt: 0,
            qid: 1,
            sqsize: 31,
            cattr: 0,
            kato: 0,
        },
        &ConnectData {
            hostid: HOSTID,
            cntlid,
            subnqn: SUBNQN.into(),
            hostnqn: HOSTNQN.into(),
        },
    )
    .map(|c| c.cqe)
    .map_err(|e| e.to_string())
}

/// A controller with one I/O queue.
pub fn controller(d: &Daemon) -> (Client, Client) {
    let (a, cntlid) = admin(d);
    (a, io_queue(d, options(), cntlid, 1))
}

pub use nvme::testing::pattern;

/// An SQE with PSDT 01b (SGL) and the given CID / SGL.
pub fn sqe(opcode: u8, nsid: u32, cid: u16, dptr: SglDescriptor) -> Sqe {
    Sqe {
        opcode,
        flags: nvme::spec::sqe_flags::PSDT_SGL,
        cid,
        nsid,
        dptr,
        ..Sqe::default()
    }
}

/// Sends `sqe` exactly as given (with `capsule` in-capsule) and returns its completion status
/// (reading `read_len` bytes of C2HData on the way, if any).
pub fn status_of(
    c: &mut Client,
    sqe: Sqe,
    capsule: &[u8],
    read_len: u32,
) -> Result<Status, String> {
    c.submit_exact(sqe, capsule, read_len)
        .map_err(|e| format!("send: {e}"))?;
    let done = c.wait(sqe.cid).map_err(|e| format!("no completion: {e}"))?;
    if done.cqe.cid != sqe.cid {
        return Err(format!("completion for cid {:#x}", done.cqe.cid));
    }
    Ok(done.cqe.status)
}

/// The status must be exactly `want`, DNR included.
pub fn expect_status(what: &str, got: Status, want: Status) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: status {got:?}, expected {want:?}"))
    }
}

pub fn expect(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// The controller answers with a C2HTermReq carrying `fes`/`fei` and then closes.
pub fn expect_term(c: &mut Client, fes: Fes, fei: u32) -> Result<(), String> {
    match c.expect_close() {
        Ok(Some(t)) if t.fes == fes as u16 && t.fei == fei => Ok(()),
        Ok(Some(t)) => Err(format!(
            "C2HTermReq FES {:#x} FEI {}, expected FES {:#x} ({fes:?}) FEI {fei}",
            t.fes, t.fei, fes as u16
        )),
        Ok(None) => Err(format!(
            "closed without a C2HTermReq, expected FES {fes:?} FEI {fei}"
        )),
        Err(e) => Err(format!("no termination: {e}")),
    }
}

/// The controller closes without a termination request (and without any other PDU).
pub fn expect_silent_close(c: &mut Client) -> Result<(), String> {
    match c.recv_pdu() {
        Err(ClientError::Closed) => Ok(()),
        Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
        Ok(p) => Err(format!(
            "got {:?}, expected a plain close",
            p.header.pdu_type()
        )),
        Err(e) => Err(format!("expected a close: {e}")),
    }
}

/// The raw bytes of a PDU whose common header is then edited by the caller.
pub fn capsule_bytes(c: &Client, sqe: Sqe, data: &[u8]) -> Vec<u8> {
    c.encode(&PduHeader::CapsuleCmd(sqe), data)
}

/// Sets PLEN of an encoded PDU.
pub fn set_plen(pdu: &mut [u8], plen: u32) {
    pdu[4..8].copy_from_slice(&plen.to_le_bytes());
}

/// Sends as much of `bytes` as the peer takes, ignoring errors (it may close meanwhile).
pub fn send_lossy(c: &mut Client, bytes: &[u8]) {
    if let Ok(mut w) = c.writer() {
        let _ = w.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = std::io::Write::write_all(&mut w, bytes);
    }
}

/// Resets the connection (SO_LINGER 0 then close: the peer gets RST, not FIN).
pub fn reset(stream: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&stream),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(stream);
}

/// Waits until the peer closes `stream` (EOF or reset); returns when that happened.
pub fn wait_closed(stream: &mut TcpStream, timeout: Duration) -> Result<Instant, String> {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("still open after {timeout:?}"));
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return Ok(Instant::now()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(Instant::now()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

// ---- the canary: verified I/O on its own controller while attacks run -----------------------

pub struct Canary {
    stop: Arc<AtomicBool>,
    pub ops: Arc<AtomicU64>,
    error: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Canary {
    /// Writes and reads back a fresh pattern in a region no attack touches (RAM namespace
    /// LBAs from 30000, file namespace LBAs 0..64), by R2T and in-capsule, over and over.
    pub fn start(d: &Daemon) -> Canary {
        let (admin, cntlid) = admin(d);
        let io = io_queue(d, options(), cntlid, 1);
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let error = Arc::new(Mutex::new(None));
        let (s, o, e) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&error));
        let thread = std::thread::spawn(move || {
            if let Err(msg) = canary_loop(admin, io, &s, &o) {
                *e.lock().unwrap() = Some(msg);
            }
        });
        let c = Canary {
            stop,
            ops,
            error,
            thread: Some(thread),
        };
        c.wait_ops(4, Duration::from_secs(10)).expect("canary I/O");
        c
    }

    pub fn check(&self) -> Result<(), String> {
        match &*self.error.lock().unwrap() {
            Some(e) => Err(format!("canary failed: {e}")),
            None => Ok(()),
        }
    }

    pub fn wait_ops(&self, more: u64, timeout: Duration) -> Result<(), String> {
        let target = self.ops.load(Ordering::Relaxed) + more;
        let deadline = Instant::now() + timeout;
        while self.ops.load(Ordering::Relaxed) < target {
            self.check()?;
            if Instant::now() >= deadline {
                return Err(format!("canary made no progress in {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| "canary thread panicked".to_owned())?;
        }
        self.check()?;
        Ok(self.ops.load(Ordering::Relaxed))
    }
}

fn canary_loop(
    mut admin: Client,
    mut io: Client,
    stop: &AtomicBool,
    ops: &AtomicU64,
) -> Result<(), String> {
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let (nsid, slba, len) = match round % 3 {
            0 => (RAM_NSID, 30_000 + (round % 64) * 16, 8192), // R2T
            1 => (RAM_NSID, 31_000 + (round % 64) * 8, 2048),  // in-capsule
            _ => (FILE_NSID, (round % 4) * 16, 8192),          // io_uring
        };
        let data = pattern(len, round);
        io.write(nsid, slba, data.clone(), BLOCK)
            .map_err(|e| format!("write {round}: {e}"))?;
        let back = io
            .read(nsid, slba, len as u32 / BLOCK, BLOCK)
            .map_err(|e| format!("read {round}: {e}"))?;
        if back != data {
            return Err(format!(
                "round {round}: read back differs (nsid {nsid}, lba {slba})"
            ));
        }
        if round % 50 == 0 {
            admin.keep_alive().map_err(|e| format!("keep-alive: {e}"))?;
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

// ---- the group runner ----------------------------------------------------------------------

pub type CaseFn = fn(&Daemon) -> Result<(), String>;

/// Runs every case against `d` while a canary does verified I/O; fails listing every case
/// that failed. Afterwards: the canary progressed and never failed, the daemon is alive and
/// did not panic, and its RSS grew by at most `rss_bound_kib`.
pub fn run_group(d: &mut Daemon, cases: &[(&str, CaseFn)], rss_bound_kib: u64) {
    let canary = Canary::start(d);
    let rss_before = d.rss_kib();
    let t0 = Instant::now();
    let mut failures = Vec::new();
    for (name, case) in cases {
        let start = Instant::now();
        // After every case the canary completes at least one more verified write+read.
        let result = case(d)
            .and_then(|()| canary.wait_ops(1, Duration::from_secs(10)))
            .and_then(|()| d.alive());
        match result {
            Ok(()) => eprintln!("  ok   {name} ({:.2?})", start.elapsed()),
            Err(e) => {
                eprintln!("  FAIL {name}: {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    // The canary still does verified I/O after everything.
    if let Err(e) = canary.wait_ops(3, Duration::from_secs(10)) {
        failures.push(format!("after the cases: {e}"));
    }
    // Give the daemon a moment to reap the closed connections before measuring.
    std::thread::sleep(Duration::from_millis(300));
    let rss_after = d.rss_kib();
    let ops = canary.finish();
    eprintln!(
        "  {} cases in {:.2?}; canary {:?} verified ops; RSS {} KiB -> {} KiB",
        cases.len(),
        t0.elapsed(),
        ops,
        rss_before,
        rss_after
    );
    match ops {
        Ok(n) if n > cases.len() as u64 / 4 => {}
        Ok(n) => failures.push(format!("canary did only {n} verified ops")),
        Err(e) => failures.push(e),
    }
    if rss_after > rss_before + rss_bound_kib {
        failures.push(format!(
            "RSS grew from {rss_before} KiB to {rss_after} KiB (bound {rss_bound_kib} KiB)"
        ));
    }
    if let Err(e) = d.alive() {
        failures.push(e);
    }
    let log = d.log();
    if log.contains("panicked") {
        failures.push(format!("nvmfd panicked:\n{log}"));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

pub fn read_sqe(nsid: u32, slba: u64, nlb: u32, cid: u16) -> Sqe {
    let mut s = Client::read_sqe(nsid, slba, nlb);
    s.cid = cid;
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::transport_data_block(nlb * BLOCK);
    s
}

pub fn write_sqe(nsid: u32, slba: u64, nlb: u32, cid: u16, dptr: SglDescriptor) -> Sqe {
    let mut s = Client::write_sqe(nsid, slba, nlb, false);
    s.cid = cid;
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = dptr;
    s
}

/// Reads `nlb` blocks, for checks after an attack.
pub fn read_back(c: &mut Client, nsid: u32, slba: u64, nlb: u32) -> Result<Vec<u8>, String> {
    c.read(nsid, slba, nlb, BLOCK)
        .map_err(|e| format!("read back: {e}"))
}

pub fn write(c: &mut Client, nsid: u32, slba: u64, data: Vec<u8>) -> Result<(), String> {
    c.write(nsid, slba, data, BLOCK)
        .map_err(|e| format!("write: {e}"))
}
