//! Log pages (NVMe Base 2.0 §5.16.1): Error Information (01h, Figure 205), SMART / Health
//! Information (02h, Figure 207), Firmware Slot Information (03h, Figure 209), Changed
//! Namespace List (04h, Figure 210), Commands Supported and Effects (05h, Figure 211),
//! Asymmetric Namespace Access (0Ch, §5.16.1.13), the Discovery log (70h, Figures 262–264) and
//! Reservation Notification (80h).

use super::fabrics::encode_nqn;
use crate::spec::Status;
use codec::{put_u16_at, put_u32_at, put_u64_at, DecodeError, Reader};

fn u128_le(r: &mut Reader<'_>) -> Result<u128, DecodeError> {
    Ok(u128::from_le_bytes(r.take_array()?))
}

/// One Error Information log entry (Figure 205).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorLogEntry {
    /// Unique, incrementing; 0 means an empty entry.
    pub error_count: u64,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
    /// Byte (bits 7:0) and bit (10:8) of the command field in error, 0xffff if unknown.
    pub param_error_location: u16,
    pub lba: u64,
    pub nsid: u32,
    pub trtype: u8,
    pub command_specific: u64,
}

impl ErrorLogEntry {
    pub const SIZE: usize = 64;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_u64_at(&mut b, 0, self.error_count);
        put_u16_at(&mut b, 8, self.sqid);
        put_u16_at(&mut b, 10, self.cid);
        put_u16_at(&mut b, 12, self.status.to_field());
        put_u16_at(&mut b, 14, self.param_error_location);
        put_u64_at(&mut b, 16, self.lba);
        put_u32_at(&mut b, 24, self.nsid);
        b[29] = self.trtype;
        put_u64_at(&mut b, 32, self.command_specific);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let error_count = r.u64()?;
        let sqid = r.u16()?;
        let cid = r.u16()?;
        let status = Status::from_field(r.u16()?);
        let param_error_location = r.u16()?;
        let lba = r.u64()?;
        let nsid = r.u32()?;
        let _vendor = r.u8()?;
        let trtype = r.u8()?;
        r.take(2)?;
        let command_specific = r.u64()?;
        r.take(24)?;
        r.expect_empty()?;
        Ok(Self {
            error_count,
            sqid,
            cid,
            status,
            param_error_location,
            lba,
            nsid,
            trtype,
            command_specific,
        })
    }
}

const _: () = assert!(ErrorLogEntry::SIZE == 64);

/// SMART / Health Information (Figure 207). 128-bit counters are kept as `u128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    pub critical_warning: u8,
    /// Kelvin; 0 = no temperature reported.
    pub composite_temperature: u16,
    pub available_spare: u8,
    pub available_spare_threshold: u8,
    pub percentage_used: u8,
    /// In thousands of 512-byte units, rounded up (Figure 207 note).
    pub data_units_read: u128,
    pub data_units_written: u128,
    pub host_read_commands: u128,
    pub host_write_commands: u128,
    /// Minutes.
    pub controller_busy_time: u128,
    pub power_cycles: u128,
    pub power_on_hours: u128,
    pub unsafe_shutdowns: u128,
    pub media_errors: u128,
    pub error_log_entries: u128,
}

impl SmartLog {
    pub const SIZE: usize = 512;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.critical_warning;
        put_u16_at(&mut b, 1, self.composite_temperature);
        b[3] = self.available_spare;
        b[4] = self.available_spare_threshold;
        b[5] = self.percentage_used;
        let counters = [
            self.data_units_read,
            self.data_units_written,
            self.host_read_commands,
            self.host_write_commands,
            self.controller_busy_time,
            self.power_cycles,
            self.power_on_hours,
            self.unsafe_shutdowns,
            self.media_errors,
            self.error_log_entries,
        ];
        for (i, c) in counters.iter().enumerate() {
            b[32 + 16 * i..48 + 16 * i].copy_from_slice(&c.to_le_bytes());
        }
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let critical_warning = r.u8()?;
        let composite_temperature = r.u16()?;
        let available_spare = r.u8()?;
        let available_spare_threshold = r.u8()?;
        let percentage_used = r.u8()?;
        r.take(26)?;
        let s = Self {
            critical_warning,
            composite_temperature,
            available_spare,
            available_spare_threshold,
            percentage_used,
            data_units_read: u128_le(&mut r)?,
            data_units_written: u128_le(&mut r)?,
            host_read_commands: u128_le(&mut r)?,
            host_write_commands: u128_le(&mut r)?,
            controller_busy_time: u128_le(&mut r)?,
            power_cycles: u128_le(&mut r)?,
            power_on_hours: u128_le(&mut r)?,
            unsafe_shutdowns: u128_le(&mut r)?,
            media_errors: u128_le(&mut r)?,
            error_log_entries: u128_le(&mut r)?,
        };
        r.take(Self::SIZE - 192)?;
        r.expect_empty()?;
        Ok(s)
    }

    /// Bytes → SMART data units (1000 × 512 bytes, rounded up).
    pub fn data_units(bytes: u64) -> u128 {
        (bytes as u128).div_ceil(512).div_ceil(1000)
    }
}

const _: () = assert!(SmartLog::SIZE == 512);

/// Firmware Slot Information (Figure 209).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info: bits 2:0 active slot.
    pub afi: u8,
    /// Firmware revision per slot 1..=7, space-padded ASCII (zero = empty slot).
    pub frs: [[u8; 8]; 7],
}

impl FirmwareSlotLog {
    pub const SIZE: usize = 512;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.afi;
        for (i, f) in self.frs.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(f);
        }
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let afi = r.u8()?;
        r.take(7)?;
        let mut frs = [[0u8; 8]; 7];
        for f in &mut frs {
            *f = r.take_array()?;
        }
        r.take(Self::SIZE - 64)?;
        r.expect_empty()?;
        Ok(Self { afi, frs })
    }
}

const _: () = assert!(FirmwareSlotLog::SIZE == 512);

/// Changed Namespace List (Figure 210): up to 1024 NSIDs; more than that is reported as a
/// single 0xffffffff entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChangedNsList {
    pub nsids: Vec<u32>,
}

impl ChangedNsList {
    pub const SIZE: usize = 4096;
    pub const MAX_ENTRIES: usize = Self::SIZE / 4;
    pub const OVERFLOW: u32 = 0xffff_ffff;

    pub fn encode(&self) -> Box<[u8; Self::SIZE]> {
        let mut b = Box::new([0u8; Self::SIZE]);
        if self.nsids.len() > Self::MAX_ENTRIES {
            put_u32_at(&mut b, 0, Self::OVERFLOW);
        } else {
            for (slot, nsid) in b.chunks_exact_mut(4).zip(&self.nsids) {
                slot.copy_from_slice(&nsid.to_le_bytes());
            }
        }
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let page = r.take(Self::SIZE)?;
        r.expect_empty()?;
        Ok(Self {
            nsids: page
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .take_while(|&n| n != 0)
                .collect(),
        })
    }
}

/// Commands Supported and Effects (Figure 211/212).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandEffectsLog {
    pub admin: [u32; 256],
    pub io: [u32; 256],
}

impl Default for CommandEffectsLog {
    fn default() -> Self {
        Self {
            admin: [0; 256],
            io: [0; 256],
        }
    }
}

impl CommandEffectsLog {
    pub const SIZE: usize = 4096;

    pub fn encode(&self) -> Box<[u8; Self::SIZE]> {
        let mut b = Box::new([0u8; Self::SIZE]);
        for (i, v) in self.admin.iter().chain(self.io.iter()).enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let mut out = Self::default();
        for v in out.admin.iter_mut().chain(out.io.iter_mut()) {
            *v = r.u32()?;
        }
        r.take(Self::SIZE - 2048)?;
        r.expect_empty()?;
        Ok(out)
    }
}

const _: () = assert!(CommandEffectsLog::SIZE == 4096);

/// Discovery log page header (Figure 262).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiscoveryLogHeader {
    pub genctr: u64,
    pub numrec: u64,
    pub recfmt: u16,
}

impl DiscoveryLogHeader {
    pub const SIZE: usize = 1024;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_u64_at(&mut b, 0, self.genctr);
        put_u64_at(&mut b, 8, self.numrec);
        put_u16_at(&mut b, 16, self.recfmt);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let h = Self {
            genctr: r.u64()?,
            numrec: r.u64()?,
            recfmt: r.u16()?,
        };
        r.take(Self::SIZE - 18)?;
        r.expect_empty()?;
        Ok(h)
    }
}

const _: () = assert!(DiscoveryLogHeader::SIZE == 1024);

/// One Discovery log page entry (Figure 263).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryLogEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub eflags: u16,
    /// Transport service identifier (the TCP/RDMA port number as decimal ASCII).
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// Transport specific address subtype, raw.
    pub tsas: [u8; 256],
}

impl DiscoveryLogEntry {
    pub const SIZE: usize = 1024;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16_at(&mut b, 4, self.portid);
        put_u16_at(&mut b, 6, self.cntlid);
        put_u16_at(&mut b, 8, self.asqsz);
        put_u16_at(&mut b, 10, self.eflags);
        // TRSVCID and TRADDR are space-padded ASCII (Figure 263); SUBNQN is NUL-terminated.
        space_pad(&mut b[32..64], &self.trsvcid);
        encode_nqn(&mut b[256..512], &self.subnqn);
        space_pad(&mut b[512..768], &self.traddr);
        b[768..1024].copy_from_slice(&self.tsas);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let trtype = r.u8()?;
        let adrfam = r.u8()?;
        let subtype = r.u8()?;
        let treq = r.u8()?;
        let portid = r.u16()?;
        let cntlid = r.u16()?;
        let asqsz = r.u16()?;
        let eflags = r.u16()?;
        r.take(20)?;
        let trsvcid = trimmed(r.take(32)?);
        r.take(192)?;
        let subnqn = trimmed(r.take(256)?);
        let traddr = trimmed(r.take(256)?);
        let tsas = r.take_array()?;
        r.expect_empty()?;
        Ok(Self {
            trtype,
            adrfam,
            subtype,
            treq,
            portid,
            cntlid,
            asqsz,
            eflags,
            trsvcid,
            subnqn,
            traddr,
            tsas,
        })
    }
}

const _: () = assert!(DiscoveryLogEntry::SIZE == 1024);

/// One ANA Group Descriptor of the ANA log page (NVMe Base 2.0 §5.16.1.13): ANAGRPID, NNSIDS,
/// CHGCNT, ANA state, 15 reserved bytes, then NNSIDS namespace IDs in ascending order (the
/// Linux host walks its namespace list and this list side by side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroupDescriptor {
    pub grpid: u32,
    /// Change count of this descriptor (the last time its state or NSID list changed).
    pub chgcnt: u64,
    /// ANA state (01h optimized … 0Fh change), bits 3:0 of byte 16.
    pub state: u8,
    /// Empty when the host asked for groups only (RGO).
    pub nsids: Vec<u32>,
}

impl AnaGroupDescriptor {
    /// Bytes before the NSID list.
    pub const HEADER: usize = 32;

    pub fn encoded_len(&self) -> usize {
        Self::HEADER + 4 * self.nsids.len()
    }
}

/// The Asymmetric Namespace Access log page (log identifier 0Ch, NVMe Base 2.0 §5.16.1.13):
/// a 16-byte header (CHGCNT, NGRPS) followed by NGRPS variable-length group descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnaLog {
    pub chgcnt: u64,
    pub groups: Vec<AnaGroupDescriptor>,
}

impl AnaLog {
    pub const HEADER: usize = 16;
    /// Log Specific Parameter bit 0: Return Groups Only (no NSID lists).
    pub const LSP_RGO: u8 = 1 << 0;

    pub fn encoded_len(&self) -> usize {
        Self::HEADER
            + self
                .groups
                .iter()
                .map(AnaGroupDescriptor::encoded_len)
                .sum::<usize>()
    }

    /// NGRPS is 16 bits: callers keep the group count within ANAGRPMAX (far below 65535).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.encoded_len());
        b.extend_from_slice(&self.chgcnt.to_le_bytes());
        b.extend_from_slice(&(self.groups.len().min(u16::MAX as usize) as u16).to_le_bytes());
        b.resize(Self::HEADER, 0);
        for g in self.groups.iter().take(u16::MAX as usize) {
            let start = b.len();
            b.extend_from_slice(&g.grpid.to_le_bytes());
            b.extend_from_slice(&(g.nsids.len() as u32).to_le_bytes());
            b.extend_from_slice(&g.chgcnt.to_le_bytes());
            b.push(g.state & 0x0f);
            b.resize(start + AnaGroupDescriptor::HEADER, 0);
            for nsid in &g.nsids {
                b.extend_from_slice(&nsid.to_le_bytes());
            }
        }
        b
    }

    /// Decodes a page as a host receives it: anything after the last descriptor (the rest of
    /// the host's buffer) is ignored; every NNSIDS is checked against the bytes present before
    /// anything is allocated from it.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let chgcnt = r.u64()?;
        let ngrps = r.u16()?;
        r.take(Self::HEADER - 10)?;
        let mut groups = Vec::new();
        for _ in 0..ngrps {
            let grpid = r.u32()?;
            let nnsids = r.u32()?;
            let chgcnt = r.u64()?;
            let state = r.u8()? & 0x0f;
            r.take(AnaGroupDescriptor::HEADER - 17)?;
            let list_len = (nnsids as usize)
                .checked_mul(4)
                .filter(|&n| n <= r.remaining())
                .ok_or(DecodeError::InvalidValue {
                    field: "nnsids",
                    value: nnsids as u64,
                })?;
            let nsids = r
                .take(list_len)?
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            groups.push(AnaGroupDescriptor {
                grpid,
                chgcnt,
                state,
                nsids,
            });
        }
        Ok(Self { chgcnt, groups })
    }
}

const _: () = assert!(AnaLog::HEADER == 16 && AnaGroupDescriptor::HEADER == 32);

/// Reservation Notification log page (80h, NVMe Base 2.0 §5.16.1 "Reservation
/// Notification"): one notification per page. A page whose count is 0 is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReservationNotificationLog {
    /// Log Page Count: unique, incrementing, 0 only for an empty page.
    pub count: u64,
    /// Reservation Notification Log Page Type (`spec::resv::NOTICE_*`).
    pub kind: u8,
    /// Number of Available Log Pages after this one (255 meaning 255 or more).
    pub available: u8,
    pub nsid: u32,
}

impl ReservationNotificationLog {
    pub const SIZE: usize = 64;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_u64_at(&mut b, 0, self.count);
        b[8] = self.kind;
        b[9] = self.available;
        put_u32_at(&mut b, 12, self.nsid);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let count = r.u64()?;
        let kind = r.u8()?;
        let available = r.u8()?;
        r.take(2)?;
        let nsid = r.u32()?;
        r.take(48)?;
        r.expect_empty()?;
        Ok(Self {
            count,
            kind,
            available,
            nsid,
        })
    }
}

const _: () = assert!(ReservationNotificationLog::SIZE == 64);

fn space_pad(field: &mut [u8], s: &str) {
    field.fill(b' ');
    let n = s.len().min(field.len());
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Text of a space-padded or NUL-terminated field.
fn trimmed(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end])
        .trim_end_matches(' ')
        .to_string()
}

#[cfg(test)]
mod tests;
