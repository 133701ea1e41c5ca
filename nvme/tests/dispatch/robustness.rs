//! Random commands from a hostile or broken host: no panic, exactly one completion per
//! command (or a held AER), and the controller keeps serving well-formed commands.

use nvme::spec::admin_opcode as adm;
use nvme::spec::{nvm_opcode, DISCOVERY_NQN, FABRICS_OPCODE};
use std::time::Instant;

use nvme::queue::{Direction, Outcome, TransportKind};
use nvme::wire::{Sqe, Status};

use crate::harness::*;

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// True with probability 1/n.
    fn one_in(&mut self, n: u64) -> bool {
        self.next() % n < 1
    }
    fn u32(&mut self) -> u32 {
        // Bias towards small values, where the interesting boundaries are.
        match self.next() % 4 {
            0 => 0,
            1 => (self.next() % 16) as u32,
            2 => u32::MAX - (self.next() % 4) as u32,
            _ => self.next() as u32,
        }
    }
}

fn random_sqe(rng: &mut Rng, opcodes: &[u8]) -> Sqe {
    let opcode = if rng.one_in(8) {
        rng.next() as u8
    } else {
        opcodes[(rng.next() % opcodes.len() as u64) as usize]
    };
    Sqe {
        opcode,
        flags: if rng.one_in(16) {
            rng.next() as u8
        } else {
            0x40
        },
        cid: 0,
        nsid: if rng.one_in(2) { 1 } else { rng.u32() },
        cdw10: rng.u32(),
        cdw11: rng.u32(),
        cdw12: rng.u32(),
        cdw13: rng.u32(),
        cdw14: rng.u32(),
        cdw15: rng.u32(),
        ..Sqe::default()
    }
}

/// Drives `n` random commands; returns how many completed successfully.
fn hammer(h: &mut Host, rng: &mut Rng, opcodes: &[u8], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let mut s = random_sqe(rng, opcodes);
        s.cid = i as u16;
        let len = match rng.next() % 4 {
            0 => 0,
            1 => 512 * (1 + rng.next() % 8) as u32,
            2 => 4096,
            _ => (rng.next() % 8192) as u32,
        };
        let mut data = vec![0u8; len as usize];
        let resp = match h.q.prepare(&s, len) {
            Err(status) => {
                assert!(!status.is_success());
                h.q.reject(&s, status)
            }
            Ok(dir) => {
                if dir == Direction::None {
                    data.clear();
                }
                match h.execute_now(&s, &mut data, i as u64) {
                    Some(r) => r,
                    None => continue,
                }
            }
        };
        assert_eq!(resp.cqe.cid, s.cid);
        assert!(resp.data_len as usize <= data.len());
        if resp.cqe.status.is_success() {
            ok += 1;
        }
        let _ = h.q.poll(Instant::now());
    }
    ok
}

#[test]
fn random_admin_io_and_discovery_commands_never_panic() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut a, cntlid) = admin(&t, SUBNQN, 0);
    let mut q = io_queue(&t, cntlid, 1);
    let (mut d, _) = admin(&t, DISCOVERY_NQN, 0);
    let admin_ops = [
        adm::GET_LOG_PAGE,
        adm::IDENTIFY,
        adm::ABORT,
        adm::SET_FEATURES,
        adm::GET_FEATURES,
        adm::ASYNC_EVENT_REQUEST,
        adm::KEEP_ALIVE,
        FABRICS_OPCODE,
    ];
    let io_ops = [
        nvm_opcode::FLUSH,
        nvm_opcode::WRITE,
        nvm_opcode::READ,
        nvm_opcode::COMPARE,
        nvm_opcode::WRITE_ZEROES,
        nvm_opcode::DATASET_MANAGEMENT,
        FABRICS_OPCODE,
    ];
    // Never send Property Set from the random stream to the admin queue: a random CC write
    // disables the controller, which is legal but stops everything else.
    let admin_ops_no_cc: Vec<u8> = admin_ops
        .iter()
        .copied()
        .filter(|&o| o != FABRICS_OPCODE)
        .collect();
    assert!(hammer(&mut a, &mut rng, &admin_ops_no_cc, 3000) > 0);
    assert!(hammer(&mut q, &mut rng, &io_ops, 3000) > 0);
    assert!(hammer(&mut d, &mut rng, &admin_ops_no_cc, 2000) > 0);
    // Still healthy.
    let mut page = vec![0u8; 4096];
    assert_eq!(a.status(identify(1, 0, 0), &mut page), Status::SUCCESS);
    let mut buf = vec![7u8; 512];
    assert_eq!(
        q.status(rw(nvm_opcode::WRITE, 1, 0, 1), &mut buf),
        Status::SUCCESS
    );
}

#[test]
fn random_connect_data_never_panics() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let mut rng = Rng(42);
    for i in 0..2000 {
        let mut h = Host::new(&t, peer(TransportKind::Tcp, 1));
        let mut data = connect_data(SUBNQN, HOSTNQN, 0xffff).encode().to_vec();
        // Flip a few random bytes, or truncate.
        for _ in 0..(rng.next() % 6) {
            let pos = (rng.next() % 1024) as usize;
            data[pos] = rng.next() as u8;
        }
        if i % 7 == 0 {
            data.truncate((rng.next() % 1024) as usize);
        }
        let s = nvme::wire::fabrics::ConnectCommand {
            recfmt: (rng.one_in(3)) as u16,
            qid: (rng.next() % 4) as u16,
            sqsize: rng.next() as u16,
            cattr: rng.next() as u8,
            kato: rng.u32(),
        }
        .to_sqe(1);
        let r = match h.q.prepare(&s, data.len() as u32) {
            Err(st) => h.q.reject(&s, st),
            Ok(_) => match h.q.execute(&s, &mut data, 0, &mut h.io) {
                Outcome::Complete(r) => r,
                other => panic!("Connect must complete inline, got {other:?}"),
            },
        };
        assert_eq!(r.cqe.cid, 1);
    }
}
