//! Attack suite: hostile and faulty NVMe/TCP hosts against the real `nvmfd` binary on
//! 127.0.0.1. Every case asserts the precise reaction (NVMe status, or C2HTermReq FES/FEI, or a
//! close); meanwhile a well-behaved connection keeps doing verified I/O, and the daemon's RSS
//! must stay within a small bound (see `support::run_group`).

mod abort_copy;
mod auth;
mod commands;
mod faults;
#[path = "../fixture/mod.rs"]
mod fixture;
mod pdu;
mod qos;
mod support;
mod timeouts;
mod tls;

use support::{run_group, start, Options};

/// RSS growth allowed over a whole group, KiB: far below what buffering any of the hostile
/// lengths (up to 4 GiB) would cost, above allocator noise and per-queue buffers touched once.
const RSS_BOUND_KIB: u64 = 8 * 1024;

#[test]
fn hostile_pdus() {
    let mut d = start("pdu", Options::default());
    run_group(&mut d, pdu::CASES, RSS_BOUND_KIB);
}

#[test]
fn hostile_commands() {
    let mut d = start("cmd", Options::default());
    run_group(&mut d, commands::CASES, RSS_BOUND_KIB);
}

#[test]
fn silent_slow_and_idle_hosts() {
    let mut d = start(
        "timeouts",
        Options {
            connect_timeout_ms: Some(timeouts::CONNECT_TIMEOUT.as_millis() as u32),
            ..Options::default()
        },
    );
    // 1000 connections at once leave the allocator holding more (reused, not growing: the
    // case checks that itself). How many are alive at the same moment depends on scheduling:
    // on a loaded 2-CPU machine the group grew 34 MiB (twice, 2026-12-04) against ~17 MiB when
    // quiet, so the bound is 64 MiB — still far below buffering one hostile length.
    run_group(&mut d, timeouts::CASES, 8 * RSS_BOUND_KIB);
}

#[test]
fn vanishing_hosts_and_backend_faults() {
    let mut d = start(
        "faults",
        Options {
            tmpfs_namespace: support::private_tmpfs_available(),
            fault_namespace: true,
            ..Options::default()
        },
    );
    run_group(&mut d, faults::CASES, RSS_BOUND_KIB);
}

#[test]
fn qos_changes_during_traffic() {
    let mut d = start(
        "qos",
        Options {
            qos_namespace: true,
            ..Options::default()
        },
    );
    run_group(&mut d, qos::CASES, RSS_BOUND_KIB);
}

#[test]
fn hostile_abort_copy_and_verify() {
    let mut d = start(
        "abortcopy",
        Options {
            fault_namespace: true,
            ..Options::default()
        },
    );
    run_group(&mut d, abort_copy::CASES, RSS_BOUND_KIB);
}

#[test]
fn hostile_hosts_of_a_keyed_subsystem() {
    let mut d = start(
        "auth",
        Options {
            keyed_subsystem: true,
            ..Options::default()
        },
    );
    run_group(&mut d, auth::CASES, RSS_BOUND_KIB);
}

#[test]
fn hostile_tls_hosts() {
    let mut d = start(
        "tls",
        Options {
            tls: true,
            ..Options::default()
        },
    );
    run_group(&mut d, tls::CASES, RSS_BOUND_KIB);
}
