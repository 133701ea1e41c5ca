//! End-to-end tests of the dispatch core through the transport contract (`nvme::queue`),
//! entirely in memory.

mod admin;
mod ana;
mod auth;
mod discovery;
mod fabrics;
mod fused;
mod harness;
mod lifecycle;
mod nvm;
mod qos;
mod reservation;
mod robustness;
mod visibility;
