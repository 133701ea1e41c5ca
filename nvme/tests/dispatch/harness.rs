//! An in-memory host for driving `nvme::queue::Queue` end to end: builds SQEs, runs them
//! through prepare → execute (→ finish), and performs submitted backend ops synchronously
//! with pread/pwrite, like the reactor's io_uring would.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::queue::{Direction, Outcome, PeerInfo, Queue, Response, TransportKind};
use nvme::spec::{admin_opcode, cc, fctype, reg, FABRICS_OPCODE};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig};
use nvme::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use nvme::wire::{SglDescriptor, Sqe, Status};
pub use storage::sync::SyncEngine;
use storage::{Backend, BackendError, BackendRequest, Capabilities, IoSubmit, Started, Zeroing};

pub const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:test";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";

/// An in-memory backend whose next operations can be made to fail with an errno.
#[derive(Debug)]
pub struct MemBackend {
    pub data: Mutex<Vec<u8>>,
    pub fail_with: Mutex<Option<i32>>,
    /// FUA flag of the last write.
    pub last_fua: Mutex<Option<bool>>,
    /// What `capabilities` reports: RAM-like zeroing and, like a file, a volatile write
    /// cache (so that FUA and VWC matter), unless a test changes it.
    pub caps: Mutex<Capabilities>,
}

impl MemBackend {
    fn check(&self) -> std::io::Result<()> {
        match *self.fail_with.lock().unwrap() {
            Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}

impl Backend for MemBackend {
    fn capacity(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn kind(&self) -> &'static str {
        "test"
    }
    fn capabilities(&self) -> Capabilities {
        *self.caps.lock().unwrap()
    }
    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        _tag: u64,
        _io: &mut dyn IoSubmit,
    ) -> Started {
        if let Err(e) = self.check() {
            return Started::Done(Err(e));
        }
        let mut d = self.data.lock().unwrap();
        match request {
            BackendRequest::Read { offset } => {
                let o = offset as usize;
                buf.copy_from_slice(&d[o..o + buf.len()]);
            }
            BackendRequest::Write { offset, fua } => {
                *self.last_fua.lock().unwrap() = Some(fua);
                let o = offset as usize;
                d[o..o + buf.len()].copy_from_slice(buf);
            }
            BackendRequest::Flush => {}
        }
        Started::Done(Ok(()))
    }
    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        _what: Zeroing,
        _tag: u64,
        _io: &mut dyn IoSubmit,
    ) -> Started {
        if let Err(e) = self.check() {
            return Started::Done(Err(e));
        }
        let mut d = self.data.lock().unwrap();
        for &(offset, len) in ranges {
            d[offset as usize..(offset + len) as usize].fill(0);
        }
        Started::Done(Ok(()))
    }
}

/// Opens `Ram` configs as `MemBackend` (kept in `made` so tests can inject faults) and
/// everything else with the real `storage::open`.
pub struct Backends {
    pub made: Arc<Mutex<Vec<Arc<MemBackend>>>>,
}

impl Backends {
    pub fn new() -> Self {
        Self {
            made: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn opener(
        &self,
    ) -> impl Fn(&BackendConfig, u32) -> Result<Arc<dyn Backend>, BackendError> + Send + Sync {
        let made = Arc::clone(&self.made);
        move |cfg: &BackendConfig, bs: u32| match cfg {
            BackendConfig::Ram { size } => {
                let b = Arc::new(MemBackend {
                    data: Mutex::new(vec![0; *size as usize]),
                    fail_with: Mutex::new(None),
                    last_fua: Mutex::new(None),
                    caps: Mutex::new(Capabilities {
                        volatile_cache: true,
                        ..Capabilities::ZEROING
                    }),
                });
                made.lock().unwrap().push(Arc::clone(&b));
                Ok(b as Arc<dyn Backend>)
            }
            other => storage::open(other, bs),
        }
    }

    pub fn last(&self) -> Arc<MemBackend> {
        Arc::clone(self.made.lock().unwrap().last().unwrap())
    }
}

pub fn ram_ns(nsid: u32, size: u64, block_size: u32) -> NamespaceConfig {
    NamespaceConfig::new(nsid, BackendConfig::Ram { size }, block_size)
}

pub fn subsystem(nqn: &str, namespaces: Vec<NamespaceConfig>) -> SubsystemConfig {
    SubsystemConfig::open_to_any_host(nqn, "nvmfd-test", namespaces)
}

pub fn port(id: u16, transport: TransportKind, address: IpAddr) -> PortConfig {
    PortConfig {
        id,
        transport,
        address,
        service: 4420,
        secure_channel: Default::default(),
    }
}

/// One TCP port on 127.0.0.1, one subsystem with a 1 MiB namespace of 512-byte blocks.
pub fn basic_config() -> TargetConfig {
    TargetConfig {
        ports: vec![port(1, TransportKind::Tcp, IpAddr::V4(Ipv4Addr::LOCALHOST))],
        subsystems: vec![subsystem(SUBNQN, vec![ram_ns(1, 1 << 20, 512)])],
        limits: Limits::default(),
        referrals: vec![],
        multipath: Default::default(),
        state_dir: None,
        discovery_nqn: None,
        reservation_stores: None,
    }
}

pub fn peer(transport: TransportKind, port_id: u16) -> PeerInfo {
    PeerInfo {
        transport,
        port_id,
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 4420),
        remote: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 40000),
        reactor: None,
    }
}

/// A host-side view of one queue.
pub struct Host {
    pub q: Queue,
    next_cid: u16,
    /// Ops run at submit time; `finish` is called by `Host::run`.
    pub io: SyncEngine,
    pub submitted: usize,
}

pub fn fabrics_sqe(fct: u8) -> Sqe {
    Sqe {
        opcode: FABRICS_OPCODE,
        flags: 0x40,
        nsid: fct as u32,
        ..Sqe::default()
    }
}

pub fn sqe(opcode: u8, nsid: u32) -> Sqe {
    Sqe {
        opcode,
        flags: 0x40,
        nsid,
        dptr: SglDescriptor::transport_data_block(0),
        ..Sqe::default()
    }
}

impl Host {
    pub fn new(target: &Arc<Target>, peer: PeerInfo) -> Self {
        Self {
            q: Queue::new(Arc::clone(target), peer),
            next_cid: 1,
            io: SyncEngine::default(),
            submitted: 0,
        }
    }

    /// Runs one command; `data` is the command's data buffer (its length is the SGL length).
    /// Returns None when the command was held or blocked.
    pub fn try_run(&mut self, mut sqe: Sqe, data: &mut [u8]) -> Option<Response> {
        sqe.cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        match self.q.prepare(&sqe, data.len() as u32) {
            Err(status) => return Some(self.q.reject(&sqe, status)),
            Ok(Direction::ControllerToHost) => data.fill(0xa5),
            Ok(_) => {}
        }
        self.execute_now(&sqe, data, sqe.cid as u64)
    }

    /// Runs `execute` and completes its submitted ops right away, running the command again
    /// while the core says it is not done (a fused Write after its Compare read). None: the
    /// command was held or blocked.
    pub fn execute_now(&mut self, sqe: &Sqe, data: &mut [u8], tag: u64) -> Option<Response> {
        loop {
            match self.q.execute(sqe, data, tag, &mut self.io) {
                Outcome::Complete(r) => return Some(r),
                Outcome::Held | Outcome::Blocked => return None,
                Outcome::Submitted => {
                    self.submitted += 1;
                    let (t, res) = self.io.done.pop().expect("op submitted");
                    assert_eq!(t, tag);
                    if let Some(r) = self.q.finish(sqe, res) {
                        return Some(r);
                    }
                }
            }
        }
    }

    pub fn run(&mut self, sqe: Sqe, data: &mut [u8]) -> Response {
        let r = self.try_run(sqe, data).expect("command completed");
        assert_eq!(r.cqe.cid, self.next_cid.wrapping_sub(1));
        r
    }

    pub fn status(&mut self, sqe: Sqe, data: &mut [u8]) -> Status {
        self.run(sqe, data).cqe.status
    }

    pub fn connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        cattr: u8,
        kato: u32,
        data: &ConnectData,
    ) -> Response {
        let s = ConnectCommand {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato,
        }
        .to_sqe(0);
        let mut buf = data.encode().to_vec();
        self.run(s, &mut buf)
    }

    pub fn property_get(&mut self, offset: u32, size: PropertySize) -> Response {
        let s = PropertyCommand {
            size,
            offset,
            value: 0,
        }
        .to_sqe(fctype::PROPERTY_GET, 0);
        self.run(s, &mut [])
    }

    pub fn property_set(&mut self, offset: u32, value: u32) -> Status {
        let s = PropertyCommand {
            size: PropertySize::Four,
            offset,
            value: value as u64,
        }
        .to_sqe(fctype::PROPERTY_SET, 0);
        self.run(s, &mut []).cqe.status
    }

    pub fn poll(&mut self, now: Instant) -> nvme::queue::PollResult {
        self.q.poll(now)
    }
}

pub fn connect_data(subnqn: &str, hostnqn: &str, cntlid: u16) -> ConnectData {
    ConnectData {
        hostid: [0x42; 16],
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    }
}

/// Connects and enables an admin queue; returns it with its cntlid.
pub fn admin(target: &Arc<Target>, subnqn: &str, kato: u32) -> (Host, u16) {
    let mut h = Host::new(target, peer(TransportKind::Tcp, 1));
    let r = h.connect(0, 31, 0, kato, &connect_data(subnqn, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS, "admin connect");
    let cntlid = r.cqe.dw0 as u16;
    assert_eq!(h.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    (h, cntlid)
}

/// Connects I/O queue `qid` of controller `cntlid`.
pub fn io_queue(target: &Arc<Target>, cntlid: u16, qid: u16) -> Host {
    let mut h = Host::new(target, peer(TransportKind::Tcp, 1));
    let r = h.connect(qid, 127, 0, 0, &connect_data(SUBNQN, HOSTNQN, cntlid));
    assert_eq!(r.cqe.status, Status::SUCCESS, "I/O connect");
    h
}

/// Target from `cfg` with test backends.
pub fn target_with(cfg: TargetConfig, backends: &Backends) -> Arc<Target> {
    Target::with_opener(cfg, &backends.opener()).expect("target")
}

/// Identify SQE.
pub fn identify(cns: u8, nsid: u32, csi: u8) -> Sqe {
    Sqe {
        cdw10: cns as u32,
        cdw11: (csi as u32) << 24,
        ..sqe(admin_opcode::IDENTIFY, nsid)
    }
}

/// Get Log Page SQE for `len` bytes (multiple of 4) at `offset`.
pub fn get_log(lid: u8, len: u32, offset: u64, rae: bool) -> Sqe {
    let numd = len / 4 - 1;
    Sqe {
        cdw10: lid as u32 | (rae as u32) << 15 | (numd & 0xffff) << 16,
        cdw11: numd >> 16,
        cdw12: offset as u32,
        cdw13: (offset >> 32) as u32,
        ..sqe(admin_opcode::GET_LOG_PAGE, 0xffff_ffff)
    }
}

/// Read/Write/Compare SQE.
pub fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    Sqe {
        cdw10: slba as u32,
        cdw11: (slba >> 32) as u32,
        cdw12: nlb - 1,
        ..sqe(opcode, nsid)
    }
}
