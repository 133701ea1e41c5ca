//! Hostile NVMe/TCP PDUs (NVMe/TCP 1.0 §3.3, §3.6): each must end in exactly the termination
//! request the spec names (FES, and FEI = byte offset of the offending field for FES 01h,
//! §3.6.2.4 Figure 22), in a plain close, or — for data digest errors — in a failed command on
//! a connection that lives on.

use std::time::Duration;

use nvme::wire::{SglDescriptor, Status};
use transport::client::{ClientOptions, DataOut};
use transport::tcp::pdu::{
    digest, encode_header, flags, DataHeader, Digests, Fes, IcReq, PduHeader, PduType, TermReq,
};

use crate::support::*;

const IDENTIFY: u8 = 0x06;

fn identify_sqe(cid: u16) -> nvme::wire::Sqe {
    let mut s = sqe(IDENTIFY, 0, cid, SglDescriptor::transport_data_block(4096));
    s.cdw10 = 1;
    s
}

fn icreq(pfv: u16, hpda: u8) -> [u8; 128] {
    IcReq {
        pfv,
        hpda,
        dgst: 0,
        maxr2t: 0,
    }
    .encode()
}

/// A header of `pdu_type` with the given fields and zeroed body, `hlen` bytes long.
fn header(pdu_type: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) -> Vec<u8> {
    let mut h = vec![0u8; hlen.max(8) as usize];
    h[0] = pdu_type;
    h[1] = flags;
    h[2] = hlen;
    h[3] = pdo;
    set_plen(&mut h, plen);
    h
}

fn h2c(cccid: u16, ttag: u16, datao: u32, datal: u32, data: &[u8]) -> Vec<u8> {
    let hdr = PduHeader::H2CData {
        hdr: DataHeader {
            cccid,
            ttag,
            datao,
            datal,
        },
        last: true,
    };
    let mut out = encode_header(&hdr, Digests::default(), data.len() as u32, 4)
        .as_slice()
        .to_vec();
    out.extend_from_slice(data);
    out
}

pub fn icreq_pfv_nonzero(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    c.send_raw(&icreq(1, 0)).unwrap();
    expect_term(&mut c, Fes::UnsupportedParameter, 8)
}

pub fn icreq_hpda_above_31(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    c.send_raw(&icreq(0, 32)).unwrap();
    expect_term(&mut c, Fes::UnsupportedParameter, 10)
}

/// HPDA 31: every C2HData's data starts at a 128-byte boundary, and reads still verify.
pub fn icreq_hpda_31_is_honoured(d: &Daemon) -> Result<(), String> {
    let (_admin, cntlid) = admin(d);
    let opts = ClientOptions {
        hpda: 31,
        ..options()
    };
    let mut io = io_queue(d, opts, cntlid, 1);
    let data = pattern(8192, 31);
    write(&mut io, RAM_NSID, 1000, data.clone())?;
    let cid = io
        .submit(
            transport::client::Client::read_sqe(RAM_NSID, 1000, 16),
            DataOut::Read(8192),
        )
        .map_err(|e| e.to_string())?;
    let back = io.wait(cid).map_err(|e| e.to_string())?;
    expect(back.data == data, || "HPDA 31 read differs".into())
}

pub fn icreq_bad_hlen(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    let mut pdu = icreq(0, 0);
    pdu[2] = 127;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 2)
}

pub fn icreq_bad_plen(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    let mut pdu = icreq(0, 0).to_vec();
    set_plen(&mut pdu, 129);
    pdu.push(0);
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 4)
}

/// PLEN 4 GiB: refused from the common header; nothing is allocated or buffered for it
/// (the group's RSS check) even with megabytes of junk behind it.
pub fn icreq_plen_4g(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    let mut pdu = icreq(0, 0).to_vec();
    set_plen(&mut pdu, u32::MAX);
    c.send_raw(&pdu).unwrap();
    let r = expect_term(&mut c, Fes::InvalidPduHeaderField, 4);
    send_lossy(&mut c, &vec![0x5a; 4 << 20]);
    r
}

pub fn icreq_with_flags(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    let mut pdu = icreq(0, 0);
    pdu[1] = flags::HDGSTF;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 1)
}

/// §3.3: the IC exchange happens once; a second ICReq is out of sequence.
pub fn icreq_twice(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    c.send_raw(&icreq(0, 0)).unwrap();
    expect_term(&mut c, Fes::PduSequenceError, 0)
}

pub fn capsule_before_icreq(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    let pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::PduSequenceError, 0)
}

pub fn h2cdata_before_icreq(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    c.send_raw(&h2c(1, 0, 0, 512, &[0; 512])).unwrap();
    expect_term(&mut c, Fes::PduSequenceError, 0)
}

pub fn unknown_pdu_type(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    c.send_raw(&header(0x0a, 0, 24, 0, 24)).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 0)
}

pub fn pdu_type_0xff_first(d: &Daemon) -> Result<(), String> {
    let mut c = raw(d);
    c.send_raw(&header(0xff, 0, 8, 0, 8)).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 0)
}

/// PDUs only a controller sends, coming from the host.
pub fn controller_pdu_types_from_host(d: &Daemon) -> Result<(), String> {
    for (ty, hlen) in [
        (PduType::IcResp, 128u8),
        (PduType::C2HTermReq, 24),
        (PduType::CapsuleResp, 24),
        (PduType::C2HData, 24),
        (PduType::R2T, 24),
    ] {
        let mut c = established(d);
        c.send_raw(&header(ty as u8, 0, hlen, 0, hlen as u32))
            .unwrap();
        expect_term(&mut c, Fes::InvalidPduHeaderField, 0).map_err(|e| format!("{ty:?}: {e}"))?;
    }
    Ok(())
}

pub fn capsule_bad_hlen(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    pdu[2] = 71;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 2)
}

pub fn capsule_pdo_unaligned(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[0; 512]);
    pdu[3] = 74;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 3)
}

pub fn capsule_pdo_inside_header(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[0; 512]);
    pdu[3] = 64;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 3)
}

pub fn capsule_pdo_beyond_plen(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[0; 100]);
    pdu[3] = 200; // PLEN is 172
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 3)
}

pub fn capsule_plen_below_hlen(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    set_plen(&mut pdu, 40);
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 4)
}

/// In-capsule data of almost 4 GiB: Data Transfer Limit Exceeded from the header alone.
pub fn capsule_plen_huge(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[0; 4]);
    set_plen(&mut pdu, 0xffff_fff0);
    c.send_raw(&pdu).unwrap();
    let r = expect_term(&mut c, Fes::DataTransferLimitExceeded, 0);
    send_lossy(&mut c, &vec![0xa5; 4 << 20]);
    r
}

pub fn capsule_header_digest_flag_not_negotiated(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    pdu[1] |= flags::HDGSTF;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 1)
}

pub fn capsule_data_digest_flag_not_negotiated(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[0; 16]);
    pdu[1] |= flags::DDGSTF;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 1)
}

pub fn capsule_reserved_flag(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    pdu[1] |= 0x80;
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::InvalidPduHeaderField, 1)
}

/// 12 KiB in-capsule: beyond what any queue takes (8 KiB admin, 4 KiB I/O), refused from the
/// header (NVMe/TCP 1.0 §3.6.2.4 FES 05h) before any of it is read.
pub fn in_capsule_beyond_pdu_limit(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let s = write_sqe(RAM_NSID, 0, 24, 9, SglDescriptor::in_capsule(0, 12 * 1024));
    let pdu = capsule_bytes(&io, s, &[0; 12 * 1024]);
    send_lossy(&mut io, &pdu);
    expect_term(&mut io, Fes::DataTransferLimitExceeded, 0)
}

/// H2CTermReq from the host: the controller closes without answering (§3.6.2.4).
pub fn host_term_req(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let t = TermReq::new(Fes::InvalidPduHeaderField, 0, &[0; 24]);
    c.send_raw(&t.encode(PduType::H2CTermReq)).unwrap();
    expect_silent_close(&mut c)
}

pub fn host_term_req_too_long(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut pdu = header(PduType::H2CTermReq as u8, 0, 24, 0, 200);
    pdu.resize(200, 0);
    c.send_raw(&pdu).unwrap();
    expect_silent_close(&mut c)
}

pub fn header_digest_mismatch(d: &Daemon) -> Result<(), String> {
    let opts = ClientOptions {
        header_digest: true,
        ..options()
    };
    let mut c = transport::client::Client::connect(d.addr, opts).map_err(|e| e.to_string())?;
    let mut pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    pdu[72] ^= 0xff; // HDGST follows the 72-byte header
    c.send_raw(&pdu).unwrap();
    expect_term(&mut c, Fes::HeaderDigestError, 0)
}

/// A write waiting for H2CData: returns the I/O queue, the admin queue and the R2T's TTAG.
fn pending_write(
    d: &Daemon,
    cid: u16,
    len: u32,
) -> Result<(transport::client::Client, transport::client::Client, u16), String> {
    let (a, mut io) = controller(d);
    let s = write_sqe(
        RAM_NSID,
        2000,
        len / BLOCK,
        cid,
        SglDescriptor::transport_data_block(len),
    );
    let pdu = capsule_bytes(&io, s, &[]);
    io.send_raw(&pdu).unwrap();
    let r2t = io.recv_pdu().map_err(|e| format!("R2T: {e}"))?;
    let PduHeader::R2T(r2t) = r2t.header else {
        return Err(format!("expected R2T, got {:?}", r2t.header.pdu_type()));
    };
    expect(r2t.cccid == cid && r2t.r2to == 0 && r2t.r2tl == len, || {
        format!("R2T {r2t:?}")
    })?;
    Ok((io, a, r2t.ttag))
}

pub fn h2cdata_unknown_ttag(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    io.send_raw(&h2c(0, 999, 0, 512, &[0; 512])).unwrap();
    expect_term(&mut io, Fes::InvalidPduHeaderField, 10)
}

pub fn h2cdata_for_idle_slot(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    io.send_raw(&h2c(0, 0, 0, 512, &[0; 512])).unwrap();
    expect_term(&mut io, Fes::PduSequenceError, 0)
}

pub fn h2cdata_wrong_cccid(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    io.send_raw(&h2c(6, ttag, 0, 8192, &[0; 8192])).unwrap();
    expect_term(&mut io, Fes::InvalidPduHeaderField, 8)
}

pub fn h2cdata_wrong_offset(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    io.send_raw(&h2c(5, ttag, 512, 4096, &[0; 4096])).unwrap();
    expect_term(&mut io, Fes::DataTransferOutOfRange, 0)
}

pub fn h2cdata_overrun(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    io.send_raw(&h2c(5, ttag, 0, 8704, &[0; 8704])).unwrap();
    expect_term(&mut io, Fes::DataTransferOutOfRange, 0)
}

/// DATAL 0 (§3.6.2.8: H2CData carries data): Invalid PDU Header Field at DATAL.
pub fn h2cdata_zero_length(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    let mut pdu = header(PduType::H2CData as u8, flags::LAST_PDU, 24, 0, 24);
    pdu[8..10].copy_from_slice(&5u16.to_le_bytes());
    pdu[10..12].copy_from_slice(&ttag.to_le_bytes());
    io.send_raw(&pdu).unwrap();
    expect_term(&mut io, Fes::InvalidPduHeaderField, 16)
}

pub fn h2cdata_datal_not_plen(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    let mut pdu = h2c(5, ttag, 0, 1024, &[0; 512]);
    pdu[16..20].copy_from_slice(&1024u32.to_le_bytes());
    io.send_raw(&pdu).unwrap();
    expect_term(&mut io, Fes::InvalidPduHeaderField, 16)
}

/// DATAL above MAXH2CDATA (= MDTS here): Data Transfer Limit Exceeded from the header.
pub fn h2cdata_above_maxh2cdata(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    let big = io.maxh2cdata() + 4;
    let mut pdu = h2c(5, ttag, 0, big, &[]);
    pdu[3] = 24; // PDO: data right after the header
    set_plen(&mut pdu, 24 + big);
    io.send_raw(&pdu).unwrap();
    let r = expect_term(&mut io, Fes::DataTransferLimitExceeded, 0);
    send_lossy(&mut io, &vec![0; big as usize]);
    r
}

fn digest_client(d: &Daemon) -> (transport::client::Client, transport::client::Client) {
    let opts = ClientOptions {
        header_digest: true,
        data_digest: true,
        ..options()
    };
    let (a, cntlid) = admin_with(d, opts, 30_000);
    (a, io_queue(d, opts, cntlid, 1))
}

/// A data digest error fails that command only (Transient Transport Error), the data is not
/// written, and the connection keeps working.
pub fn data_digest_mismatch_in_capsule(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = digest_client(d);
    let good = pattern(2048, 71);
    write(&mut io, RAM_NSID, 3000, good.clone())?;
    let s = write_sqe(RAM_NSID, 3000, 4, 77, SglDescriptor::in_capsule(0, 2048));
    let mut pdu = capsule_bytes(&io, s, &pattern(2048, 72));
    let n = pdu.len();
    pdu[n - 1] ^= 0xff;
    io.send_raw(&pdu).unwrap();
    let resp = io.recv_pdu().map_err(|e| e.to_string())?;
    match resp.header {
        PduHeader::CapsuleResp(cqe) if cqe.cid == 77 => expect_status(
            "in-capsule digest error",
            cqe.status,
            Status::TRANSIENT_TRANSPORT_ERROR,
        )?,
        other => return Err(format!("expected the response of cid 77, got {other:?}")),
    }
    let back = read_back(&mut io, RAM_NSID, 3000, 4)?;
    expect(back == good, || {
        "the corrupted write reached the media".into()
    })
}

pub fn data_digest_mismatch_h2c(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = digest_client(d);
    let good = pattern(8192, 81);
    write(&mut io, RAM_NSID, 3100, good.clone())?;
    let s = write_sqe(
        RAM_NSID,
        3100,
        16,
        78,
        SglDescriptor::transport_data_block(8192),
    );
    let pdu = capsule_bytes(&io, s, &[]);
    io.send_raw(&pdu).unwrap();
    let r2t = match io.recv_pdu().map_err(|e| e.to_string())?.header {
        PduHeader::R2T(r) => r,
        other => return Err(format!("expected R2T, got {other:?}")),
    };
    let bad = pattern(8192, 82);
    let mut data_pdu = io.encode(
        &PduHeader::H2CData {
            hdr: DataHeader {
                cccid: 78,
                ttag: r2t.ttag,
                datao: 0,
                datal: 8192,
            },
            last: true,
        },
        &bad,
    );
    let n = data_pdu.len();
    let wrong = digest(&bad) ^ 1;
    data_pdu[n - 4..].copy_from_slice(&wrong.to_le_bytes());
    io.send_raw(&data_pdu).unwrap();
    let resp = io.recv_pdu().map_err(|e| e.to_string())?;
    match resp.header {
        PduHeader::CapsuleResp(cqe) if cqe.cid == 78 => expect_status(
            "H2CData digest error",
            cqe.status,
            Status::TRANSIENT_TRANSPORT_ERROR,
        )?,
        other => return Err(format!("expected the response of cid 78, got {other:?}")),
    }
    let back = read_back(&mut io, RAM_NSID, 3100, 16)?;
    expect(back == good, || {
        "the corrupted write reached the media".into()
    })
}

/// Half a capsule, then FIN: logged as a host close, nothing else happens.
pub fn half_pdu_then_close(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let local = c.local_addr().unwrap().to_string();
    let pdu = capsule_bytes(&c, identify_sqe(1), &[]);
    c.send_raw(&pdu[..40]).unwrap();
    drop(c);
    d.wait_log(&["closed by host", &local], Duration::from_secs(3))
        .map(|_| ())
}

/// Half of a write's data, then RST.
pub fn half_data_then_reset(d: &Daemon) -> Result<(), String> {
    let (mut io, _a, ttag) = pending_write(d, 5, 8192)?;
    let local = io.local_addr().unwrap().to_string();
    let pdu = h2c(5, ttag, 0, 8192, &[0; 8192]);
    io.send_raw(&pdu[..24 + 4096]).unwrap();
    reset(io.writer().unwrap());
    drop(io);
    d.wait_log(&["connection failed", &local], Duration::from_secs(3))
        .map(|_| ())
}

/// A well-formed in-capsule write with the data digest right, for contrast with the two
/// digest cases above: the same path succeeds.
pub fn data_digest_correct(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = digest_client(d);
    let data = pattern(2048, 91);
    write(&mut io, RAM_NSID, 3200, data.clone())?;
    let back = read_back(&mut io, RAM_NSID, 3200, 4)?;
    expect(back == data, || "digest-protected write differs".into())
}

pub const CASES: &[(&str, CaseFn)] = &[
    ("icreq_pfv_nonzero", icreq_pfv_nonzero),
    ("icreq_hpda_above_31", icreq_hpda_above_31),
    ("icreq_hpda_31_is_honoured", icreq_hpda_31_is_honoured),
    ("icreq_bad_hlen", icreq_bad_hlen),
    ("icreq_bad_plen", icreq_bad_plen),
    ("icreq_plen_4g", icreq_plen_4g),
    ("icreq_with_flags", icreq_with_flags),
    ("icreq_twice", icreq_twice),
    ("capsule_before_icreq", capsule_before_icreq),
    ("h2cdata_before_icreq", h2cdata_before_icreq),
    ("unknown_pdu_type", unknown_pdu_type),
    ("pdu_type_0xff_first", pdu_type_0xff_first),
    (
        "controller_pdu_types_from_host",
        controller_pdu_types_from_host,
    ),
    ("capsule_bad_hlen", capsule_bad_hlen),
    ("capsule_pdo_unaligned", capsule_pdo_unaligned),
    ("capsule_pdo_inside_header", capsule_pdo_inside_header),
    ("capsule_pdo_beyond_plen", capsule_pdo_beyond_plen),
    ("capsule_plen_below_hlen", capsule_plen_below_hlen),
    ("capsule_plen_huge", capsule_plen_huge),
    (
        "capsule_header_digest_flag_not_negotiated",
        capsule_header_digest_flag_not_negotiated,
    ),
    (
        "capsule_data_digest_flag_not_negotiated",
        capsule_data_digest_flag_not_negotiated,
    ),
    ("capsule_reserved_flag", capsule_reserved_flag),
    ("in_capsule_beyond_pdu_limit", in_capsule_beyond_pdu_limit),
    ("host_term_req", host_term_req),
    ("host_term_req_too_long", host_term_req_too_long),
    ("header_digest_mismatch", header_digest_mismatch),
    ("h2cdata_unknown_ttag", h2cdata_unknown_ttag),
    ("h2cdata_for_idle_slot", h2cdata_for_idle_slot),
    ("h2cdata_wrong_cccid", h2cdata_wrong_cccid),
    ("h2cdata_wrong_offset", h2cdata_wrong_offset),
    ("h2cdata_overrun", h2cdata_overrun),
    ("h2cdata_zero_length", h2cdata_zero_length),
    ("h2cdata_datal_not_plen", h2cdata_datal_not_plen),
    ("h2cdata_above_maxh2cdata", h2cdata_above_maxh2cdata),
    (
        "data_digest_mismatch_in_capsule",
        data_digest_mismatch_in_capsule,
    ),
    ("data_digest_mismatch_h2c", data_digest_mismatch_h2c),
    ("data_digest_correct", data_digest_correct),
    ("half_pdu_then_close", half_pdu_then_close),
    ("half_data_then_reset", half_data_then_reset),
];
