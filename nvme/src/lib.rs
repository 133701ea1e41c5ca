//! NVMe-oF spec types and the sans-IO command-dispatch core of nvmfd.
//!
//! The core knows NVMe (fabrics, admin, discovery, NVM command set) and nothing about sockets
//! or verbs: transports hand it decoded commands and data buffers, it hands back completions
//! and backend operations. See `ARCHITECTURE.md` at the repository root.
//!
//! Map (one file per concern, like the kernel's nvmet): `queue` (dispatch, Contract 1),
//! `fabrics` (Connect, Property Get/Set), `admin`, `discovery`, `io` (NVM command set),
//! `target` / `subsystem` / `controller` / `namespace` (state), `ana` (asymmetric namespace
//! access groups and states), `metrics` (command counters), `wire` (encodings).

pub mod admin;
pub mod ana;
pub mod backend;
pub mod controller;
pub mod discovery;
pub mod fabrics;
pub mod io;
pub mod metrics;
pub mod namespace;
pub mod queue;
pub mod subsystem;
pub mod target;
pub mod wire;
