//! Every NVMe and NVMe-oF constant nvmfd names, defined once: opcodes, Fabrics command types,
//! feature and log page identifiers, CNS values, controller properties and their bits, status
//! codes, and the well-known identifiers. Handlers, the client, perf, fuzz and the tests all
//! name these; nothing re-types them. The layouts of structures (field offsets, bits inside
//! Identify data) stay with their encoders in `wire`.

pub mod status;

pub use status::{sct, Status};

/// Admin command opcodes (NVMe Base 2.0 Figure 139).
pub mod admin_opcode {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set I/O opcodes (NVM Command Set 1.0 Figure 18).
pub mod nvm_opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    /// NVM Command Set 1.0 §3.3.5.
    pub const VERIFY: u8 = 0x0c;
    /// NVM Command Set 1.0 §3.3.1.
    pub const COPY: u8 = 0x19;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    pub const RESERVATION_REPORT: u8 = 0x0e;
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    pub const RESERVATION_RELEASE: u8 = 0x15;
}

/// Opcode of every Fabrics command (NVMe-oF 1.1 §6); the command type is `fctype` in byte 4.
pub const FABRICS_OPCODE: u8 = 0x7f;

/// Fabrics command types (NVMe-oF 1.1 Figure 22; authentication: NVMe-oF 1.1 §6.3).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// SQE flags byte (NVMe Base 2.0 Figure 88): FUSE bits 1:0, PSDT bits 7:6.
pub mod sqe_flags {
    pub const FUSE_MASK: u8 = 0x3;
    /// FUSE 01b: first command of a fused operation; 10b: second (NVMe Base 2.0 §3.4.2).
    pub const FUSE_FIRST: u8 = 0x1;
    pub const FUSE_SECOND: u8 = 0x2;
    pub const PSDT_SHIFT: u8 = 6;
    /// PSDT = 01b: SGL, metadata in one contiguous buffer (the only value NVMe-oF allows).
    pub const PSDT_SGL: u8 = 1 << PSDT_SHIFT;
}

/// Error Recovery feature (05h) CDW11 / DW0 fields (NVMe Base 2.0 §5.27.1.6).
pub mod error_recovery {
    /// Bits 15:0: Time Limited Error Recovery, in 100 ms units (0: no timeout).
    pub const TLER_MASK: u32 = 0xffff;
    /// Bit 16: Deallocated or Unwritten Logical Block Error Enable.
    pub const DULBE: u32 = 1 << 16;
}

/// Command dword bits of the NVM command set (NVM Command Set 1.0 §3).
pub mod nvm_bits {
    /// CDW12 bit 30: Force Unit Access (Read/Write).
    pub const FUA: u32 = 1 << 30;
    /// CDW12 bit 25: Deallocate (Write Zeroes).
    pub const DEAC: u32 = 1 << 25;
    /// DSM CDW11 bit 2: Attribute – Deallocate.
    pub const DSM_AD: u32 = 1 << 2;
    /// DSM range: context attributes (4), length in LBAs (4), starting LBA (8).
    pub const DSM_RANGE_SIZE: usize = 16;
    /// Copy Source Range Entry, descriptor format 0 (NVM Command Set 1.0 Figure 37).
    pub const COPY_SOURCE_RANGE_SIZE: usize = 32;
}

/// Reservation command fields (NVMe Base 2.0 §7.5–7.8).
pub mod resv {
    /// CDW10 bit 3 of Register, Acquire and Release: Ignore Existing Key.
    pub const IEKEY: u32 = 1 << 3;
    /// Register RREGA (CDW10 2:0).
    pub const REGISTER_REGISTER: u32 = 0b000;
    pub const REGISTER_UNREGISTER: u32 = 0b001;
    pub const REGISTER_REPLACE: u32 = 0b010;
    /// Register CPTPL (CDW10 31:30, NVMe Base 2.0 §7.6): 00b no change, 01b reserved,
    /// 10b set PTPL to 0 (cleared at power on), 11b set PTPL to 1 (persist through power
    /// loss). nvme-cli's `--cptpl=3` asks for persistence.
    pub const CPTPL_NO_CHANGE: u32 = 0b00;
    pub const CPTPL_CLEAR: u32 = 0b10;
    pub const CPTPL_SET: u32 = 0b11;
    /// Acquire RACQA (CDW10 2:0).
    pub const ACQUIRE_ACQUIRE: u32 = 0b000;
    pub const ACQUIRE_PREEMPT: u32 = 0b001;
    pub const ACQUIRE_PREEMPT_ABORT: u32 = 0b010;
    /// Release RRELA (CDW10 2:0).
    pub const RELEASE_RELEASE: u32 = 0b000;
    pub const RELEASE_CLEAR: u32 = 0b001;
    /// Report CDW11 bit 0: Extended Data Structure (128-bit host identifiers).
    pub const REPORT_EDS: u32 = 1 << 0;
    /// Extended Reservation Status: 64-byte header, 64-byte Registrant entries (Figure 398).
    pub const EXT_HEADER_SIZE: usize = 64;
    pub const EXT_ENTRY_SIZE: usize = 64;
    /// Registrant RCSTS bit 0: holds the reservation.
    pub const RCSTS_HOLDS: u8 = 1 << 0;
    /// Identify Controller ONCS bit 5: Reservations.
    pub const ONCS_RESERVATIONS: u16 = 1 << 5;
    /// Identify Namespace RESCAP (byte 31): bits 1..6 the six reservation types; bit 7 the
    /// Ignore Existing Key behaviour of NVMe 1.3 and later (obsolete in Acquire and Release).
    /// Bit 0: Persist Through Power Loss (only with a state directory).
    pub const RESCAP_PTPL: u8 = 1 << 0;
    pub const RESCAP_TYPES: u8 = 0b0111_1110;
    pub const RESCAP_IEKEY: u8 = 1 << 7;
    /// Reservation Notification log page types (NVMe Base 2.0 §5.16.1, "Reservation Notification"): 00h empty,
    /// 01h Registration Preempted, 02h Reservation Released, 03h Reservation Preempted.
    pub const NOTICE_EMPTY: u8 = 0x00;
    pub const NOTICE_REGISTRATION_PREEMPTED: u8 = 0x01;
    pub const NOTICE_RESERVATION_RELEASED: u8 = 0x02;
    pub const NOTICE_RESERVATION_PREEMPTED: u8 = 0x03;
    /// Reservation Notification Mask (feature 82h) CDW11: bit 1 REGPRE, bit 2 RESREL, bit 3
    /// RESPRE mask the notification of the type with the same number; the rest is reserved.
    pub const NOTIFICATION_MASK_BITS: u32 = 0b1110;
}

/// Asynchronous Event Type (completion DW0 bits 2:0, NVMe Base 2.0 Figure 148).
pub mod aen_type {
    pub const NOTICE: u32 = 0b010;
    pub const IO_COMMAND_SPECIFIC: u32 = 0b110;
}

/// Feature identifiers (NVMe Base 2.0 Figure 317).
pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const TIMESTAMP: u8 = 0x0e;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask (namespace-specific; NVMe Base 2.0 §5.27.1).
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence (namespace-specific; NVMe Base 2.0 §5.27.1.14).
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// Log page identifiers (NVMe Base 2.0 Figure 202).
pub mod lid {
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const ANA: u8 = 0x0c;
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification (NVMe Base 2.0 §5.16.1; one notification per read).
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
}

/// Identify CNS values (NVMe Base 2.0 Figure 273).
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    pub const NS_DESCRIPTORS: u8 = 0x03;
    pub const CS_NAMESPACE: u8 = 0x05;
    pub const CS_CONTROLLER: u8 = 0x06;
}

/// Controller register (property) offsets (NVMe Base 2.0 Figure 33).
pub mod reg {
    pub const CAP: u32 = 0x00;
    pub const CAP_HIGH: u32 = 0x04;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
    pub const NSSR: u32 = 0x20;
}

/// CC fields (NVMe Base 2.0 Figure 41).
pub mod cc {
    pub const EN: u32 = 1 << 0;
    pub const CSS_SHIFT: u32 = 4;
    pub const MPS_SHIFT: u32 = 7;
    pub const AMS_SHIFT: u32 = 11;
    pub const SHN_SHIFT: u32 = 14;
    pub const IOSQES_SHIFT: u32 = 16;
    pub const IOCQES_SHIFT: u32 = 20;
    /// Writable bits: EN, CSS, MPS, AMS, SHN, IOSQES, IOCQES.
    pub const WRITABLE: u32 = 0x00ff_fff1;
    /// The value the Linux host writes to enable: EN, IOSQES 6 (64 B), IOCQES 4 (16 B).
    pub const ENABLE: u32 = EN | 6 << IOSQES_SHIFT | 4 << IOCQES_SHIFT;
}

/// CSTS fields (NVMe Base 2.0 Figure 42).
pub mod csts {
    pub const RDY: u32 = 1 << 0;
    pub const CFS: u32 = 1 << 1;
    /// SHST = 10b: shutdown processing complete.
    pub const SHST_COMPLETE: u32 = 0b10 << 2;
}

/// Version reported in VS and Identify VER: NVMe 1.3 (the Linux host then uses NS
/// identification descriptors and Identify CNS 06h; NVMe-oF 1.0 requires at least 1.2.1).
pub const NVME_VERSION: u32 = 0x0001_0300;

/// Connect CNTLID asking for a dynamic controller (NVMe-oF 1.1 §3.3.1, Figure 20).
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// Highest controller ID (NVMe Base 2.0 §3.1.1: FFF0h–FFFFh are reserved).
pub const MAX_CNTLID: u16 = 0xffef;

/// The well-known discovery subsystem NQN (NVMe Base 2.0 §4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// SQ Head Pointer value when SQ flow control is disabled (NVMe-oF 1.1 §3.3.2.1).
pub const SQHD_FLOW_CONTROL_DISABLED: u16 = 0xffff;

/// Commands Supported and Effects data structure bits (NVMe Base 2.0 Figure 212).
pub mod effects {
    /// Command supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical block content change.
    pub const LBCC: u32 = 1 << 1;
}

/// Discovery log values (NVMe Base 2.0 Figure 264 and the transport specs).
pub mod disc {
    /// TRTYPE.
    pub const TRTYPE_RDMA: u8 = 1;
    pub const TRTYPE_TCP: u8 = 3;
    /// ADRFAM.
    pub const ADRFAM_IPV4: u8 = 1;
    pub const ADRFAM_IPV6: u8 = 2;
    /// SUBTYPE.
    pub const SUBTYPE_REFERRAL: u8 = 1;
    pub const SUBTYPE_NVM: u8 = 2;
    pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
    /// EFLAGS (TP 8013, NVMe Base 2.0 Figure 264): bit 0 Duplicate Returned Information (the
    /// entry leads to the discovery subsystem that returned this page), bit 1 Explicit
    /// Persistent Connection Support for Discovery (KATO and the change notice are honoured).
    pub const EFLAGS_DUPRETINFO: u16 = 1 << 0;
    pub const EFLAGS_EPCSD: u16 = 1 << 1;
    /// TREQ bits 1:0 secure channel: 00b not specified; bit 2: SQ flow control disable
    /// supported (the Linux host then sets CATTR bit 2 on Connect).
    pub const TREQ_NOT_SPECIFIED: u8 = 0;
    /// TREQ secure channel 01b required / 10b not required (nvmet's addr_treq "required" /
    /// "not required"; a TLS port is one or the other, NVMe/TCP 1.1 §3.6.1.1).
    pub const TREQ_REQUIRED: u8 = 1;
    pub const TREQ_NOT_REQUIRED: u8 = 2;
    pub const TREQ_DISABLE_SQFLOW: u8 = 1 << 2;
    /// RDMA TSAS (NVMe/RDMA 1.0 Figure 3): QPTYPE reliable connected, PRTYPE no provider
    /// specified, CMS RDMA_CM.
    pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
    pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
    pub const RDMA_CMS_RDMA_CM: u8 = 1;
    /// TCP TSAS (NVMe/TCP 1.1 Figure 4): SECTYPE 00h none, 02h TLS 1.3 (Linux
    /// NVMF_TCP_SECTYPE_TLS13; nvme-cli prints "tls13").
    pub const TCP_SECTYPE_NONE: u8 = 0;
    pub const TCP_SECTYPE_TLS13: u8 = 2;
}
