#!/usr/bin/env bash
# Installs what building nvmfd needs on a Debian 12 / Ubuntu 22.04+ machine (run as root).
# Idempotent: packages already present are not fetched again.
set -euo pipefail

# libssl-dev: OpenSSL for the NVMe/TCP TLS 1.3 handshake (openssl crate). man-db: the tests
# render the generated manual pages with `man -l`.
packages=(build-essential pkg-config clang libclang-dev libibverbs-dev librdmacm-dev libssl-dev man-db)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install-deps: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust: use the toolchain on PATH if there is one; otherwise rustup (Debian 13+/Ubuntu 24.04+
# package it), else the official installer.
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
    if apt-cache show rustup >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustup >/dev/null
    else
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl ca-certificates >/dev/null
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    fi
    rustup default stable
    rustup component add clippy rustfmt
fi
cargo --version
