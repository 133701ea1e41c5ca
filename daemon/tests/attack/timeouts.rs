//! Slow and silent hosts against a daemon with `connect_timeout_ms = 1500`: connections that
//! never complete a Fabrics Connect are closed on time and cost bounded memory; a host that
//! trickles bytes is served as long as it is inside the rules; an idle controller is reclaimed
//! by keep-alive expiry (NVMe Base 2.0 §3.9.4).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nvme::wire::fabrics::{ConnectCommand, ConnectData};
use nvme::wire::{Cqe, SglDescriptor, Status};
use transport::tcp::pdu::{encode_pdu, Digests, IcReq, IcResp, PduHeader, PduType};

use crate::support::*;

pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// The reactor checks at every tick (≤ 100 ms); allow for a loaded machine.
const SLACK: Duration = Duration::from_millis(3000);

/// One round of [`thousand_silent_connections`]; returns the RSS while they were open and
/// once they are closed.
fn silent_round(d: &Daemon) -> Result<(u64, u64), String> {
    const N: usize = 1000;
    let rss0 = d.rss_kib();
    let fds0 = d.open_fds();
    let mut socks = Vec::with_capacity(N);
    for i in 0..N {
        let s = TcpStream::connect(d.addr).map_err(|e| format!("connect #{i}: {e}"))?;
        socks.push((Instant::now(), s));
    }
    // Not closed early: every socket still younger than the timeout (minus a margin for
    // this check itself) must still be open.
    let mut young = 0;
    for (i, (opened, s)) in socks.iter().enumerate() {
        if opened.elapsed() + Duration::from_millis(200) < CONNECT_TIMEOUT {
            young += 1;
            expect(is_open(s), || {
                format!("socket #{i} closed after {:?}", opened.elapsed())
            })?;
        }
    }
    // Let the reactor accept them all.
    std::thread::sleep(Duration::from_millis(300));
    let rss_open = d.rss_kib();
    let per_conn = rss_open.saturating_sub(rss0) * 1024 / N as u64;
    eprintln!(
        "    {N} silent connections: RSS {rss0} -> {rss_open} KiB ({per_conn} B each), {} threads",
        d.threads()
    );
    expect(per_conn < 64 * 1024, || {
        format!("{per_conn} bytes of RSS per idle connection")
    })?;
    let mut latest = Duration::ZERO;
    for (i, (opened, s)) in socks.iter_mut().enumerate() {
        // Accepting and closing 1000 sockets (a log line each) takes the reactor a while.
        let deadline =
            (*opened + CONNECT_TIMEOUT + 2 * SLACK).saturating_duration_since(Instant::now());
        let at = wait_closed(s, deadline.max(Duration::from_millis(1)))
            .map_err(|e| format!("socket #{i}: {e}"))?;
        latest = latest.max(at.duration_since(*opened));
    }
    eprintln!(
        "    {young} checked open before the timeout; all closed by {latest:.2?} after connecting"
    );
    drop(socks);
    d.wait_log(
        &["no Fabrics Connect within 1500 ms"],
        Duration::from_secs(1),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let rss_after = d.rss_kib();
    let fds = d.open_fds();
    eprintln!("    RSS after they closed: {rss_after} KiB; daemon fds {fds0} -> {fds}");
    expect(fds <= fds0, || {
        format!("daemon holds {fds} fds, {fds0} before")
    })?;
    Ok((rss_open, rss_after))
}

/// 1000 sockets that never send ICReq, three times: none is closed before the connect
/// timeout, each is closed within the timeout plus slack, while open they cost less than
/// 64 KiB of RSS each, every socket is released, and after the third round RSS is no higher
/// than the highest peak seen (the allocator keeps and reuses freed memory — how much varies
/// from run to run — but nothing accumulates round after round: a per-connection leak would
/// put the third round's remainder above every peak).
pub fn thousand_silent_connections(d: &Daemon) -> Result<(), String> {
    let mut peak = 0;
    let mut after = 0;
    for _ in 0..3 {
        let (p, a) = silent_round(d)?;
        peak = peak.max(p);
        after = a;
    }
    expect(after <= peak + 4096, || {
        format!("RSS {after} KiB after three rounds of 1000 connections, highest peak {peak} KiB")
    })
}

/// Whether the peer has neither closed nor reset `s` (a non-blocking peek).
fn is_open(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a valid socket and a 1-byte buffer.
    let n = unsafe {
        libc::recv(
            std::os::fd::AsRawFd::as_raw_fd(s),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// ICReq done, no Connect: closed by the same timeout.
pub fn icreq_without_connect(d: &Daemon) -> Result<(), String> {
    let c = established(d);
    let t0 = Instant::now();
    let mut s = c.writer().unwrap();
    let at = wait_closed(&mut s, CONNECT_TIMEOUT + SLACK)?;
    let after = at.duration_since(t0);
    expect(
        after >= CONNECT_TIMEOUT - Duration::from_millis(300),
        || format!("closed after {after:?}"),
    )
}

/// ICReq trickled a byte every 5 ms, then Connect within the timeout: served normally, and
/// once connected the connect timeout no longer applies. Spoken on a bare socket (the
/// client's receive machine only knows ICReqs it sent whole).
pub fn trickled_icreq_then_connect(d: &Daemon) -> Result<(), String> {
    let mut s = TcpStream::connect(d.addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(WAIT)).unwrap();
    for b in IcReq::default().encode() {
        s.write_all(&[b]).map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut icresp = [0u8; 128];
    s.read_exact(&mut icresp)
        .map_err(|e| format!("ICResp: {e}"))?;
    let resp = IcResp::decode(&icresp).map_err(|e| e.to_string())?;
    expect(icresp[0] == PduType::IcResp as u8 && resp.pfv == 0, || {
        format!("ICResp {icresp:?}")
    })?;
    let connect = |s: &mut TcpStream, cid: u16, kato: u32| -> Result<Cqe, String> {
        let mut sqe = ConnectCommand {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato,
        }
        .to_sqe(cid);
        sqe.flags = nvme::spec::sqe_flags::PSDT_SGL;
        sqe.dptr = SglDescriptor::in_capsule(0, ConnectData::SIZE as u32);
        let data = ConnectData {
            hostid: HOSTID,
            cntlid: 0xffff,
            subnqn: SUBNQN.into(),
            hostnqn: HOSTNQN.into(),
        }
        .encode();
        let pdu = encode_pdu(&PduHeader::CapsuleCmd(sqe), &data, Digests::default(), 4);
        s.write_all(&pdu).map_err(|e| e.to_string())?;
        let mut resp = [0u8; 24];
        s.read_exact(&mut resp)
            .map_err(|e| format!("CapsuleResp: {e}"))?;
        expect(resp[0] == PduType::CapsuleResp as u8, || {
            format!("expected CapsuleResp, got type {:#x}", resp[0])
        })?;
        Cqe::decode(&resp[8..]).map_err(|e| e.to_string())
    };
    let cqe = connect(&mut s, 1, 30_000)?;
    expect_status(
        "Connect after a trickled ICReq",
        cqe.status,
        Status::SUCCESS,
    )?;
    std::thread::sleep(CONNECT_TIMEOUT + Duration::from_millis(300));
    // Still open past the connect timeout: a second Connect is answered (sequence error).
    let cqe = connect(&mut s, 2, 30_000)?;
    expect_status(
        "second Connect after the connect timeout",
        cqe.status,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
    )
}

/// One byte a second: bounded — the connection is closed by the connect timeout after a
/// couple of bytes, it does not linger.
pub fn one_byte_a_second(d: &Daemon) -> Result<(), String> {
    let mut s = TcpStream::connect(d.addr).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let icreq = IcReq::default().encode();
    let mut sent = 0;
    let closed = loop {
        if s.write_all(&icreq[sent..sent + 1]).is_err() {
            break Instant::now();
        }
        sent += 1;
        if let Ok(at) = wait_closed(&mut s, Duration::from_secs(1)) {
            break at;
        }
        if t0.elapsed() > CONNECT_TIMEOUT + SLACK + Duration::from_secs(2) {
            return Err(format!(
                "still open after {sent} bytes / {:?}",
                t0.elapsed()
            ));
        }
    };
    let after = closed.duration_since(t0);
    eprintln!("    trickler closed after {sent} bytes, {after:.2?}");
    expect(
        sent <= 6 && after >= CONNECT_TIMEOUT - Duration::from_millis(100),
        || format!("closed after {sent} bytes and {after:?}"),
    )
}

/// A connected host sending a command a byte every 20 ms (1.4 s per capsule, beyond the
/// connect timeout) is served, and its queue keeps working.
pub fn trickled_capsule_after_connect(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let mut s = sqe(
        nvme::spec::admin_opcode::IDENTIFY,
        0,
        0x9b,
        SglDescriptor::transport_data_block(4096),
    );
    s.cdw10 = 1;
    let bytes = capsule_bytes(&a, s, &[]);
    let mut w = a.writer().unwrap();
    for b in &bytes {
        w.write_all(&[*b]).map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(20));
    }
    // Not submitted through the client's bookkeeping: read the answer raw.
    match a.recv_pdu().map_err(|e| e.to_string())?.header {
        PduHeader::C2HData { hdr, .. } if hdr.cccid == 0x9b && hdr.datal == 4096 => {}
        other => return Err(format!("expected Identify data for 0x9b, got {other:?}")),
    }
    match a.recv_pdu().map_err(|e| e.to_string())?.header {
        PduHeader::CapsuleResp(cqe) if cqe.cid == 0x9b => {
            expect_status("trickled capsule", cqe.status, Status::SUCCESS)?
        }
        other => return Err(format!("expected the response of 0x9b, got {other:?}")),
    }
    a.keep_alive().map_err(|e| e.to_string())
}

/// KATO 1 s and silence: the controller is terminated, its admin queue closed, and its
/// cntlid no longer accepts I/O queues.
pub fn keep_alive_expiry_reclaims_the_controller(d: &Daemon) -> Result<(), String> {
    let (a, cntlid) = admin_with(d, options(), 1000);
    let t0 = Instant::now();
    let mut s = a.writer().unwrap();
    let at = wait_closed(&mut s, Duration::from_secs(6))?;
    eprintln!(
        "    admin queue closed {:.2?} after the last command",
        at.duration_since(t0)
    );
    d.wait_log(
        &["keep alive timeout expired", &format!("cntlid={cntlid}")],
        Duration::from_secs(1),
    )?;
    let cqe = io_connect(d, cntlid)?;
    expect_status(
        "I/O Connect to an expired controller",
        cqe.status,
        Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
    )
}

pub const CASES: &[(&str, CaseFn)] = &[
    ("thousand_silent_connections", thousand_silent_connections),
    ("icreq_without_connect", icreq_without_connect),
    ("trickled_icreq_then_connect", trickled_icreq_then_connect),
    ("one_byte_a_second", one_byte_a_second),
    (
        "trickled_capsule_after_connect",
        trickled_capsule_after_connect,
    ),
    (
        "keep_alive_expiry_reclaims_the_controller",
        keep_alive_expiry_reclaims_the_controller,
    ),
];
