//! The TCP connection core driven in memory (quinn-proto style, deterministic): a whole host
//! exchange is fed as a byte stream cut at every offset, and byte by byte, through the same
//! `read_buf` / `received` path the socket shell uses; the bytes the core queues to send must
//! not depend on where the cuts fell.

use std::net::SocketAddr;
use std::sync::Arc;

use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::queue::{PeerInfo, Queue, TransportKind};
use nvme::target::{Limits, PortConfig, SubsystemConfig, Target, TargetConfig};
use nvme::testing::{pattern, InlineOnly};
use nvme::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use nvme::wire::{Cqe, SglDescriptor};

use super::*;
use crate::client::Client;
use crate::tcp::pdu::encode_pdu;
use nvme::spec::{cc, fctype, reg};

const SUBNQN: &str = "nqn.2026-12.dev.nvmfd:core-test";
const HOSTNQN: &str = "nqn.2026-12.dev.nvmfd:core-test-host";
const BLOCK: u32 = 512;
const NSID: u32 = 1;
const DIGESTS: Digests = Digests {
    header: true,
    data: true,
};
/// Every test connection's token: tags are `1 << 32 | slot`.
const TOKEN: u32 = 1;

fn peer() -> PeerInfo {
    PeerInfo {
        transport: TransportKind::Tcp,
        port_id: 1,
        local: "127.0.0.1:4420".parse().unwrap(),
        remote: "127.0.0.1:50000".parse().unwrap(),
        reactor: None,
    }
}

fn params() -> TcpParams {
    TcpParams {
        // The smallest MAXH2CDATA: an 8 KiB write takes two R2Ts.
        max_h2c_data: 4096,
        in_capsule_data_size: 8192,
        max_data_transfer: 16384,
    }
}

fn target() -> Arc<Target> {
    target_with(BackendConfig::Ram { size: 1 << 20 })
}

fn target_with(backend: BackendConfig) -> Arc<Target> {
    let p = params();
    let config = TargetConfig {
        ports: vec![PortConfig {
            id: 1,
            transport: TransportKind::Tcp,
            address: peer().local.ip(),
            service: peer().local.port(),
            secure_channel: Default::default(),
        }],
        subsystems: vec![SubsystemConfig::open_to_any_host(
            SUBNQN,
            "nvmfd-core-test",
            vec![NamespaceConfig::new(NSID, backend, BLOCK)],
        )],
        limits: Limits {
            max_queue_size: 64,
            max_io_queues: 2,
            max_data_transfer: p.max_data_transfer,
            in_capsule_data_size: p.in_capsule_data_size,
            kato_default_ms: 120_000,
        },
        referrals: vec![],
        multipath: Default::default(),
        state_dir: None,
        discovery_nqn: None,
        reservation_stores: None,
    };
    Target::with_opener(config, &storage::open).expect("target")
}

fn core(target: &Arc<Target>) -> TcpCore {
    let remote: SocketAddr = peer().remote;
    TcpCore::new(
        Queue::new(Arc::clone(target), peer()),
        TOKEN,
        remote,
        params(),
        Instant::now(),
    )
}

/// Hands `bytes` to the core the way the shell reads a socket: into whatever `read_buf`
/// offers (slot window first in a data phase), as much as fits, then `received`.
fn feed(core: &mut TcpCore, bytes: &[u8]) {
    feed_into(core, bytes, &mut InlineOnly);
    core.poll(Instant::now(), &mut InlineOnly);
}

/// Hands `bytes` to the core as socket reads would, with `io` as the reactor's submitter.
fn feed_into(core: &mut TcpCore, mut bytes: &[u8], io: &mut dyn IoSubmit) {
    while !bytes.is_empty() {
        assert!(
            core.wants_input(),
            "the core stopped reading ({:?}, {} bytes left): {:?}",
            core.status(),
            bytes.len(),
            decode(&drain(core, usize::MAX))
        );
        let n = match core.read_buf().expect("open") {
            ReadBuf::Staging(buf) => copy_into(buf, bytes),
            ReadBuf::Direct { data, staging } => {
                let n = copy_into(data, bytes);
                n + copy_into(staging, &bytes[n..])
            }
        };
        core.received(n, io);
        bytes = &bytes[n..];
    }
}

fn copy_into(buf: &mut [u8], bytes: &[u8]) -> usize {
    let n = buf.len().min(bytes.len());
    buf[..n].copy_from_slice(&bytes[..n]);
    n
}

/// Takes everything queued, reporting it sent `step` bytes at a time (a socket that takes
/// little per write).
fn drain(core: &mut TcpCore, step: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while core.has_output() {
        let mut iov = crate::tcp::send::iovec_batch();
        let want = core.send_iovecs(&mut iov);
        let take = want.min(step);
        let mut left = take;
        for part in &iov {
            let n = part.len().min(left);
            out.extend_from_slice(&part[..n]);
            left -= n;
        }
        drop(iov);
        core.sent(take);
    }
    out
}

fn icreq() -> Vec<u8> {
    icreq_with(DIGESTS)
}

fn icreq_with(digests: Digests) -> Vec<u8> {
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        dgst: digests.to_dgst(),
        maxr2t: 0,
    };
    encode_pdu(&PduHeader::IcReq(ic), &[], Digests::default(), 4)
}

/// A command capsule with `data` in-capsule; `dptr` is the SGL of the command.
fn capsule(sqe: Sqe, dptr: SglDescriptor, data: &[u8]) -> Vec<u8> {
    capsule_with(DIGESTS, sqe, dptr, data)
}

fn capsule_with(digests: Digests, mut sqe: Sqe, dptr: SglDescriptor, data: &[u8]) -> Vec<u8> {
    sqe.flags = (sqe.flags & 0x3f) | 0x40; // PSDT 01b: SGL (NVMe-oF 1.1 §2.2)
    sqe.dptr = dptr;
    encode_pdu(&PduHeader::CapsuleCmd(sqe), data, digests, 4)
}

fn connect(qid: u16, cntlid: u16) -> Vec<u8> {
    connect_with(DIGESTS, qid, cntlid)
}

fn connect_with(digests: Digests, qid: u16, cntlid: u16) -> Vec<u8> {
    let sqe = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato: if qid == 0 { 30_000 } else { 0 },
    }
    .to_sqe(0x10);
    let data = ConnectData {
        hostid: [7; 16],
        cntlid,
        subnqn: SUBNQN.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode();
    capsule_with(
        digests,
        sqe,
        SglDescriptor::in_capsule(0, data.len() as u32),
        &data,
    )
}

fn h2c_data(cccid: u16, ttag: u16, datao: u32, data: &[u8]) -> Vec<u8> {
    let hdr = DataHeader {
        cccid,
        ttag,
        datao,
        datal: data.len() as u32,
    };
    encode_pdu(&PduHeader::H2CData { hdr, last: true }, data, DIGESTS, 4)
}

/// The PDUs in `bytes` as the host decodes them: (header, data).
fn decode(bytes: &[u8]) -> Vec<(PduHeader, Vec<u8>)> {
    decode_from(bytes, None)
}

/// [`decode`] of output that follows the ICResp (`digests` as it negotiated).
fn decode_from(bytes: &[u8], digests: Option<Digests>) -> Vec<(PduHeader, Vec<u8>)> {
    let limits = RecvLimits {
        max_capsule_data: 0,
        max_data_pdu: 1 << 20,
    };
    let mut rx = Receiver::new(Role::Host, limits);
    if let Some(d) = digests {
        rx.establish(d, 4);
    }
    let mut pdus: Vec<(PduHeader, Vec<u8>)> = Vec::new();
    // The data of the PDU being received, placed by offset.
    let mut data: Vec<u8> = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (used, ev) = rx
            .feed(rest, &mut data.as_mut_slice())
            .expect("valid PDU stream");
        rest = &rest[used..];
        match ev {
            Some(Event::Pdu { header, data_len }) => {
                if let PduHeader::IcResp(ic) = &header {
                    rx.establish(Digests::from_dgst(ic.dgst), 4);
                }
                data = vec![0; data_len as usize];
                pdus.push((header, Vec::new()));
            }
            Some(Event::DataComplete { digest_ok }) => {
                assert!(digest_ok, "C2HData digest");
                pdus.last_mut().expect("a data PDU").1 = std::mem::take(&mut data);
            }
            None => {}
        }
    }
    assert!(rx.at_boundary(), "the output ends inside a PDU");
    pdus
}

fn cqe(pdu: &(PduHeader, Vec<u8>)) -> Cqe {
    match pdu.0 {
        PduHeader::CapsuleResp(cqe) => cqe,
        ref other => panic!("expected a CapsuleResp, got {other:?}"),
    }
}

/// An admin queue that connected and enabled the controller; returns it (it must outlive
/// the I/O queues) and the controller ID.
fn admin(target: &Arc<Target>) -> (TcpCore, u16) {
    let mut admin = core(target);
    let mut stream = icreq();
    stream.extend(connect(0, 0xffff));
    let cc = PropertyCommand {
        size: PropertySize::Four,
        offset: reg::CC,
        value: u64::from(cc::ENABLE),
    }
    .to_sqe(fctype::PROPERTY_SET, 0x11);
    stream.extend(capsule(cc, SglDescriptor::transport_data_block(0), &[]));
    feed(&mut admin, &stream);
    let out = decode(&drain(&mut admin, usize::MAX));
    assert_eq!(out.len(), 3, "{out:?}");
    let connected = cqe(&out[1]);
    assert!(connected.status.is_success(), "{connected:?}");
    assert!(cqe(&out[2]).status.is_success(), "CC.EN: {:?}", out[2]);
    (admin, connected.dw0 as u16)
}

/// ICReq, I/O queue Connect, a 4 KiB write with in-capsule data, an 8 KiB write by two
/// R2Ts, a 12 KiB read of both, all with header and data digests.
fn exchange(cntlid: u16) -> Vec<u8> {
    let mut s = icreq();
    s.extend(connect(1, cntlid));
    let mut w1 = Client::write_sqe(NSID, 0, 8, false);
    w1.cid = 1;
    s.extend(capsule(
        w1,
        SglDescriptor::in_capsule(0, 4096),
        &pattern(4096, 1),
    ));
    let mut w2 = Client::write_sqe(NSID, 8, 16, false);
    w2.cid = 2;
    s.extend(capsule(w2, SglDescriptor::transport_data_block(8192), &[]));
    // Slot 0 is free again (the first write completed inline), so the R2Ts carry TTAG 0.
    let data = pattern(8192, 2);
    s.extend(h2c_data(2, 0, 0, &data[..4096]));
    s.extend(h2c_data(2, 0, 4096, &data[4096..]));
    let mut r = Client::read_sqe(NSID, 0, 24);
    r.cid = 3;
    s.extend(capsule(r, SglDescriptor::transport_data_block(12288), &[]));
    s
}

/// Feeds `stream` cut at `cuts` to a new I/O queue; returns what it sent.
fn run(target: &Arc<Target>, stream: &[u8], cuts: &[usize], send_step: usize) -> Vec<u8> {
    let mut io = core(target);
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        feed(&mut io, &stream[from..cut]);
        out.extend(drain(&mut io, send_step));
        from = cut;
    }
    assert_eq!(io.status(), ConnStatus::Open, "{:?}", decode(&out));
    assert_eq!(io.inflight_ops(), 0);
    out
}

/// The reference run: the whole stream at once; its responses are what the host expects.
fn reference(target: &Arc<Target>, stream: &[u8]) -> Vec<u8> {
    let out = run(target, stream, &[], usize::MAX);
    let pdus = decode(&out);
    let kinds: Vec<PduType> = pdus.iter().map(|(h, _)| h.pdu_type()).collect();
    use PduType::*;
    assert_eq!(
        kinds,
        [
            IcResp,
            CapsuleResp,
            CapsuleResp,
            R2T,
            R2T,
            CapsuleResp,
            C2HData,
            CapsuleResp
        ]
    );
    for i in [1, 2, 5, 7] {
        assert!(cqe(&pdus[i]).status.is_success(), "{:?}", pdus[i]);
    }
    for (i, r2to) in [(3, 0), (4, 4096)] {
        let PduHeader::R2T(r2t) = pdus[i].0 else {
            unreachable!()
        };
        assert_eq!(
            (r2t.cccid, r2t.ttag, r2t.r2to, r2t.r2tl),
            (2, 0, r2to, 4096)
        );
    }
    let mut written = pattern(4096, 1);
    written.extend(pattern(8192, 2));
    assert!(pdus[6].1 == written, "the read returns both writes");
    out
}

#[test]
fn responses_do_not_depend_on_how_the_input_is_cut() {
    let target = target();
    let (_admin, cntlid) = admin(&target);
    let stream = exchange(cntlid);
    let expected = reference(&target, &stream);
    for cut in 1..stream.len() {
        let got = run(&target, &stream, &[cut], usize::MAX);
        assert!(got == expected, "split at byte {cut} changed the responses");
    }
}

#[test]
fn responses_are_the_same_fed_byte_by_byte_and_sent_in_small_pieces() {
    let target = target();
    let (_admin, cntlid) = admin(&target);
    let stream = exchange(cntlid);
    let expected = reference(&target, &stream);
    let every_byte: Vec<usize> = (1..stream.len()).collect();
    assert!(run(&target, &stream, &every_byte, usize::MAX) == expected);
    for step in [1, 7, 4099] {
        assert!(
            run(&target, &stream, &[], step) == expected,
            "partial sends of {step} bytes"
        );
    }
}

/// The PDUs of output after the ICResp.
fn later(bytes: &[u8]) -> Vec<(PduHeader, Vec<u8>)> {
    decode_from(bytes, Some(DIGESTS))
}

/// An Abort (NVMe Base 2.0 §5.1) of command `cid` on queue `sqid`, as admin command `abort_cid`.
fn abort_capsule(abort_cid: u16, sqid: u16, cid: u16) -> Vec<u8> {
    let sqe = Sqe {
        opcode: nvme::spec::admin_opcode::ABORT,
        cid: abort_cid,
        cdw10: u32::from(sqid) | u32::from(cid) << 16,
        ..Sqe::default()
    };
    capsule(sqe, SglDescriptor::transport_data_block(0), &[])
}

/// An I/O queue of the controller `cntlid` after ICReq and Connect (their responses drained).
fn io_queue(target: &Arc<Target>, cntlid: u16) -> TcpCore {
    let mut io = core(target);
    let mut s = icreq();
    s.extend(connect(1, cntlid));
    feed(&mut io, &s);
    let out = decode(&drain(&mut io, usize::MAX));
    assert!(cqe(&out[1]).status.is_success(), "{out:?}");
    io
}

#[test]
fn abort_completes_a_write_waiting_for_its_data_once_and_drops_the_late_data() {
    let target = target();
    let (mut admin, cntlid) = admin(&target);
    let mut io = io_queue(&target, cntlid);
    // An 8 KiB write: the first R2T asks for 4 KiB, which the host withholds.
    let mut w = Client::write_sqe(NSID, 0, 16, false);
    w.cid = 5;
    feed(
        &mut io,
        &capsule(w, SglDescriptor::transport_data_block(8192), &[]),
    );
    let out = later(&drain(&mut io, usize::MAX));
    let [(PduHeader::R2T(r2t), _)] = out[..] else {
        panic!("expected one R2T: {out:?}");
    };
    // Abort of the write, of an unknown CID on the same queue, of a queue that does not exist.
    let mut s = abort_capsule(0x20, 1, 5);
    s.extend(abort_capsule(0x21, 1, 77));
    s.extend(abort_capsule(0x22, 2, 5));
    feed(&mut admin, &s);
    let out = later(&drain(&mut admin, usize::MAX));
    assert_eq!(out.len(), 1, "two Aborts wait for the I/O queue: {out:?}");
    assert_eq!((cqe(&out[0]).cid, cqe(&out[0]).dw0), (0x22, 1));
    // The I/O queue's poll finds the write and completes it.
    io.poll(Instant::now(), &mut InlineOnly);
    let out = later(&drain(&mut io, usize::MAX));
    assert_eq!(out.len(), 1, "{out:?}");
    let c = cqe(&out[0]);
    assert_eq!((c.cid, c.status), (5, Status::ABORT_REQUESTED));
    admin.poll(Instant::now(), &mut InlineOnly);
    let out = later(&drain(&mut admin, usize::MAX));
    let mut answers: Vec<(u16, u32, Status)> = out
        .iter()
        .map(|p| (cqe(p).cid, cqe(p).dw0, cqe(p).status))
        .collect();
    answers.sort_by_key(|a| a.0);
    assert_eq!(
        answers,
        [(0x20, 0, Status::SUCCESS), (0x21, 1, Status::SUCCESS)],
        "aborted, not aborted"
    );
    // The host answers the R2T anyway (it was sent before the Abort): the data is dropped,
    // nothing is written or completed again, and the connection stays up.
    feed(
        &mut io,
        &h2c_data(5, r2t.ttag, 0, &pattern(r2t.r2tl as usize, 9)),
    );
    assert!(
        drain(&mut io, usize::MAX).is_empty(),
        "no second completion"
    );
    assert_eq!(io.status(), ConnStatus::Open);
    // The same CID is free for a new command, and the slot for new work.
    let mut r = Client::read_sqe(NSID, 0, 16);
    r.cid = 5;
    feed(
        &mut io,
        &capsule(r, SglDescriptor::transport_data_block(8192), &[]),
    );
    let out = later(&drain(&mut io, usize::MAX));
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out[0].1.iter().all(|&b| b == 0),
        "the aborted write wrote nothing"
    );
    assert_eq!(cqe(&out[1]).status, Status::SUCCESS);
    assert_eq!(io.free.len(), io.slots.len(), "every slot free");
}

#[test]
fn abort_of_a_write_parked_by_back_pressure_answers_from_the_parked_capsule() {
    let target = target();
    let (mut admin, cntlid) = admin(&target);
    let mut io = io_queue(&target, cntlid);
    // Fill every slot with writes waiting for data, then one more capsule parks.
    let slots = io.slots.len() as u16;
    let mut s = Vec::new();
    for cid in 0..=slots {
        let mut w = Client::write_sqe(NSID, 0, 8, false);
        w.cid = cid;
        s.extend(capsule(w, SglDescriptor::transport_data_block(4096), &[]));
    }
    let mut rest = s.split_off(
        s.len() - capsule(Sqe::default(), SglDescriptor::transport_data_block(0), &[]).len(),
    );
    feed(&mut io, &s);
    // The last capsule arrives with every slot busy: it is parked, reads pause.
    let n = match io.read_buf().expect("open") {
        ReadBuf::Staging(buf) => copy_into(buf, &rest),
        ReadBuf::Direct { .. } => unreachable!("no data phase"),
    };
    io.received(n, &mut InlineOnly);
    rest.drain(..n);
    assert!(rest.is_empty());
    assert!(!io.wants_input(), "parked");
    drain(&mut io, usize::MAX);
    feed(&mut admin, &abort_capsule(0x30, 1, slots));
    io.poll(Instant::now(), &mut InlineOnly);
    let out = later(&drain(&mut io, usize::MAX));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (cqe(&out[0]).cid, cqe(&out[0]).status),
        (slots, Status::ABORT_REQUESTED)
    );
    assert!(io.wants_input(), "nothing parked any more");
    assert!(
        io.can_resume(),
        "the shell reads on (edge-triggered: no new EPOLLIN comes)"
    );
    io.resume(&mut InlineOnly);
    assert!(!io.can_resume());
    admin.poll(Instant::now(), &mut InlineOnly);
    let out = later(&drain(&mut admin, usize::MAX));
    assert_eq!((cqe(&out[0]).cid, cqe(&out[0]).dw0), (0x30, 0));
}

/// A target whose namespace is a 1 MiB file (buffered), so that its I/O goes to the ring.
fn file_target(name: &str) -> (std::path::PathBuf, Arc<Target>) {
    let path = std::env::temp_dir().join(format!("nvmfd-{name}-{}", std::process::id()));
    let target = target_with(BackendConfig::File {
        path: path.clone(),
        size: Some(1 << 20),
        direct_io: false,
    });
    (path, target)
}

/// Capsules of a write of 4 KiB in-capsule data at LBA 0 (CID 6) and a 4 KiB read at LBA 8
/// (CID 7).
fn write_and_read() -> Vec<u8> {
    let mut w = Client::write_sqe(NSID, 0, 8, false);
    w.cid = 6;
    let mut r = Client::read_sqe(NSID, 8, 8);
    r.cid = 7;
    let mut s = capsule(w, SglDescriptor::in_capsule(0, 4096), &pattern(4096, 3));
    s.extend(capsule(r, SglDescriptor::transport_data_block(4096), &[]));
    s
}

/// A submitter that keeps ops for the test to complete, and takes every cancel request.
#[derive(Default)]
struct Deferred {
    submitted: Vec<u64>,
    cancelled: Vec<u64>,
    /// Ops submitted with the buffer they lie in (`submit_in`): tag, unit index, and whether
    /// the op's buffer starts at the unit's.
    in_units: Vec<(u64, u32, bool)>,
}

impl IoSubmit for Deferred {
    fn submit(&mut self, _op: storage::BlockOp, tag: u64) {
        self.submitted.push(tag);
    }
    fn submit_in(&mut self, op: storage::BlockOp, tag: u64, unit: &storage::fixedbuf::BufferUnit) {
        self.in_units.push((tag, unit.index, op.buf == unit.base));
        self.submitted.push(tag);
    }
    fn submit_group(&mut self, _ops: &[storage::BlockOp], tag: u64) {
        self.submitted.push(tag);
    }
    fn cancel(&mut self, tag: u64) -> bool {
        self.cancelled.push(tag);
        true
    }
}

#[test]
fn abort_of_a_command_in_the_backend_cancels_it_and_answers_on_its_completion() {
    let (path, target) = file_target("abort-cancel");
    let (mut admin, cntlid) = admin(&target);
    let mut io = io_queue(&target, cntlid);
    let mut ring = Deferred::default();
    // A write (in-capsule data) and a read, both submitted to the backend.
    feed_into(&mut io, &write_and_read(), &mut ring);
    assert_eq!(ring.submitted.len(), 2);
    let mut s = abort_capsule(0x40, 1, 6);
    s.extend(abort_capsule(0x41, 1, 7));
    feed(&mut admin, &s);
    io.poll(Instant::now(), &mut ring);
    assert_eq!(ring.cancelled, ring.submitted, "both cancels requested");
    admin.poll(Instant::now(), &mut InlineOnly);
    assert!(
        drain(&mut admin, usize::MAX).is_empty(),
        "answers wait for the ops"
    );
    // The write's cancel came in time; the read had already completed.
    assert!(io.on_io_complete(ring.submitted[0], -libc::ECANCELED));
    assert!(io.on_io_complete(ring.submitted[1], 4096));
    let out = later(&drain(&mut io, usize::MAX));
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(
        (cqe(&out[0]).cid, cqe(&out[0]).status),
        (6, Status::ABORT_REQUESTED)
    );
    assert_eq!(
        (cqe(&out[2]).cid, cqe(&out[2]).status),
        (7, Status::SUCCESS)
    );
    admin.poll(Instant::now(), &mut InlineOnly);
    let out = later(&drain(&mut admin, usize::MAX));
    let mut answers: Vec<(u16, u32)> = out.iter().map(|p| (cqe(p).cid, cqe(p).dw0)).collect();
    answers.sort();
    assert_eq!(answers, [(0x40, 0), (0x41, 1)], "aborted, not aborted");
    drop(io);
    std::fs::remove_file(path).unwrap();
}
/// Without a data digest, a read of a RAM namespace goes out from the namespace's memory
/// (`storage::Lent`), not through the command's buffer; with one, through the buffer
/// (the digest is computed there). Either way the host gets the namespace's bytes.
#[test]
fn reads_are_sent_from_namespace_memory_unless_data_digests_are_on() {
    let target = target();
    let (_admin, cntlid) = admin(&target);
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: false,
        },
        DIGESTS,
    ] {
        let mut s = icreq_with(digests);
        s.extend(connect_with(digests, 1, cntlid));
        // Two in-capsule writes through the same slot (each completes inline and frees it),
        // then a read of the first: the slot buffer still holds the second write's data.
        for (cid, slba, seed) in [(1, 0, 11), (2, 8, 12)] {
            let mut w = Client::write_sqe(NSID, slba, 8, false);
            w.cid = cid;
            let dptr = SglDescriptor::in_capsule(0, 4096);
            s.extend(capsule_with(digests, w, dptr, &pattern(4096, seed)));
        }
        let mut r = Client::read_sqe(NSID, 0, 8);
        r.cid = 3;
        let dptr = SglDescriptor::transport_data_block(4096);
        s.extend(capsule_with(digests, r, dptr, &[]));
        let mut io = core(&target);
        feed(&mut io, &s);
        let in_buffer = io.buffers.get(0)[..4096] == pattern(4096, 11)[..];
        assert_eq!(
            in_buffer, digests.data,
            "{digests:?}: copied into the slot buffer"
        );
        // Sent in small pieces: the lent range is resumed exactly like a buffer.
        let pdus = decode(&drain(&mut io, 1000));
        let (hdr, data) = pdus
            .iter()
            .find(|(h, _)| h.pdu_type() == PduType::C2HData)
            .expect("C2HData");
        assert!(data[..] == pattern(4096, 11)[..], "{digests:?} {hdr:?}");
        assert!(cqe(pdus.last().unwrap()).status.is_success());
        assert_eq!(io.free.len(), io.slots.len(), "every slot free once sent");
    }
}

/// With fixed buffers on (`set_fixed_buffers`), a command's backend ops reach the submitter
/// with the slot buffer they lie in (`IoSubmit::submit_in`), which a ring may register; off
/// (the default), as plain ops.
#[test]
fn slot_buffers_are_named_to_the_submitter_only_with_fixed_buffers() {
    let (path, target) = file_target("fixedbuf");
    let (_admin, cntlid) = admin(&target);
    for on in [false, true] {
        let mut io = io_queue(&target, cntlid);
        io.set_fixed_buffers(on);
        let mut ring = Deferred::default();
        feed_into(&mut io, &write_and_read(), &mut ring);
        assert_eq!(ring.submitted.len(), 2);
        let slots: Vec<u32> = ring.submitted.iter().map(|t| (t & 0xffff) as u32).collect();
        let expect: Vec<(u64, u32, bool)> = if on {
            // Each op at the start of its own slot's buffer.
            ring.submitted
                .iter()
                .zip(&slots)
                .map(|(&t, &s)| (t, s, true))
                .collect()
        } else {
            Vec::new()
        };
        assert_eq!(ring.in_units, expect, "fixed buffers {on}");
        for t in ring.submitted.clone() {
            assert!(io.on_io_complete(t, 4096));
        }
    }
    std::fs::remove_file(path).unwrap();
}

/// With the target counting, the times the shell gives become each command's latency (capsule
/// read to response handed over) and backend latency (op submitted to completed), by class.
#[test]
fn latencies_run_from_the_times_the_shell_gives() {
    use nvme::metrics::Class;
    use std::time::Duration;
    let (path, target) = file_target("timing");
    let registry = target.enable_metrics();
    let (_admin, cntlid) = admin(&target);
    let mut io = io_queue(&target, cntlid);
    assert!(io.timing());
    let mut ring = Deferred::default();
    let t0 = Instant::now();
    io.set_time(t0);
    feed_into(&mut io, &write_and_read(), &mut ring);
    assert_eq!(ring.submitted.len(), 2);
    io.set_time(t0 + Duration::from_micros(40));
    assert!(io.on_io_complete(ring.submitted[0], 4096));
    assert!(io.on_io_complete(ring.submitted[1], 4096));
    assert!(io.has_timed());
    io.handed_over(t0 + Duration::from_micros(55));
    assert!(!io.has_timed());
    drop(io);
    let snapshot = registry.snapshot();
    let total = |class| {
        let mut c = nvme::metrics::ClassCounters::default();
        for e in &snapshot.entries {
            c.add(&e.counters.class_total(class));
        }
        c
    };
    for class in [Class::Write, Class::Read] {
        let c = total(class);
        assert_eq!(c.commands, 1, "{class:?}");
        assert_eq!(
            (c.latency.count, c.latency.sum_ns),
            (1, 55_000),
            "{class:?}"
        );
        assert_eq!(
            (c.backend.count, c.backend.sum_ns),
            (1, 40_000),
            "{class:?}"
        );
    }
    std::fs::remove_file(path).unwrap();
}

/// Sends everything queued the way the shell does with zero-copy on (`threshold`), each write
/// taking at most `step` bytes; zero-copy writes get ids 0, 1, … and are reported done only
/// when `done` says so. Returns the bytes and the ids used.
fn drain_zerocopy(
    core: &mut TcpCore,
    threshold: usize,
    step: usize,
    out: &mut Vec<u8>,
    ids: &mut Vec<u32>,
) {
    while core.has_output() {
        let mut iov = crate::tcp::send::iovec_batch();
        let batch = core.send_batch(&mut iov, threshold);
        if batch.zerocopy {
            assert_eq!(iov.len(), 1, "a zero-copy batch is one PDU's data, alone");
        }
        let take = batch.want.min(step);
        let mut left = take;
        for part in &iov {
            let n = part.len().min(left);
            out.extend_from_slice(&part[..n]);
            left -= n;
        }
        drop(iov);
        if batch.zerocopy {
            let id = ids.len() as u32;
            ids.push(id);
            core.sent_zerocopy(take, id);
        } else {
            core.sent(take);
        }
    }
}

/// A read's data sent zero-copy keeps its slot busy — not on the free list, so its buffer (or
/// the lent namespace range) cannot be reused — after every byte was written, until the
/// kernel's notification covers every zero-copy send that carried part of it; notifications
/// may come in pieces and out of order. The bytes on the wire are those of a copying send.
#[test]
fn a_zero_copy_slot_is_not_reused_before_its_notification() {
    let target = target();
    // Data digests on: the data comes from the slot buffer; off: lent from the namespace.
    for digests in [DIGESTS, Digests::default()] {
        // Two controllers: the reference connection and the zero-copy one.
        let mut cores = Vec::new();
        for _ in 0..2 {
            let (admin, cntlid) = admin(&target);
            let mut s = icreq_with(digests);
            s.extend(connect_with(digests, 1, cntlid));
            let mut w = Client::write_sqe(NSID, 0, 8, false);
            w.cid = 1;
            let dptr = SglDescriptor::in_capsule(0, 4096);
            s.extend(capsule_with(digests, w, dptr, &pattern(4096, 7)));
            let mut c = core(&target);
            feed(&mut c, &s);
            cores.push((c, admin));
        }
        let (mut zc, _admin_zc) = cores.pop().unwrap();
        let (mut reference, _admin_ref) = cores.pop().unwrap();
        drain(&mut reference, usize::MAX);
        drain(&mut zc, usize::MAX);
        let mut r = Client::read_sqe(NSID, 0, 8);
        r.cid = 2;
        let read = capsule_with(digests, r, SglDescriptor::transport_data_block(4096), &[]);
        feed(&mut reference, &read);
        feed(&mut zc, &read);
        let want = drain(&mut reference, usize::MAX);

        // Written 1,000 bytes at a time: the 4 KiB of data take five zero-copy sends.
        let (mut got, mut ids) = (Vec::new(), Vec::new());
        drain_zerocopy(&mut zc, 4096, 1000, &mut got, &mut ids);
        let diff = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(got == want, "{digests:?}: the same bytes as a copying send ({} vs {}, first difference at {diff:?})", got.len(), want.len());
        assert_eq!(ids.len(), 5, "{digests:?}");
        assert_eq!(zc.zerocopy_outstanding(), 5);
        let busy = zc.slots.len() - zc.free.len();
        assert_eq!(
            busy, 1,
            "{digests:?}: the read's slot is held after its last byte"
        );
        // Out of order and in pieces: the slot stays busy while any send is outstanding.
        zc.zerocopy_done(3, 4);
        zc.zerocopy_done(0, 1);
        assert_eq!(
            zc.slots.len() - zc.free.len(),
            1,
            "{digests:?}: id 2 outstanding"
        );
        zc.zerocopy_done(2, 2);
        assert_eq!(zc.zerocopy_outstanding(), 0);
        assert_eq!(
            zc.free.len(),
            zc.slots.len(),
            "{digests:?}: free once all are done"
        );
        // Below the threshold nothing goes zero-copy and the slot is free once written.
        feed(&mut zc, &read);
        let (mut again, mut ids) = (Vec::new(), Vec::new());
        drain_zerocopy(&mut zc, 4097, usize::MAX, &mut again, &mut ids);
        assert!(
            ids.is_empty(),
            "{digests:?}: nothing zero-copy below the threshold"
        );
        let pdus = decode_from(&again, Some(digests));
        let data = pdus.iter().find(|(h, _)| h.pdu_type() == PduType::C2HData);
        assert!(
            data.is_some_and(|(_, d)| d[..] == pattern(4096, 7)[..]),
            "{digests:?}"
        );
        assert_eq!(zc.free.len(), zc.slots.len());
    }
}
