//! Instructions per I/O of the NVMe/RDMA connection core (`scripts/bench.sh profile-rdma`,
//! under callgrind; the example `rdma_core_profile` runs it).
//!
//! [`ConnCore`] runs on the real dispatch core (a `Queue` of a target with a RAM namespace)
//! with an in-memory NIC in place of the QP: every posted work request completes at once, and
//! each response SEND is followed by the host's next command capsule, so `depth` commands stay
//! outstanding. The NIC moves no data (on hardware RDMA READ/WRITE cost the CPU nothing either)
//! and only copies each command capsule into its receive buffer, as the HCA's DMA would.
//!
//! Measured: everything [`deliver`] does — one `ConnCore::on_completions` call per batch of
//! completions, i.e. the transport state machine, the NVMe dispatch core and the RAM copy.
//! Not measured (it is not sans-I/O): the reactor's epoll wait, `ibv_poll_cq` and
//! `ibv_post_send`/`ibv_post_recv` in the provider library, and the completion-channel re-arm.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::queue::{PeerInfo, Queue};
use nvme::spec::{cc, csts, fctype, nvm_opcode, reg};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig, TransportKind};
use nvme::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use nvme::wire::{Cqe, SglDescriptor, SglType, Sqe};
use storage::{BlockOp, IoSubmit};

use super::core::{ConnCore, ConnShape, WorkPoster};
use super::pool::{DevicePools, PoolParams};
use super::verbs::{LocalBuf, SendOp, VerbsError, WcOpcode, WorkCompletion};
use crate::conn::ConnStatus;

const NQN: &str = "nqn.2026-12.dev.nvmfd:rdma-profile";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const BLOCK: u32 = 4096;
const NAMESPACE_BYTES: u64 = 8 << 20;
const ADMIN_DEPTH: u16 = 32;
const IO_DEPTH: u16 = 128;
const IN_CAPSULE: u32 = 8192;
const MDTS: u32 = 128 * 1024;
/// The host's remote key and buffer address in every keyed SGL (the NIC never uses them).
const RKEY: u32 = 0x1234;
const HOST_ADDR: u64 = 0x7f00_0000_0000;

/// One measured workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Host → controller (NVM Write) rather than NVM Read.
    pub write: bool,
    /// Bytes per I/O (a multiple of 4 KiB, at most 128 KiB).
    pub bytes: u32,
    /// Commands kept outstanding (1..=128).
    pub depth: u16,
    /// Sequential rather than random offsets.
    pub sequential: bool,
}

/// What a run did (for the report line; the instruction count comes from callgrind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub ios: u64,
    /// `deliver` calls: batches of work completions, as the reactor polls them.
    pub batches: u64,
    pub rdma_reads: u64,
    pub rdma_writes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("invalid workload: {0}")]
    Workload(&'static str),
    #[error("target: {0}")]
    Target(String),
    #[error("{what} failed: {status}")]
    Status {
        what: &'static str,
        status: nvme::wire::Status,
    },
    #[error("connection closed: {0}")]
    Closed(String),
    #[error("protocol: {0}")]
    Protocol(&'static str),
}

/// The in-memory NIC: posted receives in order, posted sends until completed.
#[derive(Default)]
struct Nic {
    recvs: VecDeque<(u64, LocalBuf)>,
    sends: Vec<(u64, SendOp, LocalBuf)>,
}

impl WorkPoster for Nic {
    fn post_recv(&mut self, wr_id: u64, buf: LocalBuf) -> Result<(), VerbsError> {
        self.recvs.push_back((wr_id, buf));
        Ok(())
    }
    fn post_send(&mut self, wr_id: u64, op: SendOp, buf: LocalBuf) -> Result<(), VerbsError> {
        self.sends.push((wr_id, op, buf));
        Ok(())
    }
}

/// RAM namespaces complete inline; nothing may be submitted.
struct NoRing;

impl IoSubmit for NoRing {
    fn submit(&mut self, _op: BlockOp, _tag: u64) {
        unreachable!("RAM namespaces complete inline")
    }
    fn submit_group(&mut self, _ops: &[BlockOp], _tag: u64) {
        unreachable!("RAM namespaces complete inline")
    }
}

/// One queue: its core, its NIC and the host's view.
struct Link {
    core: ConnCore<Queue>,
    nic: Nic,
    io: NoRing,
    wcs: Vec<WorkCompletion>,
}

/// The measured call: one batch of completions into the core (callgrind collects only here:
/// `--toggle-collect='*profile*deliver*'`).
#[inline(never)]
fn deliver(link: &mut Link) -> ConnStatus {
    let Link { core, nic, io, wcs } = link;
    let status = core.on_completions(wcs, nic, io);
    wcs.clear();
    status
}

fn ok(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: 0,
        opcode,
        byte_len: 0,
    }
}

impl Link {
    fn new(target: &Arc<Target>, pools: &DevicePools, token: u32, depth: u16) -> Self {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4420);
        let queue = Queue::new(
            Arc::clone(target),
            PeerInfo {
                transport: TransportKind::Rdma,
                port_id: 1,
                local: addr,
                remote: SocketAddr::new(addr.ip(), 50000 + token as u16),
                reactor: None,
            },
        );
        let shape = ConnShape {
            depth,
            contexts: depth * 2,
            ord: 16,
            in_capsule_data_size: IN_CAPSULE,
            max_data_transfer: MDTS,
        };
        let mut link = Self {
            core: ConnCore::new(queue, token, shape, pools.clone()).expect("pools sized for it"),
            nic: Nic::default(),
            io: NoRing,
            wcs: Vec::with_capacity(4 * usize::from(depth)),
        };
        link.core.post_initial_receives(&mut link.nic);
        link
    }

    /// The host's SEND of one capsule: copied into the next posted receive buffer.
    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ProfileError> {
        let (wr_id, _) = self
            .nic
            .recvs
            .pop_front()
            .ok_or(ProfileError::Protocol("no receive posted for a capsule"))?;
        let len =
            self.core
                .write_capsule(wr_id, &sqe.encode(), data)
                .ok_or(ProfileError::Protocol(
                    "capsule does not fit its receive buffer",
                ))?;
        self.wcs.push(WorkCompletion {
            wr_id,
            status: 0,
            opcode: WcOpcode::Recv,
            byte_len: len,
        });
        Ok(())
    }

    /// Completes every posted send; returns the responses sent (their CQEs).
    fn complete_sends(&mut self, out: &mut Vec<Cqe>) -> Result<(u64, u64), ProfileError> {
        let (mut reads, mut writes) = (0, 0);
        for (wr_id, op, buf) in self.nic.sends.drain(..) {
            let opcode = match op {
                SendOp::Send { .. } => {
                    out.push(
                        self.core
                            .sent_response(&buf)
                            .ok_or(ProfileError::Protocol("SEND not from a response buffer"))?,
                    );
                    WcOpcode::Send
                }
                SendOp::RdmaRead { .. } => {
                    reads += 1;
                    WcOpcode::RdmaRead
                }
                SendOp::RdmaWrite { .. } => {
                    writes += 1;
                    WcOpcode::RdmaWrite
                }
            };
            self.wcs.push(ok(wr_id, opcode));
        }
        Ok((reads, writes))
    }

    /// One command with in-capsule data (or none), run to its response.
    fn command(&mut self, what: &'static str, sqe: Sqe, data: &[u8]) -> Result<Cqe, ProfileError> {
        self.capsule(&sqe, data)?;
        let mut cqes = Vec::new();
        for _ in 0..8 {
            if deliver(self) == ConnStatus::Closed {
                return Err(self.closed());
            }
            self.complete_sends(&mut cqes)?;
            if let Some(cqe) = cqes.pop() {
                // Retire the SEND completion too.
                deliver(self);
                return if cqe.status.is_success() {
                    Ok(cqe)
                } else {
                    Err(ProfileError::Status {
                        what,
                        status: cqe.status,
                    })
                };
            }
        }
        Err(ProfileError::Protocol("no response"))
    }

    fn closed(&self) -> ProfileError {
        ProfileError::Closed(
            self.core
                .close_reason()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        )
    }
}

fn in_capsule_sgl(len: u32) -> SglDescriptor {
    SglDescriptor {
        address: 0,
        length: len,
        key: 0,
        sgl_type: SglType::DataBlockOffset,
    }
}

fn connect(link: &mut Link, qid: u16, depth: u16, cntlid: u16) -> Result<u16, ProfileError> {
    let mut sqe = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize: depth - 1,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(1);
    let data = ConnectData {
        hostid: [7; 16],
        cntlid,
        subnqn: NQN.to_owned(),
        hostnqn: HOSTNQN.to_owned(),
    }
    .encode();
    sqe.dptr = in_capsule_sgl(data.len() as u32);
    Ok(link.command("Connect", sqe, &data)?.dw0 as u16)
}

fn property(link: &mut Link, fctype: u8, offset: u32, value: u64) -> Result<Cqe, ProfileError> {
    let mut sqe = PropertyCommand {
        size: PropertySize::Four,
        offset,
        value,
    }
    .to_sqe(fctype, 2);
    // No data: a zero-length keyed SGL, as the Linux host sends (nvme_rdma_set_sg_null).
    sqe.dptr = SglDescriptor {
        address: 0,
        length: 0,
        key: 0,
        sgl_type: SglType::KeyedDataBlock,
    };
    link.command("Property", sqe, &[])
}

fn target() -> Result<Arc<Target>, ProfileError> {
    let config = TargetConfig {
        ports: vec![PortConfig {
            id: 1,
            transport: TransportKind::Rdma,
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            service: 4420,
            secure_channel: Default::default(),
        }],
        subsystems: vec![SubsystemConfig::open_to_any_host(
            NQN,
            "nvmfd-rdma-profile",
            vec![NamespaceConfig::new(
                1,
                BackendConfig::Ram {
                    size: NAMESPACE_BYTES,
                },
                BLOCK,
            )],
        )],
        limits: Limits {
            max_data_transfer: MDTS,
            in_capsule_data_size: IN_CAPSULE,
            ..Limits::default()
        },
        ..TargetConfig::default()
    };
    Target::with_opener(config, &storage::open).map_err(|e| ProfileError::Target(e.to_string()))
}

/// xorshift64: reproducible random offsets without a dependency.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Connects an admin and an I/O queue, enables the controller, then runs `ios` I/Os of
/// `workload` on the I/O queue.
pub fn run(workload: Workload, ios: u64) -> Result<Summary, ProfileError> {
    if workload.bytes == 0 || !workload.bytes.is_multiple_of(BLOCK) || workload.bytes > MDTS {
        return Err(ProfileError::Workload(
            "bytes: a multiple of 4 KiB up to 128 KiB",
        ));
    }
    if workload.depth == 0 || workload.depth > IO_DEPTH {
        return Err(ProfileError::Workload("depth: 1..=128"));
    }
    let target = target()?;
    let depths = u32::from(ADMIN_DEPTH + IO_DEPTH);
    let pools = DevicePools::unregistered(&PoolParams {
        in_capsule_data_size: IN_CAPSULE,
        max_data_transfer: MDTS,
        capsule_buffers: depths,
        response_buffers: 2 * depths,
        data_buffers: u32::from(IO_DEPTH),
    })
    .map_err(|e| ProfileError::Target(e.to_string()))?;

    let mut admin = Link::new(&target, &pools, 1, ADMIN_DEPTH);
    let cntlid = connect(&mut admin, 0, ADMIN_DEPTH, 0xffff)?;
    property(
        &mut admin,
        fctype::PROPERTY_SET,
        reg::CC,
        u64::from(cc::ENABLE),
    )?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while property(&mut admin, fctype::PROPERTY_GET, reg::CSTS, 0)?.dw0 & csts::RDY == 0 {
        if Instant::now() > deadline {
            return Err(ProfileError::Protocol("controller not ready"));
        }
        admin
            .core
            .on_tick(Instant::now(), &mut admin.nic, &mut admin.io);
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut link = Link::new(&target, &pools, 2, IO_DEPTH);
    connect(&mut link, 1, IO_DEPTH, cntlid)?;

    let blocks = workload.bytes / BLOCK;
    let slots = NAMESPACE_BYTES / u64::from(workload.bytes);
    let mut random = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_slot = 0u64;
    let mut sent = 0u64;
    let mut free_cids: Vec<u16> = (0..workload.depth).rev().collect();
    let mut summary = Summary {
        ios: 0,
        batches: 0,
        rdma_reads: 0,
        rdma_writes: 0,
    };
    let mut cqes = Vec::with_capacity(usize::from(workload.depth));
    let mut issue = |link: &mut Link, cid: u16| -> Result<(), ProfileError> {
        let slot = if workload.sequential {
            next_slot = (next_slot + 1) % slots;
            next_slot
        } else {
            next_random(&mut random) % slots
        };
        let slba = slot * u64::from(blocks);
        let sqe = Sqe {
            opcode: if workload.write {
                nvm_opcode::WRITE
            } else {
                nvm_opcode::READ
            },
            flags: 0x40,
            cid,
            nsid: 1,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: blocks - 1,
            dptr: SglDescriptor {
                address: HOST_ADDR,
                length: workload.bytes,
                key: RKEY,
                sgl_type: SglType::KeyedDataBlock,
            },
            ..Sqe::default()
        };
        link.capsule(&sqe, &[])
    };
    while sent < ios.min(u64::from(workload.depth)) {
        issue(&mut link, free_cids.pop().expect("depth cids"))?;
        sent += 1;
    }
    while summary.ios < ios {
        if link.wcs.is_empty() {
            return Err(ProfileError::Protocol("stalled: nothing to complete"));
        }
        summary.batches += 1;
        if deliver(&mut link) == ConnStatus::Closed {
            return Err(link.closed());
        }
        let (reads, writes) = link.complete_sends(&mut cqes)?;
        summary.rdma_reads += reads;
        summary.rdma_writes += writes;
        for cqe in cqes.drain(..) {
            if !cqe.status.is_success() {
                return Err(ProfileError::Status {
                    what: "I/O",
                    status: cqe.status,
                });
            }
            summary.ios += 1;
            free_cids.push(cqe.cid);
            if sent < ios {
                issue(&mut link, free_cids.pop().expect("a cid was freed"))?;
                sent += 1;
            }
        }
    }
    // The last SEND completions.
    deliver(&mut link);
    let expected = |on: bool| if on { ios } else { 0 };
    if summary.rdma_reads != expected(workload.write)
        || summary.rdma_writes != expected(!workload.write)
    {
        return Err(ProfileError::Protocol(
            "data moved by other than one RDMA op per I/O",
        ));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_completes_with_one_rdma_op_per_io() {
        for (write, bytes, depth) in [(false, 4096, 32), (true, 4096, 32), (false, 128 << 10, 8)] {
            let w = Workload {
                write,
                bytes,
                depth,
                sequential: bytes > 4096,
            };
            let s = run(w, 500).unwrap();
            assert_eq!(s.ios, 500);
            assert_eq!(s.rdma_reads, if write { 500 } else { 0 });
            assert_eq!(s.rdma_writes, if write { 0 } else { 500 });
            assert!(s.batches > 0 && s.batches <= 500, "{s:?}");
        }
    }

    #[test]
    fn bad_workloads_are_refused() {
        let w = Workload {
            write: false,
            bytes: 4096,
            depth: 32,
            sequential: false,
        };
        assert!(run(Workload { bytes: 1000, ..w }, 1).is_err());
        assert!(run(Workload { depth: 0, ..w }, 1).is_err());
        assert!(run(Workload { depth: 129, ..w }, 1).is_err());
    }
}
