#!/usr/bin/env bash
# The whole nvmfd test suite, as CI runs it (run as root on Debian 12 / Ubuntu 22.04+):
#   1. formatting and clippy,
#   2. unit and integration tests (sans-IO core, PDU codecs, loopback TCP with the Rust client),
#   3. a short run of every fuzz target (scripts/fuzz.sh),
#   4. Ceph RBD namespaces against a real single-node Ceph cluster on loopback,
#   5. the real-initiator scenarios: the Linux nvme-tcp/nvme-rdma hosts, nvme-cli and fio in a
#      qemu guest against the nvmfd binary built here (tests/e2e/run.sh).
# Skip stage 3 with NVMFD_SKIP_E2E=1 (e.g. on a laptop without qemu time to spare).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
scripts/ceph-test-cluster.sh deps
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

stage() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

stage "cargo fmt --check"
cargo fmt --all -- --check

stage "cargo clippy"
# One clippy pass with every optional backend compiled in (a superset of the default build).
cargo clippy --workspace --all-targets --features nvmfd/rbd -- -D warnings
# And the build without RDMA (`--no-default-features`): code only RDMA uses must not warn there.
cargo clippy -p nvmfd --no-default-features --all-targets -- -D warnings

stage "cargo test"
cargo test --workspace 2>&1 | tee /tmp/nvmfd-cargo-test.log
grep -q "test result: ok" /tmp/nvmfd-cargo-test.log

stage "fuzz smoke (${NVMFD_FUZZ_SECS:-20} s per target)"
scripts/fuzz.sh "${NVMFD_FUZZ_SECS:-20}"

stage "Ceph RBD namespace (single-node cluster on loopback)"
cargo test -p nvmfd --features rbd --test ceph_rbd
stage "Gateway group: three gateways, failover, fencing, failback (single-node cluster on loopback)"
cargo test -p nvmfd --features rbd --test gateway_group

stage "Gateway group reservations (two gateways, one RBD namespace, loopback cluster)"
cargo test -p nvmfd --features rbd --test gateway_reservations

if [[ "${NVMFD_SKIP_E2E:-0}" != 1 ]]; then
    stage "release build for the VM scenarios"
    # nvmfd-perf too: the perf-rdma scenario runs it in the guest (run.sh takes it from
    # beside NVMFD_BIN and builds nothing itself when NVMFD_BIN is given).
    # The gateway-failover scenario runs nvmfd on the host against a Ceph cluster: a build
    # with rbd, kept aside (the package and the other scenarios use the default features).
    cargo build --release -p nvmfd --features rbd
    cp target/release/nvmfd target/release/nvmfd-gateway
    cargo build --release -p nvmfd -p nvmfd-perf
    stage "Debian package for the deb-package scenario"
    deb=$(scripts/build-deb.sh | tail -n1)
    stage "real-initiator scenarios (qemu guest)"
    NVMFD_BIN="$PWD/target/release/nvmfd" NVMFD_DEB="$deb" \
        NVMFD_GATEWAY_BIN="$PWD/target/release/nvmfd-gateway" tests/e2e/run.sh
fi
stage "all stages passed"
