//! The control socket, end to end: `proto` is the line protocol both ends speak, `socket` the
//! daemon's listener and client threads (requests go to the main thread), `commands` what the
//! main thread does with a request (views of the live target, edits of the running
//! configuration), `cli` the `nvmfd ctl` client (`top` and `qos` its live views). A new command is a `proto::Request` variant,
//! its handling in `commands` (called from `Server::control_call`) and its rendering in `cli`.

pub mod cli;
pub mod commands;
pub mod proto;
pub mod qos;
mod socket;
pub mod top;

pub use socket::{pending, ControlCall, ControlSocket, Waker};
