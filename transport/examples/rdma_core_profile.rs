//! Runs I/Os through the NVMe/RDMA connection core with an in-memory NIC
//! (`transport::rdma::profile`), for `scripts/bench.sh profile-rdma` under callgrind:
//!
//! ```text
//! rdma_core_profile <randread|randwrite|read|write> <bytes> <depth> <ios>
//! ```

use std::process::ExitCode;

use transport::rdma::profile::{run, Workload};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        eprintln!("usage: rdma_core_profile <randread|randwrite|read|write> <bytes> <depth> <ios>");
        ExitCode::from(2)
    };
    let [kind, bytes, depth, ios] = args.as_slice() else {
        return usage();
    };
    let (write, sequential) = match kind.as_str() {
        "randread" => (false, false),
        "randwrite" => (true, false),
        "read" => (false, true),
        "write" => (true, true),
        _ => return usage(),
    };
    let (Ok(bytes), Ok(depth), Ok(ios)) = (bytes.parse(), depth.parse(), ios.parse()) else {
        return usage();
    };
    let workload = Workload {
        write,
        bytes,
        depth,
        sequential,
    };
    match run(workload, ios) {
        Ok(s) => {
            println!(
                "{kind} {bytes} B QD{depth}: {} I/Os in {} completion batches, {} RDMA READs, {} RDMA WRITEs",
                s.ios, s.batches, s.rdma_reads, s.rdma_writes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma_core_profile: {e}");
            ExitCode::FAILURE
        }
    }
}
