//! QoS limits changed under a host's feet: `set-qos` while I/O runs, limits at the extremes
//! (1 command/s, 1 MiB/s, the largest values, values beyond them), a limit removed while
//! commands wait for it, the namespace removed while commands wait, a waiting command
//! aborted, and admin commands of a limited host. Every command completes exactly once (the
//! client fails on an unknown or repeated CID), with success or the status its fate says.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nvme::spec::admin_opcode::ABORT;
use nvme::wire::{SglDescriptor, Sqe, Status};
use serde_json::{json, Value};
use transport::client::{Client, DataOut};

use crate::support::*;

/// The namespace these cases limit (16 MiB of RAM, no limit at start).
pub const QOS_NSID: u32 = 5;
/// A host of its own for the host limit (the canary's host is never limited).
const QOS_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5e1f0000-0000-4000-8000-0000000000a5";
const QOS_HOSTID: [u8; 16] = [0xa5; 16];
/// A namespace added and removed by one case.
const GONE_NSID: u32 = 6;

/// One control socket request (not written to the configuration file).
fn ctl(d: &Daemon, mut request: Value) -> Result<Value, String> {
    request["transient"] = json!(true);
    let path = d.dir.join("control.sock");
    let mut s = UnixStream::connect(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
    let mut line = request.to_string();
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&answer).map_err(|e| format!("{e}: {answer}"))?;
    if v["ok"] == json!(true) {
        Ok(v["result"].clone())
    } else {
        Err(v["error"].as_str().unwrap_or("refused").to_owned())
    }
}

fn set_ns_qos(d: &Daemon, nsid: u32, qos: Value) -> Result<(), String> {
    ctl(
        d,
        json!({"command": "set-qos", "nqn": SUBNQN, "nsid": nsid, "qos": qos}),
    )
    .map(drop)
    .map_err(|e| format!("set-qos nsid {nsid} {qos}: {e}"))
}

fn read(nsid: u32, slba: u64) -> (Sqe, DataOut) {
    let mut s = Client::read_sqe(nsid, slba, 8);
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::transport_data_block(8 * BLOCK);
    (s, DataOut::Read(8 * BLOCK))
}

/// Submits `n` 4 KiB reads of `nsid`; their CIDs.
fn submit_reads(c: &mut Client, nsid: u32, n: u64) -> Result<Vec<u16>, String> {
    (0..n)
        .map(|i| {
            let (sqe, data) = read(nsid, i * 8);
            c.submit(sqe, data).map_err(|e| format!("submit: {e}"))
        })
        .collect()
}

/// Waits for each of `cids`, expecting `want`.
fn expect_all(c: &mut Client, cids: &[u16], want: Status, what: &str) -> Result<(), String> {
    for &cid in cids {
        let done = c.wait(cid).map_err(|e| format!("{what}: cid {cid}: {e}"))?;
        expect_status(&format!("{what}: cid {cid}"), done.cqe.status, want)?;
    }
    Ok(())
}

/// QD24 of reads for 1.6 s while the limit goes 200 → 2,000 → 50 IOPS → none (5 ms bursts):
/// while it is 200 and 50 the reads come at that rate, and all succeed.
pub fn set_qos_while_io_runs(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    set_ns_qos(d, QOS_NSID, json!({"iops": 200, "burst_ms": 5}))?;
    let mut outstanding = submit_reads(&mut io, QOS_NSID, 24)?;
    let start = Instant::now();
    let mut phase = 0;
    let mut counted = (0u64, start);
    let mut slba = 0u64;
    while !outstanding.is_empty() {
        let done = io.reap().map_err(|e| format!("reap: {e}"))?;
        expect_status(
            "read under a changing limit",
            done.cqe.status,
            Status::SUCCESS,
        )?;
        outstanding.retain(|&c| c != done.cid);
        counted.0 += 1;
        let t = start.elapsed();
        let next = match phase {
            0 if t >= Duration::from_millis(400) => {
                Some((json!({"iops": 2000, "burst_ms": 5}), Some(200.0)))
            }
            1 if t >= Duration::from_millis(800) => {
                Some((json!({"iops": 50, "burst_ms": 5}), None))
            }
            2 if t >= Duration::from_millis(1200) => Some((json!({}), Some(50.0))),
            _ => None,
        };
        if let Some((qos, rate)) = next {
            // The rate of the phase that ends (the first 200 ms of each settle the change).
            if let Some(rate) = rate {
                let secs = counted.1.elapsed().as_secs_f64();
                expect(counted.0 as f64 <= rate * secs + 2.0 + 24.0, || {
                    format!("{} reads in {secs:.2} s under {rate} IOPS", counted.0)
                })?;
            }
            set_ns_qos(d, QOS_NSID, qos)?;
            phase += 1;
            counted = (0, Instant::now());
        }
        if phase < 3 {
            slba = (slba + 8) % 2048;
            let (sqe, data) = read(QOS_NSID, slba);
            outstanding.push(io.submit(sqe, data).map_err(|e| e.to_string())?);
        }
    }
    expect(io.outstanding() == 0, || {
        format!("{} outstanding", io.outstanding())
    })
}

/// 1 command/s, 1 MiB/s, and the largest limits: what waits goes on when the limit rises;
/// limits beyond the largest are refused and change nothing.
pub fn extreme_limits(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    set_ns_qos(d, QOS_NSID, json!({"iops": 1}))?;
    let cids = submit_reads(&mut io, QOS_NSID, 8)?;
    expect_all(&mut io, &cids[..1], Status::SUCCESS, "first read at 1 IOPS")?;
    let t = Instant::now();
    let most = json!({"iops": 1_000_000_000u64, "read_mbps": 1u64 << 30, "write_mbps": 1u64 << 30,
                      "total_mbps": 1u64 << 30, "burst_ms": 60_000});
    set_ns_qos(d, QOS_NSID, most)?;
    expect_all(
        &mut io,
        &cids[1..],
        Status::SUCCESS,
        "reads after raising the limit",
    )?;
    expect(t.elapsed() < Duration::from_secs(2), || {
        format!("7 reads waited {:?} after the limit rose", t.elapsed())
    })?;
    for bad in [
        json!({"iops": 1_000_000_001u64}),
        json!({"total_mbps": (1u64 << 30) + 1}),
        json!({"iops": 5, "burst_ms": 60_001}),
    ] {
        expect(set_ns_qos(d, QOS_NSID, bad.clone()).is_err(), || {
            format!("set-qos {bad} accepted")
        })?;
    }
    // 1 MiB/s of 128 KiB reads: 8 a second (the first at once).
    set_ns_qos(d, QOS_NSID, json!({"read_mbps": 1, "burst_ms": 5}))?;
    let t = Instant::now();
    let mut cids = Vec::new();
    for i in 0..5u64 {
        let mut s = Client::read_sqe(QOS_NSID, i * 256, 256);
        s.flags = nvme::spec::sqe_flags::PSDT_SGL;
        s.dptr = SglDescriptor::transport_data_block(MDTS);
        cids.push(
            io.submit(s, DataOut::Read(MDTS))
                .map_err(|e| e.to_string())?,
        );
    }
    expect_all(&mut io, &cids, Status::SUCCESS, "128 KiB reads at 1 MiB/s")?;
    let took = t.elapsed();
    expect(took >= Duration::from_millis(450) && took < WAIT, || {
        format!("5 × 128 KiB at 1 MiB/s took {took:?} (4 × 125 ms expected)")
    })?;
    set_ns_qos(d, QOS_NSID, json!({}))
}

/// A limit removed while 7 reads wait for it (at 1 command/s): they complete at once.
pub fn limit_removed_while_commands_wait(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    set_ns_qos(d, QOS_NSID, json!({"iops": 1}))?;
    let cids = submit_reads(&mut io, QOS_NSID, 8)?;
    expect_all(&mut io, &cids[..1], Status::SUCCESS, "first read")?;
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    set_ns_qos(d, QOS_NSID, json!({}))?;
    expect_all(
        &mut io,
        &cids[1..],
        Status::SUCCESS,
        "reads after the limit went",
    )?;
    expect(t.elapsed() < Duration::from_millis(500), || {
        format!("waiting reads took {:?} after the limit went", t.elapsed())
    })
}

/// A namespace removed while reads wait for its limit: they complete with Invalid Namespace.
pub fn namespace_removed_while_commands_wait(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let ns = json!({"nsid": GONE_NSID, "ram_size": "1M", "qos": {"iops": 1}});
    ctl(
        d,
        json!({"command": "add-namespace", "nqn": SUBNQN, "namespace": ns}),
    )
    .map_err(|e| format!("add-namespace: {e}"))?;
    let cids = submit_reads(&mut io, GONE_NSID, 6)?;
    expect_all(&mut io, &cids[..1], Status::SUCCESS, "first read")?;
    ctl(
        d,
        json!({"command": "remove-namespace", "nqn": SUBNQN, "nsid": GONE_NSID}),
    )
    .map_err(|e| format!("remove-namespace: {e}"))?;
    let t = Instant::now();
    for &cid in &cids[1..] {
        let done = io.wait(cid).map_err(|e| format!("cid {cid}: {e}"))?;
        expect_status(
            &format!("cid {cid} of the removed namespace"),
            done.cqe.status,
            Status::INVALID_NAMESPACE.with_dnr(),
        )?;
    }
    expect(t.elapsed() < Duration::from_secs(2), || {
        format!(
            "waiting reads took {:?} after their namespace went",
            t.elapsed()
        )
    })
}

/// An Abort of a read waiting for its limit: aborted (Abort Requested, Abort DW0 bit 0 = 0);
/// the others go on once the limit goes.
pub fn waiting_command_aborted(d: &Daemon) -> Result<(), String> {
    let (mut a, mut io) = controller(d);
    set_ns_qos(d, QOS_NSID, json!({"iops": 1}))?;
    let cids = submit_reads(&mut io, QOS_NSID, 4)?;
    expect_all(&mut io, &cids[..1], Status::SUCCESS, "first read")?;
    let mut abort = sqe(ABORT, 0, 0, SglDescriptor::transport_data_block(0));
    abort.cdw10 = 1 | u32::from(cids[2]) << 16;
    let done = a
        .execute(abort, DataOut::None)
        .map_err(|e| format!("Abort: {e}"))?;
    expect_status("Abort", done.cqe.status, Status::SUCCESS)?;
    expect(done.cqe.dw0 & 1 == 0, || {
        format!(
            "Abort of a waiting read: DW0 {:#x} (not aborted)",
            done.cqe.dw0
        )
    })?;
    expect_all(
        &mut io,
        &cids[2..3],
        Status::ABORT_REQUESTED,
        "aborted read",
    )?;
    set_ns_qos(d, QOS_NSID, json!({}))?;
    expect_all(
        &mut io,
        &[cids[1], cids[3]],
        Status::SUCCESS,
        "the other reads",
    )
}

/// A host limited to 1 command/s with reads waiting: its admin queue (Identify, Get Log
/// Page, Keep Alive, Property Get) is never held.
pub fn admin_commands_of_a_limited_host_are_never_held(d: &Daemon) -> Result<(), String> {
    let limit = |qos: Value| {
        let request = json!({"command": "set-qos", "nqn": SUBNQN, "host": QOS_HOST, "qos": qos});
        ctl(d, request).map(drop)
    };
    limit(json!({"iops": 1}))?;
    let mut a = connected(d, options());
    let cntlid = a
        .fabrics_connect(0, 31, 0xffff, SUBNQN, QOS_HOST, QOS_HOSTID, 30_000)
        .map_err(|e| format!("admin Connect: {e}"))?;
    a.enable_controller(WAIT).map_err(|e| e.to_string())?;
    let mut io = connected(d, options());
    io.fabrics_connect(
        1,
        MAX_QUEUE_SIZE - 1,
        cntlid,
        SUBNQN,
        QOS_HOST,
        QOS_HOSTID,
        0,
    )
    .map_err(|e| format!("I/O Connect: {e}"))?;
    // The unlimited namespace too: the host's limit covers all of them.
    let cids = submit_reads(&mut io, RAM_NSID, 4)?;
    expect_all(&mut io, &cids[..1], Status::SUCCESS, "first read")?;
    let t = Instant::now();
    for _ in 0..5 {
        a.identify(1, 0).map_err(|e| format!("Identify: {e}"))?;
        a.get_log_page(2, 0xffff_ffff, 512, 0)
            .map_err(|e| format!("SMART log: {e}"))?;
        a.keep_alive().map_err(|e| format!("Keep Alive: {e}"))?;
        a.property_get(0x1c, false)
            .map_err(|e| format!("Property Get CSTS: {e}"))?;
    }
    expect(t.elapsed() < Duration::from_secs(1), || {
        format!(
            "20 admin commands took {:?} while the host's reads waited",
            t.elapsed()
        )
    })?;
    limit(json!({}))?;
    expect_all(
        &mut io,
        &cids[1..],
        Status::SUCCESS,
        "reads after the host limit went",
    )
}

pub const CASES: &[(&str, CaseFn)] = &[
    ("set_qos_while_io_runs", set_qos_while_io_runs),
    ("extreme_limits", extreme_limits),
    (
        "limit_removed_while_commands_wait",
        limit_removed_while_commands_wait,
    ),
    (
        "namespace_removed_while_commands_wait",
        namespace_removed_while_commands_wait,
    ),
    ("waiting_command_aborted", waiting_command_aborted),
    (
        "admin_commands_of_a_limited_host_are_never_held",
        admin_commands_of_a_limited_host_are_never_held,
    ),
];
