//! Hostile commands inside well-formed PDUs: Fabrics Connect / Property (NVMe-oF 1.1 §3.3),
//! admin commands (NVMe Base 2.0 §5) and NVM I/O (NVM Command Set 1.0 §3), and SGLs NVMe/TCP
//! does not allow (NVMe/TCP 1.0 §3.5.1). Each fails with the exact status, on that command only.

use nvme::spec::admin_opcode::{
    ASYNC_EVENT_REQUEST as AER, GET_FEATURES, GET_LOG_PAGE, IDENTIFY, KEEP_ALIVE,
};
use nvme::spec::{fctype, lid, nvm_opcode, reg, FABRICS_OPCODE as FABRICS};
use nvme::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use nvme::wire::{SglDescriptor, SglType, Sqe, Status};
use transport::client::{Client, DataOut};

use crate::support::*;

fn connect(
    c: &mut Client,
    qid: u16,
    sqsize: u16,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Result<nvme::wire::Cqe, String> {
    connect_cmd(
        c,
        ConnectCommand {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato: 0,
        },
        cntlid,
        subnqn,
        hostnqn,
    )
}

fn connect_cmd(
    c: &mut Client,
    cmd: ConnectCommand,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Result<nvme::wire::Cqe, String> {
    let data = ConnectData {
        hostid: HOSTID,
        cntlid,
        subnqn: subnqn.to_owned(),
        hostnqn: hostnqn.to_owned(),
    };
    c.fabrics_connect_raw(cmd, &data)
        .map(|done| done.cqe)
        .map_err(|e| format!("Connect: {e}"))
}

/// Connect Invalid Parameters (SCT 1h, SC 82h, DNR) with DW0 = IATTR/IPO naming the field
/// (NVMe-oF 1.1 §3.3.1, Figure 21: bit 16 set = in the Connect data, bits 15:0 = offset).
fn expect_invalid_param(cqe: nvme::wire::Cqe, in_data: bool, offset: u16) -> Result<(), String> {
    expect_status(
        "Connect",
        cqe.status,
        Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
    )?;
    let want = (in_data as u32) << 16 | offset as u32;
    expect(cqe.dw0 == want, || {
        format!("Connect DW0 {:#x}, expected {want:#x}", cqe.dw0)
    })
}

pub fn io_connect_wrong_cntlid(d: &Daemon) -> Result<(), String> {
    let (_a, cntlid) = admin(d);
    let mut c = established(d);
    let cqe = connect(&mut c, 1, 31, cntlid ^ 0x400, SUBNQN, HOSTNQN)?;
    expect_invalid_param(cqe, true, ConnectData::OFFSET_CNTLID)
}

/// NVMe-oF 1.1 §3.3.1: an I/O queue joins a controller of the same host only.
pub fn io_connect_other_hostnqn(d: &Daemon) -> Result<(), String> {
    let (_a, cntlid) = admin(d);
    let mut c = established(d);
    let cqe = connect(&mut c, 1, 31, cntlid, SUBNQN, OTHER_HOSTNQN)?;
    expect_invalid_param(cqe, true, ConnectData::OFFSET_CNTLID)
}

pub fn io_connect_qid_above_granted(d: &Daemon) -> Result<(), String> {
    let (_a, cntlid) = admin(d);
    let mut c = established(d);
    let cqe = connect(&mut c, MAX_IO_QUEUES + 1, 31, cntlid, SUBNQN, HOSTNQN)?;
    expect_invalid_param(cqe, false, ConnectCommand::OFFSET_QID)
}

pub fn io_connect_sqsize_zero(d: &Daemon) -> Result<(), String> {
    let (_a, cntlid) = admin(d);
    let mut c = established(d);
    let cqe = connect(&mut c, 1, 0, cntlid, SUBNQN, HOSTNQN)?;
    expect_invalid_param(cqe, false, ConnectCommand::OFFSET_SQSIZE)
}

pub fn io_connect_sqsize_above_mqes(d: &Daemon) -> Result<(), String> {
    let (_a, cntlid) = admin(d);
    let mut c = established(d);
    let cqe = connect(&mut c, 1, MAX_QUEUE_SIZE, cntlid, SUBNQN, HOSTNQN)?;
    expect_invalid_param(cqe, false, ConnectCommand::OFFSET_SQSIZE)
}

pub fn admin_connect_sqsize_zero(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let cqe = connect(&mut c, 0, 0, 0xffff, SUBNQN, HOSTNQN)?;
    expect_invalid_param(cqe, false, ConnectCommand::OFFSET_SQSIZE)
}

pub fn admin_connect_static_cntlid(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let cqe = connect(&mut c, 0, 31, 1, SUBNQN, HOSTNQN)?;
    expect_invalid_param(cqe, true, ConnectData::OFFSET_CNTLID)
}

pub fn connect_unknown_subsystem(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let cqe = connect(&mut c, 0, 31, 0xffff, "nqn.2026-12.dev.nvmfd:nope", HOSTNQN)?;
    expect_invalid_param(cqe, true, ConnectData::OFFSET_SUBNQN)
}

/// Connect Invalid Host (SCT 1h, SC 84h, DNR), and the rejection is logged with the host NQN
/// and address (interop notes: opaque connect failures).
pub fn connect_host_not_allowed(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let local = c.local_addr().unwrap().to_string();
    let cqe = connect(&mut c, 0, 31, 0xffff, RESTRICTED_NQN, HOSTNQN)?;
    expect_status(
        "Connect",
        cqe.status,
        Status::CONNECT_INVALID_HOST.with_dnr(),
    )?;
    d.wait_log(
        &["Connect rejected: host not allowed", HOSTNQN, &local],
        std::time::Duration::from_secs(2),
    )?;
    // The allowed host gets in.
    let mut ok = established(d);
    let cqe = connect(&mut ok, 0, 31, 0xffff, RESTRICTED_NQN, OTHER_HOSTNQN)?;
    expect_status("allowed host", cqe.status, Status::SUCCESS)
}

pub fn connect_recfmt_nonzero(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let cqe = connect_cmd(
        &mut c,
        ConnectCommand {
            recfmt: 1,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 0,
        },
        0xffff,
        SUBNQN,
        HOSTNQN,
    )?;
    expect_status(
        "Connect",
        cqe.status,
        Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr(),
    )
}

pub fn connect_twice(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let cqe = connect(&mut a, 0, 31, 0xffff, SUBNQN, HOSTNQN)?;
    expect_status(
        "second Connect",
        cqe.status,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
    )?;
    a.identify(1, 0).map(|_| ()).map_err(|e| e.to_string())
}

pub fn io_connect_duplicate_qid(d: &Daemon) -> Result<(), String> {
    let (_a, cntlid) = admin(d);
    let _q1 = io_queue(d, options(), cntlid, 1);
    let mut c = established(d);
    let cqe = connect(&mut c, 1, 31, cntlid, SUBNQN, HOSTNQN)?;
    expect_status(
        "duplicate qid",
        cqe.status,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
    )
}

/// Connect data must be the whole 1024 bytes.
pub fn connect_data_short(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let s = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(40);
    let mut s = s;
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::in_capsule(0, 512);
    let data = ConnectData {
        hostid: HOSTID,
        cntlid: 0xffff,
        subnqn: SUBNQN.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode();
    let st = status_of(&mut c, s, &data[..512], 0)?;
    expect_status(
        "short Connect data",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

pub fn connect_data_long(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut s = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(41);
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::in_capsule(0, 2048);
    let mut data = ConnectData {
        hostid: HOSTID,
        cntlid: 0xffff,
        subnqn: SUBNQN.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode()
    .to_vec();
    data.resize(2048, 0);
    let st = status_of(&mut c, s, &data, 0)?;
    expect_status(
        "long Connect data",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

/// NVMe Base 2.0 §3.5.1: nothing but Fabrics commands before CC.EN = 1 / CSTS.RDY = 1.
pub fn io_connect_before_enable(d: &Daemon) -> Result<(), String> {
    let mut a = established(d);
    let cntlid = a
        .fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 30_000)
        .map_err(|e| e.to_string())?;
    let mut c = established(d);
    let cqe = connect(&mut c, 1, 31, cntlid, SUBNQN, HOSTNQN)?;
    expect_status(
        "I/O Connect before CC.EN",
        cqe.status,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
    )
}

pub fn admin_command_before_enable(d: &Daemon) -> Result<(), String> {
    let mut a = established(d);
    a.fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 30_000)
        .map_err(|e| e.to_string())?;
    let mut s = sqe(IDENTIFY, 0, 42, SglDescriptor::transport_data_block(4096));
    s.cdw10 = 1;
    let st = status_of(&mut a, s, &[], 4096)?;
    expect_status(
        "Identify before CC.EN",
        st,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
    )
}

pub fn command_before_connect(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let mut s = sqe(IDENTIFY, 0, 43, SglDescriptor::transport_data_block(4096));
    s.cdw10 = 1;
    let st = status_of(&mut c, s, &[], 4096)?;
    expect_status(
        "Identify before Connect",
        st,
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
    )
}

fn property(
    c: &mut Client,
    fct: u8,
    offset: u32,
    size: PropertySize,
    cid: u16,
) -> Result<Status, String> {
    let mut s = PropertyCommand {
        size,
        offset,
        value: 0x1234_5678,
    }
    .to_sqe(fct, cid);
    s.flags = nvme::spec::sqe_flags::PSDT_SGL;
    s.dptr = SglDescriptor::transport_data_block(0);
    status_of(c, s, &[], 0)
}

/// CAP, VS and CSTS are read-only (NVMe Base 2.0 §3.1.3): Invalid Field, and they keep
/// their values.
pub fn property_set_read_only(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let cap = a.property_get(reg::CAP, true).map_err(|e| e.to_string())?;
    let vs = a.property_get(reg::VS, false).map_err(|e| e.to_string())?;
    for (off, size) in [
        (reg::CAP, PropertySize::Eight),
        (reg::VS, PropertySize::Four),
        (reg::CSTS, PropertySize::Four),
    ] {
        let st = property(&mut a, fctype::PROPERTY_SET, off, size, 50)?;
        expect_status(
            &format!("Property Set {off:#x}"),
            st,
            Status::INVALID_FIELD.with_dnr(),
        )?;
    }
    expect(
        a.property_get(reg::CAP, true).ok() == Some(cap)
            && a.property_get(reg::VS, false).ok() == Some(vs),
        || "a read-only property changed".into(),
    )?;
    let csts = a
        .property_get(reg::CSTS, false)
        .map_err(|e| e.to_string())?;
    expect(csts & 1 == 1, || format!("CSTS {csts:#x} lost RDY"))
}

pub fn property_get_unknown_offset(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let st = property(&mut a, fctype::PROPERTY_GET, 0x50, PropertySize::Four, 51)?;
    expect_status("Property Get 0x50", st, Status::INVALID_FIELD.with_dnr())
}

/// Property Get/Set belong to the admin queue (NVMe-oF 1.1 §3.3.2).
pub fn property_on_io_queue(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let st = property(
        &mut io,
        fctype::PROPERTY_GET,
        reg::CSTS,
        PropertySize::Four,
        52,
    )?;
    expect_status(
        "Property Get on I/O queue",
        st,
        Status::INVALID_OPCODE.with_dnr(),
    )
}

pub fn unknown_fabrics_type(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let mut s = sqe(FABRICS, 0, 53, SglDescriptor::transport_data_block(0));
    s.nsid = 0x55; // fctype is byte 4
    let st = status_of(&mut a, s, &[], 0)?;
    expect_status("fctype 0x55", st, Status::INVALID_OPCODE.with_dnr())
}

pub fn discovery_io_connect(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    let cqe = connect(&mut c, 1, 31, 0xffff, DISCOVERY_NQN, HOSTNQN)?;
    expect_invalid_param(cqe, false, ConnectCommand::OFFSET_QID)
}

fn log_page_sqe(lid: u8, numd: u32, offset: u64, sgl_len: u32, cid: u16) -> Sqe {
    let mut s = sqe(
        GET_LOG_PAGE,
        0xffff_ffff,
        cid,
        SglDescriptor::transport_data_block(sgl_len),
    );
    s.cdw10 = lid as u32 | (numd & 0xffff) << 16;
    s.cdw11 = numd >> 16;
    s.cdw12 = offset as u32;
    s.cdw13 = (offset >> 32) as u32;
    s
}

/// A buffer above MDTS: refused by the transport before anything is sized from it.
pub fn get_log_page_above_mdts(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let len = 16 << 20;
    let s = log_page_sqe(lid::SMART, len / 4 - 1, 0, len, 60);
    let st = status_of(&mut a, s, &[], 0)?;
    expect_status(
        "16 MiB Get Log Page",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

/// NUMD (the maximum, 16 GiB) larger than the host's buffer.
pub fn get_log_page_numd_beyond_buffer(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let s = log_page_sqe(lid::SMART, u32::MAX, 0, 4096, 61);
    let st = status_of(&mut a, s, &[], 0)?;
    expect_status("NUMD 2^32", st, Status::DATA_SGL_LENGTH_INVALID.with_dnr())
}

/// NVMe Base 2.0 §5.16: an offset beyond the log page is Invalid Field.
pub fn get_log_page_offset_past_end(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    for offset in [512u64, 4096, !3] {
        let s = log_page_sqe(lid::SMART, 127, offset, 512, 62);
        let st = status_of(&mut a, s, &[], 0)?;
        expect_status(
            &format!("SMART log at offset {offset:#x}"),
            st,
            Status::INVALID_FIELD.with_dnr(),
        )?;
    }
    // The partial read the spec allows: offset inside, length past the end, zero-filled.
    let page = a
        .get_log_page(lid::SMART, 0xffff_ffff, 4096, 256)
        .map_err(|e| e.to_string())?;
    expect(page[256..].iter().all(|&b| b == 0), || {
        "bytes past the SMART log are not zero".into()
    })
}

/// The discovery log on an I/O controller (interop notes: never) and an unknown LID.
pub fn get_log_page_unknown_lid(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    for lid in [0x70u8, 0xee] {
        let s = log_page_sqe(lid, 127, 0, 512, 63);
        let st = status_of(&mut a, s, &[], 512)?;
        expect_status(
            &format!("LID {lid:#x}"),
            st,
            Status::INVALID_LOG_PAGE.with_dnr(),
        )?;
    }
    Ok(())
}

pub fn identify_bad_cns(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let mut s = sqe(IDENTIFY, 0, 64, SglDescriptor::transport_data_block(4096));
    s.cdw10 = 0x55;
    let st = status_of(&mut a, s, &[], 4096)?;
    expect_status("CNS 0x55", st, Status::INVALID_FIELD.with_dnr())
}

/// AERL is 0's based: AERL + 1 requests are held, the next one fails with Asynchronous Event
/// Request Limit Exceeded (NVMe Base 2.0 §5.2) and the held ones stay held.
pub fn aer_limit(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let id = a.identify(1, 0).map_err(|e| e.to_string())?;
    let aerl = id[259] as u16;
    for cid in 0..=aerl {
        let s = sqe(AER, 0, 100 + cid, SglDescriptor::transport_data_block(0));
        a.submit_exact(s, &[], 0).map_err(|e| e.to_string())?;
    }
    let s = sqe(
        AER,
        0,
        100 + aerl + 1,
        SglDescriptor::transport_data_block(0),
    );
    let st = status_of(&mut a, s, &[], 0)?;
    expect_status(
        &format!("AER #{} (AERL {aerl})", aerl + 2),
        st,
        Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED.with_dnr(),
    )?;
    // The queue still works and no held AER completed meanwhile.
    a.keep_alive().map_err(|e| e.to_string())?;
    expect(a.outstanding() == aerl as usize + 1, || {
        format!(
            "{} AERs outstanding, expected {}",
            a.outstanding(),
            aerl + 1
        )
    })
}

pub fn unknown_admin_opcode(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let s = sqe(0xc5, 0, 65, SglDescriptor::transport_data_block(0));
    let st = status_of(&mut a, s, &[], 0)?;
    expect_status("admin opcode 0xc5", st, Status::INVALID_OPCODE.with_dnr())
}

/// FID 00h is reserved (NVMe Base 2.0 Figure 317).
pub fn get_features_reserved_fid(d: &Daemon) -> Result<(), String> {
    let (mut a, _) = admin(d);
    let s = sqe(GET_FEATURES, 0, 66, SglDescriptor::transport_data_block(0));
    let st = status_of(&mut a, s, &[], 0)?;
    expect_status("Get Features FID 0", st, Status::INVALID_FIELD.with_dnr())
}

fn io_status(io: &mut Client, s: Sqe, capsule: &[u8], read_len: u32) -> Result<Status, String> {
    status_of(io, s, capsule, read_len)
}

/// LBA ranges past the end (NVM Command Set 1.0 §3.2.4: LBA Out of Range), including the
/// ones whose SLBA + NLB wraps around 2^64.
pub fn lba_out_of_range(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    for (slba, nlb) in [
        (RAM_BLOCKS, 1u32),
        (RAM_BLOCKS - 1, 2),
        (u64::MAX, 2),
        (u64::MAX - 3, 8),
        (1 << 63, 1),
    ] {
        let st = io_status(&mut io, read_sqe(RAM_NSID, slba, nlb, 70), &[], nlb * BLOCK)?;
        expect_status(
            &format!("read {slba:#x}+{nlb}"),
            st,
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        )?;
        let w = write_sqe(
            RAM_NSID,
            slba,
            nlb,
            71,
            SglDescriptor::in_capsule(0, nlb * BLOCK),
        );
        let st = io_status(&mut io, w, &vec![0xee; (nlb * BLOCK) as usize], 0)?;
        expect_status(
            &format!("write {slba:#x}+{nlb}"),
            st,
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        )?;
    }
    // The last block itself is fine.
    write(&mut io, RAM_NSID, RAM_BLOCKS - 1, pattern(512, 5))?;
    read_back(&mut io, RAM_NSID, RAM_BLOCKS - 1, 1).map(|_| ())
}

pub fn bad_namespace_ids(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    for nsid in [0u32, 0xffff_ffff, 77] {
        let st = io_status(&mut io, read_sqe(nsid, 0, 1, 72), &[], 512)?;
        expect_status(
            &format!("read nsid {nsid:#x}"),
            st,
            Status::INVALID_NAMESPACE.with_dnr(),
        )?;
    }
    Ok(())
}

pub fn write_to_read_only_namespace(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let w = write_sqe(READ_ONLY_NSID, 0, 1, 73, SglDescriptor::in_capsule(0, 512));
    let st = io_status(&mut io, w, &[1; 512], 0)?;
    expect_status(
        "write read-only ns",
        st,
        Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
    )?;
    let back = read_back(&mut io, READ_ONLY_NSID, 0, 1)?;
    expect(back == vec![0; 512], || {
        "read-only namespace changed".into()
    })
}

/// The SGL must describe exactly NLB blocks.
pub fn sgl_length_differs_from_nlb(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let mut s = read_sqe(RAM_NSID, 0, 8, 74);
    s.dptr = SglDescriptor::transport_data_block(512);
    let st = io_status(&mut io, s, &[], 512)?;
    expect_status(
        "read 8 blocks into 512 B",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

/// NVMe/TCP 1.0 §3.5.1: only Transport SGL Data Block and (in-capsule) Data Block with
/// offset; keyed (RDMA), segment, last segment, bit bucket and address forms are invalid.
pub fn unsupported_sgl_types(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    for ty in [
        SglType::KeyedDataBlock,
        SglType::KeyedDataBlockInvalidate,
        SglType::DataBlockAddress,
        SglType::Other {
            sgl_type: 0x1,
            subtype: 0,
        },
        SglType::Other {
            sgl_type: 0x2,
            subtype: 0,
        },
        SglType::Other {
            sgl_type: 0x3,
            subtype: 0,
        },
        SglType::Other {
            sgl_type: 0x5,
            subtype: 0,
        },
    ] {
        let mut s = read_sqe(RAM_NSID, 0, 1, 75);
        s.dptr = SglDescriptor {
            address: 0x1000,
            length: 512,
            key: 0x1234,
            sgl_type: ty,
        };
        let st = io_status(&mut io, s, &[], 512)?;
        expect_status(
            &format!("SGL {ty:?}"),
            st,
            Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(),
        )?;
    }
    Ok(())
}

/// Interop notes: an offset (in-capsule) SGL on a read is an SGL offset error.
pub fn offset_sgl_on_read(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let mut s = read_sqe(RAM_NSID, 0, 1, 76);
    s.dptr = SglDescriptor::in_capsule(0, 512);
    let st = io_status(&mut io, s, &[0; 512], 0)?;
    expect_status(
        "offset SGL on a read",
        st,
        Status::SGL_OFFSET_INVALID.with_dnr(),
    )
}

pub fn transport_sgl_with_address(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let mut s = read_sqe(RAM_NSID, 0, 1, 77);
    s.dptr.address = 4096;
    let st = io_status(&mut io, s, &[], 512)?;
    expect_status(
        "transport SGL address 4096",
        st,
        Status::SGL_OFFSET_INVALID.with_dnr(),
    )
}

pub fn transport_sgl_above_mdts(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let nlb = 2 * MDTS / BLOCK;
    let st = io_status(&mut io, read_sqe(RAM_NSID, 0, nlb, 78), &[], 0)?;
    expect_status(
        "read of 2×MDTS",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

pub fn in_capsule_offset_beyond_data(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let s = write_sqe(RAM_NSID, 0, 1, 79, SglDescriptor::in_capsule(1024, 512));
    let st = io_status(&mut io, s, &[0; 512], 0)?;
    expect_status(
        "in-capsule offset 1024 of 512",
        st,
        Status::SGL_OFFSET_INVALID.with_dnr(),
    )
}

/// In-capsule data within the PDU limit but beyond this queue's IOCCSZ (4 KiB).
pub fn in_capsule_beyond_ioccsz(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let s = write_sqe(RAM_NSID, 0, 12, 80, SglDescriptor::in_capsule(0, 6144));
    let st = io_status(&mut io, s, &[0; 6144], 0)?;
    expect_status(
        "6 KiB in-capsule",
        st,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )
}

/// A transport SGL (data by R2T) on a capsule that carries data anyway.
pub fn transport_sgl_with_capsule_data(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let s = write_sqe(RAM_NSID, 0, 1, 81, SglDescriptor::transport_data_block(512));
    let st = io_status(&mut io, s, &[0; 512], 0)?;
    expect_status(
        "transport SGL with in-capsule data",
        st,
        Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(),
    )
}

/// NVMe-oF 1.1 §2.2: PSDT must be 01b. Fused operations (NVMe Base 2.0 §3.4.2): only
/// Compare (first) + Write (second) on the same LBAs; halves alone or mismatched are refused.
pub fn prp_and_fused_commands(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    // PRP, and a Read marked as the first half of a fused operation.
    for flags in [0x00u8, 0x80, 0x41] {
        let mut s = read_sqe(RAM_NSID, 0, 1, 82);
        s.flags = flags;
        let st = io_status(&mut io, s, &[], 512)?;
        expect_status(
            &format!("flags {flags:#x}"),
            st,
            Status::INVALID_FIELD.with_dnr(),
        )?;
    }
    // A second half alone.
    let mut s = read_sqe(RAM_NSID, 0, 1, 82);
    s.flags = 0x42;
    let st = io_status(&mut io, s, &[], 512)?;
    expect_status("second half alone", st, Status::ABORTED_MISSING_FUSED)?;
    let fused_sqe = |opcode: u8, slba: u64, fuse: u8| {
        let mut s = Client::write_sqe(RAM_NSID, slba, 1, false);
        s.opcode = opcode;
        s.flags |= fuse;
        s
    };
    let err = |e| format!("{e:?}");
    // A first half followed by an ordinary command: aborted as missing its partner.
    let c = io
        .submit(
            fused_sqe(nvm_opcode::COMPARE, 0, 1),
            DataOut::Write(vec![0; 512]),
        )
        .map_err(err)?;
    let r = io
        .submit(Client::read_sqe(RAM_NSID, 0, 1), DataOut::Read(512))
        .map_err(err)?;
    let st = io.wait(c).map_err(err)?.cqe.status;
    expect_status("first half alone", st, Status::ABORTED_MISSING_FUSED)?;
    expect_status(
        "the command after it",
        io.wait(r).map_err(err)?.cqe.status,
        Status::SUCCESS,
    )?;
    // Halves on different LBAs: both Invalid Field, nothing written.
    let c = io
        .submit(
            fused_sqe(nvm_opcode::COMPARE, 0, 1),
            DataOut::Write(vec![0; 512]),
        )
        .map_err(err)?;
    let w = io
        .submit(
            fused_sqe(nvm_opcode::WRITE, 1, 2),
            DataOut::Write(vec![0xee; 512]),
        )
        .map_err(err)?;
    for (what, cid) in [("mismatched first", c), ("mismatched second", w)] {
        let st = io.wait(cid).map_err(err)?.cqe.status;
        expect_status(what, st, Status::INVALID_FIELD.with_dnr())?;
    }
    let back = io.read(RAM_NSID, 1, 1, 512).map_err(err)?;
    if back.contains(&0xee) {
        return Err("a mismatched fused Write was executed".into());
    }
    Ok(())
}

pub fn unknown_io_opcodes(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    // Admin opcodes that are not NVM I/O opcodes too (AER's 0Ch is Verify on an I/O queue).
    for opcode in [0x55u8, IDENTIFY, KEEP_ALIVE, 0xff] {
        let s = sqe(opcode, RAM_NSID, 83, SglDescriptor::transport_data_block(0));
        let st = io_status(&mut io, s, &[], 0)?;
        expect_status(
            &format!("I/O opcode {opcode:#x}"),
            st,
            Status::INVALID_OPCODE.with_dnr(),
        )?;
    }
    Ok(())
}

/// Reservation commands (NVMe Base 2.0 §7.5–7.8) with bad namespaces, keys, types, lengths
/// and fields. The registration made here is removed at the end and no reservation is ever
/// acquired, so the other cases (same Host Identifier) are unaffected.
pub fn hostile_reservation_commands(d: &Daemon) -> Result<(), String> {
    use nvme::spec::nvm_opcode::{
        RESERVATION_ACQUIRE as ACQ, RESERVATION_REGISTER as REG, RESERVATION_RELEASE as REL,
        RESERVATION_REPORT as REP,
    };
    let (_a, mut io) = controller(d);
    let keys = |a: u64, b: u64| [a.to_le_bytes(), b.to_le_bytes()].concat();
    let send = |io: &mut Client, op: u8, nsid: u32, cdw10: u32, data: &[u8]| {
        let mut s = sqe(
            op,
            nsid,
            90,
            SglDescriptor::in_capsule(0, data.len() as u32),
        );
        s.cdw10 = cdw10;
        io_status(io, s, data, 0)
    };
    let conflict = Status::RESERVATION_CONFLICT.with_dnr();
    let invalid = Status::INVALID_FIELD.with_dnr();
    for nsid in [0u32, 0xffff_ffff, 77] {
        for op in [REG, ACQ, REL] {
            let st = send(&mut io, op, nsid, 0, &keys(1, 2))?;
            let what = format!("opcode {op:#x} nsid {nsid:#x}");
            expect_status(&what, st, Status::INVALID_NAMESPACE.with_dnr())?;
        }
        let mut s = sqe(REP, nsid, 91, SglDescriptor::transport_data_block(4096));
        (s.cdw10, s.cdw11) = (1023, 1);
        let st = io_status(&mut io, s, &[], 4096)?;
        expect_status("report", st, Status::INVALID_NAMESPACE.with_dnr())?;
    }
    // Lengths the command does not have, a bad action, CPTPL 11b (PTPL not supported).
    let short = send(&mut io, REG, RAM_NSID, 0, &[0; 8])?;
    expect_status(
        "register, 8 bytes",
        short,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )?;
    let long = send(&mut io, REG, RAM_NSID, 0, &[0; 4096])?;
    expect_status(
        "register, 4 KiB",
        long,
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
    )?;
    expect_status(
        "RREGA 7",
        send(&mut io, REG, RAM_NSID, 7, &keys(0, 1))?,
        invalid,
    )?;
    expect_status(
        "CPTPL",
        send(&mut io, REG, RAM_NSID, 3 << 30, &keys(0, 1))?,
        invalid,
    )?;
    // Unregistered: every key conflicts.
    expect_status(
        "acquire",
        send(&mut io, ACQ, RAM_NSID, 1 << 8, &keys(0, 0))?,
        conflict,
    )?;
    let key = 0x5eed_0000_0000_0001u64;
    let st = send(&mut io, REG, RAM_NSID, 0, &keys(0, key))?;
    expect_status("register", st, Status::SUCCESS)?;
    let result = (|| {
        let st = send(&mut io, REG, RAM_NSID, 0, &keys(0, key + 1))?;
        expect_status("register another key", st, conflict)?;
        let st = send(&mut io, ACQ, RAM_NSID, 1 << 8, &keys(key + 1, 0))?;
        expect_status("acquire, wrong key", st, conflict)?;
        for rtype in [0u32, 7, 0xff] {
            let st = send(&mut io, ACQ, RAM_NSID, rtype << 8, &keys(key, 0))?;
            expect_status(&format!("acquire type {rtype}"), st, invalid)?;
        }
        // IEKEY is obsolete in Acquire; RACQA 3..7 are reserved.
        expect_status(
            "IEKEY",
            send(&mut io, ACQ, RAM_NSID, 1 << 8 | 8, &keys(key, 0))?,
            invalid,
        )?;
        expect_status(
            "RACQA 5",
            send(&mut io, ACQ, RAM_NSID, 1 << 8 | 5, &keys(key, 0))?,
            invalid,
        )?;
        let st = send(&mut io, REL, RAM_NSID, 1 << 8, &keys(key + 1, 0)[..8])?;
        expect_status("release, wrong key", st, conflict)?;
        // Report without EDS cannot carry 128-bit host IDs; NUMD far beyond the buffer.
        let mut s = sqe(REP, RAM_NSID, 92, SglDescriptor::transport_data_block(64));
        s.cdw10 = 15;
        let st = io_status(&mut io, s, &[], 64)?;
        expect_status(
            "report without EDS",
            st,
            Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr(),
        )?;
        let mut s = sqe(REP, RAM_NSID, 93, SglDescriptor::transport_data_block(128));
        (s.cdw10, s.cdw11) = (u32::MAX, 1);
        let done = io
            .execute(s, DataOut::Read(128))
            .map_err(|e| format!("report: {e}"))?;
        expect_status("report", done.cqe.status, Status::SUCCESS)?;
        let page = done.data;
        expect(
            page.len() == 128 && page[5] == 1 && page[64 + 16..64 + 32] == HOSTID,
            || format!("report: {page:02x?}"),
        )
    })();
    let st = send(&mut io, REG, RAM_NSID, 1, &keys(key, 0))?;
    result.and(expect_status("unregister", st, Status::SUCCESS))
}

/// The Reservation Notification log page (80h) and mask feature (82h) with offsets past the
/// 64-byte page, a NUMD beyond the buffer, reserved mask bits, namespaces that do not exist,
/// SV and reserved SEL values; then a plain read of the page still works.
pub fn hostile_reservation_notification_requests(d: &Daemon) -> Result<(), String> {
    use nvme::spec::admin_opcode::SET_FEATURES;
    use nvme::spec::fid::RESERVATION_NOTIFICATION_MASK as MASK;
    let (mut a, _) = admin(d);
    let invalid = Status::INVALID_FIELD.with_dnr();
    for (numd, offset, len, want) in [
        (15u32, 64u64, 64u32, invalid),
        (15, 2, 64, invalid),
        (15, 1 << 40, 64, invalid),
        (u32::MAX, 0, 64, Status::DATA_SGL_LENGTH_INVALID.with_dnr()),
    ] {
        let s = log_page_sqe(lid::RESERVATION_NOTIFICATION, numd, offset, len, 94);
        let st = status_of(&mut a, s, &[], len)?;
        expect_status(&format!("log 80h at {offset:#x}, NUMD {numd:#x}"), st, want)?;
    }
    let feature = |op: u8, nsid: u32, cdw10_high: u32, cdw11: u32| {
        let mut s = sqe(op, nsid, 95, SglDescriptor::transport_data_block(0));
        (s.cdw10, s.cdw11) = (MASK as u32 | cdw10_high, cdw11);
        s
    };
    for (what, s, want) in [
        ("mask bit 0", feature(SET_FEATURES, RAM_NSID, 0, 1), invalid),
        (
            "mask bit 4",
            feature(SET_FEATURES, RAM_NSID, 0, 1 << 4),
            invalid,
        ),
        (
            "mask all ones",
            feature(SET_FEATURES, u32::MAX, 0, u32::MAX),
            invalid,
        ),
        (
            "set nsid 0",
            feature(SET_FEATURES, 0, 0, 2),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "set nsid 77",
            feature(SET_FEATURES, 77, 0, 2),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "set SV",
            feature(SET_FEATURES, RAM_NSID, 1 << 31, 0),
            Status::FEATURE_NOT_SAVEABLE.with_dnr(),
        ),
        (
            "get nsid FFFFFFFFh",
            feature(GET_FEATURES, u32::MAX, 0, 0),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            "get SEL 5",
            feature(GET_FEATURES, RAM_NSID, 5 << 8, 0),
            invalid,
        ),
    ] {
        let st = status_of(&mut a, s, &[], 0)?;
        expect_status(what, st, want)?;
    }
    let page = a
        .get_log_page(lid::RESERVATION_NOTIFICATION, 0, 64, 0)
        .map_err(|e| e.to_string())?;
    expect(page.len() == 64, || {
        format!("log 80h: {} bytes", page.len())
    })
}

/// After every refused command above, the same queue still moves data correctly.
pub fn queue_survives_refusals(d: &Daemon) -> Result<(), String> {
    let (_a, mut io) = controller(d);
    let _ = io_status(&mut io, read_sqe(0, 0, 1, 84), &[], 512)?;
    let _ = io_status(&mut io, read_sqe(RAM_NSID, u64::MAX, 2, 85), &[], 1024)?;
    let data = pattern(16384, 84);
    io.execute(
        Client::write_sqe(RAM_NSID, 4000, 32, false),
        DataOut::WriteR2t(data.clone()),
    )
    .map_err(|e| e.to_string())?;
    let back = read_back(&mut io, RAM_NSID, 4000, 32)?;
    expect(back == data, || "data differs after refusals".into())
}

/// CC.EN 1 → 0 resets the controller (NVMe Base 2.0 §3.7.2): its I/O queues are deleted, so
/// the target closes their connections; the admin queue stays and reports CSTS.RDY = 0.
pub fn io_queue_after_controller_reset(d: &Daemon) -> Result<(), String> {
    let (mut a, mut io) = controller(d);
    a.property_set(reg::CC, 0, false)
        .map_err(|e| e.to_string())?;
    let st = io
        .execute(Client::read_sqe(RAM_NSID, 0, 1), DataOut::Read(512))
        .map(|c| c.cqe.status);
    // Either the read was refused before the close or the close came first.
    match st {
        Ok(s) if s.is_success() => {
            return Err("read on an I/O queue of a reset controller succeeded".into())
        }
        _ => {}
    }
    expect_silent_close(&mut io).or_else(|e| match io.recv_pdu() {
        Err(_) => Ok(()),
        Ok(p) => Err(format!("{e}; then {:?}", p.header.pdu_type())),
    })?;
    let csts = a
        .property_get(reg::CSTS, false)
        .map_err(|e| e.to_string())?;
    expect(csts & 1 == 0, || {
        format!("CSTS {csts:#x} still RDY after CC.EN = 0")
    })
}

/// Fabrics Disconnect (NVMe-oF 1.1 §3.3.4) on an I/O queue: completes, then the queue's
/// connection closes; the controller and its admin queue live on.
pub fn disconnect_io_queue(d: &Daemon) -> Result<(), String> {
    let (mut a, mut io) = controller(d);
    let mut s = sqe(FABRICS, 0, 90, SglDescriptor::transport_data_block(0));
    s.nsid = fctype::DISCONNECT as u32;
    let st = status_of(&mut io, s, &[], 0)?;
    expect_status("Disconnect", st, Status::SUCCESS)?;
    expect_silent_close(&mut io)?;
    a.keep_alive()
        .map_err(|e| format!("admin queue after the I/O queue left: {e}"))
}

/// The discovery log (LID 70h) with offsets past its end, a NUMD beyond the buffer and a
/// buffer beyond MDTS; then a normal header read still works.
pub fn discovery_log_abuse(d: &Daemon) -> Result<(), String> {
    let mut c = established(d);
    c.fabrics_connect(0, 31, 0xffff, DISCOVERY_NQN, HOSTNQN, HOSTID, 0)
        .map_err(|e| e.to_string())?;
    c.enable_controller(WAIT).map_err(|e| e.to_string())?;
    for (numd, offset, len, want) in [
        (127u32, 1u64 << 40, 512u32, Status::INVALID_FIELD.with_dnr()),
        (127, 2, 512, Status::INVALID_FIELD.with_dnr()),
        (
            u32::MAX,
            0,
            4096,
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
        ),
        (
            1023,
            0,
            4 * MDTS,
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
        ),
    ] {
        let mut s = log_page_sqe(lid::DISCOVERY, numd, offset, len, 67);
        s.nsid = 0;
        let st = status_of(&mut c, s, &[], 0)?;
        expect_status(
            &format!("discovery log NUMD {numd:#x} offset {offset:#x} buffer {len}"),
            st,
            want,
        )?;
    }
    let header = c
        .get_log_page(0x70, 0, 1024, 0)
        .map_err(|e| e.to_string())?;
    let numrec = u64::from_le_bytes(header[8..16].try_into().unwrap());
    expect(numrec >= 1, || {
        format!("discovery log lists {numrec} records")
    })
}

pub const CASES: &[(&str, CaseFn)] = &[
    ("io_connect_wrong_cntlid", io_connect_wrong_cntlid),
    ("io_connect_other_hostnqn", io_connect_other_hostnqn),
    ("io_connect_qid_above_granted", io_connect_qid_above_granted),
    ("io_connect_sqsize_zero", io_connect_sqsize_zero),
    ("io_connect_sqsize_above_mqes", io_connect_sqsize_above_mqes),
    ("admin_connect_sqsize_zero", admin_connect_sqsize_zero),
    ("admin_connect_static_cntlid", admin_connect_static_cntlid),
    ("connect_unknown_subsystem", connect_unknown_subsystem),
    ("connect_host_not_allowed", connect_host_not_allowed),
    ("connect_recfmt_nonzero", connect_recfmt_nonzero),
    ("connect_twice", connect_twice),
    ("io_connect_duplicate_qid", io_connect_duplicate_qid),
    ("connect_data_short", connect_data_short),
    ("connect_data_long", connect_data_long),
    ("io_connect_before_enable", io_connect_before_enable),
    ("admin_command_before_enable", admin_command_before_enable),
    ("command_before_connect", command_before_connect),
    ("property_set_read_only", property_set_read_only),
    ("property_get_unknown_offset", property_get_unknown_offset),
    ("property_on_io_queue", property_on_io_queue),
    ("unknown_fabrics_type", unknown_fabrics_type),
    ("discovery_io_connect", discovery_io_connect),
    ("get_log_page_above_mdts", get_log_page_above_mdts),
    (
        "get_log_page_numd_beyond_buffer",
        get_log_page_numd_beyond_buffer,
    ),
    ("get_log_page_offset_past_end", get_log_page_offset_past_end),
    ("get_log_page_unknown_lid", get_log_page_unknown_lid),
    ("identify_bad_cns", identify_bad_cns),
    ("aer_limit", aer_limit),
    ("unknown_admin_opcode", unknown_admin_opcode),
    ("get_features_reserved_fid", get_features_reserved_fid),
    ("lba_out_of_range", lba_out_of_range),
    ("bad_namespace_ids", bad_namespace_ids),
    ("write_to_read_only_namespace", write_to_read_only_namespace),
    ("sgl_length_differs_from_nlb", sgl_length_differs_from_nlb),
    ("unsupported_sgl_types", unsupported_sgl_types),
    ("offset_sgl_on_read", offset_sgl_on_read),
    ("transport_sgl_with_address", transport_sgl_with_address),
    ("transport_sgl_above_mdts", transport_sgl_above_mdts),
    (
        "in_capsule_offset_beyond_data",
        in_capsule_offset_beyond_data,
    ),
    ("in_capsule_beyond_ioccsz", in_capsule_beyond_ioccsz),
    (
        "transport_sgl_with_capsule_data",
        transport_sgl_with_capsule_data,
    ),
    ("prp_and_fused_commands", prp_and_fused_commands),
    ("unknown_io_opcodes", unknown_io_opcodes),
    ("queue_survives_refusals", queue_survives_refusals),
    (
        "io_queue_after_controller_reset",
        io_queue_after_controller_reset,
    ),
    ("disconnect_io_queue", disconnect_io_queue),
    ("hostile_reservation_commands", hostile_reservation_commands),
    (
        "hostile_reservation_notification_requests",
        hostile_reservation_notification_requests,
    ),
    ("discovery_log_abuse", discovery_log_abuse),
];
