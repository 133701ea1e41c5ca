//! A whole target-side NVMe/TCP connection (`transport::tcp::TcpConnection`: capsule and SGL
//! checks, R2T / H2CData, slots, back-pressure, the core behind it) driven through an
//! in-process socket pair, up to two connections per run (admin + I/O queue).
//!
//! Input: `[cfg][op…]`. Unless `cfg` says "raw", the host first sends a valid ICReq. Each op
//! is one host action: raw bytes, a capsule (any SQE, in-capsule data), a Connect / CC.EN
//! helper (so the fuzzer reaches connected and enabled queues quickly), an answer to the
//! oldest R2T, an H2CData with arbitrary fields, a corruption of the next PDU, a tick with
//! the clock advanced, or a half-close.
//!
//! Oracles: no panic or sanitizer report; everything the target writes decodes with the
//! host-side receiver (correct types, lengths, digests, PDO alignment to HPDA); C2HData
//! never exceeds MDTS; every submitted backend op is completed before the connection goes.

#![no_main]

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use nvme::wire::SglDescriptor;
use nvmfd_fuzz::{
    connect_data, connect_sqe, connect_subnqn, enable_sqe, fill_cyclic, peer, target, trace, Input,
    SyncEngine, IN_CAPSULE, MDTS,
};
use transport::conn::{ConnStatus, Connection};
use transport::tcp::pdu::{
    encode_pdu, DataHeader, Digests, IcReq, PduHeader, R2t, RecvLimits, Role,
};
use transport::tcp::recv::{Discard, Event, Receiver};
use transport::tcp::{TcpConnection, TcpParams};

/// Bytes of fuzz input a single op may consume as PDU data (more is repeated cyclically).
const MAX_DATA_INPUT: usize = 512;

/// Host side of one connection.
struct Host {
    sock: UnixStream,
    conn: TcpConnection,
    io: SyncEngine,
    rx: Receiver,
    /// Digests the target enabled (from its ICResp).
    digests: Digests,
    status: ConnStatus,
    /// Data alignment the host asked for in its ICReq (bytes): the target pads C2HData to
    /// it, and the host receiver checks that it did. 4 when the ICReq is raw fuzz bytes.
    pda: usize,
    r2ts: VecDeque<R2t>,
    /// Command id of a Connect in flight, to learn the controller id from its response.
    connect_cid: Option<u16>,
    /// XOR `value` into byte `at` of the next PDU this harness encodes.
    corrupt: Option<(usize, u8)>,
    next_cid: u16,
    write_closed: bool,
}

impl Host {
    fn new(token: u32, ic: Option<IcReq>) -> Self {
        let (host, ours) = UnixStream::pair().expect("socketpair");
        host.set_nonblocking(true).expect("non-blocking");
        ours.set_nonblocking(true).expect("non-blocking");
        // SAFETY: the descriptor comes from `into_raw_fd`, so it is open and owned by nothing
        // else. A `TcpStream` only issues generic socket calls on it (read/readv/writev/
        // shutdown/setsockopt); on this AF_UNIX stream socket TCP_NODELAY fails, which
        // `TcpConnection::new` ignores.
        let stream = unsafe { TcpStream::from_raw_fd(ours.into_raw_fd()) };
        let params = TcpParams {
            max_h2c_data: 8192,
            in_capsule_data_size: IN_CAPSULE,
            max_data_transfer: MDTS,
        };
        let conn = TcpConnection::new(stream, token, target(), peer(), params);
        let mut h = Host {
            sock: host,
            conn,
            io: SyncEngine::default(),
            rx: Receiver::new(
                Role::Host,
                RecvLimits {
                    max_capsule_data: 0,
                    max_data_pdu: MDTS,
                },
            ),
            digests: Digests::default(),
            status: ConnStatus::Open,
            pda: ic.map_or(4, |ic| (ic.hpda as usize + 1) * 4),
            r2ts: VecDeque::new(),
            connect_cid: None,
            corrupt: None,
            next_cid: 0,
            write_closed: false,
        };
        if let Some(ic) = ic {
            h.send(&ic.encode());
        }
        h
    }

    fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    /// Writes `bytes` to the target, running it whenever the socket is full; gives up on
    /// what it cannot write when the target stopped reading (back-pressure, closed).
    fn send(&mut self, bytes: &[u8]) {
        if self.write_closed {
            return;
        }
        let mut bytes = bytes.to_vec();
        if let Some((at, value)) = self.corrupt.take() {
            if !bytes.is_empty() {
                let i = at % bytes.len();
                bytes[i] ^= value.max(1);
            }
        }
        let mut off = 0;
        let mut stalls = 0;
        while off < bytes.len() && stalls < 4 {
            match self.sock.write(&bytes[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    stalls += 1;
                    self.run();
                }
                Err(_) => return,
            }
        }
        self.run();
    }

    fn send_pdu(&mut self, header: PduHeader, data: &[u8]) {
        // CPDA 0: the target takes data at dword alignment.
        let pdu = encode_pdu(&header, data, self.digests, 4);
        self.send(&pdu);
    }

    /// Drives the target until it makes no more progress: input, backend completions (after
    /// the call that submitted them, as io_uring would), output.
    fn run(&mut self) {
        for _ in 0..64 {
            let mut progress = false;
            if self.status == ConnStatus::Open {
                self.status = self.conn.on_readable(&mut self.io);
            }
            for (tag, res) in std::mem::take(&mut self.io.done) {
                progress = true;
                self.status = self.conn.on_io_complete(tag, res, &mut self.io);
            }
            if self.status == ConnStatus::Open && self.conn.wants_write() {
                self.status = self.conn.on_writable();
            }
            progress |= self.receive();
            if !progress && self.io.done.is_empty() {
                break;
            }
        }
    }

    /// Reads and checks what the target sent; true when there was something.
    fn receive(&mut self) -> bool {
        let mut buf = [0u8; 16384];
        let mut any = false;
        loop {
            let n = match self.sock.read(&mut buf) {
                Ok(0) => return any,
                Ok(n) => n,
                Err(_) => return any,
            };
            any = true;
            let mut pos = 0;
            while pos < n {
                let (used, ev) = match self.rx.feed(&buf[pos..n], &mut Discard) {
                    Ok(r) => r,
                    Err(e) => panic!("the target sent an invalid PDU: {e}"),
                };
                pos += used;
                if let Some(ev) = ev {
                    self.on_event(ev);
                }
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        if trace() {
            eprintln!("target -> {ev:?}");
        }
        let Event::Pdu { header, data_len } = ev else {
            if let Event::DataComplete { digest_ok } = ev {
                assert!(digest_ok, "the target sent a wrong data digest");
            }
            return;
        };
        match header {
            PduHeader::IcResp(ic) => {
                assert!(ic.maxh2cdata >= 4096 && ic.maxh2cdata % 4 == 0);
                self.digests = Digests::from_dgst(ic.dgst);
                self.rx.establish(self.digests, self.pda);
            }
            PduHeader::R2T(r2t) => {
                assert!(r2t.r2tl > 0 && r2t.r2to as u64 + r2t.r2tl as u64 <= MDTS as u64);
                self.r2ts.push_back(r2t);
            }
            PduHeader::CapsuleResp(cqe) => {
                if self.connect_cid == Some(cqe.cid) {
                    self.connect_cid = None;
                    if cqe.status.is_success() && cqe.sqid == 0 {
                        CNTLID.with(|c| c.set(Some(cqe.dw0 as u16)));
                    }
                }
            }
            PduHeader::C2HData { hdr, .. } => {
                assert!(data_len <= MDTS && hdr.datao == 0);
            }
            PduHeader::C2HTermReq(_) => {}
            other => panic!("the target sent a host PDU: {other:?}"),
        }
    }

    /// Completes every backend op still in flight (the reactor keeps a closed connection
    /// until then) and checks that none is left.
    fn finish(mut self) {
        for _ in 0..64 {
            if self.io.done.is_empty() {
                break;
            }
            for (tag, res) in std::mem::take(&mut self.io.done) {
                self.status = self.conn.on_io_complete(tag, res, &mut self.io);
            }
        }
        assert_eq!(self.conn.inflight_ops(), 0, "ops left in flight");
    }
}

thread_local! {
    /// Controller id from the last successful admin Connect (for an I/O queue Connect).
    static CNTLID: std::cell::Cell<Option<u16>> = const { std::cell::Cell::new(None) };
}

fn op(input: &mut Input, hosts: &mut [Host], clock: &mut Instant) {
    let code = input.u8();
    let h = &mut hosts[(code >> 7) as usize % hosts.len()];
    match code & 0x7f {
        // Raw bytes.
        0..=9 => {
            let n = input.u8() as usize;
            let bytes = input.take(n);
            h.send(bytes);
        }
        // A capsule with any SQE and in-capsule data.
        10..=39 => {
            let sqe = input.sqe().unwrap_or_default();
            let len = input.u16() as usize % (IN_CAPSULE as usize + 64);
            let mut data = vec![0u8; len];
            fill_cyclic(&mut data, input.take(len.min(MAX_DATA_INPUT)));
            h.send_pdu(PduHeader::CapsuleCmd(sqe), &data);
        }
        // Fabrics Connect.
        40..=49 => {
            let sel = input.u8();
            let qid = if sel & 1 == 0 {
                0
            } else {
                1 + (sel >> 1) as u16 % 4
            };
            let sqsize = input.u8() as u16 % 16;
            let cattr = input.u8();
            let kato = input.u8() as u32 * 1000;
            let in_capsule = sel & 0x10 != 0;
            let cntlid = if qid == 0 {
                None
            } else {
                CNTLID.with(|c| c.get())
            };
            let cid = h.cid();
            let sqe = connect_sqe(cid, qid, sqsize, cattr, kato, in_capsule);
            let data = connect_data(connect_subnqn(sel >> 5), cntlid);
            h.connect_cid = Some(cid);
            if in_capsule {
                h.send_pdu(PduHeader::CapsuleCmd(sqe), &data);
            } else {
                h.send_pdu(PduHeader::CapsuleCmd(sqe), &[]);
                answer_r2t(h, &data, false);
            }
        }
        // Property Set CC.EN.
        50..=54 => {
            let cid = h.cid();
            h.send_pdu(PduHeader::CapsuleCmd(enable_sqe(cid)), &[]);
        }
        // A command that moves its data by R2T: any SQE with a transport data block SGL.
        55..=74 => {
            let mut sqe = input.sqe().unwrap_or_default();
            sqe.flags = 0x40 | (sqe.flags & 0x3f);
            let len = input.u16() as u32 % (MDTS + 1);
            sqe.dptr = SglDescriptor::transport_data_block(len);
            h.send_pdu(PduHeader::CapsuleCmd(sqe), &[]);
        }
        // Answer the oldest R2T with the data it asks for.
        75..=89 => {
            let flags = input.u8();
            let n = input.u16() as usize % (MAX_DATA_INPUT + 1);
            let data = input.take(n).to_vec();
            answer_r2t(h, &data, flags & 1 != 0);
        }
        // An H2CData with arbitrary fields.
        90..=99 => {
            let hdr = DataHeader {
                cccid: input.u16(),
                ttag: input.u16(),
                datao: input.u32(),
                datal: 0,
            };
            let last = input.u8() & 1 != 0;
            let len = 1 + input.u16() as usize % 9000;
            let mut data = vec![0u8; len];
            fill_cyclic(&mut data, input.take(len.min(MAX_DATA_INPUT)));
            let hdr = DataHeader {
                datal: len as u32,
                ..hdr
            };
            h.send_pdu(PduHeader::H2CData { hdr, last }, &data);
        }
        // Corrupt the next PDU (digest errors, bad fields behind a valid header).
        100..=109 => h.corrupt = Some((input.u16() as usize, input.u8())),
        // Time passes: keep-alive, the Connect timeout, held AERs.
        110..=119 => {
            *clock += Duration::from_millis(input.u8() as u64 * 500);
            if h.status == ConnStatus::Open {
                h.status = h.conn.on_tick(*clock, &mut h.io);
            }
            h.run();
        }
        // The host stops sending (FIN).
        120..=122 => {
            let _ = h.sock.shutdown(Shutdown::Write);
            h.write_closed = true;
            h.run();
        }
        _ => h.run(),
    }
}

/// Sends the data the oldest R2T asks for, from `data` repeated; `split` sends it as two
/// H2CData PDUs where it can.
fn answer_r2t(h: &mut Host, data: &[u8], split: bool) {
    h.run();
    let Some(r2t) = h.r2ts.pop_front() else {
        return;
    };
    let mut payload = vec![0u8; r2t.r2tl as usize];
    fill_cyclic(&mut payload, data);
    let cut = if split && payload.len() > 1 {
        payload.len() / 2
    } else {
        payload.len()
    };
    let mut off = 0;
    for part in [&payload[..cut], &payload[cut..]] {
        if part.is_empty() {
            continue;
        }
        let hdr = DataHeader {
            cccid: r2t.cccid,
            ttag: r2t.ttag,
            datao: r2t.r2to + off as u32,
            datal: part.len() as u32,
        };
        off += part.len();
        h.send_pdu(
            PduHeader::H2CData {
                hdr,
                last: off == payload.len(),
            },
            part,
        );
    }
}

fuzz_target!(|bytes: &[u8]| {
    let mut input = Input::new(bytes);
    let cfg = input.u8();
    let ic = (cfg & 0x10 == 0).then(|| IcReq {
        pfv: 0,
        hpda: [0, 1, 3, 31][(cfg >> 2 & 3) as usize],
        dgst: cfg & 3,
        maxr2t: 0,
    });
    CNTLID.with(|c| c.set(None));
    let mut hosts = vec![Host::new(1, ic)];
    if cfg & 0x20 != 0 {
        // A second connection, for an I/O queue of the controller the first one creates.
        hosts.push(Host::new(2, ic));
    }
    let mut clock = Instant::now();
    let mut ops = 0;
    while !input.is_empty() && ops < 256 {
        op(&mut input, &mut hosts, &mut clock);
        ops += 1;
    }
    for h in hosts {
        h.finish();
    }
});
