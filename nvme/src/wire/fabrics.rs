//! Fabrics command fields (NVMe-oF 1.1 §3.3): Connect (Figure 19/20), the 1024-byte Connect
//! data (Figure 20), and Property Get / Property Set (Figures 25–28).

use super::sqe::Sqe;
use crate::spec::{fctype, FABRICS_OPCODE};
use codec::{put_u16_at, DecodeError, Reader};

/// Connect SQE fields (NVMe-oF 1.1 Figure 19). Byte offsets, kept for the IPO of a Connect
/// "Invalid Parameters" response (Figure 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCommand {
    /// Record format; only 0 is defined.
    pub recfmt: u16,
    pub qid: u16,
    /// 0's based submission queue size.
    pub sqsize: u16,
    /// Connect attributes; bit 2 = SQ flow control disabled.
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (admin queue only).
    pub kato: u32,
}

impl ConnectCommand {
    /// Byte offsets of the fields inside the 64-byte SQE.
    pub const OFFSET_RECFMT: u16 = 40;
    pub const OFFSET_QID: u16 = 42;
    pub const OFFSET_SQSIZE: u16 = 44;
    pub const OFFSET_CATTR: u16 = 46;
    pub const OFFSET_KATO: u16 = 48;
    /// CATTR bit 2: the host will not use SQ flow control (NVMe-oF 1.1 §3.3.2.1).
    pub const CATTR_SQ_FLOW_CONTROL_DISABLED: u8 = 1 << 2;

    pub fn from_sqe(sqe: &Sqe) -> Self {
        Self {
            recfmt: sqe.cdw10 as u16,
            qid: (sqe.cdw10 >> 16) as u16,
            sqsize: sqe.cdw11 as u16,
            cattr: (sqe.cdw11 >> 16) as u8,
            kato: sqe.cdw12,
        }
    }

    /// Builds the SQE (host side and tests).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            opcode: FABRICS_OPCODE,
            flags: 0x40,
            cid,
            nsid: fctype::CONNECT as u32,
            cdw10: self.recfmt as u32 | (self.qid as u32) << 16,
            cdw11: self.sqsize as u32 | (self.cattr as u32) << 16,
            cdw12: self.kato,
            ..Sqe::default()
        }
    }

    pub fn flow_control_disabled(&self) -> bool {
        self.cattr & Self::CATTR_SQ_FLOW_CONTROL_DISABLED != 0
    }
}

/// The data of a Connect command (NVMe-oF 1.1 Figure 20). NQNs are NUL-terminated within
/// their 256-byte fields; they are kept as decoded strings without the terminator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    pub const SIZE: usize = 1024;
    pub const NQN_FIELD: usize = 256;
    pub const OFFSET_HOSTID: u16 = 0;
    pub const OFFSET_CNTLID: u16 = 16;
    pub const OFFSET_SUBNQN: u16 = 256;
    pub const OFFSET_HOSTNQN: u16 = 512;

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let hostid = r.take_array()?;
        let cntlid = r.u16()?;
        r.take(238)?;
        let subnqn = decode_nqn(r.take(Self::NQN_FIELD)?, "subnqn")?;
        let hostnqn = decode_nqn(r.take(Self::NQN_FIELD)?, "hostnqn")?;
        r.take(256)?;
        r.expect_empty()?;
        Ok(Self {
            hostid,
            cntlid,
            subnqn,
            hostnqn,
        })
    }

    /// Encodes; NQNs longer than 255 bytes are truncated (the field must keep its NUL).
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..16].copy_from_slice(&self.hostid);
        put_u16_at(&mut out, 16, self.cntlid);
        encode_nqn(&mut out[256..512], &self.subnqn);
        encode_nqn(&mut out[512..768], &self.hostnqn);
        out
    }
}

const _: () = assert!(ConnectData::SIZE == 1024);
const _: () = assert!(ConnectData::OFFSET_HOSTNQN as usize + ConnectData::NQN_FIELD + 256 == 1024);

/// An NQN field: ASCII/UTF-8 up to the first NUL. A field without a NUL is invalid
/// (NVMe Base 2.0 §4.5: NQNs are at most 223 bytes, NUL-terminated).
fn decode_nqn(field: &[u8], name: &'static str) -> Result<String, DecodeError> {
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(DecodeError::InvalidValue {
            field: name,
            value: field.len() as u64,
        })?;
    std::str::from_utf8(&field[..end])
        .map(str::to_owned)
        .map_err(|e| DecodeError::InvalidValue {
            field: name,
            value: e.valid_up_to() as u64,
        })
}

/// Writes `nqn` NUL-terminated into `field` (truncating to leave room for the NUL).
pub fn encode_nqn(field: &mut [u8], nqn: &str) {
    let n = nqn.len().min(field.len().saturating_sub(1));
    field[..n].copy_from_slice(&nqn.as_bytes()[..n]);
    field[n..].fill(0);
}

/// Width of a property access (NVMe-oF 1.1 Figure 25/27, ATTRIB bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertySize {
    Four,
    Eight,
}

/// Property Get (fctype 04h) / Property Set (fctype 00h) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCommand {
    pub size: PropertySize,
    /// Register offset (NVMe Base 2.0 §3.1.3, Figure 33).
    pub offset: u32,
    /// Value to write (Property Set only): CDW12 low, CDW13 high.
    pub value: u64,
}

impl PropertyCommand {
    pub fn from_sqe(sqe: &Sqe) -> Result<Self, DecodeError> {
        let size = match sqe.cdw10 & 0x7 {
            0 => PropertySize::Four,
            1 => PropertySize::Eight,
            other => {
                return Err(DecodeError::InvalidValue {
                    field: "attrib",
                    value: other as u64,
                })
            }
        };
        Ok(Self {
            size,
            offset: sqe.cdw11,
            value: sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32,
        })
    }

    pub fn to_sqe(&self, fctype: u8, cid: u16) -> Sqe {
        Sqe {
            opcode: FABRICS_OPCODE,
            flags: 0x40,
            cid,
            nsid: fctype as u32,
            cdw10: match self.size {
                PropertySize::Four => 0,
                PropertySize::Eight => 1,
            },
            cdw11: self.offset,
            cdw12: self.value as u32,
            cdw13: (self.value >> 32) as u32,
            ..Sqe::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_command_round_trip() {
        let c = ConnectCommand {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: ConnectCommand::CATTR_SQ_FLOW_CONTROL_DISABLED,
            kato: 5000,
        };
        let sqe = Sqe::decode(&c.to_sqe(9).encode()).unwrap();
        assert_eq!(sqe.fctype(), fctype::CONNECT);
        assert_eq!(ConnectCommand::from_sqe(&sqe), c);
        assert!(c.flow_control_disabled());
        let bytes = sqe.encode();
        assert_eq!(bytes[ConnectCommand::OFFSET_QID as usize], 3);
        assert_eq!(bytes[ConnectCommand::OFFSET_SQSIZE as usize], 127);
        assert_eq!(bytes[ConnectCommand::OFFSET_CATTR as usize], 4);
    }

    #[test]
    fn connect_data_round_trip() {
        let d = ConnectData {
            hostid: [0x11; 16],
            cntlid: 0xffff,
            subnqn: "nqn.2026-12.dev.nvmfd:ram0".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1234".into(),
        };
        let bytes = d.encode();
        assert_eq!(&bytes[256..260], b"nqn.");
        assert_eq!(ConnectData::decode(&bytes), Ok(d));
    }

    #[test]
    fn connect_data_rejects_unterminated_nqn_and_bad_length() {
        let mut bytes = [0u8; 1024];
        bytes[512..768].fill(b'a');
        assert_eq!(
            ConnectData::decode(&bytes),
            Err(DecodeError::InvalidValue {
                field: "hostnqn",
                value: 256
            })
        );
        assert!(ConnectData::decode(&[0u8; 1023]).is_err());
        assert!(ConnectData::decode(&[0u8; 1025]).is_err());
    }

    #[test]
    fn property_round_trip_and_bad_size() {
        let p = PropertyCommand {
            size: PropertySize::Eight,
            offset: 0,
            value: 0x1_0000_0001,
        };
        let sqe = p.to_sqe(fctype::PROPERTY_SET, 1);
        assert_eq!(PropertyCommand::from_sqe(&sqe), Ok(p));
        let mut bad = sqe;
        bad.cdw10 = 2;
        assert!(PropertyCommand::from_sqe(&bad).is_err());
    }
}
