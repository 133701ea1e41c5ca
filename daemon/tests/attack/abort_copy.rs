//! Hostile Abort (NVMe Base 2.0 §5.1), Copy (NVM Command Set 1.0 §3.3.1) and Verify (§3.3.5):
//! Aborts of queues and commands that do not exist and of the Abort itself, Copy source
//! ranges in unsupported formats, too many, too long, wrapping or outside the namespace, on
//! namespaces 0 / FFFFFFFFh / read-only / with failing media, Verify likewise. Each gets its
//! exact status, on that command only, and completes exactly once.

use nvme::spec::admin_opcode::ABORT;
use nvme::spec::nvm_opcode::{COPY, VERIFY};
use nvme::wire::copy::encode_ranges;
use nvme::wire::{SglDescriptor, Sqe, Status};
use transport::client::{Client, DataOut};

use crate::support::*;

fn abort_sqe(cid: u16, sqid: u16, target: u16) -> Sqe {
    let mut s = sqe(ABORT, 0, cid, SglDescriptor::transport_data_block(0));
    s.cdw10 = u32::from(sqid) | u32::from(target) << 16;
    s
}

/// Sends `sqe` with `data` (the client sets CID and SGL), waits for its one completion:
/// (status, DW0).
fn complete(c: &mut Client, sqe: Sqe, data: DataOut) -> Result<(Status, u32), String> {
    let cid = c.submit(sqe, data).map_err(|e| format!("send: {e}"))?;
    let done = c.wait(cid).map_err(|e| format!("no completion: {e}"))?;
    Ok((done.cqe.status, done.cqe.dw0))
}

/// Aborts of a queue that does not exist, of FFFFh, of a CID nothing uses, and an Abort of
/// an Abort sent right behind it: each completes once, successfully, saying "not aborted".
pub fn aborts_of_nothing_and_of_aborts(d: &Daemon) -> Result<(), String> {
    let (mut a, _io) = controller(d);
    for (cid, sqid, target) in [(0x200, 9u16, 1u16), (0x201, 0xffff, 0), (0x202, 1, 0xbeef)] {
        let (st, dw0) = complete(&mut a, abort_sqe(cid, sqid, target), DataOut::None)?;
        expect_status(&format!("Abort of {sqid}/{target:#x}"), st, Status::SUCCESS)?;
        expect(dw0 & 1 == 1, || {
            format!("Abort of {sqid}/{target:#x}: DW0 {dw0:#x}")
        })?;
    }
    // Both in one batch: the second names the first (queue 0).
    let first = abort_sqe(0x210, 1, 0x1234);
    let second = abort_sqe(0x211, 0, 0x210);
    a.submit_exact(first, &[], 0).map_err(|e| e.to_string())?;
    a.submit_exact(second, &[], 0).map_err(|e| e.to_string())?;
    for (cid, what) in [(0x211, "Abort of the Abort"), (0x210, "the first Abort")] {
        let done = a.wait(cid).map_err(|e| format!("{what}: {e}"))?;
        expect_status(what, done.cqe.status, Status::SUCCESS)?;
        expect(done.cqe.dw0 & 1 == 1, || {
            format!("{what}: DW0 {:#x}", done.cqe.dw0)
        })?;
    }
    // Nothing else completes (the client fails on an unknown CID): the queue still works.
    a.keep_alive().map_err(|e| e.to_string())?;
    expect(a.outstanding() == 0, || {
        format!("{} outstanding", a.outstanding())
    })
}

/// A Copy to `sdlba` with descriptor format `format` and NR `nr` (entries: the data).
fn copy_sqe(cid: u16, nsid: u32, sdlba: u64, format: u32, nr: u32) -> Sqe {
    let mut s = sqe(COPY, nsid, cid, SglDescriptor::transport_data_block(0));
    s.cdw10 = sdlba as u32;
    s.cdw11 = (sdlba >> 32) as u32;
    s.cdw12 = nr | format << 8;
    s
}

pub fn hostile_copies(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let one = encode_ranges(&[(0, 1)]);
    let cases: Vec<(&str, Sqe, Vec<u8>, Status)> = vec![
        (
            "format 1",
            copy_sqe(0x300, RAM_NSID, 0, 1, 0),
            one.clone(),
            Status::INVALID_FIELD.with_dnr(),
        ),
        (
            "format Fh",
            copy_sqe(0x301, RAM_NSID, 0, 0xf, 0),
            one.clone(),
            Status::INVALID_FIELD.with_dnr(),
        ),
        (
            "NR 3, one entry",
            copy_sqe(0x302, RAM_NSID, 0, 0, 3),
            one.clone(),
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
        ),
        (
            "129 ranges (MSRC 127)",
            copy_sqe(0x303, RAM_NSID, 0, 0, 128),
            vec![0; 129 * 32],
            Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(),
        ),
        (
            "a source wrapping 2^64",
            copy_sqe(0x304, RAM_NSID, 0, 0, 0),
            encode_ranges(&[(u64::MAX, 2)]),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            "a source past the end",
            copy_sqe(0x305, RAM_NSID, 0, 0, 0),
            encode_ranges(&[(RAM_BLOCKS - 1, 2)]),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            "a destination wrapping 2^64",
            copy_sqe(0x306, RAM_NSID, u64::MAX, 0, 0),
            one.clone(),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            "nsid 0",
            copy_sqe(0x307, 0, 0, 0, 0),
            one.clone(),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "nsid FFFFFFFFh",
            copy_sqe(0x308, 0xffff_ffff, 0, 0, 0),
            one.clone(),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "a read-only namespace",
            copy_sqe(0x309, READ_ONLY_NSID, 8, 0, 0),
            one.clone(),
            Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
        ),
        (
            "sources that cannot be read",
            copy_sqe(0x30a, FAULT_NSID, 100, 0, 1),
            encode_ranges(&[(0, 4), (20, 1)]),
            Status::UNRECOVERED_READ_ERROR,
        ),
        (
            "a destination that cannot be written",
            copy_sqe(0x30b, FAULT_NSID, 60, 0, 0),
            encode_ranges(&[(0, 8)]),
            Status::CAPACITY_EXCEEDED.with_dnr(),
        ),
    ];
    for (what, s, data, want) in cases {
        let (st, _) = complete(&mut io, s, DataOut::Write(data))?;
        expect_status(&format!("Copy: {what}"), st, want)?;
    }
    // Nothing was copied over the RAM namespace's first blocks by the refused commands.
    write(&mut io, RAM_NSID, 0, pattern(512, 9))?;
    let good = copy_sqe(0x30c, RAM_NSID, 1, 0, 0);
    let (st, _) = complete(&mut io, good, DataOut::Write(one))?;
    expect_status("a good Copy after them", st, Status::SUCCESS)?;
    let back = read_back(&mut io, RAM_NSID, 1, 1)?;
    expect(back == pattern(512, 9), || "the good Copy".into())
}

fn verify_sqe(cid: u16, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut s = sqe(VERIFY, nsid, cid, SglDescriptor::transport_data_block(0));
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    s
}

pub fn hostile_verifies(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let whole = RAM_BLOCKS as u32;
    for (what, s, want) in [
        (
            "nsid 0",
            verify_sqe(0x400, 0, 0, 1),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "nsid FFFFFFFFh",
            verify_sqe(0x401, 0xffff_ffff, 0, 1),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "wrapping 2^64",
            verify_sqe(0x402, RAM_NSID, u64::MAX, 2),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            "past the end",
            verify_sqe(0x403, RAM_NSID, RAM_BLOCKS - 1, 2),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            "failing media",
            verify_sqe(0x404, FAULT_NSID, 20, 1),
            Status::UNRECOVERED_READ_ERROR,
        ),
        (
            "the whole namespace",
            verify_sqe(0x405, RAM_NSID, 0, whole),
            Status::SUCCESS,
        ),
    ] {
        let (st, _) = complete(&mut io, s, DataOut::None)?;
        expect_status(&format!("Verify: {what}"), st, want)?;
    }
    // Verify moves no data: a buffer is a length error.
    let (st, _) = complete(
        &mut io,
        verify_sqe(0x406, RAM_NSID, 0, 1),
        DataOut::Read(512),
    )?;
    expect_status(
        "Verify with a data buffer",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

pub const CASES: &[(&str, CaseFn)] = &[
    (
        "aborts_of_nothing_and_of_aborts",
        aborts_of_nothing_and_of_aborts,
    ),
    ("hostile_copies", hostile_copies),
    ("hostile_verifies", hostile_verifies),
];
