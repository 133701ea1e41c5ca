//! Shared pieces of the nvmfd fuzz targets: an input cursor that never fails (missing bytes
//! read as zero), the synchronous `IoSubmit` (`storage::sync::SyncEngine`), one
//! process-wide `Target` with a RAM and a file namespace, and builders for the commands a host needs to reach the deep states (Connect,
//! Property Set CC.EN).
//!
//! The targets themselves live in `fuzz_targets/`; the seed corpora are written by
//! `src/bin/gen_corpus.rs` from the same builders, so seeds and harnesses agree on the
//! input format.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::unistd::ftruncate;
pub use storage::sync::SyncEngine;
use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::queue::{PeerInfo, TransportKind};
use nvme::spec::{cc, fctype, reg, CNTLID_DYNAMIC, DISCOVERY_NQN};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig};
use nvme::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use nvme::wire::{SglDescriptor, Sqe};
use std::os::fd::IntoRawFd;

pub const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:fuzz";
/// A subsystem where HOSTNQN has a DH-HMAC-CHAP key: its queues take Authentication
/// Send/Receive and refuse everything else until authenticated.
pub const AUTH_SUBNQN: &str = "nqn.2026-12.dev.nvmfd:fuzz-auth";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f0000000-0000-0000-0000-00000000f022";
pub const RAM_NSID: u32 = 1;
pub const FILE_NSID: u32 = 2;
pub const READ_ONLY_NSID: u32 = 3;
/// Small limits keep every per-command buffer small, so one exec stays cheap.
pub const MDTS: u32 = 64 * 1024;
pub const IN_CAPSULE: u32 = 8192;
pub const QUEUE_SIZE: u16 = 32;

/// Reads fuzz input front to back; once it runs out every read yields zeroes, so a harness
/// never has to handle "input too short" and every prefix of an input is itself an input.
pub struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.bytes.len());
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head
    }

    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.bytes.len())
    }

    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let t = self.take(2);
        b[..t.len()].copy_from_slice(t);
        u16::from_le_bytes(b)
    }

    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let t = self.take(4);
        b[..t.len()].copy_from_slice(t);
        u32::from_le_bytes(b)
    }

    /// 64 bytes as an SQE (missing bytes are zero); `None` only for SGL bytes the decoder
    /// refuses, which cannot happen for a full 16-byte descriptor but is not assumed.
    pub fn sqe(&mut self) -> Option<Sqe> {
        let mut b = [0u8; Sqe::SIZE];
        let t = self.take(Sqe::SIZE);
        b[..t.len()].copy_from_slice(t);
        Sqe::decode(&b).ok()
    }
}

/// A tiny deterministic generator for split points (xorshift32): the splits are a function
/// of the input, so a crash reproduces from the saved input alone.
pub struct Splits(u32);

impl Splits {
    pub fn new(seed: u32) -> Self {
        Self(seed | 1)
    }

    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }

    /// A chunk length in 1..=max, biased towards small pieces (the boundaries that matter
    /// are inside the 8-byte common header and the digests).
    pub fn chunk(&mut self, max: usize) -> usize {
        let r = self.next_u32();
        let cap = match r & 3 {
            0 => 8,
            1 => 64,
            2 => 1024,
            _ => max,
        };
        1 + (r >> 2) as usize % cap.min(max).max(1)
    }
}

/// `NVMFD_FUZZ_TRACE=1`: harnesses print every command and response (to see how deep an
/// input gets, e.g. `NVMFD_FUZZ_TRACE=1 fuzz/target/…/queue fuzz/corpus/queue/seed-session`).
pub fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("NVMFD_FUZZ_TRACE").is_some())
}

/// The limits every fuzz target runs with.
pub fn limits() -> Limits {
    Limits {
        max_queue_size: QUEUE_SIZE,
        max_io_queues: 4,
        max_data_transfer: MDTS,
        in_capsule_data_size: IN_CAPSULE,
        kato_default_ms: 120_000,
    }
}

/// An anonymous in-memory file (memfd) as a path the file backend can open: no files are
/// left behind however the fuzzer exits.
fn memfd_path(size: u64) -> std::path::PathBuf {
    let fd = memfd_create(c"nvmfd-fuzz-ns", MemFdCreateFlag::empty()).expect("memfd_create");
    ftruncate(&fd, size as i64).expect("ftruncate");
    // The descriptor stays open for the life of the process; the backend reopens it by path.
    let fd = fd.into_raw_fd();
    format!("/proc/self/fd/{fd}").into()
}

fn namespace(
    nsid: u32,
    backend: BackendConfig,
    block_size: u32,
    read_only: bool,
) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        backend,
        block_size,
        read_only,
        uuid: None,
        nguid: None,
        ana_group: nvme::ana::DEFAULT_ANA_GROUP,
    }
}

/// One target per process (building it per exec would dominate the run time): port 1 on
/// 127.0.0.1, one subsystem with a 1 MiB RAM namespace (512-byte blocks), a 1 MiB file
/// namespace (4096-byte blocks, I/O through `IoSubmit`) and a read-only RAM namespace, and
/// [`AUTH_SUBNQN`] (NULL DH group only: FFDHE is slow under the sanitizers and the `auth`
/// target covers it).
pub fn target() -> Arc<Target> {
    static TARGET: OnceLock<Arc<Target>> = OnceLock::new();
    Arc::clone(TARGET.get_or_init(|| {
        let config = TargetConfig {
            ports: vec![PortConfig {
                id: 1,
                transport: TransportKind::Tcp,
                address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                service: 4420,
                secure_channel: Default::default(),
            }],
            subsystems: vec![SubsystemConfig {
                nqn: SUBNQN.into(),
                serial: String::new(),
                model: "nvmfd-fuzz".into(),
                allow_any_host: true,
                allowed_hosts: vec![],
                host_auth: Default::default(),
                ports: vec![],
                namespaces: vec![
                    namespace(RAM_NSID, BackendConfig::Ram { size: 1 << 20 }, 512, false),
                    namespace(
                        FILE_NSID,
                        BackendConfig::File {
                            path: memfd_path(1 << 20),
                            size: None,
                            direct_io: false,
                        },
                        4096,
                        false,
                    ),
                    namespace(
                        READ_ONLY_NSID,
                        BackendConfig::Ram { size: 64 << 10 },
                        512,
                        true,
                    ),
                ],
                visibility: Default::default(),
                qos: Default::default(),
            }, auth_subsystem()],
            limits: limits(),
            ..TargetConfig::default()
        };
        Target::with_opener(config, &storage::open).expect("fuzz target configuration is valid")
    }))
}

fn auth_subsystem() -> SubsystemConfig {
    let host = nvme::auth::HostAuth {
        host_key: nvmfd_auth::Secret::new(None, vec![0x33; 32]).expect("32-byte secret"),
        ctrl_key: Some(nvmfd_auth::Secret::new(None, vec![0x44; 32]).expect("32-byte secret")),
        hashes: nvmfd_auth::HashId::ALL.to_vec(),
        dh_groups: vec![nvmfd_auth::DhGroup::Null],
    };
    SubsystemConfig {
        nqn: AUTH_SUBNQN.into(),
        serial: String::new(),
        model: "nvmfd-fuzz".into(),
        allow_any_host: false,
        allowed_hosts: vec![HOSTNQN.into()],
        host_auth: [(HOSTNQN.to_owned(), host)].into(),
        ports: vec![],
        namespaces: vec![namespace(
            RAM_NSID,
            BackendConfig::Ram { size: 64 << 10 },
            512,
            false,
        )],
        visibility: Default::default(),
        qos: Default::default(),
    }
}

pub fn peer() -> PeerInfo {
    PeerInfo {
        transport: TransportKind::Tcp,
        port_id: 1,
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4420),
        remote: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 40000),
        reactor: None,
    }
}

/// Which subsystem a Connect names (chosen by a fuzz byte).
pub fn connect_subnqn(sel: u8) -> &'static str {
    match sel % 4 {
        0 => SUBNQN,
        1 => AUTH_SUBNQN,
        2 => DISCOVERY_NQN,
        _ => "nqn.2026-12.dev.nvmfd:absent",
    }
}

/// A Connect SQE whose 1024 bytes of data travel with a transport data block SGL (R2T) or
/// in the capsule.
pub fn connect_sqe(cid: u16, qid: u16, sqsize: u16, cattr: u8, kato: u32, in_capsule: bool) -> Sqe {
    let mut sqe = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize,
        cattr,
        kato,
    }
    .to_sqe(cid);
    sqe.dptr = if in_capsule {
        SglDescriptor::in_capsule(0, ConnectData::SIZE as u32)
    } else {
        SglDescriptor::transport_data_block(ConnectData::SIZE as u32)
    };
    sqe
}

pub fn connect_data(subnqn: &str, cntlid: Option<u16>) -> [u8; ConnectData::SIZE] {
    ConnectData {
        hostid: [0xf0; 16],
        cntlid: cntlid.unwrap_or(CNTLID_DYNAMIC),
        subnqn: subnqn.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode()
}

/// Property Set CC = enable (NVMe-oF 1.1 §3.5): needed before any admin command runs.
pub fn enable_sqe(cid: u16) -> Sqe {
    let mut sqe = PropertyCommand {
        size: PropertySize::Four,
        offset: reg::CC,
        value: u64::from(cc::ENABLE),
    }
    .to_sqe(fctype::PROPERTY_SET, cid);
    // NVMe/TCP 1.0 §3.5.1: a command without data still carries a transport SGL descriptor.
    sqe.dptr = SglDescriptor::transport_data_block(0);
    sqe
}

/// Copies `src` cyclically into `dst` (zeroes when `src` is empty): host data for a
/// command from however many fuzz bytes are left.
pub fn fill_cyclic(dst: &mut [u8], src: &[u8]) {
    if src.is_empty() {
        dst.fill(0);
        return;
    }
    for (d, s) in dst.iter_mut().zip(src.iter().cycle()) {
        *d = *s;
    }
}
