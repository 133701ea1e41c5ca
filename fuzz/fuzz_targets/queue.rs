//! The sans-IO dispatch core (`nvme::queue::Queue`) driven the way a transport drives it:
//! `prepare` → `execute` (→ `finish` for ops through `IoSubmit`) / `reject`, plus `poll`,
//! on an admin and an I/O queue of one controller, against RAM, file and read-only
//! namespaces. Backend ops run synchronously (`SyncEngine`: pread/pwrite on a memfd).
//!
//! Input: a sequence of ops: Connect / CC.EN helpers (to reach connected, enabled queues),
//! raw SQEs with host data, NVM I/O commands built from a few fields (opcode, nsid, LBA
//! range, data length that may disagree with it; Copy with host-chosen source ranges and
//! format, Verify), Abort of any queue and CID (the I/O queue answers "not aborted" from its
//! poll, as a transport does for a command it does not hold waiting), `poll` with the clock
//! advanced, and dropping a queue.
//!
//! Oracles (dispatch contract): no panic or sanitizer report; `prepare` never admits more data than
//! MDTS; every response carries the command's CID, its queue's SQID and a valid SQHD; data
//! is returned only by controller-to-host commands and never more than the buffer holds;
//! `Submitted` means exactly one op reached `IoSubmit`; a command that `finish` says is not
//! done (Copy, Verify, fused Write) is run again and completes within a bounded number of
//! steps; `poll` completes only held commands.

#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use nvme::queue::{Direction, Outcome, Queue, Response};
use nvme::spec::admin_opcode::{GET_FEATURES, GET_LOG_PAGE, SET_FEATURES};
use nvme::spec::{nvm_opcode, SQHD_FLOW_CONTROL_DISABLED};
use nvme::wire::{SglDescriptor, Sqe};
use nvmfd_fuzz::{
    connect_data, connect_sqe, connect_subnqn, enable_sqe, fill_cyclic, peer, target, trace, Input,
    SyncEngine, FILE_NSID, MDTS,
};
use transport::tcp::buffers::SlotBuffers;

const MAX_DATA_INPUT: usize = 512;
/// Reservation Notification Mask, as a CDW10 FID.
const MASK: u32 = nvme::spec::fid::RESERVATION_NOTIFICATION_MASK as u32;

struct Harness {
    queues: [Option<Queue>; 2],
    /// CIDs held by the core (AERs), per queue.
    held: [Vec<u16>; 2],
    /// The command buffer: MDTS bytes, 4096-aligned, as a transport slot.
    buf: SlotBuffers,
    io: SyncEngine,
    clock: Instant,
    cntlid: Option<u16>,
}

impl Harness {
    fn queue(&mut self, i: usize) -> &mut Queue {
        self.queues[i].get_or_insert_with(|| Queue::new(target(), peer()))
    }

    /// One command through the transport's sequence; `host_data` fills a host-to-controller
    /// buffer.
    fn command(&mut self, i: usize, sqe: &Sqe, host_data: &[u8]) {
        let len = sqe.dptr.length;
        let qid_before = self.queue(i).qid();
        let dir = match self.queue(i).prepare(sqe, len) {
            Ok(dir) => dir,
            Err(status) => {
                assert!(!status.is_success(), "prepare refused with success");
                let r = self.queue(i).reject(sqe, status);
                self.check(i, sqe, &r, Direction::None, 0, qid_before);
                return;
            }
        };
        assert!(len <= MDTS, "prepare admitted {len} bytes beyond MDTS");
        let tag = 0x1_0000_0000 | i as u64;
        let data = &mut self.buf.get_mut(0)[..len as usize];
        if dir == Direction::HostToController {
            fill_cyclic(data, host_data);
        } else {
            // Whatever a previous command left: the core must not depend on it.
            data.fill(0xa5);
        }
        let q = self.queues[i].as_mut().expect("queue created above");
        let mut steps = 0;
        let r = loop {
            steps += 1;
            // A Copy of MSRC ranges takes one step per range and one for the write.
            assert!(steps <= 300, "command not done after {steps} steps: {sqe:?}");
            let outcome = q.execute(sqe, data, tag, &mut self.io);
            match outcome {
                Outcome::Complete(r) => break r,
                Outcome::Submitted => {
                    assert_eq!(self.io.done.len(), 1, "Submitted without exactly one op");
                    let (t, res) = self.io.done.pop().expect("one op");
                    assert_eq!(t, tag);
                    // None: not done (the next step of a Copy or Verify, a fused Write
                    // after its Compare): run it again, as a transport does.
                    if let Some(r) = q.finish(sqe, res) {
                        break r;
                    }
                    continue;
                }
                // Blocked: nothing started; this harness does not run it again.
                Outcome::Blocked => {
                    assert!(self.io.done.is_empty());
                    return;
                }
                Outcome::Held => {
                    assert!(self.io.done.is_empty());
                    self.held[i].push(sqe.cid);
                    return;
                }
            }
        };
        assert!(
            self.io.done.is_empty(),
            "an op was submitted for a completed command"
        );
        let is_connect = sqe.is_fabrics() && qid_before.is_none();
        if is_connect && r.cqe.status.is_success() && self.queue(i).qid() == Some(0) {
            self.cntlid = Some(r.cqe.dw0 as u16);
        }
        self.check(i, sqe, &r, dir, len, qid_before);
    }

    fn check(
        &mut self,
        i: usize,
        sqe: &Sqe,
        r: &Response,
        dir: Direction,
        len: u32,
        qid: Option<u16>,
    ) {
        let q = self.queue(i);
        if trace() {
            eprintln!(
                "q{i} qid {:?} opcode {:#04x} nsid {} len {len} -> {:?} dw0 {:#x} data {}",
                q.qid(),
                sqe.opcode,
                sqe.nsid,
                r.cqe.status,
                r.cqe.dw0,
                r.data_len
            );
        }
        assert_eq!(r.cqe.cid, sqe.cid);
        if let Some(qid) = q.qid().or(qid) {
            assert_eq!(r.cqe.sqid, qid, "response on the wrong queue");
        }
        if q.flow_control_disabled() {
            assert_eq!(r.cqe.sqhd, SQHD_FLOW_CONTROL_DISABLED);
        } else if q.sq_entries() > 0 {
            assert!(r.cqe.sqhd < q.sq_entries(), "SQHD beyond the queue");
        }
        assert!(
            r.data_len <= len,
            "{} data bytes from a {len}-byte buffer",
            r.data_len
        );
        if r.data_len > 0 {
            assert_eq!(dir, Direction::ControllerToHost, "data returned by {sqe:?}");
            assert!(r.cqe.status.is_success());
        }
    }

    fn poll(&mut self, i: usize) {
        let now = self.clock;
        let Some(q) = self.queues[i].as_mut() else {
            return;
        };
        // Aborts of this queue's commands: none is waiting here (the harness runs every
        // command to its end or drops it), so each is answered "not aborted".
        for cid in q.take_abort_requests() {
            q.answer_abort(cid, false);
        }
        let result = q.poll(now);
        for r in result.completions {
            let pos = self.held[i].iter().position(|&c| c == r.cqe.cid);
            assert!(
                pos.is_some(),
                "poll completed CID {} which was not held",
                r.cqe.cid
            );
            self.held[i].remove(pos.unwrap_or_default());
        }
        if result.terminate.is_some() {
            // The transport closes the connection: the queue goes.
            self.queues[i] = None;
            self.held[i].clear();
        }
    }
}

/// NVM command opcodes the I/O helper picks from (NVM Command Set 1.0 Figure 18; the four
/// reservation commands take their action, type and IEKEY from the CDW10 the LBA fills and
/// their keys from the host data; Copy its source range entries from the host data), plus one
/// that is not supported.
const IO_OPCODES: [u8; 13] = [
    0x00, 0x01, 0x02, 0x05, 0x08, 0x09, 0x04, 0x0d, 0x0e, 0x11, 0x15, 0x0c, 0x19,
];

/// Host data of a command: a length (bounded) and that many bytes.
fn host_data<'a>(input: &mut Input<'a>) -> &'a [u8] {
    let n = input.u16() as usize % (MAX_DATA_INPUT + 1);
    input.take(n)
}

fn op(input: &mut Input, h: &mut Harness) {
    let code = input.u8();
    let i = (code >> 7) as usize;
    match code & 0x7f {
        // Connect.
        0..=11 => {
            let sel = input.u8();
            let qid = if sel & 1 == 0 {
                0
            } else {
                1 + (sel >> 1) as u16 % 5
            };
            let sqsize = input.u8() as u16 % 40;
            let cattr = input.u8();
            let kato = input.u8() as u32 * 1000;
            let guess = input.u16();
            let cntlid = (qid != 0).then(|| h.cntlid.unwrap_or(guess));
            let sqe = connect_sqe(input.u16(), qid, sqsize, cattr, kato, sel & 0x10 != 0);
            let data = connect_data(connect_subnqn(sel >> 5), cntlid);
            h.command(i, &sqe, &data);
        }
        // CC.EN.
        12..=19 => {
            let sqe = enable_sqe(input.u16());
            h.command(i, &sqe, &[]);
        }
        // Any SQE, PSDT forced to SGL half the time (otherwise nearly all are refused early).
        20..=59 => {
            let fix = input.u8() & 1 != 0;
            let Some(mut sqe) = input.sqe() else { return };
            if fix {
                sqe.flags = 0x40 | (sqe.flags & 0x3c);
                sqe.dptr.length %= MDTS + 4097;
            }
            let data = host_data(input);
            h.command(i, &sqe, data);
        }
        // An NVM I/O command from a few fields.
        60..=109 => {
            let opcode = IO_OPCODES[input.u8() as usize % IO_OPCODES.len()];
            let nsid = input.u8() as u32 % 5;
            let slba = input.u16() as u64 * if input.u8() & 1 == 0 { 1 } else { 97 };
            let nlb = input.u8() as u32;
            let block = if nsid == FILE_NSID { 4096 } else { 512 };
            let mismatch = input.u8();
            let len = if mismatch & 3 == 0 {
                (mismatch as u32) << 4
            } else {
                ((nlb + 1) * block).min(MDTS)
            };
            let sqe = Sqe {
                opcode,
                flags: nvme::spec::sqe_flags::PSDT_SGL,
                cid: input.u16(),
                nsid,
                dptr: if mismatch & 4 == 0 {
                    SglDescriptor::transport_data_block(len)
                } else {
                    SglDescriptor::in_capsule(0, len)
                },
                cdw10: slba as u32,
                cdw11: (slba >> 32) as u32,
                // NLB (0's based) and FUA / DEAC / deallocate attribute bits from the input.
                cdw12: nlb | (input.u8() as u32 & 0xe2) << 24,
                cdw13: input.u8() as u32,
                ..Sqe::default()
            };
            let mut sqe = sqe;
            if opcode == nvm_opcode::COPY {
                // Copy: CDW12 7:0 is NR; any descriptor format (only 0 is supported); the host
                // data are the source range entries.
                sqe.cdw12 |= (input.u8() as u32 & 0xf) << 8;
            }
            let data = host_data(input);
            h.command(i, &sqe, data);
        }
        // Abort (on the admin queue) of a CID of queue 0, 1, a queue that does not exist, or
        // FFFFh; the CID of a held command (an AER, another Abort) or any.
        126 => {
            let sqid = [0u16, 1, 2, 0xffff][input.u8() as usize % 4];
            let pick = input.u16();
            let cid = match h.held[(sqid == 1) as usize].as_slice() {
                [] => pick,
                held if pick & 1 == 0 => held[pick as usize % held.len()],
                _ => pick,
            };
            let sqe = Sqe {
                opcode: nvme::spec::admin_opcode::ABORT,
                flags: nvme::spec::sqe_flags::PSDT_SGL,
                cid: input.u16(),
                cdw10: u32::from(sqid) | u32::from(cid) << 16,
                ..Sqe::default()
            };
            h.command(0, &sqe, &[]);
        }
        // Time passes.
        110..=119 => {
            h.clock += Duration::from_millis(input.u16() as u64 * 100);
            h.poll(i);
        }
        // The connection of a queue goes away.
        120..=122 => {
            h.queues[i] = None;
            h.held[i].clear();
        }
        // Reservation notifications: Get Log Page 80h (length and offset from the input) or
        // Get / Set Features 82h (NSID, SEL / SV and value from the input).
        123..=125 => {
            let pick = input.u8();
            let nsid = [0, 1, 2, FILE_NSID, u32::MAX][pick as usize % 5];
            let (opcode, cdw10, cdw11, cdw12, len) = match pick >> 5 {
                0..=3 => {
                    let len = (input.u8() as u32 + 1) * 4;
                    let offset = input.u8() as u32;
                    let numd = len / 4 - 1;
                    let lid = nvme::spec::lid::RESERVATION_NOTIFICATION as u32;
                    let rae = (input.u8() as u32 & 1) << 15;
                    (GET_LOG_PAGE, lid | rae | numd << 16, 0, offset, len)
                }
                4..=5 => (SET_FEATURES, MASK | (input.u8() as u32) << 24, input.u32(), 0, 0),
                _ => (GET_FEATURES, MASK | (input.u8() as u32 & 7) << 8, 0, 0, 0),
            };
            let sqe = Sqe {
                opcode,
                flags: nvme::spec::sqe_flags::PSDT_SGL,
                cid: input.u16(),
                nsid,
                dptr: SglDescriptor::transport_data_block(len),
                cdw10,
                cdw11,
                cdw12,
                ..Sqe::default()
            };
            h.command(i, &sqe, &[]);
        }
        _ => h.poll(i),
    }
}

fuzz_target!(|bytes: &[u8]| {
    thread_local! {
        static BUF: std::cell::RefCell<Option<SlotBuffers>> = const { std::cell::RefCell::new(None) };
    }
    let buf = BUF
        .with(|b| b.borrow_mut().take())
        .unwrap_or_else(|| SlotBuffers::new(1, MDTS as usize).expect("one MDTS buffer"));
    let mut h = Harness {
        queues: [None, None],
        held: [Vec::new(), Vec::new()],
        buf,
        io: SyncEngine::default(),
        clock: Instant::now(),
        cntlid: None,
    };
    let mut input = Input::new(bytes);
    let mut ops = 0;
    while !input.is_empty() && ops < 256 {
        op(&mut input, &mut h);
        ops += 1;
    }
    // I/O queue first: the admin queue's drop deletes the controller.
    h.queues[1] = None;
    h.queues[0] = None;
    let Harness { buf, .. } = h;
    BUF.with(|b| *b.borrow_mut() = Some(buf));
});
