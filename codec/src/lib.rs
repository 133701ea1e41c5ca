//! The one codec dialect of nvmfd's wire and on-disk formats (NVMe/TCP PDUs, NVMe structures,
//! AUTH messages, the reservation report and state file): a bounded [`Reader`] that never reads
//! past what the peer sent and a [`Writer`] that fills exactly the size it was given, fixed-offset little-endian fields for structures whose size the type
//! proves, [`coded_enum!`] for fields whose values are listed once, and typed [`DecodeError`]s.
//!
//! A leaf crate (no dependency on any other nvmfd crate), so `auth`, `nvme` and `transport`
//! all decode and encode the same way.

mod coded_enum;
pub mod reader;
pub mod writer;

pub use reader::{exact, u16_at, u32_at, u64_at, DecodeError, Reader};
pub use writer::{put_u16_at, put_u32_at, put_u64_at, Writer};
