//! `nvmfd-perf`: see `nvmfd-perf --help`.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Parser;
use nvmfd_perf::args::{Args, Transport};
use nvmfd_perf::{echo, pin, probe, run, stats};

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(addr) = args.echo_server {
        // Runs until killed: the reference peer has no end of its own.
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(cpu) = args.cpu.as_ref().and_then(|c| c.0.first()) {
            if let Err(e) = pin::pin_to(*cpu) {
                eprintln!("nvmfd-perf: echo peer: {e}");
                return ExitCode::FAILURE;
            }
        }
        eprintln!("nvmfd-perf: echo peer on {addr}");
        let window = std::time::Duration::from_micros(args.poll_window_us.into());
        return match echo::run_server(addr, stop, window) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("nvmfd-perf: echo peer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.core_probe {
        let cpus = args.cpu.as_ref().map_or(&[][..], |c| &c.0[..]);
        let (a, b) = match cpus {
            [a, b, ..] if a != b => (a, b),
            _ => {
                eprintln!("nvmfd-perf: --core-probe needs two different CPUs in --cpu (e.g. 0,1)");
                return ExitCode::FAILURE;
            }
        };
        let time = std::time::Duration::from_secs_f64(args.time.max(0.001));
        return match probe::core_round_trip(*a, *b, time) {
            Ok(rt) => {
                println!("{:.1}", rt.as_secs_f64() * 1e9);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nvmfd-perf: core probe: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(n) = args.idle_connections {
        let json = args.json;
        let announce = |r: &run::IdleReport| {
            // Printed as soon as everything is open, so a script can measure the target now.
            eprintln!(
                "nvmfd-perf: {} connections open ({} controllers, {} I/O queues) in {:.2} s",
                r.connections, r.controllers, r.io_queues, r.setup_s
            );
        };
        return match run::run_idle(&args, n, &mut { announce }) {
            Ok(r) => {
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&r).expect("plain struct")
                    );
                } else {
                    println!(
                        "idle: {} connections ({} controllers, {} I/O queues), set up in {:.2} s, held {:.1} s",
                        r.connections, r.controllers, r.io_queues, r.setup_s, r.held_s
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nvmfd-perf: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let result = if args.raw_tcp {
        run::run_raw(&args)
    } else if args.transport == Transport::Rdma {
        run::run_rdma(&args)
    } else {
        run::run_nvme(&args)
    };
    match result {
        Ok(r) => {
            if args.json {
                println!("{}", stats::to_json(&r.info, &r.summary));
            } else {
                print!("{}", stats::to_table(&r.info, &r.summary));
            }
            if r.summary.errors > 0 {
                eprintln!(
                    "nvmfd-perf: {} I/O completed with an error",
                    r.summary.errors
                );
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvmfd-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
