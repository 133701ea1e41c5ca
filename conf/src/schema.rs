//! The configuration schema as data: every key the loader accepts, with its type, default and
//! reload behaviour. One table serves the checks that report every unknown key and wrong type
//! in one run (`source`), the daemon's refusal of reloads that change restart-only keys, the
//! environment overrides, and the `nvmfd.toml(5)` manual page; tests hold it equal to the serde
//! types (`tests/schema.rs`).

use crate::size::ByteSize;

/// The type of a key's value as written in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// A table (`[global]`).
    Section,
    /// An array of tables (`[[ports]]`, or an array of inline tables).
    Entries,
    Bool,
    /// An integer within the range of its field.
    Int {
        min: i64,
        max: i64,
    },
    /// An integer or a string with a binary suffix (`"512M"`, see `ByteSize`).
    Size,
    Str,
    /// An absolute path (a string).
    Path,
    /// One of these strings.
    Enum(&'static [&'static str]),
    IntList {
        min: i64,
        max: i64,
    },
    StrList,
}

/// When a changed value takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// Applied by a reload (`systemctl reload nvmfd`, SIGHUP, `nvmfd ctl reload`).
    Live,
    /// Fixed while nvmfd runs: a reload that changes it is refused and the running
    /// configuration kept.
    Restart,
}

/// A key's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absent {
    /// The key must be given.
    Required,
    /// The value used when the key is absent, as it would be written in the file.
    Value(&'static str),
    /// Absent means this (no value is assumed).
    Unset(&'static str),
}

/// One key of the configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Path with `[]` for array entries: `subsystems[].namespaces[].nsid`.
    pub path: &'static str,
    pub ty: Type,
    pub default: Absent,
    pub reload: Reload,
    pub doc: &'static str,
}

const U16: Type = Type::Int {
    min: 0,
    max: u16::MAX as i64,
};
const U32: Type = Type::Int {
    min: 0,
    max: u32::MAX as i64,
};
const U64: Type = Type::Int {
    min: 0,
    max: i64::MAX,
};
const TRANSPORTS: &[&str] = &["tcp", "rdma"];
const ANA_STATES: &[&str] = &[
    "optimized",
    "non-optimized",
    "inaccessible",
    "persistent-loss",
    "change",
];

const fn key(
    path: &'static str,
    ty: Type,
    default: Absent,
    reload: Reload,
    doc: &'static str,
) -> Key {
    Key {
        path,
        ty,
        default,
        reload,
        doc,
    }
}

use Absent::{Required, Unset, Value};
use Reload::{Live, Restart};

/// Every key, in the order of the manual page.
pub const KEYS: &[Key] = &[
    key(
        "global",
        Type::Section,
        Unset("every key at its default"),
        Live,
        "Limits and process-wide settings.",
    ),
    key(
        "global.reactors",
        U32,
        Value("0"),
        Restart,
        "Reactor threads; 0 = one per online CPU (or one per entry of cpus). At most 1024.",
    ),
    key(
        "global.cpus",
        Type::IntList {
            min: 0,
            max: u32::MAX as i64,
        },
        Value("[]"),
        Restart,
        "CPUs to pin reactors to, round-robin (0..=1023); empty = no pinning.",
    ),
    key(
        "global.max_queue_size",
        U32,
        Value("128"),
        Restart,
        "Entries per I/O queue the target accepts (CAP.MQES + 1), 16..=1024.",
    ),
    key(
        "global.max_io_queues",
        U32,
        Value("8"),
        Restart,
        "I/O queues per controller, 1..=1024.",
    ),
    key(
        "global.in_capsule_data_size",
        Type::Size,
        Value("8K"),
        Restart,
        "In-capsule data bytes per command (IOCCSZ = (64 + this) / 16); a multiple of 16, \
         at most max_data_transfer.",
    ),
    key(
        "global.max_data_transfer",
        Type::Size,
        Value("1M"),
        Restart,
        "Largest data transfer per command (MDTS): a power of two in 4K..=16M.",
    ),
    key(
        "global.kato_default_ms",
        U32,
        Value("120000"),
        Restart,
        "Keep-alive timeout used when the host asks for none, 1000..=86400000 ms.",
    ),
    key(
        "global.connect_timeout_ms",
        U32,
        Value("30000"),
        Restart,
        "A connection without a Fabrics Connect after this many milliseconds is closed \
         (100..=600000).",
    ),
    key(
        "global.poll_window_us",
        U32,
        Value("50"),
        Restart,
        "After traffic a reactor polls its sockets and RDMA completion queues this many \
         microseconds before sleeping; 0 = always sleep. At most 100000.",
    ),
    key(
        "global.uring_sqpoll",
        Type::Bool,
        Value("false"),
        Restart,
        "A kernel thread per reactor polls its io_uring submission queue (file and block I/O \
         without a system call; the thread spins a CPU while busy).",
    ),
    key(
        "global.uring_sqpoll_idle_ms",
        U32,
        Value("10"),
        Restart,
        "Idle time after which an SQPOLL thread sleeps, 1..=10000 ms.",
    ),
    key(
        "global.uring_registered_files",
        U32,
        Value("256"),
        Restart,
        "Registered-file slots of each reactor ring (file and block namespaces); 0 = off. \
         At most 32768.",
    ),
    key(
        "global.uring_fixed_buffers",
        Type::Size,
        Value("0"),
        Restart,
        "Bytes of data buffers each reactor ring keeps registered (pinned) so that file and \
         block I/O skips per-op page pinning; 0 = off. At most 64G.",
    ),
    key(
        "global.zerocopy_send_threshold",
        Type::Size,
        Value("0"),
        Restart,
        "NVMe/TCP read data of at least this many bytes is sent with MSG_ZEROCOPY (pages \
         pinned, not copied; the command buffer is held until the kernel's notification); \
         0 = off. Pays only towards a NIC with scatter-gather: on loopback the kernel copies \
         anyway. Not on TLS connections. At most 1G.",
    ),
    key(
        "global.auth_workers",
        U32,
        Value("2"),
        Restart,
        "Threads that run the Diffie-Hellman exponentiations of in-band authentication \
         (DH-HMAC-CHAP), never on a reactor; 1..=64.",
    ),
    key(
        "global.auth_max_transactions",
        U32,
        Value("256"),
        Restart,
        "Authentication transactions under way at once on the target (1..=65536); a new one \
         past it fails (the host's connect or re-authentication fails, the log says why).",
    ),
    key(
        "global.auth_max_transactions_per_host",
        U32,
        Value("64"),
        Restart,
        "The same bound for one host address, 1..=auth_max_transactions (a Linux host \
         authenticates all the queues of a controller at once).",
    ),
    key(
        "global.log_level",
        Type::Str,
        Value("info"),
        Live,
        "A level (trace, debug, info, warn, error, off) or an env-filter such as \
         \"info,transport=debug\".",
    ),
    key(
        "global.log_format",
        Type::Enum(&["text", "json"]),
        Value("text"),
        Restart,
        "Log line format on standard error (the journal under systemd).",
    ),
    key(
        "global.control_socket",
        Type::Path,
        Value("/run/nvmfd/control.sock"),
        Restart,
        "Unix socket of nvmfd ctl (absolute, at most 107 bytes).",
    ),
    key(
        "global.cntlid_min",
        U32,
        Value("1"),
        Live,
        "Lowest controller ID handed out (1..=65519); gateways exporting one subsystem need \
         disjoint ranges.",
    ),
    key(
        "global.cntlid_max",
        U32,
        Value("65519"),
        Live,
        "Highest controller ID handed out (cntlid_min..=65519).",
    ),
    key(
        "global.state_dir",
        Type::Path,
        Unset("reservations are not persisted (PTPL not offered)"),
        Restart,
        "Directory of persistent state: reservations with Persist Through Power Loss, \
         SMART/Health counters, the discovery generation counter.",
    ),
    key(
        "global.discovery_nqn",
        Type::Str,
        Unset("the well-known discovery NQN"),
        Restart,
        "The discovery subsystem's own NQN (TP 8013 unique discovery NQN); hosts may still \
         connect with the well-known one.",
    ),
    key(
        "rdma",
        Type::Section,
        Unset("every key at its default"),
        Restart,
        "NVMe/RDMA pools, per RDMA device. Pools are pinned and registered once; when one runs \
         dry commands wait.",
    ),
    key(
        "rdma.capsule_buffers",
        Type::Int {
            min: 0,
            max: u32::MAX as i64,
        },
        Unset("(max_io_queues + 1) × max_queue_size × 4, within 256..=16384"),
        Restart,
        "Receive (command capsule) buffers per device, max_queue_size..=65536.",
    ),
    key(
        "rdma.data_buffer_memory",
        Type::Size,
        Unset("128M, 16 to 1024 buffers"),
        Restart,
        "Pinned memory for data buffers per device (this / max_data_transfer buffers), at \
         most 4G.",
    ),
    key(
        "rdma.shared_receive_queue",
        Type::Bool,
        Value("false"),
        Restart,
        "One shared receive queue per device instead of a receive ring per queue pair.",
    ),
    key(
        "rdma.busy_poll_us",
        U32,
        Value("0"),
        Restart,
        "Older name of global.poll_window_us for RDMA completion queues (the larger of the \
         two applies), at most 100000.",
    ),
    key(
        "metrics",
        Type::Section,
        Unset("off"),
        Restart,
        "Command counters for nvmfd ctl top and the metrics endpoint.",
    ),
    key(
        "metrics.enabled",
        Type::Bool,
        Value("false"),
        Restart,
        "Count commands without the endpoint (for nvmfd ctl top).",
    ),
    key(
        "metrics.listen",
        Type::Str,
        Unset("no endpoint"),
        Restart,
        "address:port of the HTTP endpoint (GET /metrics), e.g. \"127.0.0.1:9469\"; implies \
         enabled. No authentication: loopback or a management network.",
    ),
    key(
        "ports",
        Type::Entries,
        Required,
        Live,
        "Listening addresses (the NVMe-oF ports of the discovery log); at least one.",
    ),
    key(
        "ports[].id",
        U16,
        Required,
        Live,
        "Port ID (PORTID of the discovery log), unique; named by subsystems[].ports.",
    ),
    key(
        "ports[].transport",
        Type::Enum(TRANSPORTS),
        Required,
        Live,
        "tcp or rdma.",
    ),
    key(
        "ports[].address",
        Type::Str,
        Required,
        Live,
        "An IPv4 or IPv6 address literal (0.0.0.0 or :: for every address).",
    ),
    key(
        "ports[].service",
        U32,
        Required,
        Live,
        "TCP or RDMA CM port, 1..=65535 (usually 4420).",
    ),
    key(
        "ports[].tls",
        Type::Enum(&["none", "optional", "required"]),
        Value("none"),
        Restart,
        "NVMe/TCP secure channel (TLS 1.3 with PSKs): required refuses connections without a \
         TLS handshake, optional serves both. Needs [[tls_keys]].",
    ),
    key(
        "subsystems",
        Type::Entries,
        Unset("no subsystem"),
        Live,
        "NVM subsystems.",
    ),
    key(
        "subsystems[].nqn",
        Type::Str,
        Required,
        Live,
        "Subsystem NQN (at most 223 bytes, unique; not the discovery NQN).",
    ),
    key(
        "subsystems[].serial",
        Type::Str,
        Unset("derived from the NQN"),
        Live,
        "Identify Controller serial number, at most 20 printable ASCII characters.",
    ),
    key(
        "subsystems[].model",
        Type::Str,
        Value("nvmfd"),
        Live,
        "Identify Controller model number, at most 40 printable ASCII characters.",
    ),
    key(
        "subsystems[].allow_any_host",
        Type::Bool,
        Unset("required when the subsystem lists no hosts"),
        Live,
        "true: every host may connect. A subsystem without hosts must say true (or false, \
         closed) explicitly.",
    ),
    key(
        "subsystems[].allowed_hosts",
        Type::StrList,
        Value("[]"),
        Live,
        "Host NQNs allowed without authentication.",
    ),
    key(
        "subsystems[].hosts",
        Type::Entries,
        Value("[]"),
        Live,
        "Allowed hosts with DH-HMAC-CHAP settings.",
    ),
    key(
        "subsystems[].hosts[].nqn",
        Type::Str,
        Required,
        Live,
        "The host NQN.",
    ),
    key(
        "subsystems[].hosts[].dhchap_key",
        Type::Str,
        Unset("no authentication"),
        Live,
        "The host's secret, DHHC-1:… (nvme gen-dhchap-key); exclusive with dhchap_key_file.",
    ),
    key(
        "subsystems[].hosts[].dhchap_key_file",
        Type::Path,
        Unset("no authentication"),
        Live,
        "File holding the host's secret, readable by its owner only (mode 0600).",
    ),
    key(
        "subsystems[].hosts[].dhchap_ctrl_key",
        Type::Str,
        Unset("unidirectional"),
        Live,
        "The controller's secret for bidirectional authentication (needs a host key).",
    ),
    key(
        "subsystems[].hosts[].dhchap_ctrl_key_file",
        Type::Path,
        Unset("unidirectional"),
        Live,
        "File holding the controller's secret, mode 0600.",
    ),
    key(
        "subsystems[].hosts[].dhchap_hashes",
        Type::StrList,
        Unset("hmac(sha256), hmac(sha384), hmac(sha512)"),
        Live,
        "Allowed hash functions, most preferred first.",
    ),
    key(
        "subsystems[].hosts[].dhchap_dhgroups",
        Type::StrList,
        Unset("ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192, null"),
        Live,
        "Allowed DH groups, most preferred first.",
    ),
    key(
        "subsystems[].ports",
        Type::IntList {
            min: 0,
            max: u16::MAX as i64,
        },
        Unset("every port"),
        Live,
        "Port IDs this subsystem is exported on.",
    ),
    key(
        "subsystems[].namespaces",
        Type::Entries,
        Value("[]"),
        Live,
        "Namespaces.",
    ),
    key(
        "subsystems[].namespaces[].nsid",
        U32,
        Required,
        Live,
        "Namespace ID, 1..=4294967294, unique in the subsystem.",
    ),
    key(
        "subsystems[].namespaces[].ram_size",
        Type::Size,
        Unset("not RAM-backed"),
        Live,
        "RAM-backed namespace of this size (a multiple of block_size).",
    ),
    key(
        "subsystems[].namespaces[].null_size",
        Type::Size,
        Unset("not a null namespace"),
        Live,
        "Null namespace of this size: reads return zeroes, writes are dropped (benchmarks).",
    ),
    key(
        "subsystems[].namespaces[].path",
        Type::Path,
        Unset("not file-backed"),
        Live,
        "Regular file or block device (absolute path).",
    ),
    key(
        "subsystems[].namespaces[].size",
        Type::Size,
        Unset("the file's size"),
        Live,
        "Create or extend the regular file at path to this size.",
    ),
    key(
        "subsystems[].namespaces[].rbd",
        Type::Str,
        Unset("not an RBD image"),
        Live,
        "Ceph RBD image, \"pool/image\" or \"pool/namespace/image\" (nvmfd built with rbd).",
    ),
    key(
        "subsystems[].namespaces[].ceph_conf",
        Type::Path,
        Unset("librados' search"),
        Live,
        "ceph.conf for rbd.",
    ),
    key(
        "subsystems[].namespaces[].ceph_client_id",
        Type::Str,
        Unset("admin"),
        Live,
        "Ceph client id for rbd.",
    ),
    key(
        "subsystems[].namespaces[].block_size",
        U32,
        Value("512"),
        Live,
        "512 or 4096.",
    ),
    key(
        "subsystems[].namespaces[].read_only",
        Type::Bool,
        Value("false"),
        Live,
        "Refuse writes.",
    ),
    key(
        "subsystems[].namespaces[].direct_io",
        Type::Bool,
        Value("true"),
        Live,
        "O_DIRECT for path namespaces; false = buffered I/O.",
    ),
    key(
        "subsystems[].namespaces[].uuid",
        Type::Str,
        Unset("none reported"),
        Live,
        "Namespace UUID (8-4-4-4-12 hex), unique.",
    ),
    key(
        "subsystems[].namespaces[].nguid",
        Type::Str,
        Unset("none reported"),
        Live,
        "Namespace NGUID (32 hex digits), unique.",
    ),
    key(
        "subsystems[].namespaces[].ana_group",
        U32,
        Value("1"),
        Live,
        "ANA group: 1, or an [[ana_groups]] id.",
    ),
    key(
        "subsystems[].namespaces[].hosts",
        Type::StrList,
        Unset("every admitted host"),
        Live,
        "Host NQNs that see this namespace; the others find the NSID inactive.",
    ),
    key(
        "subsystems[].namespaces[].qos",
        Type::Section,
        Unset("no limit"),
        Live,
        "IOPS and bandwidth limits of this namespace, all hosts together (also: nvmfd ctl \
         set-qos).",
    ),
    key(
        "subsystems[].namespaces[].qos.iops",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_IOPS as i64,
        },
        Value("0"),
        Live,
        "Commands per second (Read, Write, Compare, Write Zeroes, Copy, Verify); 0 = no limit.",
    ),
    key(
        "subsystems[].namespaces[].qos.read_mbps",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_MBPS as i64,
        },
        Value("0"),
        Live,
        "Read data, MiB/s; 0 = no limit.",
    ),
    key(
        "subsystems[].namespaces[].qos.write_mbps",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_MBPS as i64,
        },
        Value("0"),
        Live,
        "Write data, MiB/s; 0 = no limit.",
    ),
    key(
        "subsystems[].namespaces[].qos.total_mbps",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_MBPS as i64,
        },
        Value("0"),
        Live,
        "Read and write data together, MiB/s; 0 = no limit.",
    ),
    key(
        "subsystems[].namespaces[].qos.burst_ms",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_BURST_MS as i64,
        },
        Unset("100"),
        Live,
        "How far ahead of each rate a burst may run, ms of that rate (at least 5).",
    ),
    key(
        "subsystems[].namespaces[].faults",
        Type::Entries,
        Value("[]"),
        Live,
        "Fault injection for tests: commands touching these LBA ranges are delayed or fail.",
    ),
    key(
        "subsystems[].namespaces[].faults[].slba",
        U64,
        Required,
        Live,
        "First LBA.",
    ),
    key(
        "subsystems[].namespaces[].faults[].blocks",
        U64,
        Required,
        Live,
        "Number of LBAs.",
    ),
    key(
        "subsystems[].namespaces[].faults[].on",
        Type::Enum(&["read", "write", "any"]),
        Required,
        Live,
        "Which commands.",
    ),
    key(
        "subsystems[].namespaces[].faults[].error",
        Type::Enum(&["eio", "enospc"]),
        Unset("no error"),
        Live,
        "The errno the storage reports.",
    ),
    key(
        "subsystems[].namespaces[].faults[].latency_ms",
        U32,
        Unset("no delay"),
        Live,
        "Delay before the command starts, 1..=600000 ms.",
    ),
    key(
        "subsystems[].namespaces[].faults[].every",
        U32,
        Value("1"),
        Live,
        "Only every n-th command touching the range.",
    ),
    key(
        "subsystems[].host_qos",
        Type::Entries,
        Value("[]"),
        Live,
        "IOPS and bandwidth limits of hosts on this subsystem, all their queues together.",
    ),
    key(
        "subsystems[].host_qos[].host",
        Type::Str,
        Required,
        Live,
        "The host NQN.",
    ),
    key(
        "subsystems[].host_qos[].qos",
        Type::Section,
        Required,
        Live,
        "Its limits.",
    ),
    key(
        "subsystems[].host_qos[].qos.iops",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_IOPS as i64,
        },
        Value("0"),
        Live,
        "Commands per second (Read, Write, Compare, Write Zeroes, Copy, Verify); 0 = no limit.",
    ),
    key(
        "subsystems[].host_qos[].qos.read_mbps",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_MBPS as i64,
        },
        Value("0"),
        Live,
        "Read data, MiB/s; 0 = no limit.",
    ),
    key(
        "subsystems[].host_qos[].qos.write_mbps",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_MBPS as i64,
        },
        Value("0"),
        Live,
        "Write data, MiB/s; 0 = no limit.",
    ),
    key(
        "subsystems[].host_qos[].qos.total_mbps",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_MBPS as i64,
        },
        Value("0"),
        Live,
        "Read and write data together, MiB/s; 0 = no limit.",
    ),
    key(
        "subsystems[].host_qos[].qos.burst_ms",
        Type::Int {
            min: 0,
            max: crate::qos::MAX_BURST_MS as i64,
        },
        Unset("100"),
        Live,
        "How far ahead of each rate a burst may run, ms of that rate (at least 5).",
    ),
    key(
        "referrals",
        Type::Entries,
        Value("[]"),
        Live,
        "Other discovery controllers listed in the discovery log.",
    ),
    key(
        "referrals[].transport",
        Type::Enum(TRANSPORTS),
        Required,
        Live,
        "tcp or rdma.",
    ),
    key(
        "referrals[].address",
        Type::Str,
        Required,
        Live,
        "IPv4 or IPv6 address.",
    ),
    key(
        "referrals[].service",
        U32,
        Required,
        Live,
        "Port, 1..=65535.",
    ),
    key(
        "ana_groups",
        Type::Entries,
        Value("[]"),
        Live,
        "Asymmetric Namespace Access groups (group 1 exists implicitly).",
    ),
    key("ana_groups[].id", U32, Required, Live, "Group ID, 1..=128."),
    key(
        "ana_groups[].state",
        Type::Enum(ANA_STATES),
        Value("optimized"),
        Live,
        "State on every port not listed in port_states.",
    ),
    key(
        "ana_groups[].port_states",
        Type::Entries,
        Value("[]"),
        Live,
        "Per-port states: [{ port = 2, state = \"non-optimized\" }].",
    ),
    key(
        "ana_groups[].port_states[].port",
        U16,
        Required,
        Live,
        "A [[ports]] id.",
    ),
    key(
        "ana_groups[].port_states[].state",
        Type::Enum(ANA_STATES),
        Required,
        Live,
        "State on that port.",
    ),
    key(
        "tls_keys",
        Type::Entries,
        Value("[]"),
        Live,
        "Configured TLS PSKs of the hosts; new handshakes use a reloaded key, established \
         sessions keep theirs.",
    ),
    key(
        "tls_keys[].host",
        Type::Str,
        Required,
        Live,
        "The host NQN of the PSK identities the key answers.",
    ),
    key(
        "tls_keys[].subsystem",
        Type::Str,
        Unset("every subsystem"),
        Live,
        "Only for this subsystem.",
    ),
    key(
        "tls_keys[].key_file",
        Type::Path,
        Required,
        Live,
        "The key in the interchange format (nvme gen-tls-key), mode 0600.",
    ),
    key(
        "tls_keys[].hkdf_label",
        Type::Enum(&["compat", "rfc8446"]),
        Value("compat"),
        Live,
        "HKDF-Expand-Label encoding of the key's creator: compat (nvme-cli 2.13) or rfc8446.",
    ),
    key(
        "gateway_group",
        Type::Section,
        Unset("no gateway group"),
        Restart,
        "Gateways sharing ANA group ownership through RADOS leases, with fencing and failback \
         (docs/gateway-groups.md); needs nvmfd built with the rbd feature.",
    ),
    key(
        "gateway_group.name",
        Type::Str,
        Required,
        Restart,
        "The group's name, prefix of its RADOS objects (the same on every gateway).",
    ),
    key(
        "gateway_group.gateway",
        Type::Str,
        Required,
        Restart,
        "This gateway's id (one of gateway_group.members).",
    ),
    key(
        "gateway_group.pool",
        Type::Str,
        Required,
        Restart,
        "RADOS pool of the group's lock objects.",
    ),
    key(
        "gateway_group.namespace",
        Type::Str,
        Unset("the pool's default namespace"),
        Restart,
        "RADOS namespace of the group's lock objects.",
    ),
    key(
        "gateway_group.ceph_conf",
        Type::Path,
        Unset("librados' search ($CEPH_CONF, /etc/ceph/ceph.conf, …)"),
        Restart,
        "ceph.conf of the gateway's RADOS client; RBD namespaces open their images on that \
         client (their own ceph_conf unset or the same).",
    ),
    key(
        "gateway_group.client_id",
        Type::Str,
        Unset("admin"),
        Restart,
        "Ceph client id; needs 'osd blocklist' on the monitors (fencing).",
    ),
    key(
        "gateway_group.lease_ms",
        Type::Int {
            min: 1000,
            max: 600_000,
        },
        Value("5000"),
        Restart,
        "Lease of an ANA group's owner: a dead owner's groups move after at most this plus \
         renew_ms and the fencing round trip; also the timeout of the gateway's RADOS operations.",
    ),
    key(
        "gateway_group.renew_ms",
        Type::Int {
            min: 100,
            max: 200_000,
        },
        Value("1000"),
        Restart,
        "How often leases are renewed and the group surveyed; at most a third of lease_ms.",
    ),
    key(
        "gateway_group.failback_hold_ms",
        Type::Int {
            min: 0,
            max: 3_600_000,
        },
        Value("15000"),
        Restart,
        "How long a returning preferred gateway must stay up before it gets its groups back.",
    ),
    key(
        "gateway_group.handover_drain_ms",
        Type::Int {
            min: 0,
            max: 60_000,
        },
        Value("2000"),
        Restart,
        "During a failback, time between reporting a group inaccessible and unlocking it.",
    ),
    key(
        "gateway_group.standby_state",
        Type::Enum(&["inaccessible", "non-optimized"]),
        Value("inaccessible"),
        Restart,
        "ANA state of groups this gateway does not own (non-optimized lets hosts write \
         through several gateways: only with rbd_cache = false).",
    ),
    key(
        "gateway_group.members",
        Type::Entries,
        Required,
        Restart,
        "Every gateway of the group, in order (ties when spreading groups).",
    ),
    key(
        "gateway_group.members[].id",
        Type::Str,
        Required,
        Restart,
        "A gateway's id (its gateway_group.gateway).",
    ),
    key(
        "gateway_group.members[].prefers",
        Type::IntList { min: 1, max: 128 },
        Unset("none"),
        Restart,
        "ANA groups this gateway owns whenever it is up (failback target); each group \
         preferred by at most one gateway.",
    ),
];

/// The schema entry of `path`, which may carry indices (`subsystems[2].nqn`).
pub fn lookup(path: &str) -> Option<&'static Key> {
    let generic = generic_path(path);
    KEYS.iter().find(|k| k.path == generic)
}

/// `subsystems[2].namespaces[0].nsid` → `subsystems[].namespaces[].nsid`.
pub fn generic_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push('[');
            }
            ']' => {
                in_index = false;
                out.push(']');
            }
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

/// The keys directly under `parent` ("" for the top level, `subsystems[]` for an entry).
pub fn children(parent: &str) -> impl Iterator<Item = &'static Key> + '_ {
    KEYS.iter().filter(move |k| {
        let rest = if parent.is_empty() {
            Some(k.path)
        } else {
            k.path
                .strip_prefix(parent)
                .and_then(|r| r.strip_prefix('.'))
        };
        rest.is_some_and(|r| !r.contains('.'))
    })
}

/// The last component of a key path (`subsystems[].nqn` → `nqn`).
pub fn leaf(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// The closest sibling key name, for "did you mean" (edit distance ≤ 2, or a prefix).
pub fn suggest(parent: &str, name: &str) -> Option<&'static str> {
    children(parent)
        .map(|k| (leaf(k.path), distance(leaf(k.path), name)))
        .filter(|&(candidate, d)| d <= 2 || (name.len() >= 4 && candidate.starts_with(name)))
        .min_by_key(|&(_, d)| d)
        .map(|(candidate, _)| candidate)
}

/// Levenshtein distance (short key names only).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

impl Type {
    /// How the type is named in messages and the manual page.
    pub fn describe(self) -> String {
        match self {
            Type::Section => "table".into(),
            Type::Entries => "array of tables".into(),
            Type::Bool => "boolean".into(),
            // The range is in the message of a value outside it.
            Type::Int { .. } => "integer".into(),
            Type::Size => "size (integer, or a string such as \"512M\", \"1G\", \"1GiB\")".into(),
            Type::Str => "string".into(),
            Type::Path => "path (string)".into(),
            Type::Enum(names) => format!("one of {}", quoted(names)),
            Type::IntList { .. } => "array of integers".into(),
            Type::StrList => "array of strings".into(),
        }
    }
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A scalar value as the checks see it, from a TOML document or an environment variable.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scalar<'a> {
    Int(i64),
    Str(&'a str),
    Bool,
    /// Another TOML type (float, date, table …), by name.
    Other(&'static str),
}

impl Scalar<'_> {
    fn name(self) -> &'static str {
        match self {
            Scalar::Int(_) => "integer",
            Scalar::Str(_) => "string",
            Scalar::Bool => "boolean",
            Scalar::Other(name) => name,
        }
    }
}

/// Why a scalar does not fit `ty` (a list element is checked against the list's element type).
pub(crate) fn check_scalar(ty: Type, value: Scalar<'_>) -> Result<(), String> {
    let wrong = || {
        Err(format!(
            "expected {}, found {}",
            ty.describe(),
            value.name()
        ))
    };
    match (ty, value) {
        (Type::Bool, Scalar::Bool) | (Type::Str | Type::Path, Scalar::Str(_)) => Ok(()),
        (Type::Int { min, max } | Type::IntList { min, max }, Scalar::Int(n)) => {
            if (min..=max).contains(&n) {
                Ok(())
            } else {
                Err(format!("{n} is out of range {min}..={max}"))
            }
        }
        (Type::Size, Scalar::Int(n)) if n < 0 => Err(format!("{n}: a size cannot be negative")),
        (Type::Size, Scalar::Int(_)) => Ok(()),
        (Type::Size, Scalar::Str(text)) => ByteSize::parse(text).map(drop).map_err(|e| {
            format!("{e} (sizes are binary: 4096, \"512M\", \"1G\", \"1GiB\"; no decimal KB/MB)")
        }),
        (Type::Enum(names), Scalar::Str(text)) => {
            if names.contains(&text) {
                Ok(())
            } else {
                Err(format!("{text:?} is not one of {}", quoted(names)))
            }
        }
        (Type::StrList, Scalar::Str(_)) => Ok(()),
        _ => wrong(),
    }
}

/// The keys marked restart-only whose values differ between two configurations. A key inside
/// array entries (`ports[].tls`) compares the entries that set it: adding, removing or changing
/// such an entry (a TLS port) needs a restart; entries that leave it at its default change live.
pub fn restart_only_changes(old: &crate::Config, new: &crate::Config) -> Vec<&'static str> {
    let (Ok(old), Ok(new)) = (serde_json::to_value(old), serde_json::to_value(new)) else {
        // Serializing a Config cannot fail (no maps with non-string keys); be safe anyway.
        return vec!["the configuration"];
    };
    let mut changed = Vec::new();
    for key in KEYS.iter().filter(|k| k.reload == Reload::Restart) {
        let differs = match key.path.split_once("[].") {
            None => values_at(&old, key.path) != values_at(&new, key.path),
            Some((array, field)) => {
                let setting = |config: &serde_json::Value| -> Vec<serde_json::Value> {
                    let entries = config.get(array).and_then(|v| v.as_array());
                    entries
                        .into_iter()
                        .flatten()
                        .filter(|entry| entry.get(field).is_some_and(|v| !is_default(key, v)))
                        .cloned()
                        .collect()
                };
                setting(&old) != setting(&new)
            }
        };
        // A whole section marked restart-only is reported once, not key by key.
        let covered = changed
            .iter()
            .any(|c: &&str| key.path.starts_with(&format!("{c}.")));
        if differs && !covered {
            changed.push(key.path);
        }
    }
    changed
}

fn values_at<'a>(config: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.')
        .try_fold(config, |value, part| value.get(part))
}

fn is_default(key: &Key, value: &serde_json::Value) -> bool {
    match key.default {
        Absent::Value(text) => value.as_str() == Some(text) || *value.to_string() == *text,
        Absent::Required | Absent::Unset(_) => value.is_null(),
    }
}

#[cfg(test)]
mod tests;
