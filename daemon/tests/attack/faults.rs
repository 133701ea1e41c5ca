//! Faults: hosts that vanish with RST in the middle of a write, and backend errors (a file
//! namespace truncated underneath → read past EOF; a full filesystem → ENOSPC). Each costs the
//! affected command or connection only; nothing leaks.

use std::time::{Duration, Instant};

use nvme::spec::lid;
use nvme::wire::{SglDescriptor, Status};
use transport::client::{Client, DataOut};
use transport::tcp::pdu::{DataHeader, Digests, PduHeader};

use crate::support::*;

/// 20 times: a controller with an I/O queue, a 64 KiB write half-sent (R2T answered with half
/// the data), then both connections reset. Afterwards each controller is gone (its cntlid
/// refuses I/O queues: the admin queue's drop deleted it) and a new controller runs a full
/// queue depth of commands (no slot or buffer went missing).
pub fn reset_mid_write(d: &Daemon) -> Result<(), String> {
    let mut gone = Vec::new();
    for round in 0..20u16 {
        let (mut a, cntlid) = admin(d);
        let mut io = io_queue(d, options(), cntlid, 1);
        let len = 64 * 1024;
        let s = write_sqe(
            if round % 2 == 0 { RAM_NSID } else { FILE_NSID },
            8192,
            len / BLOCK,
            7,
            SglDescriptor::transport_data_block(len),
        );
        io.send_raw(&capsule_bytes(&io, s, &[])).unwrap();
        let ttag = match io.recv_pdu().map_err(|e| e.to_string())?.header {
            PduHeader::R2T(r) => r.ttag,
            other => return Err(format!("expected R2T, got {other:?}")),
        };
        let h = transport::tcp::pdu::encode_header(
            &PduHeader::H2CData {
                hdr: DataHeader {
                    cccid: 7,
                    ttag,
                    datao: 0,
                    datal: len,
                },
                last: true,
            },
            Digests::default(),
            len,
            4,
        );
        let mut half = h.as_slice().to_vec();
        half.extend_from_slice(&pattern(len as usize / 2, round as u64));
        io.send_raw(&half).unwrap();
        reset(io.writer().unwrap());
        drop(io);
        let _ = a.keep_alive();
        reset(a.writer().unwrap());
        drop(a);
        gone.push(cntlid);
    }
    for cntlid in gone {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let cqe = io_connect(d, cntlid)?;
            if cqe.status == Status::CONNECT_INVALID_PARAMETERS.with_dnr() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "controller {cntlid} still takes I/O queues after its host reset ({:?})",
                    cqe.status
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    full_queue_depth(d)
}

/// A new controller: MAX_QUEUE_SIZE − 1 writes outstanding at once, all complete and verify.
fn full_queue_depth(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let depth = MAX_QUEUE_SIZE as u64 - 1;
    let mut cids = Vec::new();
    for i in 0..depth {
        let sqe = Client::write_sqe(FILE_NSID, 4096 + i * 16, 16, false);
        cids.push(
            io.submit(sqe, DataOut::WriteR2t(pattern(8192, 1000 + i)))
                .map_err(|e| e.to_string())?,
        );
    }
    for cid in cids {
        let done = io.wait(cid).map_err(|e| e.to_string())?;
        expect_status("queued write", done.cqe.status, Status::SUCCESS)?;
    }
    for i in 0..depth {
        let back = read_back(&mut io, FILE_NSID, 4096 + i * 16, 16)?;
        expect(back == pattern(8192, 1000 + i), || {
            format!("write {i} differs")
        })?;
    }
    Ok(())
}

/// Many file-namespace writes in flight (io_uring), then RST: the buffers stay until the
/// kernel completes them (backend contract), nothing crashes, later I/O is fine.
pub fn reset_with_backend_io_in_flight(d: &Daemon) -> Result<(), String> {
    for round in 0..5u64 {
        let (_a, mut io) = controller(d);
        for i in 0..24u64 {
            let sqe = Client::write_sqe(FILE_NSID, 6144 + i * 8, 8, false);
            io.submit(sqe, DataOut::Write(pattern(4096, round * 100 + i)))
                .map_err(|e| e.to_string())?;
        }
        reset(io.writer().unwrap());
    }
    full_queue_depth(d)
}

/// The backing file shrinks under the daemon: a read past its new end fails with
/// Unrecovered Read Error (a short transfer is a media error, NVMe Base 2.0 Figure 101) on
/// that command only; reads inside the file and later commands on the queue are fine.
pub fn truncated_file_read(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let data = pattern(8192, 4242);
    write(&mut io, FILE_NSID, 12_000, data.clone())?;
    expect(read_back(&mut io, FILE_NSID, 12_000, 16)? == data, || {
        "read back before truncation".into()
    })?;
    let image = d.dir.join("ns2.img");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .map_err(|e| e.to_string())?;
    file.set_len(1 << 20).map_err(|e| e.to_string())?;
    let result = (|| {
        let st = status_of(&mut io, read_sqe(FILE_NSID, 12_000, 16, 0x77), &[], 8192)?;
        expect_status(
            "read past the truncated end",
            st,
            Status::UNRECOVERED_READ_ERROR,
        )?;
        // Inside the file: the canary's region and ours at LBA 100.
        write(&mut io, FILE_NSID, 100, data.clone())?;
        expect(read_back(&mut io, FILE_NSID, 100, 16)? == data, || {
            "read inside the truncated file".into()
        })
    })();
    file.set_len(FILE_SIZE).map_err(|e| e.to_string())?;
    result
}

/// ENOSPC from a 1 MiB tmpfs under a 4 MiB namespace: Capacity Exceeded (DNR) for the write
/// that hit it (NVM Command Set 1.0 Figure 16), earlier data still reads back, the queue goes
/// on. Needs a private tmpfs mount for the daemon (root with CAP_SYS_ADMIN); skipped with a
/// note otherwise.
pub fn enospc_write(d: &Daemon) -> Result<(), String> {
    if !d.tmpfs {
        eprintln!("    SKIPPED: no private tmpfs for the daemon here (needs CAP_SYS_ADMIN)");
        return Ok(());
    }
    let (_a, mut io) = controller(d);
    let chunk = 4096u32; // tmpfs allocates whole pages: a write fits entirely or not at all
    let mut refused = None;
    for i in 0..(4u64 << 20) / chunk as u64 {
        let slba = i * (chunk / BLOCK) as u64;
        let w = write_sqe(
            READ_ONLY_NSID,
            slba,
            chunk / BLOCK,
            0x55,
            SglDescriptor::in_capsule(0, chunk),
        );
        let st = status_of(&mut io, w, &pattern(chunk as usize, i), 0)?;
        if st != Status::SUCCESS {
            expect_status(
                "write on a full filesystem",
                st,
                Status::CAPACITY_EXCEEDED.with_dnr(),
            )?;
            refused = Some(i);
            break;
        }
    }
    let Some(full_at) = refused else {
        return Err("4 MiB of writes fit in a 1 MiB tmpfs".into());
    };
    eprintln!("    ENOSPC after {} KiB", full_at * chunk as u64 / 1024);
    let back = read_back(&mut io, READ_ONLY_NSID, 0, chunk / BLOCK)?;
    expect(back == pattern(chunk as usize, 0), || {
        "data written before ENOSPC differs".into()
    })?;
    write(&mut io, RAM_NSID, 5000, pattern(4096, 5))
}

/// Injected faults (namespace key `faults`): reads of LBAs 16..24 fail with Unrecovered Read
/// Error (SCT 2h SC 81h, EIO) and leave an error log entry naming the command and LBA; writes
/// to LBAs 64..72 fail with Capacity Exceeded (SCT 0h SC 81h, DNR; ENOSPC). Neighbouring
/// blocks, the other direction and the next commands on the same queue are unaffected (and
/// the group's canary keeps doing verified I/O on namespace 1 throughout).
pub fn injected_faults(d: &Daemon) -> Result<(), String> {
    let (mut a, mut io) = controller(d);
    let data = pattern(4096, 77);
    // Writes into the read-fault range succeed; reads there fail, on either edge.
    write(&mut io, FAULT_NSID, 16, data.clone())?;
    for (slba, nlb, cid) in [(16u64, 1u32, 0x61u16), (12, 8, 0x62), (23, 1, 0x63)] {
        let st = status_of(
            &mut io,
            read_sqe(FAULT_NSID, slba, nlb, cid),
            &[],
            nlb * BLOCK,
        )?;
        expect_status(
            "read touching the EIO range",
            st,
            Status::UNRECOVERED_READ_ERROR,
        )?;
    }
    let st = status_of(&mut io, read_sqe(FAULT_NSID, 12, 4, 0x64), &[], 2048)?;
    expect_status("read just before the range", st, Status::SUCCESS)?;
    let st = status_of(&mut io, read_sqe(FAULT_NSID, 24, 8, 0x65), &[], 4096)?;
    expect_status("read just after the range", st, Status::SUCCESS)?;
    // The error log has the failed read: status, queue, command and LBA.
    let log = a
        .get_log_page(lid::ERROR, 0xffff_ffff, 64 * 4, 0)
        .map_err(|e| e.to_string())?;
    let entries: Vec<_> = log
        .chunks_exact(64)
        .filter_map(|e| nvme::wire::log::ErrorLogEntry::decode(e).ok())
        .collect();
    let found = entries.iter().any(|e| {
        e.status == Status::UNRECOVERED_READ_ERROR
            && e.cid == 0x63
            && e.nsid == FAULT_NSID
            && e.lba == 23
            && e.sqid == 1
    });
    expect(found, || {
        format!("no error log entry for the failed read: {entries:?}")
    })?;
    // ENOSPC on writes into 64..72; reads there and writes next to it are fine.
    let w = write_sqe(FAULT_NSID, 60, 8, 0x66, SglDescriptor::in_capsule(0, 4096));
    let st = status_of(&mut io, w, &data, 0)?;
    expect_status(
        "write into the ENOSPC range",
        st,
        Status::CAPACITY_EXCEEDED.with_dnr(),
    )?;
    write(&mut io, FAULT_NSID, 72, data.clone())?;
    expect(read_back(&mut io, FAULT_NSID, 72, 8)? == data, || {
        "write after the ENOSPC range".into()
    })?;
    let st = status_of(&mut io, read_sqe(FAULT_NSID, 64, 8, 0x67), &[], 4096)?;
    expect_status("read in the ENOSPC range", st, Status::SUCCESS)?;
    write(&mut io, RAM_NSID, 6000, pattern(4096, 6))
}

/// Injected latency (`latency_ms`): a read of LBAs 128..136 of the fault namespace waits
/// `FAULT_LATENCY` on the reactor's ring. Commands sent after it on the same queue — a read of
/// other LBAs of that namespace, a write to namespace 1 — complete first; it then completes
/// with its data, no earlier than the delay. A second delayed read, aborted from the admin
/// queue while it waits, completes with Abort Requested and the Abort says "aborted".
pub fn injected_latency(d: &Daemon) -> Result<(), String> {
    let (mut a, mut io) = controller(d);
    let data = pattern(4096, 88);
    // The rule delays reads only: this write is not held back.
    write(&mut io, FAULT_NSID, 128, data.clone())?;
    let e = |e: transport::client::ClientError| e.to_string();
    let started = Instant::now();
    let slow = io
        .submit(Client::read_sqe(FAULT_NSID, 128, 8), DataOut::Read(4096))
        .map_err(e)?;
    let others = [
        io.submit(Client::read_sqe(FAULT_NSID, 0, 8), DataOut::Read(4096))
            .map_err(e)?,
        io.submit(
            Client::write_sqe(RAM_NSID, 7000, 8, false),
            DataOut::Write(pattern(4096, 89)),
        )
        .map_err(e)?,
    ];
    for _ in others {
        let c = io.reap().map_err(e)?;
        expect(c.cid != slow, || {
            format!(
                "the delayed read completed before a later command ({:?} after {:?})",
                c.cqe.status,
                started.elapsed()
            )
        })?;
        expect_status(
            "command behind the delayed read",
            c.cqe.status,
            Status::SUCCESS,
        )?;
    }
    let done = io.wait(slow).map_err(e)?;
    expect_status("delayed read", done.cqe.status, Status::SUCCESS)?;
    expect(started.elapsed() >= FAULT_LATENCY, || {
        format!("delayed read done after {:?}", started.elapsed())
    })?;
    expect(done.data == data, || "delayed read data differs".into())?;

    // Abort while it waits: the wait is cancelled, the storage never sees the read.
    let victim = io
        .submit(Client::read_sqe(FAULT_NSID, 130, 2), DataOut::Read(1024))
        .map_err(e)?;
    // A later command on the same queue done: the daemon has taken the victim (a queue's
    // commands are taken in order), so the Abort cannot overtake it.
    io.read(RAM_NSID, 0, 1, BLOCK).map_err(e)?;
    let abort = nvme::wire::Sqe {
        opcode: nvme::spec::admin_opcode::ABORT,
        cdw10: 1 | u32::from(victim) << 16,
        ..nvme::wire::Sqe::default()
    };
    let answer = a.execute(abort, DataOut::None).map_err(e)?;
    expect_status("Abort", answer.cqe.status, Status::SUCCESS)?;
    expect(answer.cqe.dw0 & 1 == 0, || {
        format!("Abort of a waiting command: dw0 {:#x}", answer.cqe.dw0)
    })?;
    let aborted = io.wait(victim).map_err(e)?;
    expect_status(
        "aborted delayed read",
        aborted.cqe.status,
        Status::ABORT_REQUESTED,
    )?;
    write(&mut io, RAM_NSID, 7100, pattern(4096, 90))
}

pub const CASES: &[(&str, CaseFn)] = &[
    ("reset_mid_write", reset_mid_write),
    (
        "reset_with_backend_io_in_flight",
        reset_with_backend_io_in_flight,
    ),
    ("truncated_file_read", truncated_file_read),
    ("enospc_write", enospc_write),
    ("injected_faults", injected_faults),
    ("injected_latency", injected_latency),
];
