use super::*;
use nvme::spec::nvm_opcode;
use nvme::wire::{Cqe, SglType, Sqe, Status};
use transport::tcp::pdu::{encode_pdu, RecvLimits, Role, TermReq};
use transport::tcp::recv::DataSink;

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn queue(digests: Digests, bs: u32, qd: u32, in_capsule: u32, maxh2cdata: u32) -> NvmeQueue {
    let mut rx = Receiver::new(
        Role::Host,
        RecvLimits {
            max_capsule_data: 0,
            max_data_pdu: bs.max(4096),
        },
    );
    rx.establish(digests, 4);
    let link = Link {
        rx,
        digests,
        cpda: 4,
        maxh2cdata,
    };
    let params = QueueParams {
        nsid: 1,
        bs,
        nlb: bs / 512,
        qd,
        in_capsule_limit: in_capsule,
    };
    NvmeQueue::from_link(link, params, crate::run::payload(bs))
}

struct Collect(Vec<u8>);

impl DataSink for Collect {
    fn write(&mut self, _offset: u32, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

/// What a controller would make of the queued bytes: (header, data, data digest ok).
fn controller_view(
    q: &mut SendQueue,
    digests: Digests,
    bs: u32,
) -> Vec<(PduHeader, Vec<u8>, bool)> {
    let mut bytes = Vec::new();
    assert!(q.flush(&mut bytes, &crate::run::payload(bs)).unwrap());
    let mut rx = Receiver::new(
        Role::Controller,
        RecvLimits {
            max_capsule_data: 1 << 20,
            max_data_pdu: 1 << 20,
        },
    );
    rx.establish(digests, 4);
    let mut out = Vec::new();
    let mut pending: Option<PduHeader> = None;
    let mut data = Collect(Vec::new());
    let mut pos = 0;
    while pos < bytes.len() {
        let (used, ev) = rx.feed(&bytes[pos..], &mut data).unwrap();
        pos += used;
        match ev {
            Some(Event::Pdu {
                header,
                data_len: 0,
            }) => out.push((header, Vec::new(), true)),
            Some(Event::Pdu { header, .. }) => pending = Some(header),
            Some(Event::DataComplete { digest_ok }) => out.push((
                pending.take().unwrap(),
                std::mem::take(&mut data.0),
                digest_ok,
            )),
            None => {}
        }
    }
    out
}

fn c2h(cid: u16, len: u32, success: bool, digests: Digests) -> Vec<u8> {
    let h = PduHeader::C2HData {
        hdr: DataHeader {
            cccid: cid,
            ttag: 0,
            datao: 0,
            datal: len,
        },
        last: true,
        success,
    };
    encode_pdu(&h, &vec![0xa5; len as usize], digests, 4)
}

fn resp(cid: u16, status: Status, digests: Digests) -> Vec<u8> {
    let cqe = Cqe {
        cid,
        status,
        ..Cqe::default()
    };
    encode_pdu(&PduHeader::CapsuleResp(cqe), &[], digests, 4)
}

fn sqe_of(pdu: &(PduHeader, Vec<u8>, bool)) -> Sqe {
    match pdu.0 {
        PduHeader::CapsuleCmd(sqe) => sqe,
        ref other => panic!("expected a capsule, got {other:?}"),
    }
}

#[test]
fn read_capsule_then_c2hdata_and_response_split_anywhere() {
    let mut stream = c2h(0, 4096, false, BOTH);
    stream.extend(resp(0, Status::SUCCESS, BOTH));
    for split in 0..=stream.len() {
        let mut q = queue(BOTH, 4096, 4, 8192, 65536);
        let mut out = SendQueue::with_capacity(4);
        q.submit(
            IoRequest {
                read: true,
                slba: 0x1_0000_0010,
            },
            Instant::now(),
            &mut out,
        );
        if split == 0 {
            let pdus = controller_view(&mut out, BOTH, 4096);
            assert_eq!(pdus.len(), 1);
            let sqe = sqe_of(&pdus[0]);
            assert_eq!((sqe.opcode, sqe.cid, sqe.nsid), (nvm_opcode::READ, 0, 1));
            assert_eq!((sqe.cdw10, sqe.cdw11, sqe.cdw12), (0x10, 1, 7));
            assert_eq!(sqe.psdt(), 1);
            assert_eq!(sqe.dptr, SglDescriptor::transport_data_block(4096));
            assert!(pdus[0].1.is_empty());
        }
        let mut done = Vec::new();
        q.on_bytes(&stream[..split], &mut out, &mut done).unwrap();
        q.on_bytes(&stream[split..], &mut out, &mut done).unwrap();
        assert_eq!(done.len(), 1, "split at {split}");
        assert!(done[0].read && done[0].ok);
        assert_eq!(q.outstanding(), 0);
    }
}

#[test]
fn success_flag_completes_without_a_response() {
    let mut q = queue(Digests::default(), 4096, 2, 8192, 65536);
    let mut out = SendQueue::with_capacity(2);
    let t = Instant::now();
    q.submit(
        IoRequest {
            read: true,
            slba: 0,
        },
        t,
        &mut out,
    );
    q.submit(
        IoRequest {
            read: true,
            slba: 8,
        },
        t,
        &mut out,
    );
    assert!(!q.can_submit(), "queue depth 2 reached");
    let mut done = Vec::new();
    q.on_bytes(&c2h(1, 4096, true, Digests::default()), &mut out, &mut done)
        .unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(q.outstanding(), 1);
    assert!(q.can_submit());
}

#[test]
fn in_capsule_write_carries_the_payload() {
    let mut q = queue(BOTH, 4096, 2, 8192, 65536);
    let mut out = SendQueue::with_capacity(2);
    q.submit(
        IoRequest {
            read: false,
            slba: 24,
        },
        Instant::now(),
        &mut out,
    );
    let pdus = controller_view(&mut out, BOTH, 4096);
    assert_eq!(pdus.len(), 1);
    let sqe = sqe_of(&pdus[0]);
    assert_eq!(sqe.opcode, nvm_opcode::WRITE);
    assert_eq!(sqe.dptr.sgl_type, SglType::DataBlockOffset);
    assert_eq!(sqe.dptr.length, 4096);
    assert!(pdus[0].1 == crate::run::payload(4096)[..]);
    assert!(pdus[0].2, "data digest");
    let mut done = Vec::new();
    q.on_bytes(&resp(0, Status::SUCCESS, BOTH), &mut out, &mut done)
        .unwrap();
    assert!(!done[0].read && done[0].ok);
}

#[test]
fn large_write_answers_r2t_in_maxh2cdata_chunks() {
    let bs = 32768;
    let mut q = queue(BOTH, bs, 2, 8192, 8192);
    let mut out = SendQueue::with_capacity(2);
    q.submit(
        IoRequest {
            read: false,
            slba: 0,
        },
        Instant::now(),
        &mut out,
    );
    let pdus = controller_view(&mut out, BOTH, bs);
    let sqe = sqe_of(&pdus[0]);
    assert_eq!(sqe.dptr, SglDescriptor::transport_data_block(bs));
    assert!(pdus[0].1.is_empty(), "no in-capsule data beyond IOCCSZ");
    let r2t = PduHeader::R2T(R2t {
        cccid: 0,
        ttag: 9,
        r2to: 0,
        r2tl: bs,
    });
    let mut done = Vec::new();
    q.on_bytes(&encode_pdu(&r2t, &[], BOTH, 4), &mut out, &mut done)
        .unwrap();
    let h2c = controller_view(&mut out, BOTH, bs);
    assert_eq!(h2c.len(), 4);
    let mut all = Vec::new();
    for (i, (h, data, digest_ok)) in h2c.iter().enumerate() {
        match *h {
            PduHeader::H2CData { hdr, last } => {
                assert_eq!((hdr.cccid, hdr.ttag), (0, 9));
                assert_eq!((hdr.datao, hdr.datal), (i as u32 * 8192, 8192));
                assert_eq!(last, i == 3);
            }
            ref other => panic!("{other:?}"),
        }
        assert!(digest_ok);
        all.extend_from_slice(data);
    }
    assert!(all == crate::run::payload(bs)[..]);
    q.on_bytes(&resp(0, Status::SUCCESS, BOTH), &mut out, &mut done)
        .unwrap();
    assert_eq!(done.len(), 1);
}

#[test]
fn failures_are_counted_or_fatal() {
    let d = Digests::default();
    let mut q = queue(d, 4096, 4, 8192, 65536);
    let mut out = SendQueue::with_capacity(4);
    let t = Instant::now();
    q.submit(
        IoRequest {
            read: true,
            slba: 0,
        },
        t,
        &mut out,
    );
    q.submit(
        IoRequest {
            read: false,
            slba: 0,
        },
        t,
        &mut out,
    );
    let mut done = Vec::new();
    q.on_bytes(&resp(1, Status::INTERNAL_ERROR, d), &mut out, &mut done)
        .unwrap();
    assert!(!done[0].ok, "error status");
    assert!(matches!(
        q.on_bytes(&resp(3, Status::SUCCESS, d), &mut out, &mut done),
        Err(EngineError::UnknownCid(3))
    ));

    // A data digest mismatch fails the command, not the connection.
    let mut q = queue(BOTH, 4096, 4, 8192, 65536);
    q.submit(
        IoRequest {
            read: true,
            slba: 0,
        },
        t,
        &mut out,
    );
    let mut bad = c2h(0, 4096, false, BOTH);
    let n = bad.len();
    bad[n - 1] ^= 0xff;
    bad.extend(resp(0, Status::SUCCESS, BOTH));
    let mut done = Vec::new();
    q.on_bytes(&bad, &mut out, &mut done).unwrap();
    assert_eq!(done.len(), 1);
    assert!(!done[0].ok);

    // An R2T beyond the command's data and a termination request end the connection.
    let mut q = queue(d, 4096, 4, 0, 65536);
    q.submit(
        IoRequest {
            read: false,
            slba: 0,
        },
        t,
        &mut out,
    );
    let r2t = PduHeader::R2T(R2t {
        cccid: 0,
        ttag: 1,
        r2to: 4000,
        r2tl: 200,
    });
    assert!(matches!(
        q.on_bytes(&encode_pdu(&r2t, &[], d, 4), &mut out, &mut done),
        Err(EngineError::OutOfRange { what: "R2T", .. })
    ));
    let mut q = queue(d, 4096, 4, 0, 65536);
    let term = TermReq::new(transport::tcp::pdu::Fes::PduSequenceError, 0, &[1, 2, 3]);
    let bytes = term.encode(transport::tcp::pdu::PduType::C2HTermReq);
    assert!(matches!(
        q.on_bytes(&bytes, &mut out, &mut done),
        Err(EngineError::Terminated { fes: 2, .. })
    ));
}
