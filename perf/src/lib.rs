//! nvmfd-perf: an NVMe/TCP initiator load generator (spdk_nvme_perf-like) built on the
//! project's PDU codec and NVMe wire types, plus a raw TCP loopback reference to compare
//! against.
//!
//! Layout: `args` (command line), `workload` (what to issue next), `setup` (blocking host
//! handshake), `engine` (the non-blocking pipelined I/O loop), `nvme_proto` (NVMe/TCP on an
//! I/O queue), `echo` (the raw TCP reference peer and its client), `sendq` (gathered sends), `socket`
//! (plaintext or TLS in the I/O loop),
//! `stats` (histogram and reports), `run` (threads, pinning, keep-alive, merging).

#![forbid(unsafe_code)]

pub mod args;
pub mod echo;
pub mod engine;
pub mod nvme_proto;
pub mod run;
pub mod sendq;
pub mod setup;
pub mod socket;
pub mod stats;
pub mod workload;
