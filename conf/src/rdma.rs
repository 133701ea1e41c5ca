//! `[rdma]`: NVMe/RDMA resource settings, the same for every RDMA port (ARCHITECTURE.md
//! RDMA contract).
//!
//! Every buffer the HCA touches is pinned and registered once per device, so these keys bound
//! the memory an RDMA port can pin; running out of any pool is back-pressure (a command waits,
//! a host's sends are retried on receiver-not-ready), never a dropped command.

use serde::{Deserialize, Serialize};

use crate::global::Global;
use crate::report::Errors;
use crate::size::ByteSize;

/// Upper bound on receive buffers per device (each is 64 bytes + in-capsule data).
pub const CAPSULE_BUFFERS_MAX: u32 = 65536;
/// Upper bound on pinned memory of one pool (the transport's `pool::MAX_POOL_BYTES`).
pub const POOL_MEMORY_MAX: u64 = 4 << 30;
/// Busy polling longer than the reactor tick (100 ms) would only burn CPU.
pub const BUSY_POLL_US_MAX: u32 = 100_000;

/// `[rdma]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rdma {
    /// Receive (command capsule) buffers per device. Without a shared receive queue each
    /// connection takes its queue depth of them (a connection that finds too few left is
    /// refused with NO_RSC); with one, they are all posted to the device's SRQ. Unset:
    /// four controllers at full depth on every queue, (max_io_queues + 1) × max_queue_size × 4,
    /// within 256..=16384.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capsule_buffers: Option<u32>,
    /// Pinned memory for data buffers per device; each buffer is max_data_transfer bytes, so
    /// this / max_data_transfer commands move data at once and the others wait. Unset: 128M,
    /// at least 16 and at most 1024 buffers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_buffer_memory: Option<ByteSize>,
    /// One shared receive queue per device (ibv_create_srq) instead of a receive ring per
    /// queue pair: receive memory no longer grows with the number of connections.
    pub shared_receive_queue: bool,
    /// 0: sleep in epoll until a completion channel fires. N: while RDMA connections are
    /// active, poll their completion queues on every reactor turn and keep polling for up to
    /// N µs without work before re-arming and sleeping (lower latency, a busy core under load,
    /// ~0 % CPU when idle).
    pub busy_poll_us: u32,
}

impl Rdma {
    /// Whether every key is at its default (the section is then omitted from `to_toml`).
    pub fn is_default(&self) -> bool {
        *self == Rdma::default()
    }
}

/// Every problem with `[rdma]`, each naming its key.
pub(crate) fn check(rdma: &Rdma, global: &Global, errors: &mut Errors) {
    if let Some(n) = rdma.capsule_buffers {
        let capsule = 64 + global.in_capsule_data_size.bytes();
        if n < global.max_queue_size || n > CAPSULE_BUFFERS_MAX {
            // One queue at full depth must fit: its receives (or the SRQ) are all posted
            // before the host may send.
            errors.push(
                "rdma.capsule_buffers",
                n,
                format!(
                    "must be global.max_queue_size ({})..={CAPSULE_BUFFERS_MAX}",
                    global.max_queue_size
                ),
            );
        } else if u64::from(n) * capsule > POOL_MEMORY_MAX {
            errors.push(
                "rdma.capsule_buffers",
                n,
                format!(
                    "{n} × {capsule} bytes (64 + in_capsule_data_size) exceeds {}",
                    ByteSize(POOL_MEMORY_MAX)
                ),
            );
        }
    }
    if let Some(memory) = rdma.data_buffer_memory {
        let mdts = global.max_data_transfer;
        if memory.bytes() > POOL_MEMORY_MAX {
            errors.push(
                "rdma.data_buffer_memory",
                memory,
                format!(
                    "must not exceed {} (pinned per device)",
                    ByteSize(POOL_MEMORY_MAX)
                ),
            );
        } else if memory.bytes() < mdts.bytes() {
            errors.push(
                "rdma.data_buffer_memory",
                memory,
                format!("must hold at least one max_data_transfer ({mdts}) buffer"),
            );
        }
    }
    if rdma.busy_poll_us > BUSY_POLL_US_MAX {
        errors.push(
            "rdma.busy_poll_us",
            rdma.busy_poll_us,
            format!("must be 0..={BUSY_POLL_US_MAX}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    /// The problems `check` reports for the whole configuration's `[rdma]`.
    fn problems(config: &Config) -> Vec<String> {
        let mut errors = Errors::default();
        check(&config.rdma, &config.global, &mut errors);
        let errors = errors.into_result().err().unwrap_or_default();
        errors.iter().map(ToString::to_string).collect()
    }

    fn errors_of(rdma: &str, global: &str) -> Vec<String> {
        let text = format!("[global]\n{global}\n[rdma]\n{rdma}\n");
        problems(&Config::parse_toml(&text).unwrap())
    }

    #[test]
    fn defaults_are_todays_behaviour_and_stay_out_of_to_toml() {
        let config = Config::parse_toml("").unwrap();
        assert_eq!(config.rdma, Rdma::default());
        assert_eq!(config.rdma.capsule_buffers, None);
        assert_eq!(config.rdma.data_buffer_memory, None);
        assert!(!config.rdma.shared_receive_queue);
        assert_eq!(config.rdma.busy_poll_us, 0);
        assert!(errors_of("", "").is_empty());
        let text = config.to_toml().unwrap();
        assert!(!text.contains("[rdma]"), "{text}");
    }

    #[test]
    fn to_toml_round_trips_the_section_and_the_environment_overrides_it() {
        let mut config = Config::parse_toml(crate::EMBEDDED_DEFAULT).unwrap();
        config.rdma = Rdma {
            capsule_buffers: Some(512),
            data_buffer_memory: Some(ByteSize(32 << 20)),
            shared_receive_queue: true,
            busy_poll_us: 20,
        };
        let text = config.to_toml().unwrap();
        assert!(text.contains("data_buffer_memory = \"32M\""), "{text}");
        assert_eq!(Config::parse_toml(&text).unwrap(), config);
        let vars = std::collections::HashMap::from([
            ("NVMFD_RDMA__BUSY_POLL_US".to_owned(), "75".to_owned()),
            (
                "NVMFD_RDMA__SHARED_RECEIVE_QUEUE".to_owned(),
                "true".to_owned(),
            ),
        ]);
        let env = crate::EnvSource::Vars(vars);
        let merged = Config::parse("<test>", crate::EMBEDDED_DEFAULT, env).unwrap();
        assert_eq!(merged.rdma.busy_poll_us, 75);
        assert!(merged.rdma.shared_receive_queue);
    }

    #[test]
    fn every_key_parses_and_in_range_values_validate() {
        let text = "[rdma]\ncapsule_buffers = 1024\ndata_buffer_memory = \"64M\"\n\
                    shared_receive_queue = true\nbusy_poll_us = 50\n";
        let config = Config::parse_toml(text).unwrap();
        assert_eq!(
            config.rdma,
            Rdma {
                capsule_buffers: Some(1024),
                data_buffer_memory: Some(ByteSize(64 << 20)),
                shared_receive_queue: true,
                busy_poll_us: 50,
            }
        );
        assert!(problems(&config).is_empty());
    }

    #[test]
    fn capsule_buffers_must_hold_one_full_queue_and_stay_bounded() {
        assert_eq!(
            errors_of("capsule_buffers = 64", "max_queue_size = 128"),
            ["rdma.capsule_buffers: 64: must be global.max_queue_size (128)..=65536"]
        );
        assert_eq!(
            errors_of("capsule_buffers = 70000", ""),
            ["rdma.capsule_buffers: 70000: must be global.max_queue_size (128)..=65536"]
        );
        assert_eq!(
            errors_of(
                "capsule_buffers = 65536",
                "in_capsule_data_size = \"1M\"\nmax_data_transfer = \"1M\""
            ),
            ["rdma.capsule_buffers: 65536: 65536 × 1048640 bytes (64 + in_capsule_data_size) exceeds 4G"]
        );
        assert!(errors_of("capsule_buffers = 16", "max_queue_size = 16").is_empty());
    }

    #[test]
    fn data_buffer_memory_is_bounded_by_mdts_and_the_pool_limit() {
        assert_eq!(
            errors_of("data_buffer_memory = \"512K\"", "max_data_transfer = \"1M\""),
            ["rdma.data_buffer_memory: 512K: must hold at least one max_data_transfer (1M) buffer"]
        );
        assert_eq!(
            errors_of("data_buffer_memory = \"8G\"", ""),
            ["rdma.data_buffer_memory: 8G: must not exceed 4G (pinned per device)"]
        );
        assert!(errors_of("data_buffer_memory = \"1M\"", "").is_empty());
    }

    #[test]
    fn busy_poll_is_bounded_and_unknown_keys_are_refused() {
        assert_eq!(
            errors_of("busy_poll_us = 200000", ""),
            ["rdma.busy_poll_us: 200000: must be 0..=100000"]
        );
        let err = Config::parse_toml("[rdma]\nsrq = true\n").unwrap_err();
        assert!(err.to_string().contains("rdma"), "{err}");
    }
}
