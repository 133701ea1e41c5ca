#!/usr/bin/env bash
# Builds nvmfd (release) and runs it in the foreground on its embedded default configuration:
# one subsystem with a 1 GiB RAM namespace, NVMe/TCP and discovery on 127.0.0.1:4420.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p nvmfd
exec target/release/nvmfd "$@"
