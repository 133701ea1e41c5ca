//! NVMe and NVMe-oF wire structures: every structure that crosses the fabric has exactly one
//! `decode`/`encode` pair here, with its size asserted at compile time.

pub mod copy;
pub mod cqe;
pub mod dsm;
pub mod fabrics;
pub mod identify;
pub mod log;
pub mod sgl;
pub mod sqe;

pub use crate::spec::Status;
pub use codec::{DecodeError, Reader};
pub use cqe::Cqe;
pub use sgl::{SglDescriptor, SglType};
pub use sqe::Sqe;
