//! NVMe-oF spec types and the sans-IO command-dispatch core of nvmfd.
//!
//! The core knows NVMe (fabrics, admin, discovery, NVM command set) and nothing about sockets
//! or verbs: transports hand it decoded commands and data buffers, it hands back completions
//! and backend operations. See `ARCHITECTURE.md` at the repository root.

pub mod backend;
pub mod namespace;
pub mod wire;
