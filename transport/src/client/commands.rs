//! Command helpers of the client: Fabrics Connect and properties (NVMe-oF 1.1 §3.3), admin
//! commands (Identify, Get Log Page, Set Features) and NVM I/O (NVM Command Set 1.0 §3).

use std::time::{Duration, Instant};

use nvme::spec::{admin_opcode, cc, csts, fctype, nvm_opcode, reg};
use nvme::wire::fabrics::{ConnectCommand, ConnectData, PropertyCommand, PropertySize};
use nvme::wire::identify::IDENTIFY_DATA_SIZE;
use nvme::wire::{Cqe, Sqe, Status};

use super::{Client, ClientError, Completion, DataOut};

/// Fails with the CQE status unless it is success.
fn ok(c: Completion) -> Result<Completion, ClientError> {
    if c.cqe.status.is_success() {
        Ok(c)
    } else {
        Err(ClientError::Status(c.cqe.status))
    }
}

fn property_size(eight: bool) -> PropertySize {
    if eight {
        PropertySize::Eight
    } else {
        PropertySize::Four
    }
}

fn slba_nlb(sqe: &mut Sqe, slba: u64, nlb: u32) {
    sqe.cdw10 = slba as u32;
    sqe.cdw11 = (slba >> 32) as u32;
    // NLB is 0's based (NVM Command Set 1.0 §3.2.4, Figure 64).
    sqe.cdw12 = nlb.saturating_sub(1) & 0xffff;
}

impl Client {
    /// Fabrics Connect (NVMe-oF 1.1 §3.3.1). `cntlid` is 0xFFFF on the admin queue; returns
    /// the controller ID from CQE DW0. The connect data goes in-capsule (1024 bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn fabrics_connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
    ) -> Result<u16, ClientError> {
        let c = self.fabrics_connect_raw(
            ConnectCommand {
                recfmt: 0,
                qid,
                sqsize,
                cattr: 0,
                kato: kato_ms,
            },
            &ConnectData {
                hostid,
                cntlid,
                subnqn: subnqn.to_owned(),
                hostnqn: hostnqn.to_owned(),
            },
        )?;
        Ok(ok(c)?.cqe.dw0 as u16)
    }

    /// Connect with every field under the caller's control; returns the completion as is.
    pub fn fabrics_connect_raw(
        &mut self,
        cmd: ConnectCommand,
        data: &ConnectData,
    ) -> Result<Completion, ClientError> {
        self.execute(cmd.to_sqe(0), DataOut::Write(data.encode().to_vec()))
    }

    pub fn property_get(&mut self, offset: u32, eight: bool) -> Result<u64, ClientError> {
        let c = ok(self.execute(Self::property_get_sqe(offset, eight), DataOut::None)?)?;
        Ok(Self::property_value(&c.cqe))
    }

    /// The SQE of a Property Get (NVMe-oF 1.1 §3.5.1) of a 4- or 8-byte property.
    pub fn property_get_sqe(offset: u32, eight: bool) -> Sqe {
        PropertyCommand {
            size: property_size(eight),
            offset,
            value: 0,
        }
        .to_sqe(fctype::PROPERTY_GET, 0)
    }

    /// The value a Property Get returned: CQE DW0 (and DW1 for 8 bytes).
    pub fn property_value(cqe: &Cqe) -> u64 {
        cqe.dw0 as u64 | (cqe.dw1 as u64) << 32
    }

    /// The SQE of a Property Set (NVMe-oF 1.1 §3.5.2).
    pub fn property_set_sqe(offset: u32, value: u64, eight: bool) -> Sqe {
        PropertyCommand {
            size: property_size(eight),
            offset,
            value,
        }
        .to_sqe(fctype::PROPERTY_SET, 0)
    }

    pub fn property_set(
        &mut self,
        offset: u32,
        value: u64,
        eight: bool,
    ) -> Result<(), ClientError> {
        let sqe = Self::property_set_sqe(offset, value, eight);
        ok(self.execute(sqe, DataOut::None)?)?;
        Ok(())
    }

    /// Sets CC.EN and waits for CSTS.RDY (NVMe Base 2.0 §3.5.1).
    pub fn enable_controller(&mut self, timeout: Duration) -> Result<(), ClientError> {
        self.property_set(reg::CC, u64::from(cc::ENABLE), false)?;
        let deadline = Instant::now() + timeout;
        loop {
            let csts = self.property_get(reg::CSTS, false)?;
            if csts & u64::from(csts::CFS) != 0 {
                return Err(ClientError::Status(Status::INTERNAL_ERROR));
            }
            if csts & u64::from(csts::RDY) != 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClientError::Timeout);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Identify (NVMe Base 2.0 §5.17): 4096 bytes for `cns`.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Vec<u8>, ClientError> {
        let sqe = Self::identify_sqe(cns, nsid);
        Ok(ok(self.execute(sqe, DataOut::Read(IDENTIFY_DATA_SIZE as u32))?)?.data)
    }

    /// The SQE of an Identify of `cns` (its data: [`IDENTIFY_DATA_SIZE`] bytes).
    pub fn identify_sqe(cns: u8, nsid: u32) -> Sqe {
        Sqe {
            opcode: admin_opcode::IDENTIFY,
            nsid,
            cdw10: cns as u32,
            ..Sqe::default()
        }
    }

    /// Get Log Page (NVMe Base 2.0 §5.16): `len` bytes (a multiple of 4) from `offset`.
    pub fn get_log_page(
        &mut self,
        lid: u8,
        nsid: u32,
        len: u32,
        offset: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let numd = len / 4 - 1;
        let sqe = Sqe {
            opcode: admin_opcode::GET_LOG_PAGE,
            nsid,
            cdw10: lid as u32 | (numd & 0xffff) << 16,
            cdw11: numd >> 16,
            cdw12: offset as u32,
            cdw13: (offset >> 32) as u32,
            ..Sqe::default()
        };
        Ok(ok(self.execute(sqe, DataOut::Read(len))?)?.data)
    }

    /// Set Features (NVMe Base 2.0 §5.27) without data; returns the CQE (DW0 is the result).
    pub fn set_features(&mut self, fid: u8, cdw11: u32) -> Result<Cqe, ClientError> {
        let sqe = Self::set_features_sqe(fid, cdw11);
        Ok(ok(self.execute(sqe, DataOut::None)?)?.cqe)
    }

    /// The SQE of a Set Features of `fid` without data.
    pub fn set_features_sqe(fid: u8, cdw11: u32) -> Sqe {
        Sqe {
            opcode: admin_opcode::SET_FEATURES,
            cdw10: fid as u32,
            cdw11,
            ..Sqe::default()
        }
    }

    pub fn keep_alive(&mut self) -> Result<(), ClientError> {
        ok(self.execute(Self::keep_alive_sqe(), DataOut::None)?)?;
        Ok(())
    }

    /// The SQE of a Keep Alive (NVMe Base 2.0 §5.25).
    pub fn keep_alive_sqe() -> Sqe {
        Sqe {
            opcode: admin_opcode::KEEP_ALIVE,
            ..Sqe::default()
        }
    }

    /// The SQE of a Read of `nlb` blocks at `slba`.
    pub fn read_sqe(nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let mut sqe = Sqe {
            opcode: nvm_opcode::READ,
            nsid,
            ..Sqe::default()
        };
        slba_nlb(&mut sqe, slba, nlb);
        sqe
    }

    /// The SQE of a Write of `nlb` blocks at `slba`.
    pub fn write_sqe(nsid: u32, slba: u64, nlb: u32, fua: bool) -> Sqe {
        let mut sqe = Sqe {
            opcode: nvm_opcode::WRITE,
            nsid,
            ..Sqe::default()
        };
        slba_nlb(&mut sqe, slba, nlb);
        if fua {
            sqe.cdw12 |= 1 << 30;
        }
        sqe
    }

    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        block_size: u32,
    ) -> Result<Vec<u8>, ClientError> {
        let sqe = Self::read_sqe(nsid, slba, nlb);
        Ok(ok(self.execute(sqe, DataOut::Read(nlb * block_size))?)?.data)
    }

    /// Writes `data` (a whole number of blocks) at `slba`; in-capsule when it fits.
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        data: Vec<u8>,
        block_size: u32,
    ) -> Result<(), ClientError> {
        let nlb = data.len() as u32 / block_size;
        let sqe = Self::write_sqe(nsid, slba, nlb, false);
        ok(self.execute(sqe, DataOut::Write(data))?)?;
        Ok(())
    }

    pub fn flush(&mut self, nsid: u32) -> Result<(), ClientError> {
        let sqe = Sqe {
            opcode: nvm_opcode::FLUSH,
            nsid,
            ..Sqe::default()
        };
        ok(self.execute(sqe, DataOut::None)?)?;
        Ok(())
    }

    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32) -> Result<(), ClientError> {
        let mut sqe = Sqe {
            opcode: nvm_opcode::WRITE_ZEROES,
            nsid,
            ..Sqe::default()
        };
        slba_nlb(&mut sqe, slba, nlb);
        ok(self.execute(sqe, DataOut::None)?)?;
        Ok(())
    }

    /// Dataset Management with the Deallocate attribute (NVM Command Set 1.0 §3.2.3) over
    /// `(slba, nlb)` ranges.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<(), ClientError> {
        let data = nvme::wire::dsm::encode_ranges(ranges);
        let sqe = Sqe {
            opcode: nvm_opcode::DATASET_MANAGEMENT,
            nsid,
            cdw10: (ranges.len() as u32).saturating_sub(1),
            cdw11: 1 << 2, // AD
            ..Sqe::default()
        };
        ok(self.execute(sqe, DataOut::Write(data))?)?;
        Ok(())
    }
}
