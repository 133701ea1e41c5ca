//! Writes the seed corpora (`fuzz/corpus/<target>/seed-*`): valid sessions in each target's
//! input format, so the fuzzer starts from connected queues and well-formed PDUs instead of
//! having to discover CRCs and NQNs. Run from the repository root:
//! `cargo run --manifest-path fuzz/Cargo.toml --bin gen-corpus`.

use std::fs;
use std::path::Path;

use nvme::wire::fabrics::ConnectData;
use nvme::wire::{Cqe, SglDescriptor, Sqe, Status};
use nvmfd_fuzz::{connect_data, connect_sqe, enable_sqe, SUBNQN};
use transport::tcp::pdu::{
    encode_pdu, DataHeader, Digests, Fes, IcReq, IcResp, PduHeader, PduType, R2t, TermReq,
};

fn sqe(
    opcode: u8,
    cid: u16,
    nsid: u32,
    dptr: SglDescriptor,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
) -> Sqe {
    Sqe {
        opcode,
        flags: nvme::spec::sqe_flags::PSDT_SGL,
        cid,
        nsid,
        dptr,
        cdw10,
        cdw11,
        cdw12,
        ..Sqe::default()
    }
}

fn tdb(len: u32) -> SglDescriptor {
    SglDescriptor::transport_data_block(len)
}

/// Admin commands a Linux host sends after Connect.
fn admin_commands() -> Vec<Sqe> {
    vec![
        sqe(0x06, 10, 0, tdb(4096), 1, 0, 0), // Identify Controller
        sqe(0x06, 11, 0, tdb(4096), 2, 0, 0), // Active NSID list
        sqe(0x06, 12, 1, tdb(4096), 0, 0, 0), // Identify Namespace 1
        sqe(0x06, 13, 2, tdb(4096), 3, 0, 0), // NS identification descriptors
        sqe(0x02, 14, 0xffff_ffff, tdb(512), 0x007f_0002, 0, 0), // SMART log
        sqe(0x02, 15, 0, tdb(64), 0x000f_0001, 0, 0), // Error log
        sqe(0x09, 16, 0, tdb(0), 0x07, 0x0003_0003, 0), // Set Features: number of queues
        sqe(0x0a, 17, 0, tdb(0), 0x07, 0, 0), // Get Features
        sqe(0x0c, 18, 0, tdb(0), 0, 0, 0),    // AER
        sqe(0x18, 19, 0, tdb(0), 0, 0, 0),    // Keep Alive
        sqe(0x08, 20, 0, tdb(0), 18 << 16, 0, 0), // Abort the AER
    ]
}

// --- tcp_recv: [cfg][limits][seed u32][stream] ---------------------------------------------

fn recv_seed(cfg: u8, seed: u32, stream: &[u8]) -> Vec<u8> {
    let mut out = vec![cfg, 0x0f];
    out.extend_from_slice(&seed.to_le_bytes());
    out.extend_from_slice(stream);
    out
}

fn host_stream(d: Digests, pda: usize) -> Vec<u8> {
    let mut s = IcReq {
        pfv: 0,
        hpda: 0,
        dgst: d.to_dgst(),
        maxr2t: 0,
    }
    .encode()
    .to_vec();
    let c = connect_sqe(1, 0, 31, 0, 120_000, true);
    s.extend(encode_pdu(
        &PduHeader::CapsuleCmd(c),
        &connect_data(SUBNQN, None),
        d,
        pda,
    ));
    s.extend(encode_pdu(
        &PduHeader::CapsuleCmd(enable_sqe(2)),
        &[],
        d,
        pda,
    ));
    let w = sqe(0x01, 3, 1, tdb(8192), 0, 0, 15);
    s.extend(encode_pdu(&PduHeader::CapsuleCmd(w), &[], d, pda));
    for (i, last) in [(0u32, false), (4096, true)] {
        let hdr = DataHeader {
            cccid: 3,
            ttag: 0,
            datao: i,
            datal: 4096,
        };
        s.extend(encode_pdu(
            &PduHeader::H2CData { hdr, last },
            &[0x5a; 4096],
            d,
            pda,
        ));
    }
    s.extend(TermReq::new(Fes::PduSequenceError, 0, &[4, 0, 72, 0]).encode(PduType::H2CTermReq));
    s
}

fn controller_stream(d: Digests, pda: usize) -> Vec<u8> {
    let mut s = IcResp {
        pfv: 0,
        cpda: 0,
        dgst: d.to_dgst(),
        maxh2cdata: 8192,
    }
    .encode()
    .to_vec();
    let cqe = Cqe {
        dw0: 1,
        dw1: 0,
        sqhd: 1,
        sqid: 0,
        cid: 1,
        status: Status::SUCCESS,
    };
    s.extend(encode_pdu(&PduHeader::CapsuleResp(cqe), &[], d, pda));
    let r2t = R2t {
        cccid: 3,
        ttag: 0,
        r2to: 0,
        r2tl: 8192,
    };
    s.extend(encode_pdu(&PduHeader::R2T(r2t), &[], d, pda));
    let hdr = DataHeader {
        cccid: 4,
        ttag: 0,
        datao: 0,
        datal: 512,
    };
    s.extend(encode_pdu(
        &PduHeader::C2HData {
            hdr,
            last: true,
            success: true,
        },
        &[0xa5; 512],
        d,
        pda,
    ));
    s.extend(TermReq::new(Fes::HeaderDigestError, 0, &[5; 24]).encode(PduType::C2HTermReq));
    s
}

// --- tcp_conn: [cfg][op…] (op codes as in fuzz_targets/tcp_conn.rs) -------------------------

struct ConnOps(Vec<u8>);

impl ConnOps {
    fn new(cfg: u8) -> Self {
        Self(vec![cfg])
    }
    fn connect(&mut self, conn: u8, sel: u8, sqsize: u8) -> &mut Self {
        self.0.extend([40 | conn << 7, sel, sqsize, 0, 30]);
        self
    }
    fn enable(&mut self, conn: u8) -> &mut Self {
        self.0.push(50 | conn << 7);
        self
    }
    fn capsule(&mut self, conn: u8, sqe: &Sqe, data: &[u8]) -> &mut Self {
        self.0.push(10 | conn << 7);
        self.0.extend(sqe.encode());
        self.0.extend((data.len() as u16).to_le_bytes());
        self.0.extend(&data[..data.len().min(512)]);
        self
    }
    fn r2t_command(&mut self, conn: u8, sqe: &Sqe, len: u16) -> &mut Self {
        self.0.push(55 | conn << 7);
        self.0.extend(sqe.encode());
        self.0.extend(len.to_le_bytes());
        self
    }
    fn answer(&mut self, conn: u8, split: bool, data: &[u8]) -> &mut Self {
        self.0.extend([75 | conn << 7, split as u8]);
        self.0.extend((data.len() as u16).to_le_bytes());
        self.0.extend(data);
        self
    }
    fn tick(&mut self, conn: u8, halfsecs: u8) -> &mut Self {
        self.0.extend([110 | conn << 7, halfsecs]);
        self
    }
}

// --- queue: [op…] (op codes as in fuzz_targets/queue.rs) ------------------------------------

struct QueueOps(Vec<u8>);

impl QueueOps {
    fn connect(&mut self, q: u8, sel: u8, cid: u16) -> &mut Self {
        self.0.extend([q << 7, sel, 31, 0, 30, 0, 0]);
        self.0.extend(cid.to_le_bytes());
        self
    }
    fn enable(&mut self, q: u8) -> &mut Self {
        self.0.extend([12 | q << 7, 1, 0]);
        self
    }
    fn raw(&mut self, q: u8, sqe: &Sqe, data: &[u8]) -> &mut Self {
        self.0.extend([20 | q << 7, 0]);
        self.0.extend(sqe.encode());
        self.0.extend((data.len() as u16).to_le_bytes());
        self.0.extend(data);
        self
    }
    #[allow(clippy::too_many_arguments)]
    fn io(
        &mut self,
        q: u8,
        opcode_idx: u8,
        nsid: u8,
        slba: u16,
        nlb: u8,
        mismatch: u8,
        data: &[u8],
    ) -> &mut Self {
        self.0.extend([60 | q << 7, opcode_idx, nsid]);
        self.0.extend(slba.to_le_bytes());
        self.0.extend([0, nlb, mismatch, 7, 0, 0x02, 0]);
        self.0.extend((data.len() as u16).to_le_bytes());
        self.0.extend(data);
        self
    }
    fn tick(&mut self, q: u8, tenths: u16) -> &mut Self {
        self.0.push(110 | q << 7);
        self.0.extend(tenths.to_le_bytes());
        self
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).expect("corpus directory");
    fs::write(dir.join(name), bytes).expect("write seed");
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");

    let recv = root.join("tcp_recv");
    for (i, (cfg, d)) in [
        (0x00, Digests::default()),
        (
            0x06,
            Digests {
                header: true,
                data: true,
            },
        ),
        (
            0x02,
            Digests {
                header: true,
                data: false,
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        write(
            &recv,
            &format!("seed-host-{i}"),
            &recv_seed(cfg, 0x1234_5678 + i as u32, &host_stream(d, 4)),
        );
        write(
            &recv,
            &format!("seed-ctrl-{i}"),
            &recv_seed(
                cfg | 1 | 0x20,
                0x9e37_79b9 + i as u32,
                &controller_stream(d, 64),
            ),
        );
    }

    let conn = root.join("tcp_conn");
    let identify = sqe(0x06, 10, 0, tdb(4096), 1, 0, 0);
    for (i, cfg) in [0x20u8, 0x23, 0x2c].into_iter().enumerate() {
        let mut s = ConnOps::new(cfg);
        s.connect(0, 0x00, 31).enable(0);
        for c in admin_commands() {
            s.capsule(0, &c, &[]);
        }
        s.connect(1, 0x01, 31)
            .r2t_command(1, &sqe(0x01, 30, 1, tdb(0), 0, 0, 15), 8192)
            .answer(1, i == 1, b"nvmfd-fuzz-write")
            .capsule(1, &sqe(0x02, 31, 1, tdb(8192), 0, 0, 15), &[])
            .r2t_command(1, &sqe(0x01, 32, 2, tdb(0), 1, 0, 0), 4096)
            .answer(1, false, b"file")
            .capsule(1, &sqe(0x02, 33, 2, tdb(4096), 1, 0, 0), &[])
            .capsule(
                1,
                &sqe(0x01, 34, 1, SglDescriptor::in_capsule(0, 1024), 8, 0, 1),
                &[0x77; 1024],
            )
            .capsule(1, &sqe(0x00, 35, 1, tdb(0), 0, 0, 0), &[])
            .tick(0, 4);
        write(&conn, &format!("seed-session-{i}"), &s.0);
    }
    let mut s = ConnOps::new(0x00);
    s.connect(0, 0x10 | 0x40, 31)
        .enable(0)
        .capsule(0, &identify, &[])
        .capsule(0, &sqe(0x02, 11, 0, tdb(4096), 0x00ff_0070, 0, 0), &[]);
    write(&conn, "seed-discovery", &s.0);

    let queue = root.join("queue");
    let mut q = QueueOps(Vec::new());
    q.connect(0, 0x00, 1).enable(0);
    for c in admin_commands() {
        q.raw(0, &c, &[]);
    }
    q.connect(1, 0x01, 2);
    // (opcode index, nsid, mismatch): mismatch 1 = data length from NLB, 0 = no data (or
    // mismatch << 4 bytes), 4 = in-capsule.
    for (op, nsid, mismatch) in [
        (1u8, 1u8, 1u8),
        (2, 1, 1),
        (3, 1, 1),
        (1, 2, 1),
        (2, 2, 1),
        (4, 1, 0),
        (0, 2, 0),
        (1, 3, 1),
        (2, 4, 1),
    ] {
        q.io(1, op, nsid, 8, 3, mismatch, b"queue-fuzz-data");
    }
    q.io(
        1,
        5,
        1,
        0,
        0,
        4,
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0],
    );
    q.tick(0, 30).tick(1, 1300);
    write(&queue, "seed-session", &q.0);
    // Reservations on namespace 1: register, acquire Write Exclusive, report (EDS), preempt
    // (its own key), clear; then the notification log page (80h) and mask feature (82h).
    let keys = |a: u64, b: u64| [a.to_le_bytes(), b.to_le_bytes()].concat();
    let cap = |len: u32| SglDescriptor::in_capsule(0, len);
    let mut q = QueueOps(Vec::new());
    q.connect(0, 0x00, 1).enable(0).connect(1, 0x01, 2);
    q.raw(1, &sqe(0x0d, 40, 1, cap(16), 0, 0, 0), &keys(0, 0x11))
        .raw(1, &sqe(0x11, 41, 1, cap(16), 1 << 8, 0, 0), &keys(0x11, 0))
        .raw(1, &sqe(0x0e, 42, 1, tdb(4096), 1023, 1, 0), &[])
        .raw(1, &sqe(0x11, 43, 1, cap(16), 1 | 2 << 8, 0, 0), &keys(0x11, 0x11))
        .raw(1, &sqe(0x15, 44, 1, cap(8), 1, 0, 0), &keys(0x11, 0)[..8])
        .raw(0, &sqe(0x02, 21, 0, tdb(64), 0x000f_0080, 0, 0), &[])
        .raw(0, &sqe(0x09, 22, 0xffff_ffff, tdb(0), 0x82, 0b1110, 0), &[])
        .raw(0, &sqe(0x0a, 23, 1, tdb(0), 0x82, 0, 0), &[]);
    write(&queue, "seed-reservations", &q.0);
    let mut q = QueueOps(Vec::new());
    q.connect(0, 0x40, 1).enable(0);
    q.raw(0, &identify, &[])
        .raw(0, &sqe(0x02, 11, 0, tdb(4096), 0x00ff_0070, 0, 0), &[]);
    write(&queue, "seed-discovery", &q.0);
    // The keyed subsystem (connect selector 1): a command before authentication, then
    // AUTH_Negotiate and the Receive of the Challenge.
    let auth = |fct: u8, cid: u16, len: u32| {
        let [secp, spsp0, spsp1] = [
            nvmfd_auth::wire::SECP_AUTH,
            nvmfd_auth::wire::SPSP0_AUTH,
            nvmfd_auth::wire::SPSP1_AUTH,
        ];
        let cdw10 = u32::from_le_bytes([0, spsp0, spsp1, secp]);
        sqe(0x7f, cid, u32::from(fct), tdb(len), cdw10, len, 0)
    };
    let negotiate = nvmfd_auth::host::Host::new(
        nvmfd_auth::Secret::new(None, vec![0x33; 32]).expect("secret"),
        None,
        nvmfd_fuzz::HOSTNQN,
        nvmfd_fuzz::AUTH_SUBNQN,
    )
    .negotiate(1);
    let mut q = QueueOps(Vec::new());
    q.connect(0, 0x20, 1).enable(0);
    q.raw(0, &identify, &[])
        .raw(0, &auth(0x05, 12, negotiate.len() as u32), &negotiate)
        .raw(0, &auth(0x06, 13, 4096), &[]);
    write(&queue, "seed-auth", &q.0);

    let _ = ConnectData::SIZE;
}
