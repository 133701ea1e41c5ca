//! NVMe-oF spec types and the sans-IO command-dispatch core of nvmfd.
//!
//! The core knows NVMe (fabrics, admin, discovery, NVM command set) and nothing about sockets
//! or verbs: transports hand it decoded commands and data buffers, it hands back completions
//! and backend operations. See `ARCHITECTURE.md` at the repository root.
//!
//! Map (one file per concern, like the kernel's nvmet). Dispatch: `queue` (the dispatch
//! contract: routes by queue role and opcode), `abort` (Abort requests from an admin queue to
//! the I/O queues of its controller). Handlers, free functions with a narrow
//! context: `fabrics` (Connect, Property Get/Set, Disconnect), `fabrics_auth` (Authentication
//! Send/Receive; its per-queue state and the failure limiter in `auth`), `admin`, `discovery`, `nvm` (NVM
//! command set; `copy`: Copy and Verify jobs). State: `target` / `subsystem` / `controller` / `namespace`, `ana` (asymmetric
//! namespace access groups and states), `genctr` (where the discovery GENCTR starts), `reservation` (registrants, holder, conflict table and
//! PTPL state file of one namespace; the notifications each command causes and the per-controller
//! notification log 80h), `write_lock` (fused Compare and Write exclusion), `visibility` (which
//! hosts see which namespaces), `metrics` (per-queue
//! command counters and their registry), `health` (SMART/Health counters that outlive
//! controllers and namespace reopenings). Leaves: `spec` (every
//! NVMe constant), `wire` (encodings), `command` (what handlers return), `peer`, `limits`, `testing` (test data).
//! Where blocks live (the `Backend`/`IoSubmit` traits and the backends) is the `storage` crate's.

pub mod abort;
pub mod admin;
pub mod ana;
pub mod auth;
pub mod command;
pub mod controller;
mod copy;
pub mod discovery;
pub mod fabrics;
mod fabrics_auth;
mod fused;
pub mod genctr;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod namespace;
pub mod nvm;
pub mod peer;
pub mod qos;
pub mod queue;
pub mod reservation;
pub mod spec;
pub mod subsystem;
pub mod target;
pub mod testing;
pub mod visibility;
pub mod wire;
pub mod write_lock;
