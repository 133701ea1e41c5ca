//! The I/O commands every transport of the generator sends: one builder, so that NVMe/TCP and
//! NVMe/RDMA runs issue the same Read and Write commands and differ only in the data pointer.

use nvme::spec::sqe_flags::PSDT_SGL;
use nvme::wire::Sqe;
use transport::client::Client;

use crate::workload::IoRequest;

/// The Read or Write of `io` (`nlb` blocks of namespace `nsid`) under command id `cid`, with
/// PSDT = SGL (NVMe-oF 1.1 §2.2: fabrics commands always use SGLs); the caller sets DPTR.
pub fn io_sqe(nsid: u32, nlb: u32, cid: u16, io: IoRequest) -> Sqe {
    let mut sqe = if io.read {
        Client::read_sqe(nsid, io.slba, nlb)
    } else {
        Client::write_sqe(nsid, io.slba, nlb, false)
    };
    sqe.cid = cid;
    sqe.flags = PSDT_SGL;
    sqe
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::spec::nvm_opcode;

    #[test]
    fn read_and_write_fields() {
        let r = io_sqe(
            3,
            8,
            5,
            IoRequest {
                read: true,
                slba: 0x1_0000_0010,
            },
        );
        assert_eq!((r.opcode, r.cid, r.nsid), (nvm_opcode::READ, 5, 3));
        // SLBA split over CDW10/11; NLB 0's based (NVM Command Set 1.0 §3.2.4).
        assert_eq!((r.cdw10, r.cdw11, r.cdw12), (0x10, 1, 7));
        assert_eq!(r.psdt(), 1);
        let w = io_sqe(
            1,
            1,
            0,
            IoRequest {
                read: false,
                slba: 9,
            },
        );
        assert_eq!((w.opcode, w.cdw10, w.cdw12), (nvm_opcode::WRITE, 9, 0));
    }
}
