//! End-to-end NVMe/TCP over 127.0.0.1: the host-side client against a real `TcpConnection`
//! and `nvme::target::Target`.

mod support;

use std::time::Duration;

use nvme::spec::{admin_opcode, cns, fid, lid, nvm_opcode, sqe_flags};
use nvme::wire::{SglDescriptor, SglType, Sqe, Status};
use support::*;
use transport::client::{Client, ClientOptions, DataOut, RawPdu};
use transport::tcp::pdu::{
    encode_header, encode_pdu, DataHeader, Digests, Fes, IcReq, PduHeader, PduType,
};
use transport::tcp::TcpParams;

const SIZES: [usize; 7] = [512, 4096, 8192, 12288, 32768, 65536, 131072];

/// A target, its admin queue (kept open: it owns the controller) and I/O queue 1 of
/// `sqsize + 1` entries.
fn io_setup(params: TcpParams, opts: ClientOptions, sqsize: u16) -> (TestTarget, Client, Client) {
    let t = start(params);
    let (admin, cntlid) = admin(&t, ClientOptions::default());
    let io = io_queue(&t, opts, cntlid, 1, sqsize);
    (t, admin, io)
}

fn write_read_verify(io: &mut Client, nsid: u32, seed: u32) {
    let mut slba = 0u64;
    for (i, &len) in SIZES.iter().enumerate() {
        let data = pattern(len, seed + i as u32);
        io.write(nsid, slba, data.clone(), BLOCK).expect("write");
        let back = io
            .read(nsid, slba, (len / BLOCK as usize) as u32, BLOCK)
            .expect("read");
        assert!(
            back == data,
            "nsid {nsid}: {len} bytes at {slba} read back differently"
        );
        slba += (len / BLOCK as usize) as u64 + 3;
    }
}

#[test]
fn connect_identify_write_read_every_digest_setting() {
    let t = start(default_params());
    for (h, d) in [(false, false), (true, false), (false, true), (true, true)] {
        let opts = digest_options(h, d);
        let (mut admin, cntlid) = admin(&t, opts);
        assert_eq!(admin.digests(), Digests { header: h, data: d });
        assert_eq!(admin.maxh2cdata(), 32 * 1024);
        let idc = admin.identify(0x01, 0).expect("identify controller");
        assert_eq!(idc.len(), 4096);
        assert_eq!(u16::from_le_bytes([idc[78], idc[79]]), cntlid, "CNTLID");
        let subnqn = &idc[768..768 + SUBNQN.len()];
        assert_eq!(subnqn, SUBNQN.as_bytes());
        let idns = admin.identify(0x00, RAM_NSID).expect("identify namespace");
        let nsze = u64::from_le_bytes(idns[0..8].try_into().unwrap());
        assert_eq!(nsze, (64 << 20) / BLOCK as u64);
        let log = admin
            .get_log_page(0x02, 0xffff_ffff, 512, 0)
            .expect("SMART log");
        assert_eq!(log.len(), 512);
        // Number of Queues: the result reports what the controller grants (0's based).
        let cqe = admin.set_features(0x07, 0x0003_0003).expect("set features");
        assert!(
            cqe.dw0 & 0xffff <= 3 && cqe.dw0 >> 16 <= 3,
            "{:#x}",
            cqe.dw0
        );
        let mut io = io_queue(&t, opts, cntlid, 1, 31);
        write_read_verify(&mut io, RAM_NSID, 10);
        write_read_verify(&mut io, FILE_NSID, 20);
        io.flush(FILE_NSID).expect("flush");
    }
}

#[test]
fn writes_by_r2t_in_several_chunks() {
    // MAXH2CDATA 8 KiB: a 128 KiB write needs 16 R2Ts, each answered by one H2CData.
    let params = TcpParams {
        max_h2c_data: 8192,
        ..default_params()
    };
    let (_t, _admin, mut io) = io_setup(params, digest_options(true, true), 15);
    for (i, len) in [512usize, 8192, 8704, 131072].into_iter().enumerate() {
        let data = pattern(len, 100 + i as u32);
        let nlb = (len / BLOCK as usize) as u32;
        let c = io
            .execute(
                Client::write_sqe(RAM_NSID, 64, nlb, false),
                DataOut::WriteR2t(data.clone()),
            )
            .unwrap();
        assert!(c.cqe.status.is_success(), "{:?}", c.cqe.status);
        assert_eq!(io.read(RAM_NSID, 64, nlb, BLOCK).unwrap(), data);
    }
}

#[test]
fn many_outstanding_commands_and_back_pressure() {
    let (_t, _admin, mut io) = io_setup(default_params(), ClientOptions::default(), 3);
    for nsid in [RAM_NSID, FILE_NSID] {
        // 24 in-capsule writes on a 4-entry queue before any completion is read: the target
        // must pause reading while every slot is busy, never fail.
        for i in 0..24u32 {
            io.submit(
                Client::write_sqe(nsid, i as u64 * 8, 8, false),
                DataOut::Write(pattern(4096, i)),
            )
            .unwrap();
        }
        for _ in 0..24 {
            let c = io.reap().unwrap();
            assert!(c.cqe.status.is_success(), "{:?}", c.cqe.status);
        }
        // At full depth (4 outstanding), in-capsule and R2T writes mixed.
        let mut outstanding = 0;
        for i in 0..24u32 {
            if outstanding == 4 {
                assert!(io.reap().unwrap().cqe.status.is_success());
                outstanding -= 1;
            }
            let data = pattern(4096, 1000 + i);
            let out = if i % 2 == 0 {
                DataOut::Write(data)
            } else {
                DataOut::WriteR2t(data)
            };
            io.submit(Client::write_sqe(nsid, 400 + i as u64 * 8, 8, false), out)
                .unwrap();
            outstanding += 1;
        }
        for _ in 0..outstanding {
            assert!(io.reap().unwrap().cqe.status.is_success());
        }
        // 24 reads at once, checked against what was written.
        let mut cids = Vec::new();
        for i in 0..48u32 {
            let slba = if i < 24 {
                i as u64 * 8
            } else {
                400 + (i - 24) as u64 * 8
            };
            cids.push(
                io.submit(Client::read_sqe(nsid, slba, 8), DataOut::Read(4096))
                    .unwrap(),
            );
        }
        for _ in 0..48 {
            let c = io.reap().unwrap();
            let i = cids.iter().position(|&x| x == c.cid).unwrap() as u32;
            let seed = if i < 24 { i } else { 1000 + i - 24 };
            assert!(c.data == pattern(4096, seed), "read {i} of nsid {nsid}");
        }
    }
}

#[test]
fn write_zeroes_deallocate_and_flush() {
    let (_t, _admin, mut io) = io_setup(default_params(), ClientOptions::default(), 31);
    io.write(RAM_NSID, 0, pattern(8192, 5), BLOCK).unwrap();
    io.write_zeroes(RAM_NSID, 0, 8).unwrap();
    assert!(io
        .read(RAM_NSID, 0, 8, BLOCK)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert_eq!(
        io.read(RAM_NSID, 8, 8, BLOCK).unwrap(),
        pattern(8192, 5)[4096..]
    );
    io.deallocate(RAM_NSID, &[(8, 8)]).unwrap();
    assert!(io
        .read(RAM_NSID, 8, 8, BLOCK)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    io.flush(RAM_NSID).unwrap();
}

fn status_of(io: &mut Client, sqe: Sqe, capsule: &[u8], read_len: u32) -> Status {
    io.submit_exact(sqe, capsule, read_len).unwrap();
    io.wait(sqe.cid).unwrap().cqe.status
}

#[test]
fn sgl_errors_fail_the_command_only() {
    let params = TcpParams {
        in_capsule_data_size: 4096,
        ..default_params()
    };
    let (_t, _admin, mut io) = io_setup(params, ClientOptions::default(), 31);
    let mut sqe = Client::write_sqe(RAM_NSID, 0, 1, false);
    sqe.flags = 0x40;
    // Keyed SGL (RDMA) on TCP.
    sqe.cid = 1000;
    sqe.dptr = SglDescriptor {
        address: 0x1000,
        length: 512,
        key: 7,
        sgl_type: SglType::KeyedDataBlock,
    };
    assert_eq!(
        status_of(&mut io, sqe, &[], 0),
        Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()
    );
    // In-capsule data beyond the I/O queue's in-capsule size (4096).
    sqe.cid = 1001;
    sqe.cdw12 = 15; // 16 blocks
    sqe.dptr = SglDescriptor::in_capsule(0, 8192);
    assert_eq!(
        status_of(&mut io, sqe, &vec![1u8; 8192], 0),
        Status::DATA_SGL_LENGTH_INVALID.with_dnr()
    );
    // Offset beyond the capsule's data.
    sqe.cid = 1002;
    sqe.cdw12 = 0;
    sqe.dptr = SglDescriptor::in_capsule(1024, 512);
    assert_eq!(
        status_of(&mut io, sqe, &[2u8; 512], 0),
        Status::SGL_OFFSET_INVALID.with_dnr()
    );
    // An in-capsule (offset) SGL on a read.
    let mut rd = Client::read_sqe(RAM_NSID, 0, 1);
    rd.flags = 0x40;
    rd.cid = 1003;
    rd.dptr = SglDescriptor::in_capsule(0, 512);
    assert_eq!(
        status_of(&mut io, rd, &[0u8; 512], 512),
        Status::SGL_OFFSET_INVALID.with_dnr()
    );
    // A non-zero offset inside the capsule is honoured.
    sqe.cid = 1004;
    let data = pattern(512, 9);
    let mut capsule = vec![0u8; 64];
    capsule.extend_from_slice(&data);
    sqe.dptr = SglDescriptor::in_capsule(64, 512);
    assert_eq!(status_of(&mut io, sqe, &capsule, 0), Status::SUCCESS);
    assert_eq!(io.read(RAM_NSID, 0, 1, BLOCK).unwrap(), data);
}

/// Sends `bytes` on an established I/O queue and expects a C2HTermReq with `fes`/`fei`
/// followed by the connection closing.
fn expect_termination(io: &mut Client, bytes: &[u8], fes: Fes, fei: Option<u32>) {
    io.send_raw(bytes).unwrap();
    let term = io.expect_close().expect("close").expect("a C2HTermReq");
    assert_eq!(Fes::from_u16(term.fes), Some(fes), "FES (FEI {})", term.fei);
    if let Some(fei) = fei {
        assert_eq!(term.fei, fei, "FEI");
    }
    assert!(term.data.len() <= 128);
}

#[test]
fn malformed_pdus_terminate_with_the_right_fes() {
    let t = start(default_params());
    let (_admin, cntlid) = admin(&t, ClientOptions::default());
    let new_io = || io_queue(&t, ClientOptions::default(), cntlid, 1, 15);

    // Bad HLEN on a CapsuleCmd.
    let mut io = new_io();
    let mut pdu = io.encode(&PduHeader::CapsuleCmd(Client::read_sqe(1, 0, 1)), &[]);
    pdu[2] = 70;
    expect_termination(&mut io, &pdu, Fes::InvalidPduHeaderField, Some(2));

    // Unknown PDU type.
    let mut io = new_io();
    expect_termination(
        &mut io,
        &[0x0c, 0, 8, 0, 8, 0, 0, 0],
        Fes::InvalidPduHeaderField,
        Some(0),
    );

    // A controller-to-host PDU type sent by the host.
    let mut io = new_io();
    let pdu = io.encode(&PduHeader::R2T(Default::default()), &[]);
    expect_termination(&mut io, &pdu, Fes::InvalidPduHeaderField, Some(0));

    // A second ICReq.
    let mut io = new_io();
    expect_termination(
        &mut io,
        &IcReq::default().encode(),
        Fes::PduSequenceError,
        Some(0),
    );

    // H2CData for a TTAG that awaits nothing.
    let mut io = new_io();
    let h2c = |ttag: u16, datao: u32, data: &[u8]| PduHeader::H2CData {
        hdr: DataHeader {
            cccid: 7,
            ttag,
            datao,
            datal: data.len() as u32,
        },
        last: true,
    };
    let pdu = io.encode(&h2c(0, 0, &[0u8; 512]), &[0u8; 512]);
    expect_termination(&mut io, &pdu, Fes::PduSequenceError, None);

    // H2CData without data (DATAL 0).
    let mut io = new_io();
    let pdu = io.encode(&h2c(0, 0, &[]), &[]);
    expect_termination(&mut io, &pdu, Fes::InvalidPduHeaderField, Some(16));

    // H2CData for a TTAG beyond the queue.
    let mut io = new_io();
    let pdu = io.encode(&h2c(500, 0, &[0u8; 512]), &[0u8; 512]);
    expect_termination(&mut io, &pdu, Fes::InvalidPduHeaderField, Some(10));

    // H2CData at the wrong offset / beyond the R2T: send a write by R2T, wait for the R2T.
    for (offset, len, fes) in [
        (512u32, 512usize, Fes::DataTransferOutOfRange),
        (0, 8192, Fes::DataTransferOutOfRange),
    ] {
        let mut io = new_io();
        let mut sqe = Client::write_sqe(RAM_NSID, 0, 8, false);
        sqe.flags = 0x40;
        sqe.cid = 7;
        sqe.dptr = SglDescriptor::transport_data_block(4096);
        io.send_raw(&io.encode(&PduHeader::CapsuleCmd(sqe), &[]))
            .unwrap();
        let r2t = match io.recv_pdu().unwrap().header {
            PduHeader::R2T(r) => r,
            other => panic!("expected R2T, got {other:?}"),
        };
        assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (7, 0, 4096));
        let data = vec![0u8; len];
        let pdu = io.encode(&h2c(r2t.ttag, offset, &data), &data);
        expect_termination(&mut io, &pdu, fes, None);
    }

    // Header digest error (digests negotiated).
    let mut io = io_queue(&t, digest_options(true, false), cntlid, 1, 15);
    let mut pdu = io.encode(&PduHeader::CapsuleCmd(Client::read_sqe(1, 0, 1)), &[]);
    pdu[20] ^= 0x40;
    expect_termination(&mut io, &pdu, Fes::HeaderDigestError, None);

    // HDGSTF missing although header digests were negotiated.
    let mut io = io_queue(&t, digest_options(true, false), cntlid, 1, 15);
    let pdu = encode_pdu(
        &PduHeader::CapsuleCmd(Client::read_sqe(1, 0, 1)),
        &[],
        Digests::default(),
        4,
    );
    expect_termination(&mut io, &pdu, Fes::InvalidPduHeaderField, Some(1));

    // In-capsule data beyond the 8 KiB any queue accepts: refused from the header.
    let mut io = new_io();
    let head = encode_header(
        &PduHeader::CapsuleCmd(Client::write_sqe(1, 0, 64, false)),
        Digests::default(),
        32768,
        4,
    );
    expect_termination(
        &mut io,
        head.as_slice(),
        Fes::DataTransferLimitExceeded,
        None,
    );

    // The admin queue still works after all that.
    let mut admin2 = admin(&t, ClientOptions::default()).0;
    admin2.keep_alive().unwrap();
}

#[test]
fn initialisation_errors() {
    let t = start(default_params());
    // PFV 1.
    let mut c = Client::connect_raw(t.addr, Duration::from_secs(5)).unwrap();
    let ic = IcReq {
        pfv: 1,
        ..IcReq::default()
    };
    expect_termination(&mut c, &ic.encode(), Fes::UnsupportedParameter, Some(8));
    // A command before ICReq.
    let mut c = Client::connect_raw(t.addr, Duration::from_secs(5)).unwrap();
    let pdu = encode_pdu(
        &PduHeader::CapsuleCmd(Client::read_sqe(1, 0, 1)),
        &[],
        Digests::default(),
        4,
    );
    expect_termination(&mut c, &pdu, Fes::PduSequenceError, Some(0));
    // An H2CTermReq closes without a reply.
    let mut c = Client::connect(t.addr, ClientOptions::default()).unwrap();
    let term = transport::tcp::pdu::TermReq::new(Fes::PduSequenceError, 0, &[]);
    c.send_raw(&term.encode(PduType::H2CTermReq)).unwrap();
    assert_eq!(c.expect_close().unwrap(), None);
    // HPDA 3: C2HData arrives padded to 16 bytes and still decodes.
    let opts = ClientOptions {
        hpda: 3,
        ..ClientOptions::default()
    };
    let (mut a, _) = admin(&t, opts);
    let id = a.identify(0x01, 0).unwrap();
    assert_eq!(&id[768..768 + SUBNQN.len()], SUBNQN.as_bytes());
}

#[test]
fn data_digest_errors_fail_only_the_command() {
    let (_t, _admin, mut io) = io_setup(default_params(), digest_options(false, true), 15);
    io.write(RAM_NSID, 0, pattern(4096, 1), BLOCK).unwrap();

    // In-capsule write with a corrupted data digest.
    let mut bad = Client::write_sqe(RAM_NSID, 0, 8, false);
    bad.flags = 0x40;
    bad.cid = 301;
    bad.dptr = SglDescriptor::in_capsule(0, 4096);
    let mut pdu = io.encode(&PduHeader::CapsuleCmd(bad), &pattern(4096, 3));
    let n = pdu.len();
    pdu[n - 1] ^= 1;
    io.send_raw(&pdu).unwrap();
    match io.recv_pdu().unwrap().header {
        PduHeader::CapsuleResp(cqe) => {
            assert_eq!(cqe.cid, 301);
            assert_eq!(cqe.status.sc, Status::TRANSIENT_TRANSPORT_ERROR.sc);
        }
        other => panic!("expected a response, got {other:?}"),
    }

    // R2T write whose H2CData digest is corrupted.
    let mut w = Client::write_sqe(RAM_NSID, 0, 8, false);
    w.flags = 0x40;
    w.cid = 302;
    w.dptr = SglDescriptor::transport_data_block(4096);
    io.send_raw(&io.encode(&PduHeader::CapsuleCmd(w), &[]))
        .unwrap();
    let r2t = match io.recv_pdu().unwrap().header {
        PduHeader::R2T(r) => r,
        other => panic!("expected R2T, got {other:?}"),
    };
    let data = pattern(4096, 4);
    let mut h2c = io.encode(
        &PduHeader::H2CData {
            hdr: DataHeader {
                cccid: 302,
                ttag: r2t.ttag,
                datao: 0,
                datal: 4096,
            },
            last: true,
        },
        &data,
    );
    let n = h2c.len();
    h2c[n - 2] ^= 0x10;
    io.send_raw(&h2c).unwrap();
    match io.recv_pdu().unwrap() {
        RawPdu {
            header: PduHeader::CapsuleResp(cqe),
            ..
        } => {
            assert_eq!(cqe.cid, 302);
            assert_eq!(cqe.status.sc, Status::TRANSIENT_TRANSPORT_ERROR.sc);
        }
        other => panic!("expected a response, got {other:?}"),
    }

    // The connection lives, and neither corrupted write reached the namespace.
    assert_eq!(io.read(RAM_NSID, 0, 8, BLOCK).unwrap(), pattern(4096, 1));
}

#[test]
fn data_arriving_in_small_pieces_lands_correctly() {
    let t = start(default_params());
    let (_admin, cntlid) = admin(&t, ClientOptions::default());
    for opts in [ClientOptions::default(), digest_options(true, true)] {
        let mut io = io_queue(&t, opts, cntlid, 1, 15);
        let pause = || std::thread::sleep(Duration::from_millis(3));
        // An R2T write whose H2CData header and data trickle in.
        let data = pattern(20000 - 20000 % 512, 77);
        let nlb = (data.len() / 512) as u32;
        let mut w = Client::write_sqe(RAM_NSID, 100, nlb, false);
        w.flags = 0x40;
        w.cid = 1;
        w.dptr = SglDescriptor::transport_data_block(data.len() as u32);
        io.send_raw(&io.encode(&PduHeader::CapsuleCmd(w), &[]))
            .unwrap();
        let r2t = match io.recv_pdu().unwrap().header {
            PduHeader::R2T(r) => r,
            other => panic!("expected R2T, got {other:?}"),
        };
        let pdu = io.encode(
            &PduHeader::H2CData {
                hdr: DataHeader {
                    cccid: 1,
                    ttag: r2t.ttag,
                    datao: 0,
                    datal: data.len() as u32,
                },
                last: true,
            },
            &data,
        );
        for piece in [&pdu[..5], &pdu[5..30], &pdu[30..4000], &pdu[4000..4001]] {
            io.send_raw(piece).unwrap();
            pause();
        }
        for piece in pdu[4001..].chunks(3001) {
            io.send_raw(piece).unwrap();
            pause();
        }
        match io.recv_pdu().unwrap().header {
            PduHeader::CapsuleResp(cqe) => assert!(cqe.status.is_success(), "{:?}", cqe.status),
            other => panic!("expected a response, got {other:?}"),
        }
        // An in-capsule write sent in pieces, followed directly by a read in the same send.
        let small = pattern(4096, 78);
        let mut w2 = Client::write_sqe(RAM_NSID, 200, 8, false);
        w2.flags = 0x40;
        w2.cid = 2;
        w2.dptr = SglDescriptor::in_capsule(0, 4096);
        let pdu = io.encode(&PduHeader::CapsuleCmd(w2), &small);
        io.send_raw(&pdu[..100]).unwrap();
        pause();
        io.send_raw(&pdu[100..]).unwrap();
        match io.recv_pdu().unwrap().header {
            PduHeader::CapsuleResp(cqe) => assert!(cqe.status.is_success()),
            other => panic!("expected a response, got {other:?}"),
        }
        assert_eq!(io.read(RAM_NSID, 100, nlb, BLOCK).unwrap(), data);
        assert_eq!(io.read(RAM_NSID, 200, 8, BLOCK).unwrap(), small);
    }
}

/// Mutated PDUs must only ever produce responses, termination or close — never a crash of
/// the target (the target thread is joined, panics included, when `t` drops).
#[test]
fn mutated_pdus_never_break_the_target() {
    let t = start(default_params());
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let short = ClientOptions {
        timeout: Duration::from_millis(100),
        ..ClientOptions::default()
    };
    let mut outcomes = [0usize; 3]; // responses, terminations/closes, timeouts
    for i in 0..40 {
        let digests = digest_options(i % 3 == 0, i % 4 == 0);
        let (mut c, _) = admin(
            &t,
            ClientOptions {
                timeout: short.timeout,
                ..digests
            },
        );
        let mut sqe = match i % 4 {
            0 => Sqe {
                opcode: admin_opcode::IDENTIFY,
                cdw10: cns::CONTROLLER as u32,
                ..Sqe::default()
            },
            1 => Sqe {
                opcode: admin_opcode::GET_LOG_PAGE,
                nsid: 0xffff_ffff,
                cdw10: 0x007f_0000 | lid::SMART as u32,
                ..Sqe::default()
            },
            2 => Sqe {
                opcode: admin_opcode::SET_FEATURES,
                cdw10: fid::NUMBER_OF_QUEUES as u32,
                cdw11: 0x0003_0003,
                ..Sqe::default()
            },
            _ => Client::write_sqe(RAM_NSID, 0, 1, false),
        };
        sqe.flags = sqe_flags::PSDT_SGL;
        sqe.cid = i as u16;
        let (payload, dptr) = if i % 4 == 3 {
            (pattern(512, i), SglDescriptor::in_capsule(0, 512))
        } else if i % 4 == 0 {
            (vec![], SglDescriptor::transport_data_block(4096))
        } else if i % 4 == 1 {
            (vec![], SglDescriptor::transport_data_block(512))
        } else {
            (vec![], SglDescriptor::transport_data_block(0))
        };
        sqe.dptr = dptr;
        let mut pdu = c.encode(&PduHeader::CapsuleCmd(sqe), &payload);
        let header_span = pdu.len().min(80);
        for _ in 0..1 + next() % 3 {
            let at = (next() as usize) % header_span;
            pdu[at] = next() as u8;
        }
        c.send_raw(&pdu).unwrap();
        let mut seen = None;
        for _ in 0..4 {
            match c.recv_pdu() {
                Ok(RawPdu {
                    header: PduHeader::C2HTermReq(_),
                    ..
                }) => {
                    seen = Some(1);
                    break;
                }
                Ok(_) => seen = seen.or(Some(0)),
                Err(transport::client::ClientError::Timeout) => {
                    seen = seen.or(Some(2));
                    break;
                }
                Err(_) => {
                    seen = Some(1);
                    break;
                }
            }
        }
        outcomes[seen.unwrap_or(0)] += 1;
    }
    // Whatever happened, the target still serves new connections normally.
    let (mut a, cntlid) = admin(&t, ClientOptions::default());
    a.keep_alive().unwrap();
    let mut io = io_queue(&t, ClientOptions::default(), cntlid, 1, 15);
    io.write(RAM_NSID, 0, pattern(4096, 5), BLOCK).unwrap();
    assert_eq!(io.read(RAM_NSID, 0, 8, BLOCK).unwrap(), pattern(4096, 5));
    assert!(
        outcomes[1] > 0,
        "some mutations must be fatal: {outcomes:?}"
    );
}

/// A host that floods commands and reads responses late: the target bounds its send queue
/// by pausing reads, and every command still gets exactly one response.
#[test]
fn flood_of_commands_without_reading_responses() {
    use std::io::Write;
    let (_t, _admin, mut io) = io_setup(default_params(), ClientOptions::default(), 63);
    const N: u16 = 20000;
    let mut flood = Vec::new();
    for cid in 0..N {
        let sqe = Sqe {
            opcode: nvm_opcode::FLUSH,
            flags: sqe_flags::PSDT_SGL,
            cid,
            nsid: RAM_NSID,
            dptr: SglDescriptor::transport_data_block(0),
            ..Sqe::default()
        };
        flood.extend(io.encode(&PduHeader::CapsuleCmd(sqe), &[]));
    }
    let mut writer = io.writer().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&flood));
    std::thread::sleep(Duration::from_millis(300));
    let mut seen = vec![false; N as usize];
    for _ in 0..N {
        match io.recv_pdu().unwrap().header {
            PduHeader::CapsuleResp(cqe) => {
                assert!(cqe.status.is_success(), "{:?}", cqe.status);
                assert!(!std::mem::replace(&mut seen[cqe.cid as usize], true));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    sender.join().unwrap().unwrap();
    assert!(seen.iter().all(|&s| s));
}

/// PDO beyond the header (pad bytes before the data, NVMe/TCP 1.0 §3.6.1) is honoured for
/// in-capsule and H2CData data alike.
#[test]
fn host_padding_before_data_is_skipped() {
    let t = start(default_params());
    let (_admin, cntlid) = admin(&t, ClientOptions::default());
    for d in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut io = io_queue(&t, digest_options(d.header, d.data), cntlid, 1, 15);
        let data = pattern(4096, 31);
        let mut w = Client::write_sqe(RAM_NSID, 300, 8, false);
        w.flags = 0x40;
        w.cid = 5;
        w.dptr = SglDescriptor::in_capsule(0, 4096);
        // Data aligned to 64 bytes: PDO 128 (with or without the header digest).
        let pdu = encode_pdu(&PduHeader::CapsuleCmd(w), &data, d, 64);
        assert_eq!(pdu[3], 128);
        io.send_raw(&pdu).unwrap();
        match io.recv_pdu().unwrap().header {
            PduHeader::CapsuleResp(cqe) => assert!(cqe.status.is_success(), "{:?}", cqe.status),
            other => panic!("expected a response, got {other:?}"),
        }
        assert_eq!(io.read(RAM_NSID, 300, 8, BLOCK).unwrap(), data);

        let data = pattern(4096, 32);
        w.cid = 6;
        w.dptr = SglDescriptor::transport_data_block(4096);
        io.send_raw(&io.encode(&PduHeader::CapsuleCmd(w), &[]))
            .unwrap();
        let r2t = match io.recv_pdu().unwrap().header {
            PduHeader::R2T(r) => r,
            other => panic!("expected R2T, got {other:?}"),
        };
        let h2c = PduHeader::H2CData {
            hdr: DataHeader {
                cccid: 6,
                ttag: r2t.ttag,
                datao: 0,
                datal: 4096,
            },
            last: true,
        };
        io.send_raw(&encode_pdu(&h2c, &data, d, 64)).unwrap();
        match io.recv_pdu().unwrap().header {
            PduHeader::CapsuleResp(cqe) => assert!(cqe.status.is_success(), "{:?}", cqe.status),
            other => panic!("expected a response, got {other:?}"),
        }
        assert_eq!(io.read(RAM_NSID, 300, 8, BLOCK).unwrap(), data);
    }
}

/// Rough throughput over loopback (client and target each on one thread). Not a benchmark
/// of the daemon; run with `cargo test --release -p transport --test tcp_target -- --ignored
/// --nocapture throughput`.
#[test]
#[ignore]
fn throughput_smoke() {
    let (_t, _admin, mut io) = io_setup(
        TcpParams {
            max_h2c_data: 1 << 20,
            in_capsule_data_size: 8192,
            max_data_transfer: 1 << 20,
        },
        ClientOptions::default(),
        63,
    );
    for (name, len, write, qd) in [
        ("4K read QD32", 4096u32, false, 32),
        ("4K write QD32", 4096, true, 32),
        ("128K read QD8", 131072, false, 8),
        ("128K write QD8", 131072, true, 8),
    ] {
        let nlb = len / BLOCK;
        let span = (64 << 20) / len as u64;
        let payload = pattern(len as usize, 1);
        let start = std::time::Instant::now();
        let mut done = 0u64;
        let mut outstanding = 0;
        let mut i = 0u64;
        while start.elapsed() < Duration::from_secs(2) {
            while outstanding < qd {
                let slba = (i * 7919 % span) * nlb as u64;
                i += 1;
                let (sqe, out) = if write {
                    (
                        Client::write_sqe(RAM_NSID, slba, nlb, false),
                        DataOut::Write(payload.clone()),
                    )
                } else {
                    (Client::read_sqe(RAM_NSID, slba, nlb), DataOut::Read(len))
                };
                io.submit(sqe, out).unwrap();
                outstanding += 1;
            }
            assert!(io.reap().unwrap().cqe.status.is_success());
            outstanding -= 1;
            done += 1;
        }
        while outstanding > 0 {
            io.reap().unwrap();
            outstanding -= 1;
        }
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{name}: {:.0} IOPS, {:.0} MB/s",
            done as f64 / secs,
            done as f64 * len as f64 / secs / 1e6
        );
    }
}

/// With SQ flow control disabled at Connect (CATTR bit 2, as the Linux discovery connect
/// does), reads complete by the C2HData SUCCESS flag alone and SQHD is 0xFFFF.
#[test]
fn success_flag_when_flow_control_is_disabled() {
    use nvme::wire::fabrics::{ConnectCommand, ConnectData};
    let t = start(default_params());
    for (cattr, digests) in [
        (4u8, digest_options(false, false)),
        (4, digest_options(true, true)),
        (0, digest_options(false, false)),
    ] {
        let mut c = Client::connect(t.addr, digests).unwrap();
        let done = c
            .fabrics_connect_raw(
                ConnectCommand {
                    recfmt: 0,
                    qid: 0,
                    sqsize: 31,
                    cattr,
                    kato: 30_000,
                },
                &ConnectData {
                    hostid: HOSTID,
                    cntlid: 0xffff,
                    subnqn: SUBNQN.into(),
                    hostnqn: HOSTNQN.into(),
                },
            )
            .unwrap();
        assert!(done.cqe.status.is_success(), "{:?}", done.cqe.status);
        assert_eq!(done.cqe.sqhd == 0xffff, cattr != 0);
        c.enable_controller(Duration::from_secs(5)).unwrap();
        let cid = c
            .submit(
                Sqe {
                    opcode: admin_opcode::IDENTIFY,
                    cdw10: cns::CONTROLLER as u32,
                    ..Sqe::default()
                },
                DataOut::Read(4096),
            )
            .unwrap();
        let idc = c.wait(cid).unwrap();
        assert_eq!(idc.by_success_flag, cattr != 0);
        assert_eq!(&idc.data[768..768 + SUBNQN.len()], SUBNQN.as_bytes());
        // Nothing else is pending: no stray CapsuleResp follows a SUCCESS C2HData.
        c.keep_alive().unwrap();
        assert_eq!(c.outstanding(), 0);
    }
}

/// Back-pressure resumes as soon as a slot frees — from the completion or send that freed
/// it — not at the next periodic tick (here 10 s, so relying on it would time out).
#[test]
fn back_pressure_resumes_without_waiting_for_a_tick() {
    let t = start_with_tick(default_params(), Duration::from_secs(10));
    let (_admin, cntlid) = admin(&t, ClientOptions::default());
    let mut io = io_queue(&t, ClientOptions::default(), cntlid, 1, 3);
    let begin = std::time::Instant::now();
    for nsid in [RAM_NSID, FILE_NSID] {
        for _ in 0..3 {
            for i in 0..48u64 {
                io.submit(Client::read_sqe(nsid, i * 8, 8), DataOut::Read(4096))
                    .unwrap();
            }
            for _ in 0..48 {
                assert!(io.reap().unwrap().cqe.status.is_success());
            }
        }
    }
    assert!(
        begin.elapsed() < Duration::from_secs(5),
        "{:?}",
        begin.elapsed()
    );
}
