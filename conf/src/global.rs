//! `[global]`: limits and process-wide settings, and their checks.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::multipath::CNTLID_MAX;
use crate::names::check_nqn;
use crate::report::Errors;
use crate::size::ByteSize;

pub const QUEUE_SIZE_RANGE: std::ops::RangeInclusive<u32> = 16..=1024;
pub const IO_QUEUES_RANGE: std::ops::RangeInclusive<u32> = 1..=1024;
pub const REACTORS_MAX: u32 = 1024;
/// `cpu_set_t` holds CPU_SETSIZE (1024) CPUs.
pub const CPU_MAX: u32 = 1023;
/// MDTS is a power of two in units of the 4 KiB minimum page size (NVMe Base 2.0 §5.17.2.1);
/// the upper bound keeps per-slot buffers (queue size × MDTS) within reason.
pub const MAX_DATA_TRANSFER_RANGE: std::ops::RangeInclusive<u64> = 4096..=(16 << 20);
pub const KATO_RANGE_MS: std::ops::RangeInclusive<u32> = 1000..=86_400_000;
/// Time allowed from accepting a connection to its Fabrics Connect: long enough for any host
/// (Linux sends ICReq and Connect at once), short enough that idle sockets are reclaimed.
pub const CONNECT_TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u32> = 100..=600_000;
/// Default polling window: covers a loopback or LAN round trip plus the host's turnaround
/// (docs/performance.md, "Polling after work").
pub const DEFAULT_POLL_WINDOW_US: u32 = 50;
/// Largest polling window after work (µs): beyond a tenth of a second spinning stops being
/// a latency measure and becomes a CPU cost.
pub const POLL_WINDOW_US_MAX: u32 = 100_000;
/// How long an SQPOLL kernel thread spins without submissions before it sleeps (ms).
pub const DEFAULT_URING_SQPOLL_IDLE_MS: u32 = 10;
pub const URING_SQPOLL_IDLE_RANGE_MS: std::ops::RangeInclusive<u32> = 1..=10_000;
/// Slots of each ring's registered-file table: one per file or block namespace a reactor does
/// I/O on (a few KiB of kernel memory for the default).
pub const DEFAULT_URING_REGISTERED_FILES: u32 = 256;
/// Linux before 5.15 takes at most 32768 registered files (IORING_MAX_FIXED_FILES).
pub const URING_REGISTERED_FILES_MAX: u32 = 32_768;
/// A registered buffer table pins memory; more than this per reactor is a typo.
pub const URING_FIXED_BUFFERS_MAX: u64 = 64 << 30;
/// Largest `zerocopy_send_threshold`: above any transfer nvmfd accepts (MDTS).
pub const ZEROCOPY_SEND_THRESHOLD_MAX: u64 = 1 << 30;
/// Threads that run the exponentiations of in-band authentication: a few are enough (an
/// ffdhe8192 exponentiation takes ~15 ms on a current core), more would take CPUs from the
/// reactors during a reconnect storm.
pub const DEFAULT_AUTH_WORKERS: u32 = 2;
pub const AUTH_WORKERS_MAX: u32 = 64;
/// Authentication transactions under way at once on the target, and from one address. A
/// Linux host authenticates its admin and I/O queues at once (one transaction each).
pub const DEFAULT_AUTH_MAX_TRANSACTIONS: u32 = 256;
pub const DEFAULT_AUTH_MAX_TRANSACTIONS_PER_HOST: u32 = 64;
pub const AUTH_MAX_TRANSACTIONS_MAX: u32 = 65_536;
/// `sun_path` is 108 bytes including the terminating NUL.
pub const SOCKET_PATH_MAX: usize = 107;
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// `[global]`: limits and process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Global {
    /// Reactor threads; 0 = one per online CPU (or one per entry of `cpus` when given).
    pub reactors: u32,
    /// CPUs to pin reactors to, round-robin; empty = no pinning.
    pub cpus: Vec<u32>,
    /// Entries per I/O queue the target accepts (CAP.MQES + 1).
    pub max_queue_size: u32,
    /// I/O queues per controller.
    pub max_io_queues: u32,
    /// In-capsule data bytes per command (IOCCSZ = (64 + this) / 16, NVMe-oF 1.1 §4.1).
    pub in_capsule_data_size: ByteSize,
    /// Largest data transfer per command (Identify Controller MDTS).
    pub max_data_transfer: ByteSize,
    /// Keep-alive timeout used when the host asks for none (milliseconds).
    pub kato_default_ms: u32,
    /// A transport connection that has not completed a Fabrics Connect within this many
    /// milliseconds is closed (no keep-alive runs before Connect, so an idle or half-open
    /// socket would otherwise hold its buffers forever).
    pub connect_timeout_ms: u32,
    /// After handling traffic a reactor polls its sockets and RDMA completion queues for up
    /// to this many microseconds before sleeping in epoll (adapted to the gaps between
    /// commands, zero when traffic is sparse or absent); 0 = always sleep. Restart-only.
    pub poll_window_us: u32,
    /// Each reactor's io_uring gets a kernel thread that polls its submission queue
    /// (IORING_SETUP_SQPOLL): file and block namespaces submit without a system call, at the
    /// price of a kernel thread per reactor spinning on a CPU for `uring_sqpoll_idle_ms` after
    /// every submission. Restart-only.
    pub uring_sqpoll: bool,
    /// Idle time after which an SQPOLL thread sleeps (the next submission wakes it with one
    /// system call).
    pub uring_sqpoll_idle_ms: u32,
    /// Slots of each reactor ring's registered-file table: ops on file and block namespaces
    /// name a slot instead of a descriptor, which spares the kernel a descriptor lookup and
    /// a file reference count round trip per op. Namespaces beyond the slots use their
    /// descriptors; 0 = off. Restart-only.
    pub uring_registered_files: u32,
    /// Bytes of transport data buffers each reactor ring may keep registered with the kernel
    /// (pinned), so that reads and writes on file and block namespaces are issued as
    /// READ_FIXED/WRITE_FIXED and the kernel skips pinning each O_DIRECT transfer's pages;
    /// buffers beyond it pin per op. A registration covers the largest transfer seen in its
    /// buffer, so "64M" holds, e.g., 16,384 buffers doing 4 KiB I/O or 512 doing 128 KiB.
    /// 0 (the default) = off. Restart-only.
    pub uring_fixed_buffers: ByteSize,
    /// NVMe/TCP reads whose data is at least this large are sent with `MSG_ZEROCOPY` (the
    /// kernel pins the pages instead of copying them; the command's buffer stays busy until
    /// the kernel's notification). 0 (the default) = off: on loopback and on devices without
    /// scatter-gather the kernel copies anyway, and pinning plus notifications cost more
    /// (docs/performance.md). Not on TLS connections. Restart-only.
    pub zerocopy_send_threshold: ByteSize,
    /// Worker threads for the Diffie-Hellman exponentiations of in-band authentication
    /// (DH-HMAC-CHAP), which never run on a reactor. Restart-only.
    pub auth_workers: u32,
    /// Authentication transactions under way at once on the whole target; a new one past it
    /// is refused (the host sees its authentication fail, the log says why). Restart-only.
    pub auth_max_transactions: u32,
    /// The same bound for one host address. Restart-only.
    pub auth_max_transactions_per_host: u32,
    /// `tracing` env-filter directive: a level ("info") or "target=level,…".
    pub log_level: String,
    pub log_format: LogFormat,
    pub control_socket: PathBuf,
    /// Controller IDs this target hands out (1..=65519). Gateways that export the same
    /// subsystem NQN need disjoint ranges.
    pub cntlid_min: u32,
    pub cntlid_max: u32,
    /// Directory of the reservation states with Persist Through Power Loss (one file per
    /// namespace). Unset: PTPL is not offered to hosts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// The discovery subsystem's own NQN (TP 8013 unique discovery NQN), reported in Identify
    /// Controller and the discovery log; hosts may still connect with the well-known NQN.
    /// Unset: the well-known NQN. Restart-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_nqn: Option<String>,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            reactors: 0,
            cpus: Vec::new(),
            max_queue_size: 128,
            max_io_queues: 8,
            in_capsule_data_size: ByteSize(8192),
            max_data_transfer: ByteSize(1 << 20),
            kato_default_ms: 120_000,
            connect_timeout_ms: 30_000,
            poll_window_us: DEFAULT_POLL_WINDOW_US,
            uring_sqpoll: false,
            uring_sqpoll_idle_ms: DEFAULT_URING_SQPOLL_IDLE_MS,
            uring_registered_files: DEFAULT_URING_REGISTERED_FILES,
            // Off: no gain measured here (docs/fixed-buffers.md), and what is registered
            // stays pinned.
            uring_fixed_buffers: ByteSize(0),
            // Off: measured only on loopback, where the kernel copies anyway.
            zerocopy_send_threshold: ByteSize(0),
            auth_workers: DEFAULT_AUTH_WORKERS,
            auth_max_transactions: DEFAULT_AUTH_MAX_TRANSACTIONS,
            auth_max_transactions_per_host: DEFAULT_AUTH_MAX_TRANSACTIONS_PER_HOST,
            log_level: "info".to_owned(),
            log_format: LogFormat::Text,
            control_socket: PathBuf::from("/run/nvmfd/control.sock"),
            cntlid_min: 1,
            cntlid_max: CNTLID_MAX,
            state_dir: None,
            discovery_nqn: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Every problem with `[global]` except the controller ID range (see `multipath`).
pub(crate) fn check(global: &Global, errors: &mut Errors) {
    if global.reactors > REACTORS_MAX {
        errors.push(
            "global.reactors",
            global.reactors,
            format!("must be 0..={REACTORS_MAX}"),
        );
    }
    let mut seen_cpus = HashMap::new();
    for (i, &cpu) in global.cpus.iter().enumerate() {
        let key = format!("global.cpus[{i}]");
        if cpu > CPU_MAX {
            errors.push(&key, cpu, format!("must be 0..={CPU_MAX}"));
        }
        if let Some(first) = seen_cpus.insert(cpu, i) {
            errors.push(
                &key,
                cpu,
                format!("duplicate CPU (also global.cpus[{first}])"),
            );
        }
    }
    if !QUEUE_SIZE_RANGE.contains(&global.max_queue_size) {
        errors.push(
            "global.max_queue_size",
            global.max_queue_size,
            format!(
                "must be {}..={}",
                QUEUE_SIZE_RANGE.start(),
                QUEUE_SIZE_RANGE.end()
            ),
        );
    }
    if !IO_QUEUES_RANGE.contains(&global.max_io_queues) {
        errors.push(
            "global.max_io_queues",
            global.max_io_queues,
            format!(
                "must be {}..={}",
                IO_QUEUES_RANGE.start(),
                IO_QUEUES_RANGE.end()
            ),
        );
    }
    let mdts = global.max_data_transfer.bytes();
    if !mdts.is_power_of_two() || !MAX_DATA_TRANSFER_RANGE.contains(&mdts) {
        errors.push(
            "global.max_data_transfer",
            global.max_data_transfer,
            "must be a power of two in 4K..=16M",
        );
    }
    let icd = global.in_capsule_data_size.bytes();
    // IOCCSZ counts 16-byte units (NVMe-oF 1.1 §4.1), so the data part must be one too.
    if icd % 16 != 0 {
        errors.push(
            "global.in_capsule_data_size",
            global.in_capsule_data_size,
            "must be a multiple of 16",
        );
    } else if icd > mdts {
        errors.push(
            "global.in_capsule_data_size",
            global.in_capsule_data_size,
            format!(
                "must not exceed max_data_transfer ({})",
                global.max_data_transfer
            ),
        );
    }
    if !KATO_RANGE_MS.contains(&global.kato_default_ms) {
        errors.push(
            "global.kato_default_ms",
            global.kato_default_ms,
            format!(
                "must be {}..={} (the keep-alive timer has 1 s granularity on Linux)",
                KATO_RANGE_MS.start(),
                KATO_RANGE_MS.end()
            ),
        );
    }
    if !CONNECT_TIMEOUT_RANGE_MS.contains(&global.connect_timeout_ms) {
        errors.push(
            "global.connect_timeout_ms",
            global.connect_timeout_ms,
            format!(
                "must be {}..={}",
                CONNECT_TIMEOUT_RANGE_MS.start(),
                CONNECT_TIMEOUT_RANGE_MS.end()
            ),
        );
    }
    if global.poll_window_us > POLL_WINDOW_US_MAX {
        errors.push(
            "global.poll_window_us",
            global.poll_window_us,
            format!("must be 0..={POLL_WINDOW_US_MAX}"),
        );
    }
    if let Some(nqn) = &global.discovery_nqn {
        // Unlike subsystem names (served as nvmet takes them), a new key: a well-formed NQN.
        if let Err(e) = check_nqn(nqn) {
            errors.push("global.discovery_nqn", nqn, e.to_string());
        }
    }
    if !URING_SQPOLL_IDLE_RANGE_MS.contains(&global.uring_sqpoll_idle_ms) {
        errors.push(
            "global.uring_sqpoll_idle_ms",
            global.uring_sqpoll_idle_ms,
            format!(
                "must be {}..={}",
                URING_SQPOLL_IDLE_RANGE_MS.start(),
                URING_SQPOLL_IDLE_RANGE_MS.end()
            ),
        );
    }
    if global.uring_registered_files > URING_REGISTERED_FILES_MAX {
        errors.push(
            "global.uring_registered_files",
            global.uring_registered_files,
            format!("must be 0..={URING_REGISTERED_FILES_MAX}"),
        );
    }
    if global.uring_fixed_buffers.0 > URING_FIXED_BUFFERS_MAX {
        errors.push(
            "global.uring_fixed_buffers",
            global.uring_fixed_buffers,
            format!("must be at most {}", ByteSize(URING_FIXED_BUFFERS_MAX)),
        );
    }
    if global.zerocopy_send_threshold.0 > ZEROCOPY_SEND_THRESHOLD_MAX {
        errors.push(
            "global.zerocopy_send_threshold",
            global.zerocopy_send_threshold,
            format!("must be at most {}", ByteSize(ZEROCOPY_SEND_THRESHOLD_MAX)),
        );
    }
    if !(1..=AUTH_WORKERS_MAX).contains(&global.auth_workers) {
        errors.push(
            "global.auth_workers",
            global.auth_workers,
            format!("must be 1..={AUTH_WORKERS_MAX}"),
        );
    }
    if !(1..=AUTH_MAX_TRANSACTIONS_MAX).contains(&global.auth_max_transactions) {
        errors.push(
            "global.auth_max_transactions",
            global.auth_max_transactions,
            format!("must be 1..={AUTH_MAX_TRANSACTIONS_MAX}"),
        );
    }
    if !(1..=global.auth_max_transactions.max(1)).contains(&global.auth_max_transactions_per_host) {
        errors.push(
            "global.auth_max_transactions_per_host",
            global.auth_max_transactions_per_host,
            "must be 1..=auth_max_transactions",
        );
    }
    if let Err(reason) = check_log_level(&global.log_level) {
        errors.push("global.log_level", &global.log_level, reason);
    }
    let socket = &global.control_socket;
    if !socket.is_absolute() {
        errors.push(
            "global.control_socket",
            socket.display(),
            "must be an absolute path",
        );
    } else if socket.as_os_str().len() > SOCKET_PATH_MAX {
        errors.push(
            "global.control_socket",
            socket.display(),
            format!("longer than {SOCKET_PATH_MAX} bytes (sun_path limit)"),
        );
    }
}

/// A `tracing` env-filter subset: comma-separated `level` or `target=level` items.
fn check_log_level(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("must not be empty".to_owned());
    }
    for item in text.split(',') {
        let item = item.trim();
        let level = match item.split_once('=') {
            Some((target, level)) => {
                let target_ok = !target.is_empty()
                    && target
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_:-".contains(&b));
                if !target_ok {
                    return Err(format!("{item:?}: bad target name"));
                }
                level
            }
            None => item,
        };
        if !LOG_LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!("{level:?} is not one of {}", LOG_LEVELS.join("/")));
        }
    }
    Ok(())
}
