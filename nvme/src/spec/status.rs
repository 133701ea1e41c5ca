//! Completion status (NVMe Base 2.0 §4.6.1, Figures 92–101). Only the codes nvmfd emits or
//! must recognise are named; add more beside their spec siblings.

use std::fmt;

/// Status Code Type + Status Code + Do Not Retry, as carried in CQE DW3[31:17].
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    const fn generic(sc: u8) -> Self {
        Self {
            sct: sct::GENERIC,
            sc,
            dnr: false,
        }
    }
    const fn command_specific(sc: u8) -> Self {
        Self {
            sct: sct::COMMAND_SPECIFIC,
            sc,
            dnr: false,
        }
    }
    const fn path(sc: u8) -> Self {
        Self {
            sct: sct::PATH,
            sc,
            dnr: false,
        }
    }
    const fn media(sc: u8) -> Self {
        Self {
            sct: sct::MEDIA,
            sc,
            dnr: false,
        }
    }

    // Generic command status (SCT 0), Figure 94.
    pub const SUCCESS: Self = Self::generic(0x00);
    pub const INVALID_OPCODE: Self = Self::generic(0x01);
    pub const INVALID_FIELD: Self = Self::generic(0x02);
    pub const CID_CONFLICT: Self = Self::generic(0x03);
    pub const DATA_TRANSFER_ERROR: Self = Self::generic(0x04);
    pub const INTERNAL_ERROR: Self = Self::generic(0x06);
    pub const ABORT_REQUESTED: Self = Self::generic(0x07);
    pub const ABORTED_SQ_DELETION: Self = Self::generic(0x08);
    /// The other command of a fused operation failed (NVMe Base 2.0 §3.4.2).
    pub const ABORTED_FAILED_FUSED: Self = Self::generic(0x09);
    /// The other command of a fused operation is missing (NVMe Base 2.0 §3.4.2).
    pub const ABORTED_MISSING_FUSED: Self = Self::generic(0x0a);
    pub const INVALID_NAMESPACE: Self = Self::generic(0x0b);
    pub const COMMAND_SEQUENCE_ERROR: Self = Self::generic(0x0c);
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Self = Self::generic(0x0d);
    pub const INVALID_NUMBER_OF_SGL_DESCRIPTORS: Self = Self::generic(0x0e);
    pub const DATA_SGL_LENGTH_INVALID: Self = Self::generic(0x0f);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Self = Self::generic(0x11);
    pub const SGL_OFFSET_INVALID: Self = Self::generic(0x16);
    pub const KEEP_ALIVE_TIMEOUT_INVALID: Self = Self::generic(0x1a);
    pub const NAMESPACE_WRITE_PROTECTED: Self = Self::generic(0x20);
    pub const TRANSIENT_TRANSPORT_ERROR: Self = Self::generic(0x22);
    /// Fabrics host identifiers are 128-bit: Reservation Report without EDS (§7.8).
    pub const HOST_ID_INCONSISTENT_FORMAT: Self = Self::generic(0x18);
    pub const LBA_OUT_OF_RANGE: Self = Self::generic(0x80);
    pub const CAPACITY_EXCEEDED: Self = Self::generic(0x81);
    pub const NAMESPACE_NOT_READY: Self = Self::generic(0x82);
    /// NVMe Base 2.0 Figure 101 (NVM command set generic status).
    pub const RESERVATION_CONFLICT: Self = Self::generic(0x83);

    // Command specific status (SCT 1), Figure 95 and NVMe-oF 1.1 Figure 20/21.
    pub const INVALID_QUEUE_IDENTIFIER: Self = Self::command_specific(0x01);
    pub const INVALID_QUEUE_SIZE: Self = Self::command_specific(0x02);
    pub const ABORT_COMMAND_LIMIT_EXCEEDED: Self = Self::command_specific(0x03);
    pub const ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED: Self = Self::command_specific(0x05);
    pub const INVALID_LOG_PAGE: Self = Self::command_specific(0x09);
    pub const FEATURE_NOT_SAVEABLE: Self = Self::command_specific(0x0d);
    pub const FEATURE_NOT_CHANGEABLE: Self = Self::command_specific(0x0e);
    pub const CONNECT_INCOMPATIBLE_FORMAT: Self = Self::command_specific(0x80);
    pub const CONNECT_CONTROLLER_BUSY: Self = Self::command_specific(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Self = Self::command_specific(0x82);
    pub const CONNECT_RESTART_DISCOVERY: Self = Self::command_specific(0x83);
    pub const CONNECT_INVALID_HOST: Self = Self::command_specific(0x84);
    /// A command other than a fabrics command on a queue that has not authenticated (NVMe Base
    /// 2.0 Figure 95, §8.13.1; Linux NVME_SC_AUTH_REQUIRED 0x191).
    pub const AUTHENTICATION_REQUIRED: Self = Self::command_specific(0x91);
    /// NVM command set specific (SCT 1, 0x82): write to a read-only range.
    pub const ATTEMPTED_WRITE_TO_READ_ONLY_RANGE: Self = Self::command_specific(0x82);
    /// Copy: more ranges than MSRC, a range beyond MSSRL or a total beyond MCL (NVM Command
    /// Set 1.0 Figure 25; the same code means Restart Discovery for Connect).
    pub const COMMAND_SIZE_LIMIT_EXCEEDED: Self = Self::command_specific(0x83);

    // Media and data integrity errors (SCT 2), Figure 96.
    pub const WRITE_FAULT: Self = Self::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Self = Self::media(0x81);
    pub const COMPARE_FAILURE: Self = Self::media(0x85);

    // Path related status (SCT 3), NVMe Base 2.0 §4.6.1.2.4. Never with DNR: the host must be
    // free to retry on another path (the Linux host fails over only without DNR).
    pub const ANA_PERSISTENT_LOSS: Self = Self::path(0x01);
    pub const ANA_INACCESSIBLE: Self = Self::path(0x02);
    pub const ANA_TRANSITION: Self = Self::path(0x03);

    pub const fn with_dnr(self) -> Self {
        Self { dnr: true, ..self }
    }

    pub const fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 16-bit status field of CQE DW3 (phase tag bit 0 left clear).
    pub const fn to_field(self) -> u16 {
        ((self.dnr as u16) << 15) | (((self.sct & 0x7) as u16) << 9) | ((self.sc as u16) << 1)
    }

    pub const fn from_field(field: u16) -> Self {
        Self {
            sct: ((field >> 9) & 0x7) as u8,
            sc: (field >> 1) as u8,
            dnr: field & 0x8000 != 0,
        }
    }
}

/// Status code types (NVMe Base 2.0 Figure 93).
pub mod sct {
    pub const GENERIC: u8 = 0;
    pub const COMMAND_SPECIFIC: u8 = 1;
    pub const MEDIA: u8 = 2;
    pub const PATH: u8 = 3;
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Status(sct={:#x}, sc={:#04x}{})",
            self.sct,
            self.sc,
            if self.dnr { ", dnr" } else { "" }
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trip_for_every_code() {
        for sct in 0..8u8 {
            for sc in 0..=255u8 {
                for dnr in [false, true] {
                    let s = Status { sct, sc, dnr };
                    assert_eq!(Status::from_field(s.to_field()), s);
                    assert_eq!(s.to_field() & 1, 0, "phase bit must stay clear");
                }
            }
        }
    }

    #[test]
    fn connect_invalid_host_encoding() {
        // SCT 1, SC 0x84, DNR: the value the Linux host prints as "0x4184".
        assert_eq!(
            Status::CONNECT_INVALID_HOST.with_dnr().to_field() >> 1,
            0x4184
        );
    }
}
