//! Target-wide limits advertised to hosts (CAP.MQES, MDTS, IOCCSZ, queue counts) and the
//! default KATO of discovery controllers.

/// Target-wide limits advertised to hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries per I/O queue (CAP.MQES + 1).
    pub max_queue_size: u16,
    pub max_io_queues: u16,
    /// Largest data transfer of one command in bytes (MDTS), a power of two ≥ 4096.
    pub max_data_transfer: u32,
    /// Bytes of in-capsule data accepted on I/O queues (IOCCSZ = (64 + this) / 16).
    pub in_capsule_data_size: u32,
    /// KATO used for discovery controllers that connect with KATO 0.
    pub kato_default_ms: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_queue_size: 128,
            max_io_queues: 8,
            max_data_transfer: 1 << 20,
            in_capsule_data_size: 8192,
            kato_default_ms: 120_000,
        }
    }
}
