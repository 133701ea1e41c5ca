#!/usr/bin/env bash
# Builds and runs every cargo-fuzz (libFuzzer) target of nvmfd for SECONDS each (default 30)
# and fails on any crash, leak, timeout or assertion. One line per target:
#   fuzz PASS tcp_recv: 30 s, 412345 execs (13745/s), cov 1234, ft 5678, corpus 321
#
# The committed seeds (fuzz/corpus/<target>) are only read; what the run discovers goes to a
# scratch corpus (FUZZ_WORK, default fuzz/target/work-corpus/<target>) that later runs reuse.
# Crashing inputs land in fuzz/artifacts/<target>/; reproduce one with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
#
# cargo-fuzz needs unstable rustc flags (-Zsanitizer=address …); with a stable toolchain
# RUSTC_BOOTSTRAP=1 allows them. Extra libFuzzer flags: FUZZ_ARGS="-jobs=2 …".
set -euo pipefail

secs="${1:-30}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="${FUZZ_WORK:-$root/fuzz/target/work-corpus}"
targets=(tcp_recv tcp_conn queue auth)
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cargo fuzz build >&2

failed=0
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    log="$work/$t.log"
    start=$(date +%s)
    read -r -a extra <<<"${FUZZ_ARGS:-}"
    # -max_len: the seeds are whole sessions (a few KiB); -timeout: one input must not
    # take seconds (a hang is a finding too); -rss_limit_mb: a leak or an unbounded
    # allocation from a wire length is a finding.
    if cargo fuzz run "$t" "$work/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
        status=PASS
    else
        status=FAIL
        failed=1
    fi
    elapsed=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    echo "fuzz $status $t: ${elapsed} s, ${execs:-?} execs (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}"
    if [[ $status == FAIL ]]; then
        { grep -E 'ERROR|panicked|SUMMARY|Test unit written|ParseDictionary' "$log" || tail -n 3 "$log"; } | head -n 5 | sed 's/^/    /'
        echo "    full log: $log"
    fi
done
exit "$failed"
