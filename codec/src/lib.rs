//! The one codec dialect of nvmfd's wire and on-disk formats (NVMe/TCP PDUs, NVMe structures,
//! AUTH messages, the reservation report and state file): a bounded [`Reader`] that never reads
//! past what the peer sent, fixed-offset little-endian fields for structures whose size the type
//! proves, [`coded_enum!`] for fields whose values are listed once, and typed [`DecodeError`]s.
//!
//! A leaf crate (no dependency on any other nvmfd crate), so `auth`, `nvme` and `transport`
//! all decode and encode the same way.

mod coded_enum;
pub mod reader;

pub use reader::{exact, u16_at, u32_at, u64_at, DecodeError, Reader};
