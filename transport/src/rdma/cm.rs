//! NVMe/RDMA connection-manager private data (NVMe RDMA Transport 1.0b §3.2, Figures 4–6;
//! `struct nvme_rdma_cm_req/rep/rej` in Linux `include/linux/nvme-rdma.h`).
//!
//! The host's RDMA_CM CONNECT_REQUEST carries the queue it wants (QID) and the queue sizes;
//! the target answers with an accept carrying its receive-queue size, or a reject carrying an
//! NVMe RDMA CM status. Every field is little endian.

use codec::coded_enum;
use nvme::wire::{DecodeError, Reader};

/// Record format 0 is the only one defined (NVMe RDMA 1.0b Figure 4, RECFMT).
pub const RECFMT_1_0: u16 = 0;

/// Admin queue depth limit the Linux target enforces (`NVME_AQ_DEPTH`); the Linux host asks for 32.
pub const ADMIN_QUEUE_MAX_ENTRIES: u16 = 32;

coded_enum! {
    /// NVMe RDMA CM status carried in a reject (NVMe RDMA 1.0b Figure 6); `from_code` (host
    /// side: why the target refused) gives `None` for codes the specification does not define.
    #[derive(thiserror::Error)]
    pub enum CmRejectStatus: u16, from_code {
        #[error("invalid private data length")]
        InvalidLength = 0x01,
        #[error("invalid record format")]
        InvalidRecfmt = 0x02,
        #[error("invalid queue ID")]
        InvalidQid = 0x03,
        #[error("invalid host SQ size")]
        InvalidHsqsize = 0x04,
        #[error("invalid host RQ size")]
        InvalidHrqsize = 0x05,
        #[error("no resources")]
        NoResources = 0x06,
        #[error("invalid IRD")]
        InvalidIrd = 0x07,
        #[error("invalid ORD")]
        InvalidOrd = 0x08,
    }
}

impl CmRejectStatus {
    pub fn code(self) -> u16 {
        self as u16
    }
}

/// CONNECT_REQUEST private data (NVMe RDMA 1.0b Figure 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRequest {
    pub recfmt: u16,
    pub qid: u16,
    /// Host receive queue size: how many response capsules the host can take at once (1's based).
    pub hrqsize: u16,
    /// Host send queue size, 0's based: the host sends at most `hsqsize + 1` commands at once.
    pub hsqsize: u16,
    /// Controller ID (1.0b; the Linux host leaves it 0). Informational only: the Connect
    /// command's own CNTLID is authoritative.
    pub cntlid: u16,
}

impl ConnectRequest {
    pub const SIZE: usize = 32;

    /// Decodes the private data of a CONNECT_REQUEST event. The CM may hand over more bytes
    /// than the host sent (InfiniBand CM REQ private data is fixed-size), so trailing bytes are
    /// accepted; fewer than 32 bytes is `InvalidLength`, as in SPDK's target.
    pub fn decode(bytes: &[u8]) -> Result<Self, CmRejectStatus> {
        Self::read(&mut Reader::new(bytes)).map_err(|_| CmRejectStatus::InvalidLength)
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut fixed = r.sub(Self::SIZE)?;
        Ok(Self {
            recfmt: fixed.u16()?,
            qid: fixed.u16()?,
            hrqsize: fixed.u16()?,
            hsqsize: fixed.u16()?,
            cntlid: fixed.u16()?,
        })
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        for (i, v) in [
            self.recfmt,
            self.qid,
            self.hrqsize,
            self.hsqsize,
            self.cntlid,
        ]
        .iter()
        .enumerate()
        {
            out[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Checks the request against the target's limits and returns the queue geometry.
    ///
    /// QID range is the only NVMe-level check possible before the Connect command arrives; the
    /// core re-checks the QID and queue size against the controller at Connect time.
    pub fn validate(&self, limits: &CmLimits) -> Result<QueueGeometry, CmRejectStatus> {
        if self.recfmt != RECFMT_1_0 {
            return Err(CmRejectStatus::InvalidRecfmt);
        }
        if self.qid > limits.max_io_queues {
            return Err(CmRejectStatus::InvalidQid);
        }
        // HSQSIZE is 0's based; a queue has at least 2 entries (NVMe Base 2.0 §3.3.1: MQES ≥ 1).
        let entries = u32::from(self.hsqsize) + 1;
        let max_entries = if self.qid == 0 {
            u32::from(ADMIN_QUEUE_MAX_ENTRIES)
        } else {
            u32::from(limits.max_queue_entries)
        };
        if entries < 2 || entries > max_entries {
            return Err(CmRejectStatus::InvalidHsqsize);
        }
        // Every command the host may have outstanding gets one response SEND; a host RQ
        // smaller than its SQ would make us overrun its posted receives (RNR).
        if u32::from(self.hrqsize) < entries {
            return Err(CmRejectStatus::InvalidHrqsize);
        }
        Ok(QueueGeometry {
            qid: self.qid,
            depth: entries as u16,
        })
    }
}

const _: () = assert!(ConnectRequest::SIZE == 32);

/// What the target accepts at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmLimits {
    /// Highest I/O QID (= number of I/O queues a controller may create).
    pub max_io_queues: u16,
    /// Entries per I/O queue (MQES + 1).
    pub max_queue_entries: u16,
}

/// Validated queue shape of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueGeometry {
    pub qid: u16,
    /// Commands the host may have outstanding = receives we pre-post = response slots.
    pub depth: u16,
}

/// Accept private data (NVMe RDMA 1.0b Figure 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectAccept {
    /// Controller receive queue size: the number of command capsules we keep posted.
    pub crqsize: u16,
}

impl ConnectAccept {
    pub const SIZE: usize = 32;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..2].copy_from_slice(&RECFMT_1_0.to_le_bytes());
        out[2..4].copy_from_slice(&self.crqsize.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes).sub(Self::SIZE)?;
        let recfmt = r.u16()?;
        if recfmt != RECFMT_1_0 {
            return Err(DecodeError::InvalidValue {
                field: "recfmt",
                value: recfmt.into(),
            });
        }
        Ok(Self { crqsize: r.u16()? })
    }
}

const _: () = assert!(ConnectAccept::SIZE == 32);

/// Reject private data (NVMe RDMA 1.0b Figure 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectReject {
    pub status: CmRejectStatus,
}

impl ConnectReject {
    pub const SIZE: usize = 4;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..2].copy_from_slice(&RECFMT_1_0.to_le_bytes());
        out[2..4].copy_from_slice(&self.status.code().to_le_bytes());
        out
    }

    /// Returns the raw status; unknown codes are kept for logs.
    pub fn decode_status(bytes: &[u8]) -> Result<u16, DecodeError> {
        let mut r = Reader::new(bytes).sub(Self::SIZE)?;
        let _recfmt = r.u16()?;
        r.u16()
    }
}

const _: () = assert!(ConnectReject::SIZE == 4);

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CmLimits = CmLimits {
        max_io_queues: 8,
        max_queue_entries: 128,
    };

    fn linux_io_request(qid: u16, queue_size: u16) -> ConnectRequest {
        // What drivers/nvme/host/rdma.c sends: hrqsize = queue size, hsqsize = sqsize (0's based).
        ConnectRequest {
            recfmt: 0,
            qid,
            hrqsize: queue_size,
            hsqsize: queue_size - 1,
            cntlid: 0,
        }
    }

    #[test]
    fn request_round_trip_and_layout() {
        let req = ConnectRequest {
            recfmt: 0,
            qid: 3,
            hrqsize: 128,
            hsqsize: 127,
            cntlid: 0x1234,
        };
        let bytes = req.encode();
        assert_eq!(&bytes[..10], &[0, 0, 3, 0, 128, 0, 127, 0, 0x34, 0x12]);
        assert_eq!(ConnectRequest::decode(&bytes), Ok(req));
    }

    #[test]
    fn request_accepts_cm_padding_and_refuses_short_data() {
        let mut padded = [0u8; 56];
        padded[..32].copy_from_slice(&linux_io_request(1, 32).encode());
        assert_eq!(ConnectRequest::decode(&padded), Ok(linux_io_request(1, 32)));
        assert_eq!(
            ConnectRequest::decode(&padded[..31]),
            Err(CmRejectStatus::InvalidLength)
        );
        assert_eq!(
            ConnectRequest::decode(&[]),
            Err(CmRejectStatus::InvalidLength)
        );
    }

    #[test]
    fn validate_linux_admin_and_io_requests() {
        assert_eq!(
            linux_io_request(0, 32).validate(&LIMITS),
            Ok(QueueGeometry { qid: 0, depth: 32 })
        );
        assert_eq!(
            linux_io_request(8, 128).validate(&LIMITS),
            Ok(QueueGeometry { qid: 8, depth: 128 })
        );
    }

    #[test]
    fn validate_rejects_each_bad_field_with_its_status() {
        let mut r = linux_io_request(1, 32);
        r.recfmt = 1;
        assert_eq!(r.validate(&LIMITS), Err(CmRejectStatus::InvalidRecfmt));
        assert_eq!(
            linux_io_request(9, 32).validate(&LIMITS),
            Err(CmRejectStatus::InvalidQid)
        );
        // Admin queue deeper than NVME_AQ_DEPTH.
        assert_eq!(
            linux_io_request(0, 33).validate(&LIMITS),
            Err(CmRejectStatus::InvalidHsqsize)
        );
        assert_eq!(
            linux_io_request(1, 129).validate(&LIMITS),
            Err(CmRejectStatus::InvalidHsqsize)
        );
        let mut one_entry = linux_io_request(1, 2);
        one_entry.hsqsize = 0;
        assert_eq!(
            one_entry.validate(&LIMITS),
            Err(CmRejectStatus::InvalidHsqsize)
        );
        let mut small_rq = linux_io_request(1, 64);
        small_rq.hrqsize = 63;
        assert_eq!(
            small_rq.validate(&LIMITS),
            Err(CmRejectStatus::InvalidHrqsize)
        );
        // hsqsize 0xFFFF must not overflow the 1's based conversion.
        let mut huge = linux_io_request(1, 2);
        huge.hsqsize = 0xffff;
        huge.hrqsize = 0xffff;
        assert_eq!(huge.validate(&LIMITS), Err(CmRejectStatus::InvalidHsqsize));
    }

    #[test]
    fn unknown_reject_codes_have_no_status() {
        assert_eq!(CmRejectStatus::from_code(0), None);
        assert_eq!(CmRejectStatus::from_code(9), None);
    }

    #[test]
    fn accept_layout_and_round_trip() {
        let acc = ConnectAccept { crqsize: 128 };
        let bytes = acc.encode();
        assert_eq!(&bytes[..4], &[0, 0, 128, 0]);
        assert!(bytes[4..].iter().all(|&b| b == 0));
        assert_eq!(ConnectAccept::decode(&bytes), Ok(acc));
        let mut bad = bytes;
        bad[0] = 1;
        assert!(ConnectAccept::decode(&bad).is_err());
    }

    #[test]
    fn reject_layout_for_every_status() {
        for (status, code) in [
            (CmRejectStatus::InvalidLength, 1u16),
            (CmRejectStatus::InvalidRecfmt, 2),
            (CmRejectStatus::InvalidQid, 3),
            (CmRejectStatus::InvalidHsqsize, 4),
            (CmRejectStatus::InvalidHrqsize, 5),
            (CmRejectStatus::NoResources, 6),
            (CmRejectStatus::InvalidIrd, 7),
            (CmRejectStatus::InvalidOrd, 8),
        ] {
            let bytes = ConnectReject { status }.encode();
            assert_eq!(bytes, [0, 0, code as u8, 0]);
            assert_eq!(ConnectReject::decode_status(&bytes), Ok(code));
            assert_eq!(CmRejectStatus::from_code(code), Some(status));
        }
    }
}
