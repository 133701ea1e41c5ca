//! nvmfd-perf: an NVMe/TCP and NVMe/RDMA initiator load generator (spdk_nvme_perf-like) built
//! on the project's PDU codec, verbs wrappers and NVMe wire types, plus a raw TCP loopback
//! reference to compare against.
//!
//! Layout: `args` (command line), `workload` (what to issue next), `command` (the I/O commands
//! of both transports), `setup` (blocking host handshake, admin queue of either transport),
//! `engine` (the non-blocking pipelined NVMe/TCP I/O loop), `nvme_proto` (NVMe/TCP on an I/O
//! queue), `rdma_proto` (NVMe/RDMA on a queue, sans-I/O), `rdma` (its verbs shell: CM
//! connect, admin queue, completion-polling I/O loop), `echo` (the raw TCP reference peer and
//! its client), `sendq` (gathered sends), `socket` (plaintext or TLS in the I/O loop), `stats`
//! (histogram and reports), `run` (threads, keep-alive, merging), `pin` (a thread to a CPU), `probe` (the
//! machine's core-to-core round trip, which sets the pace of every loopback run).

#![forbid(unsafe_code)]

pub mod args;
pub mod command;
pub mod echo;
pub mod engine;
pub mod nvme_proto;
pub mod pin;
pub mod probe;
pub mod rdma;
pub mod rdma_proto;
pub mod run;
pub mod sendq;
pub mod setup;
pub mod socket;
pub mod stats;
pub mod workload;
