#!/usr/bin/env bash
# One-command benchmark of nvmfd over NVMe/TCP on 127.0.0.1, printed as a Markdown section
# ready for docs/performance.md.
#
#   scripts/bench.sh                 # full run (~6 minutes)
#   QUICK=1 scripts/bench.sh         # 1 run of 2 s per case, smaller scale check (~1.5 min)
#   scripts/bench.sh profile         # instructions and syscalls per I/O of the target (callgrind, perf stat)
#   PROFILE_METRICS=1 scripts/bench.sh profile   # the same with [metrics] on
#   scripts/bench.sh curves          # QD 1…128 sweep, 4K randread/randwrite, nvmfd and raw TCP:
#                                    # IOPS, p50/p99 latency, SVG of latency against IOPS
#   scripts/bench.sh profile-rdma    # instructions per I/O of the NVMe/RDMA connection core
#                                    # (in-memory NIC, callgrind; needs no RDMA device)
#   scripts/bench.sh tls             # NVMe/TCP over TLS 1.3 (PSK) against plaintext, same run
#   BASE=<older nvmfd> scripts/bench.sh ab   # QD1 4K read and 4K randwrite QD32, BASE and this
#                                    # build in alternating rounds (AB_ROUNDS=5): spread, change
#   scripts/bench.sh polling         # QD1 latency with poll_window_us 0 and POLL_WINDOW_US, same run,
#                                    # nvmfd and the echo peer; idle CPU of both daemons
#   scripts/bench.sh reactors        # only the two-reactor row (2 connections, `reactors = 2`)
#   scripts/bench.sh auth-storm      # QD1 reader p99 alone and during a DH-HMAC-CHAP reconnect storm
#                                    # (64 controllers x 4 queues) on the same reactor, per DH group;
#                                    # BASE=<older nvmfd> alternates it with this build
#   scripts/bench.sh qos             # QoS per host: two hosts (one limited) side by side; a QD1
#                                    # reader's p99 alone, beside a limited QD128 neighbour and
#                                    # beside an unlimited one
#   scripts/bench.sh fixedbufs       # io_uring fixed buffers off/on, O_DIRECT file namespace, same run:
#                                    # IOPS and the target's user and kernel CPU per I/O
#   scripts/bench.sh prometheus      # a real Prometheus scraping nvmfd under 4K QD1 read load: its
#                                    # rate() and p50 against nvmfd-perf's (scripts/prometheus-check.sh)
#
# What it does: builds release; starts nvmfd-perf's echo peer, the raw loopback TCP
# reference (same message sizes and queue depth as each NVMe/TCP case, pinned like the
# target, each nvmfd run paired with a raw run just before it); starts target/release/nvmfd
# with one reactor pinned to TARGET_CPU and a 1 GiB RAM namespace; measures its idle CPU%
# and RSS; runs the matrix from GEN_CPU (RUNS runs each, medians), then the scale checks
# (SCALE_CONNS connections × QD SCALE_QD against one connection at the same depth;
# IDLE_CONNS idle connections: RSS delta and CPU%), and last a second nvmfd with
# `reactors = 2` on TARGET_CPU and GEN_CPU, 2 connections (where each I/O queue was placed:
# `nvmfd ctl controllers`).
#
# Knobs (environment): RUNS=5 TIME=3 WARMUP=0.5 TARGET_CPU=0 GEN_CPU=1 PORT=14420
# ECHO_PORT=14421 IDLE_SECS=10 SCALE_CONNS=64 SCALE_QD=128 IDLE_CONNS=1024 OUT=<file>
# POLL_WINDOW_US=50 (nvmfd's [global] poll_window_us, and the echo peer polls the same way)
# NO_BUILD=1 (use the binaries already in target/release)
# NVMFD=<path> PERF=<path> (other binaries, e.g. a copy of an earlier build for a before/after
# comparison; implies nothing about NO_BUILD)
# Needs: cargo, python3 (for the medians and the table).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
[[ "${1:-}" == "prometheus" ]] && exec scripts/prometheus-check.sh
COMMAND="scripts/bench.sh${QUICK:+ (QUICK=$QUICK)}"

if [[ -n "${QUICK:-}" ]]; then
    RUNS=${RUNS:-1} TIME=${TIME:-2} WARMUP=${WARMUP:-0.5} IDLE_SECS=${IDLE_SECS:-3}
    SCALE_CONNS=${SCALE_CONNS:-16} IDLE_CONNS=${IDLE_CONNS:-128}
fi
# Many short paired runs rather than a few long ones: a burst of noise from elsewhere on the
# machine then spoils one pair, not a whole case.
RUNS=${RUNS:-5}
TIME=${TIME:-3}
WARMUP=${WARMUP:-0.5}
TARGET_CPU=${TARGET_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
PORT=${PORT:-14420}
ECHO_PORT=${ECHO_PORT:-14421}
# curves: CURVE_QDS="1 2 4 … 128" CURVE_TIME=2 CURVE_WARMUP=0.5 SVG=docs/latency-vs-iops.svg
[[ "${1:-}" == "curves" ]] && IDLE_SECS=${IDLE_SECS:-1}
IDLE_SECS=${IDLE_SECS:-10}
SCALE_CONNS=${SCALE_CONNS:-64}
SCALE_QD=${SCALE_QD:-128}
IDLE_CONNS=${IDLE_CONNS:-1024}
POLL_WINDOW_US=${POLL_WINDOW_US:-50}
NQN="nqn.2026-12.dev.nvmfd:bench"

# --- auth-storm: a QD1 reader against a DH-HMAC-CHAP reconnect storm on the same reactor ---------
# The measurement is the ignored test `auth_storm_against_a_qd1_reader` (daemon/tests/auth.rs):
# one reactor; per DH group a fresh nvmfd, a QD1 4 KiB reader alone and then while
# STORM_CONTROLLERS host threads (nice 19) connect a controller (admin + STORM_QUEUES I/O
# queues, each authenticated with SHA-512 in the group) and disconnect, in a loop. With
# BASE=<nvmfd binary> (an earlier build) the two binaries run in alternating rounds (ROUNDS).
#   scripts/bench.sh auth-storm
#   BASE=/tmp/nvmfd-before ROUNDS=3 scripts/bench.sh auth-storm
# Knobs: STORM_SECS=5 STORM_GROUPS="ffdhe2048 ffdhe4096 ffdhe8192" STORM_CONTROLLERS=64
# STORM_QUEUES=4 ROUNDS=1 NVMFD=<path> (the binary measured; default target/release/nvmfd)
if [[ "${1:-}" == "auth-storm" ]]; then
    if [[ -z "${NO_BUILD:-}" ]]; then
        echo "bench: building nvmfd and its tests (release)" >&2
        cargo build --release -q -p nvmfd --bin nvmfd --test auth
    fi
    TEST=$(cargo test --release -q -p nvmfd --test auth --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "auth" and m.get("executable"):
        print(m["executable"])' | tail -n 1)
    [[ -x "$TEST" ]] || { echo "bench: no auth test binary" >&2; exit 1; }
    CANDIDATES=("new|${NVMFD:-$ROOT/target/release/nvmfd}")
    [[ -n "${BASE:-}" ]] && CANDIDATES=("base|$BASE" "${CANDIDATES[@]}")
    for round in $(seq 1 "${ROUNDS:-1}"); do
        for c in "${CANDIDATES[@]}"; do
            IFS='|' read -r label bin <<<"$c"
            echo "### round $round, $label ($bin), load $(cut -d' ' -f1-3 /proc/loadavg)"
            echo '```'
            (cd "$ROOT/daemon" && NVMFD_STORM_BIN=$bin NVMFD_STORM_SECS=${STORM_SECS:-5} \
                NVMFD_STORM_GROUPS="${STORM_GROUPS:-ffdhe2048 ffdhe4096 ffdhe8192}" \
                NVMFD_STORM_CONTROLLERS=${STORM_CONTROLLERS:-64} NVMFD_STORM_QUEUES=${STORM_QUEUES:-4} \
                "$TEST" --ignored --nocapture --exact auth_storm_against_a_qd1_reader 2>&1 |
                grep -v '^$\|^running \|^test \|^test result')
            echo '```'
        done
    done
    exit 0
fi

# --- profile-rdma: the RDMA connection core under callgrind, no device needed -----------------
# `transport::rdma::profile` drives ConnCore on the real dispatch core (RAM namespace, 4 KiB
# blocks) with an in-memory NIC that completes every work request at once. Callgrind collects
# only inside its `deliver` (one `on_completions` per completion batch): transport state
# machine + NVMe core + RAM copy. Not counted: epoll, ibv_poll_cq / ibv_post_* in the provider.
if [[ "${1:-}" == "profile-rdma" ]]; then
    command -v valgrind >/dev/null || { echo "bench: valgrind is needed for profile-rdma" >&2; exit 1; }
    PROFILE_IOS=${PROFILE_IOS:-100000}
    if [[ -z "${NO_BUILD:-}" ]]; then
        echo "bench: building the rdma_core_profile example (release)" >&2
        cargo build --release -q -p transport --example rdma_core_profile
    fi
    BIN=$ROOT/target/release/examples/rdma_core_profile
    WORK=$(mktemp -d /tmp/nvmfd-bench.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    # name | I/Os (1/5 for 128K, as in `profile`) | kind bytes depth
    PROFILES=(
        "4K randread QD32|$PROFILE_IOS|randread 4096 32"
        "4K randwrite QD32|$PROFILE_IOS|randwrite 4096 32"
        "128K read QD8|$((PROFILE_IOS / 5))|read 131072 8"
    )
    SUMMARY=()
    for k in "${!PROFILES[@]}"; do
        IFS='|' read -r name ios args <<<"${PROFILES[$k]}"
        out=$WORK/callgrind.$k
        # shellcheck disable=SC2086 # $args is a list of arguments
        valgrind --tool=callgrind --callgrind-out-file="$out" \
            --toggle-collect='*rdma::profile::deliver*' "$BIN" $args "$ios" \
            2>"$WORK/valgrind.$k.log" >"$WORK/run.$k" ||
            { cat "$WORK/valgrind.$k.log" >&2; exit 1; }
        total=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out")
        per_io=$((total / ios))
        echo "### $name: $(cat "$WORK/run.$k"); $total instructions in the core, $per_io per I/O"
        echo '```'
        callgrind_annotate --inclusive=no --threshold=100 "$out" 2>/dev/null |
            grep -E '^ *[0-9,]+ \( *[0-9.]+%\) ' | grep -v 'PROGRAM TOTALS' |
            head -"${PROFILE_TOP:-15}" |
            sed -E 's| \[/[^]]*\]$||; s|/rustc/[0-9a-f]*/library/|std:|; s|'"$ROOT"'/||' || true
        echo '```'
        SUMMARY+=("| $name | $ios | $total | $per_io |")
    done
    echo "## NVMe/RDMA connection core: instructions per I/O"
    echo
    echo "Command: \`scripts/bench.sh profile-rdma\` (PROFILE_IOS=$PROFILE_IOS) at \`$(git rev-parse --short HEAD)\`, 8 MiB RAM namespace with 4 KiB blocks, in-memory NIC."
    echo
    echo "| Workload | I/Os | instructions | instructions / I/O |"
    echo "|---|---:|---:|---:|"
    printf '%s\n' "${SUMMARY[@]}"
    exit 0
fi

command -v python3 >/dev/null || { echo "bench: python3 is needed for the report" >&2; exit 1; }

if [[ -z "${NO_BUILD:-}" ]]; then
    echo "bench: building release binaries" >&2
    cargo build --release -q -p nvmfd -p nvmfd-perf
fi
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
NVMFD=${NVMFD:-$ROOT/target/release/nvmfd}
PERF=${PERF:-$ROOT/target/release/nvmfd-perf}

WORK=$(mktemp -d /tmp/nvmfd-bench.XXXXXX)
mkdir -p "$WORK/results"
PIDS=()
CLEANUP_FILES=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK" "${CLEANUP_FILES[@]}"
}
trap cleanup EXIT

# 1,024 connections need more descriptors than the usual soft limit of 1024, on both ends.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# name | nvmfd-perf workload options
CASES=(
    "4K random read, QD1|-w randread -o 4k -q 1"
    "4K random read, QD32|-w randread -o 4k -q 32"
    "4K random write, QD32|-w randwrite -o 4k -q 32"
    "128K sequential read, QD8|-w read -o 128k -q 8"
    "4K random 70/30 read/write, QD32|-w randrw -M 70 -o 4k -q 32"
)

wait_for_port() { # port
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "bench: nothing listens on 127.0.0.1:$1" >&2
    return 1
}

# open_idle_connections PORT: IDLE_CONNS idle connections (admin + I/O queue, QD128) to the
# target on PORT from nvmfd-perf in the background (IDLE_PID), returned once they are all open.
open_idle_connections() {
    "$PERF" --addr "127.0.0.1:$1" --nqn "$NQN" --idle-connections "$IDLE_CONNS" -q 128 \
        --time $((IDLE_SECS + 600)) --json >"$WORK/results/idle.json" 2>"$WORK/idle.log" &
    IDLE_PID=$!
    PIDS+=("$IDLE_PID")
    for _ in $(seq 600); do
        grep -q "connections open" "$WORK/idle.log" && break
        kill -0 "$IDLE_PID" 2>/dev/null || { cat "$WORK/idle.log" >&2; exit 1; }
        sleep 0.1
    done
    grep -q "connections open" "$WORK/idle.log" || { echo "bench: idle connections not up" >&2; exit 1; }
}

# target_config FILE PORT GLOBAL STORAGE [SECTIONS]: an nvmfd configuration with one TCP port
# on 127.0.0.1:PORT and the subsystem NQN with one namespace of 4 KiB blocks. GLOBAL: the
# [global] lines; STORAGE: the namespace's backend lines; SECTIONS: more sections (ports, keys).
target_config() {
    cat >"$1" <<EOF
[global]
$3

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = $2
${5:-}

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
$4
block_size = 4096
EOF
}

# The [global] lines of the matrix's target (and of the TLS and two-reactor runs).
MATRIX_GLOBAL="max_queue_size = 128
max_io_queues = 8
in_capsule_data_size = 8192
max_data_transfer = \"1M\"
poll_window_us = $POLL_WINDOW_US"

cpu_ticks() { # pid → utime+stime in clock ticks (proc(5): fields 14, 15 after the name)
    sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

rss_kib() { # pid
    awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}

# CPU% of pid over N seconds of wall time.
cpu_percent_over() { # pid seconds
    local t0 c0 t1 c1
    t0=$(date +%s.%N) c0=$(cpu_ticks "$1")
    sleep "$2"
    t1=$(date +%s.%N) c1=$(cpu_ticks "$1")
    python3 -c "print(f'{($c1 - $c0) / $(getconf CLK_TCK) / ($t1 - $t0) * 100:.2f}')"
}

# --- two reactors: 2 connections against `reactors = 2` --------------------------------------
# A second nvmfd with one reactor on TARGET_CPU and one on GEN_CPU (a 256 MiB RAM namespace,
# written once), and nvmfd-perf on GEN_CPU with 2 I/O queues (2 connections) at QD32 each.
# The generator shares GEN_CPU with the second reactor: this row shows the placement and that
# both reactors serve I/O, not a ceiling. Halfway through each run `nvmfd ctl controllers`
# records which reactor serves each queue (results/placement-R.json).
REACTORS_PORT=$((PORT + 4))
reactors_runs() {
    target_config "$WORK/nvmfd-2r.toml" "$REACTORS_PORT" "reactors = 2
cpus = [$TARGET_CPU, $GEN_CPU]
$MATRIX_GLOBAL
log_level = \"warn\"
control_socket = \"$WORK/control-2r.sock\"" 'ram_size = "256M"'
    echo "bench: two reactors (CPUs $TARGET_CPU and $GEN_CPU), 2 connections" >&2
    "$NVMFD" --config "$WORK/nvmfd-2r.toml" 2>"$WORK/nvmfd-2r.log" &
    local tpid=$! r ppid
    PIDS+=("$tpid")
    wait_for_port "$REACTORS_PORT"
    local perf=("$PERF" --addr "127.0.0.1:$REACTORS_PORT" --nqn "$NQN" --target-pid "$tpid" --json)
    "${perf[@]}" -w write -o 128k -q 8 --ios $(((256 << 20) / 131072)) --cpu "$GEN_CPU" >/dev/null
    for r in $(seq "$RUNS"); do
        "${perf[@]}" -w randread -o 4k -q 32 -Q 2 --cpu "$GEN_CPU" \
            --time "$TIME" --warmup "$WARMUP" >"$WORK/results/reactors-$r.json" &
        ppid=$!
        sleep "$(python3 -c "print($WARMUP + $TIME / 2)")"
        "$NVMFD" ctl --socket "$WORK/control-2r.sock" --json controllers \
            >"$WORK/results/placement-$r.json"
        wait "$ppid"
    done
    kill "$tpid"
    wait "$tpid" 2>/dev/null || true
}

# The row (Markdown) from reactors_runs' results.
reactors_report() {
    WORK=$WORK RUNS=$RUNS NQN=$NQN TARGET_CPU=$TARGET_CPU GEN_CPU=$GEN_CPU python3 - <<'PY'
import collections, json, os, statistics

w, runs = os.environ["WORK"] + "/results", int(os.environ["RUNS"])
rs = [json.load(open(f"{w}/reactors-{r}.json"))["result"] for r in range(1, runs + 1)]
def med(key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")
placements = set()
for r in range(1, runs + 1):
    ctrls = json.load(open(f"{w}/placement-{r}.json"))["result"]
    per = collections.Counter(q["reactor"] for c in ctrls if c["nqn"] == os.environ["NQN"]
                              for q in c["queue_reactors"] if q["qid"] > 0)
    placements.add(", ".join(f"reactor {k}: {n}" for k, n in sorted(per.items(), key=str)))
cpus = f"CPUs {os.environ['TARGET_CPU']} and {os.environ['GEN_CPU']}"
print("| Two reactors (4K random read) | IOPS | p50 µs | p99 µs | target CPU % | generator CPU % | I/O queues per reactor |")
print("|---|---:|---:|---:|---:|---:|---|")
print(f"| 2 connections × QD32, `reactors = 2` on {cpus} | {med('iops'):,.0f} | {med('lat_p50_us'):.1f} | "
      f"{med('lat_p99_us'):.1f} | {med('target_cpu_percent'):.0f} | {med('cpu_percent'):.0f} | {' / '.join(sorted(placements))} |")
print(f"\nThe generator runs on CPU {os.environ['GEN_CPU']}, which the second reactor shares: target and generator "
      "compete for that CPU, so this row shows where `nvmfd ctl controllers` placed each I/O queue (admin queue "
      "not counted) and that both reactors serve I/O, not what two dedicated CPUs reach.")
PY
}

if [[ "${1:-}" == "reactors" ]]; then
    reactors_runs
    echo
    echo "Command: \`scripts/bench.sh reactors\`${QUICK:+ (QUICK=$QUICK)} at \`$(git rev-parse --short HEAD)\`, median of $RUNS run(s) of $TIME s after $WARMUP s warm-up."
    echo
    reactors_report
    exit 0
fi

# --- profile mode: callgrind on the target, a fixed number of I/Os per workload --------------
# Instruction counts are stable on a noisy machine where wall-clock figures are not. For each
# workload: start nvmfd under callgrind, precondition, zero the counters, run PROFILE_IOS I/Os,
# dump: instructions / I/O = the dump's total / PROFILE_IOS (the measured run's Connect is
# counted too, a few hundred thousand instructions in all). Then the same run without
# valgrind, pinned, under `perf stat` on the syscall tracepoints: syscalls per I/O.
if [[ "${1:-}" == "profile" ]]; then
    command -v valgrind >/dev/null || { echo "bench: valgrind is needed for profile" >&2; exit 1; }
    PROFILE_IOS=${PROFILE_IOS:-100000}
    PROFILE_TOP=${PROFILE_TOP:-25}
    # PROFILE_STORAGE='null_size = "8M"': profile a null namespace instead of a RAM one.
    # PROFILE_KEEP=<dir>: keep the callgrind files there (callgrind_annotate, kcachegrind).
    # Set here, not as a ${…:-default} inside the here-document: there bash drops the default's
    # double quotes (ram_size = 8M, which the configuration parser refuses).
    PROFILE_STORAGE=${PROFILE_STORAGE:-'ram_size = "8M"'}
    # PROFILE_FILE=1: a 64 MiB file namespace (O_DIRECT) in the work directory instead, the
    # io_uring path (io_uring_enter per I/O); PROFILE_GLOBAL='uring_sqpoll = true': extra
    # [global] lines.
    PROFILE_LABEL=$PROFILE_STORAGE
    if [[ -n "${PROFILE_FILE:-}" ]]; then
        PROFILE_STORAGE="path = \"$WORK/profile.img\"
size = \"64M\""
        PROFILE_LABEL="64 MiB file (O_DIRECT, $(df --output=fstype "$WORK" | tail -1))"
    fi
    target_config "$WORK/nvmfd.toml" "$PORT" "reactors = 1
cpus = [$TARGET_CPU]
log_level = \"warn\"
control_socket = \"$WORK/control.sock\"
${PROFILE_GLOBAL:-}" "$PROFILE_STORAGE"
    # PROFILE_METRICS=1: the same with command counting and the metrics endpoint on.
    if [[ -n "${PROFILE_METRICS:-}" ]]; then
        printf '\n[metrics]\nlisten = "127.0.0.1:%s"\n' "$((PORT + 2))" >>"$WORK/nvmfd.toml"
    fi
    # name | I/Os (1/5 for 128K: each moves 32 times the bytes) | nvmfd-perf workload options
    # QD1 (a fifth: one command in flight, each a full round trip under valgrind): the
    # latency path, where syscalls and wakeups per command matter more than instructions.
    PROFILES=(
        "4K randread QD32|$PROFILE_IOS|-w randread -o 4k -q 32"
        "4K randwrite QD32|$PROFILE_IOS|-w randwrite -o 4k -q 32"
        "128K read QD8|$((PROFILE_IOS / 5))|-w read -o 128k -q 8"
        "4K randread QD1|$((PROFILE_IOS / 5))|-w randread -o 4k -q 1"
    )
    # PROFILE_ONLY="0 3": only those rows (indices into PROFILES).
    SC="epoll_wait epoll_pwait read readv recvfrom recvmsg write writev sendmsg io_uring_enter io_uring_register"
    SUMMARY=()
    ONLY=${PROFILE_ONLY:-${!PROFILES[*]}}
    for k in $ONLY; do
        IFS='|' read -r name ios opts <<<"${PROFILES[$k]}"
        out=$WORK/callgrind.$k
        valgrind --tool=callgrind --callgrind-out-file="$out" \
            "$NVMFD" --config "$WORK/nvmfd.toml" 2>"$WORK/valgrind.$k.log" &
        VPID=$!
        PIDS+=("$VPID")
        wait_for_port "$PORT"
        "$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" -w write -o 128k -q 8 --ios 64 >/dev/null
        callgrind_control -z "$VPID" >/dev/null
        # shellcheck disable=SC2086 # $opts is a list of options
        "$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" $opts --cpu "$GEN_CPU" --ios "$ios" >/dev/null
        callgrind_control -d "$VPID" >/dev/null
        for _ in $(seq 100); do grep -qs '^totals:' "$out.1" && break; sleep 0.1; done
        kill "$VPID"
        wait "$VPID" 2>/dev/null || true
        total=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out.1")
        per_io=$((total / ios))
        row="| $name | $ios | $total | $per_io |"
        [[ -n "${PROFILE_KEEP:-}" ]] && mkdir -p "$PROFILE_KEEP" && cp "$out.1" "$PROFILE_KEEP/callgrind.$k"
        echo "### $name: $ios I/Os, $total instructions in nvmfd (user space), $per_io per I/O"
        echo '```'
        # Self cost per function. A dump taken after a zero still lists the thread entry
        # frames (clone … __rust_begin_short_backtrace) with all of it: those are dropped.
        callgrind_annotate --inclusive=no --threshold=100 "$out.1" 2>/dev/null |
            grep -E '^ *[0-9,]+ \( *[0-9.]+%\) ' | grep -vE 'PROGRAM TOTALS|\((9[0-9]|100)\.[0-9]%\)' |
            head -"$PROFILE_TOP" |
            sed -E 's| \[/[^]]*\]$||; s|/rustc/[0-9a-f]*/library/|std:|; s|'"$ROOT"'/||' || true
        echo '```'
        # Syscalls per I/O, natively (batching depends on real timing, so not under valgrind).
        if perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1; then
            "$NVMFD" --config "$WORK/nvmfd.toml" 2>"$WORK/nvmfd.$k.log" &
            TPID=$!
            PIDS+=("$TPID")
            wait_for_port "$PORT"
            "$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" -w write -o 128k -q 8 --ios 64 >/dev/null
            # Context switches of the target: its wakeups (a reactor that sleeps in
            # epoll_wait and is woken counts one).
            ev=$(for s in $SC; do printf 'syscalls:sys_enter_%s,' "$s"; done)
            perf stat -x, -e "${ev}context-switches" -p "$TPID" -o "$WORK/sys.$k" &
            SPID=$!
            sleep 0.5
            # shellcheck disable=SC2086
            "$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" $opts --cpu "$GEN_CPU" --ios "$ios" >/dev/null
            kill -INT "$SPID"
            wait "$SPID" 2>/dev/null || true
            sys=$(awk -F, -v n="$ios" '/sys_enter_/ && $1+0 > 0 {
                ev = $3; sub(/.*sys_enter_/, "", ev); printf "%s %.3f, ", ev, $1 / n }' "$WORK/sys.$k")
            sys=${sys%, }
            cs=$(awk -F, -v n="$ios" '$3 == "context-switches" { printf "%.3f", $1 / n }' "$WORK/sys.$k")
            echo "syscalls per I/O (native run): $sys; context switches per I/O: $cs"
            row="$row $sys | $cs |"
            kill "$TPID"
            wait "$TPID" 2>/dev/null || true
        else
            row="$row (perf cannot trace syscalls here) | |"
        fi
        SUMMARY+=("$row")
        echo
    done
    echo "Command: \`${PROFILE_METRICS:+PROFILE_METRICS=1 }scripts/bench.sh profile\` (PROFILE_IOS=$PROFILE_IOS) at \`$(git rev-parse --short HEAD)\`, $PROFILE_LABEL namespace with 4 KiB blocks${PROFILE_GLOBAL:+, $PROFILE_GLOBAL}."
    echo
    echo "| Workload | I/Os | instructions | instructions / I/O | syscalls / I/O (native run) | context switches / I/O |"
    echo "|---|---:|---:|---:|---|---:|"
    printf '%s\n' "${SUMMARY[@]}"
    exit 0
fi

# --- tls mode: NVMe/TCP over TLS 1.3 against plaintext nvmfd, in the same run ----------------
# One nvmfd with two ports on the same reactor: plaintext, and tls = "required" with a PSK for
# the generator's host NQN. Each case runs RUNS pairs (plaintext, then TLS, back to back);
# ratio = median over the pairs of TLS IOPS / plaintext IOPS. The record layer is whatever the
# daemon logs for the port (kernel TLS when the kernel has the tls ULP, else user space);
# nvmfd-perf's record layer is always in user space. Then counts rather than timings (steady
# on a shared machine), when `perf stat` can count syscall tracepoints: the target's system
# calls per I/O over COUNT_IOS I/Os (default 20000) of each case, plaintext and TLS (every
# thread of the process; the run's handshake and Connect are counted too).
if [[ "${1:-}" == "tls" ]]; then
    TLS_PORT=$((PORT + 3))
    HOSTNQN="nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-62656e636801"
    printf 'NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n' >"$WORK/host.psk"
    chmod 600 "$WORK/host.psk"
    target_config "$WORK/nvmfd.toml" "$PORT" "reactors = 1
cpus = [$TARGET_CPU]
$MATRIX_GLOBAL
log_level = \"info\"" 'ram_size = "1G"' "[[ports]]
id = 2
transport = \"tcp\"
address = \"127.0.0.1\"
service = $TLS_PORT
tls = \"required\"

[[tls_keys]]
host = \"$HOSTNQN\"
key_file = \"$WORK/host.psk\""
    "$NVMFD" --config "$WORK/nvmfd.toml" 2>"$WORK/nvmfd.log" &
    TPID=$!
    PIDS+=("$TPID")
    wait_for_port "$PORT"
    wait_for_port "$TLS_PORT"
    BASE=("$PERF" --nqn "$NQN" --hostnqn "$HOSTNQN" --target-pid "$TPID" --json)
    PLAIN=("${BASE[@]}" --addr "127.0.0.1:$PORT")
    TLS=("${BASE[@]}" --addr "127.0.0.1:$TLS_PORT" --tls-key "$WORK/host.psk")
    echo "bench: preconditioning the namespace" >&2
    "${PLAIN[@]}" -w write -o 128k -q 8 --ios $(((1 << 30) / 131072)) --cpu "$GEN_CPU" >/dev/null
    TLS_CASES=(
        "4K random read, QD32|-w randread -o 4k -q 32"
        "4K random write, QD32|-w randwrite -o 4k -q 32"
        "128K sequential read, QD8|-w read -o 128k -q 8"
    )
    for i in "${!TLS_CASES[@]}"; do
        opts=${TLS_CASES[$i]#*|}
        echo "bench: ${TLS_CASES[$i]%%|*}" >&2
        for r in $(seq "$RUNS"); do
            # shellcheck disable=SC2086 # $opts is a list of options
            "${PLAIN[@]}" $opts --cpu "$GEN_CPU" --time "$TIME" --warmup "$WARMUP" >"$WORK/results/plain-$i-$r.json"
            # shellcheck disable=SC2086
            "${TLS[@]}" $opts --cpu "$GEN_CPU" --time "$TIME" --warmup "$WARMUP" >"$WORK/results/tls-$i-$r.json"
        done
    done
    COUNT_IOS=${COUNT_IOS:-20000}
    COUNTED=""
    if perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1; then
        COUNTED=1
        ev=$(for s in epoll_wait epoll_pwait read readv recvfrom write writev sendto sendmsg io_uring_enter; do
            printf 'syscalls:sys_enter_%s,' "$s"; done)
        for i in "${!TLS_CASES[@]}"; do
            opts=${TLS_CASES[$i]#*|}
            echo "bench: ${TLS_CASES[$i]%%|*}, system calls over $COUNT_IOS I/Os" >&2
            for mode in plain tls; do
                perf stat -x, -e "${ev%,}" -p "$TPID" -o "$WORK/results/count-$mode-$i.txt" &
                SPID=$!
                sleep 0.5
                if [[ $mode == plain ]]; then
                    # shellcheck disable=SC2086
                    "${PLAIN[@]}" $opts --cpu "$GEN_CPU" --ios "$COUNT_IOS" >"$WORK/results/count-$mode-$i.json"
                else
                    # shellcheck disable=SC2086
                    "${TLS[@]}" $opts --cpu "$GEN_CPU" --ios "$COUNT_IOS" >"$WORK/results/count-$mode-$i.json"
                fi
                kill -INT "$SPID"
                wait "$SPID" 2>/dev/null || true
            done
        done
    fi
    RECORD_LAYER=$(sed -n 's/.*TLS 1.3 port.*record_layer="\([^"]*\).*/\1/p' "$WORK/nvmfd.log" | head -1 | sed 's/ (.*//')
    LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
    NAMES=$(printf '%s\n' "${TLS_CASES[@]}" | cut -d'|' -f1)
    export WORK RUNS TIME WARMUP TARGET_CPU GEN_CPU LOAD_START LOAD_END NAMES RECORD_LAYER COUNT_IOS COUNTED
    python3 - <<'PY'
import json, os, statistics, subprocess, datetime, platform
w = os.environ["WORK"] + "/results"
runs = int(os.environ["RUNS"])
def load(prefix):
    return [json.load(open(f"{w}/{prefix}-{r}.json"))["result"] for r in range(1, runs + 1)]
def med(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
print(f"### NVMe/TCP over TLS 1.3 against plaintext, 127.0.0.1 ({now})\n")
print(f"`scripts/bench.sh tls` at `{rev}`, Linux {platform.release()}, {os.cpu_count()} CPUs. One nvmfd, 1 reactor on CPU "
      f"{os.environ['TARGET_CPU']}, a plaintext port and a `tls = \"required\"` port (TLS_AES_128_GCM_SHA256, PSK identity "
      f"version 1); target record layer: {os.environ['RECORD_LAYER']}; nvmfd-perf (1 connection, CPU {os.environ['GEN_CPU']}) "
      f"seals and opens its records in user space too. {runs} pair(s) of {os.environ['TIME']} s runs (plaintext, then TLS) "
      f"after {os.environ['WARMUP']} s warm-up; ratio = median over the pairs of TLS IOPS / plaintext IOPS (lowest–highest). "
      f"Load average (1 min) before/after: {os.environ['LOAD_START']} / {os.environ['LOAD_END']}.\n")
print("| Workload | plaintext IOPS | TLS IOPS | TLS / plaintext | TLS MiB/s | TLS p50 µs | TLS p99 µs | target CPU µs per I/O, plaintext / TLS |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
def cpu_us(rs):
    # The target's CPU time per I/O over the measured window: on a busy machine a steadier
    # figure than IOPS, which also move with what else the CPUs run.
    vals = [r["target_cpu_percent"] / 100 / r["iops"] * 1e6 for r in rs if r.get("target_cpu_percent") and r["iops"]]
    return statistics.median(vals) if vals else float("nan")
for i, name in enumerate(os.environ["NAMES"].splitlines()):
    p, t = load(f"plain-{i}"), load(f"tls-{i}")
    ratios = sorted(b["iops"] / a["iops"] * 100 for a, b in zip(p, t))
    ratio = f"{statistics.median(ratios):.0f} % ({ratios[0]:.0f}–{ratios[-1]:.0f})" if len(ratios) > 1 else f"{ratios[0]:.0f} %"
    errs = sum(x["errors"] for x in p + t)
    print(f"| {name}{' (errors: %d)' % errs if errs else ''} | {med(p,'iops'):,.0f} | {med(t,'iops'):,.0f} | {ratio} | "
          f"{med(t,'mib_s'):,.1f} | {med(t,'lat_p50_us'):.1f} | {med(t,'lat_p99_us'):.1f} | "
          f"{cpu_us(p):.1f} / {cpu_us(t):.1f} |")
def per_io(m, i):
    done = json.load(open(f"{w}/count-{m}-{i}.json"))["result"]["ios"]
    calls = {}
    for line in open(f"{w}/count-{m}-{i}.txt"):
        f = line.strip().split(",")
        if len(f) > 2 and "sys_enter_" in f[2] and f[0].isdigit() and int(f[0]) > 0:
            calls[f[2].split("sys_enter_")[1]] = int(f[0]) / done
    total = sum(calls.values())
    return f"{total:.2f} ({', '.join(f'{k} {v:.2f}' for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))})"
if os.environ.get("COUNTED"):
    ios = int(os.environ["COUNT_IOS"])
    print(f"\nTarget system calls per I/O over {ios:,} I/Os per case (`perf stat`, syscall tracepoints):\n")
    print("| Workload | plaintext | TLS |")
    print("|---|---|---|")
    for i, name in enumerate(os.environ["NAMES"].splitlines()):
        print(f"| {name} | {per_io('plain', i)} | {per_io('tls', i)} |")
PY
    exit 0
fi

# --- fixedbufs mode: io_uring fixed buffers off and on, file namespace, in one run -----------
# What fixed buffers save is kernel work (no page pinning per O_DIRECT transfer), so this mode
# reports the target's kernel (stime) and user (utime) CPU per I/O from /proc/PID/stat over a
# fixed number of I/Os, besides IOPS. Two nvmfd instances on TARGET_CPU, each with a 256 MiB
# O_DIRECT file namespace in FIXEDBUF_DIR (ext4 or xfs; not tmpfs), `uring_fixed_buffers = 0`
# and FIXED_BUFFERS (64M); each round runs every workload on both, the order alternating between
# rounds. The "on" daemon listens on PORT + 10.
if [[ "${1:-}" == "fixedbufs" ]]; then
    FIXEDBUF_DIR=${FIXEDBUF_DIR:-/var/tmp}
    FIXEDBUF_IOS=${FIXEDBUF_IOS:-200000}
    declare -A TP=()
    for mode in off on; do
        off=0 fixed='uring_fixed_buffers = 0'
        [[ $mode == on ]] && off=10 fixed="uring_fixed_buffers = \"${FIXED_BUFFERS:-64M}\""
        img=$(mktemp "$FIXEDBUF_DIR/nvmfd-bench-fixed-$mode.XXXXXX")
        CLEANUP_FILES+=("$img")
        target_config "$WORK/nvmfd-$mode.toml" "$((PORT + off))" "reactors = 1
cpus = [$TARGET_CPU]
$MATRIX_GLOBAL
$fixed
log_level = \"warn\"
control_socket = \"$WORK/control-$mode.sock\"" "path = \"$img\"
size = \"256M\""
        "$NVMFD" --config "$WORK/nvmfd-$mode.toml" 2>"$WORK/nvmfd-$mode.log" &
        TP[$mode]=$!
        PIDS+=("${TP[$mode]}")
        wait_for_port "$((PORT + off))"
        echo "bench: preconditioning nvmfd ($mode)" >&2
        "$PERF" --addr "127.0.0.1:$((PORT + off))" --nqn "$NQN" -w write -o 128k -q 8 \
            --ios $(((256 << 20) / 131072)) --cpu "$GEN_CPU" >/dev/null
    done
    # name | nvmfd-perf options | I/Os (128K: a fifth)
    FIXED_CASES=(
        "4K randread QD32|-w randread -o 4k -q 32|$FIXEDBUF_IOS"
        "4K randwrite QD32|-w randwrite -o 4k -q 32|$FIXEDBUF_IOS"
        "128K read QD8|-w read -o 128k -q 8|$((FIXEDBUF_IOS / 5))"
    )
    stat_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; } # utime stime
    for r in $(seq "$RUNS"); do
        order="off on"
        ((r % 2 == 0)) && order="on off"
        for c in "${!FIXED_CASES[@]}"; do
            IFS='|' read -r _ opts ios <<<"${FIXED_CASES[$c]}"
            for mode in $order; do
                off=0
                [[ $mode == on ]] && off=10
                before=$(stat_ticks "${TP[$mode]}")
                # shellcheck disable=SC2086
                "$PERF" --addr "127.0.0.1:$((PORT + off))" --nqn "$NQN" --json $opts \
                    --cpu "$GEN_CPU" --ios "$ios" >"$WORK/results/fixed-$mode-$c-$r.json"
                echo "$before $(stat_ticks "${TP[$mode]}") $ios" >"$WORK/results/ticks-$mode-$c-$r.txt"
            done
        done
    done
    echo
    echo "Command: \`scripts/bench.sh fixedbufs\` at \`$(git rev-parse --short HEAD)\`, $RUNS rounds of $FIXEDBUF_IOS I/Os (128K: a fifth), medians; load average at start $LOAD_START."
    echo
    WORK=$WORK RUNS=$RUNS CLK_TCK=$(getconf CLK_TCK) CASES="$(printf '%s\n' "${FIXED_CASES[@]}" | cut -d'|' -f1)" python3 - <<'PY'
import json, os, statistics

w, runs, hz = os.environ["WORK"] + "/results", int(os.environ["RUNS"]), int(os.environ["CLK_TCK"])
print("| workload | fixed buffers | IOPS | target user µs/I/O | target kernel µs/I/O (range) | kernel, on/off per round |")
print("|---|---|---:|---:|---:|---:|")
for c, name in enumerate(os.environ["CASES"].splitlines()):
    sys_by = {}
    for mode in ("off", "on"):
        iops, user, sys = [], [], []
        for r in range(1, runs + 1):
            iops.append(json.load(open(f"{w}/fixed-{mode}-{c}-{r}.json"))["result"]["iops"])
            u0, s0, u1, s1, n = map(int, open(f"{w}/ticks-{mode}-{c}-{r}.txt").read().split())
            user.append((u1 - u0) / hz / n * 1e6)
            sys.append((s1 - s0) / hz / n * 1e6)
        sys_by[mode] = sys
        paired = ""
        if mode == "on":
            # Each round ran both daemons back to back: its ratio sees one state of the machine.
            ratios = [on / off for on, off in zip(sys_by["on"], sys_by["off"]) if off]
            lower = sum(1 for q in ratios if q < 1)
            paired = (f"median {(statistics.median(ratios) - 1) * 100:+.1f} %, lower in {lower} of {len(ratios)}"
                      if ratios else "")
        print(f"| {name} | {mode} | {statistics.median(iops):,.0f} | {statistics.median(user):.2f} | "
              f"{statistics.median(sys):.2f} ({min(sys):.2f}–{max(sys):.2f}) | {paired} |")
PY
    exit 0
fi

# --- qos mode: per-host limits on loopback ----------------------------------------------------
# One nvmfd (one reactor on TARGET_CPU, 64 MiB RAM namespace), generators on GEN_CPU, each
# with its own host NQN. Host "a1" has `host_qos` QOS_LIMITED_IOPS, host "c3" (the noisy
# neighbour) QOS_NEIGHBOUR_IOPS; the others none. 1) a1 and b2 side by side, QD32 4K random
# reads: the IOPS of each. 2) a QD1 4K random reader (d4) alone, then beside the limited
# noisy neighbour at QD128, then beside an unlimited one (e5) at QD128: the reader's p50/p99.
if [[ "${1:-}" == "qos" ]]; then
    QOS_TIME=${QOS_TIME:-10}
    QOS_LIMITED_IOPS=${QOS_LIMITED_IOPS:-5000}
    QOS_NEIGHBOUR_IOPS=${QOS_NEIGHBOUR_IOPS:-5000}
    qos_host() { echo "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000$1"; }
    target_config "$WORK/nvmfd.toml" "$PORT" "reactors = 1
cpus = [$TARGET_CPU]
max_queue_size = 128
log_level = \"warn\"
control_socket = \"$WORK/control.sock\"" 'ram_size = "64M"'
    printf '\n[[subsystems.host_qos]]\nhost = "%s"\nqos = { iops = %s }\n' \
        "$(qos_host a1)" "$QOS_LIMITED_IOPS" "$(qos_host c3)" "$QOS_NEIGHBOUR_IOPS" >>"$WORK/nvmfd.toml"
    "$NVMFD" --config "$WORK/nvmfd.toml" 2>"$WORK/nvmfd.log" &
    TPID=$!
    PIDS+=("$TPID")
    wait_for_port "$PORT"
    qos_run() { # name host-suffix seconds nvmfd-perf options…
        local name=$1 id=$2 t=$3
        shift 3
        "$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" --hostnqn "$(qos_host "$id")" \
            --cpu "$GEN_CPU" --time "$t" --json "$@" >"$WORK/results/$name.json"
    }
    qos_field() {
        python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))["result"][sys.argv[2]]; print(f"{v:,.0f}")' \
            "$WORK/results/$1.json" "$2"
    }
    echo "bench: qos, two hosts side by side" >&2
    qos_run limited a1 "$QOS_TIME" -w randread -o 4k -q 32 &
    QA=$!
    qos_run free b2 "$QOS_TIME" -w randread -o 4k -q 32
    wait "$QA"
    echo "bench: qos, QD1 reader alone and beside QD128 neighbours" >&2
    qos_run alone d4 "$QOS_TIME" -w randread -o 4k -q 1
    qos_run noisy c3 $((QOS_TIME + 2)) -w randread -o 4k -q 128 &
    QN=$!
    sleep 1
    qos_run beside-limited d4 "$QOS_TIME" -w randread -o 4k -q 1
    wait "$QN"
    qos_run unlimited-noisy e5 $((QOS_TIME + 2)) -w randread -o 4k -q 128 &
    QN=$!
    sleep 1
    qos_run beside-unlimited d4 "$QOS_TIME" -w randread -o 4k -q 1
    wait "$QN"
    echo "## QoS per host on loopback"
    echo
    echo "Command: \`scripts/bench.sh qos\` (QOS_TIME=$QOS_TIME s) at \`$(git rev-parse --short HEAD)\`: one reactor on CPU $TARGET_CPU, generators (one host NQN each) on CPU $GEN_CPU, 64 MiB RAM namespace, 4 KiB random reads; load average $(cut -d' ' -f1 /proc/loadavg)."
    echo
    echo "| Host | limit (IOPS) | QD | IOPS | p50 µs | p99 µs |"
    echo "|---|---:|---:|---:|---:|---:|"
    for row in "limited (beside free)|$QOS_LIMITED_IOPS|32|limited" \
        "free (beside limited)|-|32|free" \
        "reader alone|-|1|alone" \
        "noisy neighbour|$QOS_NEIGHBOUR_IOPS|128|noisy" \
        "reader beside the limited neighbour|-|1|beside-limited" \
        "unlimited neighbour|-|128|unlimited-noisy" \
        "reader beside the unlimited neighbour|-|1|beside-unlimited"; do
        IFS='|' read -r label limit qd name <<<"$row"
        echo "| $label | $limit | $qd | $(qos_field "$name" iops) | $(qos_field "$name" lat_p50_us) | $(qos_field "$name" lat_p99_us) |"
    done
    exit 0
fi

# --- ab mode: an older nvmfd (BASE) against this build, rounds alternating -----------------
# Two nvmfd daemons (the same configuration as the matrix, 256 MiB RAM namespace each, both
# pinned to TARGET_CPU; BASE listens on PORT + 10), one nvmfd-perf (this build's) on GEN_CPU.
# Each round runs every case on both, the order alternating from round to round, so each pair
# sees the same machine. Per run: IOPS, latency, the target's CPU per I/O and its context
# switches per I/O (sleeps in epoll_wait = wake-ups). Every figure is given as median
# (min–max) over the rounds; spread = (max − min) / median of IOPS; change = median over the
# rounds of new / base − 1 (mean latency, IOPS). Around every run `nvmfd-perf --core-probe`
# measures the cache-line round trip between the two CPUs; a second table keeps only the runs
# whose probes stayed within twice the fastest (the machine's best placement).
#   BASE=/work/baseline/nvmfd scripts/bench.sh ab          # 5 rounds × 2 cases × 2 × 5.5 s ≈ 2 min
# Knobs: AB_ROUNDS=5 AB_TIME=5 AB_WARMUP=0.5 AB_CASES="qd1 randwrite32" (also randread32, read128k)
if [[ "${1:-}" == "ab" ]]; then
    [[ -n "${BASE:-}" && -x "${BASE:-}" ]] || { echo "bench: ab needs BASE=<older nvmfd binary>" >&2; exit 1; }
    AB_ROUNDS=${AB_ROUNDS:-5}
    AB_TIME=${AB_TIME:-5}
    AB_WARMUP=${AB_WARMUP:-0.5}
    AB_CASES=${AB_CASES:-"qd1 randwrite32"}
    declare -A AB_OPTS=(
        [qd1]="4K random read, QD1|-w randread -o 4k -q 1"
        [randread32]="4K random read, QD32|-w randread -o 4k -q 32"
        [randwrite32]="4K random write, QD32|-w randwrite -o 4k -q 32"
        [read128k]="128K sequential read, QD8|-w read -o 128k -q 8"
    )
    declare -A TP=() APORT=([base]=$((PORT + 10)) [new]=$PORT) ABIN=([base]=$BASE [new]=$NVMFD)
    for mode in base new; do
        target_config "$WORK/nvmfd-$mode.toml" "${APORT[$mode]}" "reactors = 1
cpus = [$TARGET_CPU]
$MATRIX_GLOBAL
log_level = \"warn\"
control_socket = \"$WORK/control-$mode.sock\"" 'ram_size = "256M"'
        "${ABIN[$mode]}" --config "$WORK/nvmfd-$mode.toml" 2>"$WORK/nvmfd-$mode.log" &
        TP[$mode]=$!
        PIDS+=("${TP[$mode]}")
        wait_for_port "${APORT[$mode]}"
        echo "bench: preconditioning nvmfd ($mode: ${ABIN[$mode]})" >&2
        "$PERF" --addr "127.0.0.1:${APORT[$mode]}" --nqn "$NQN" -w write -o 128k -q 8 \
            --ios $(((256 << 20) / 131072)) --cpu "$GEN_CPU" >/dev/null
    done
    # The raw TCP reference on the target's CPU, run in every round beside the two builds:
    # the machine's own round-to-round swing (a shared host: the same instructions take more
    # or less time from one minute to the next) shows in its spread, and each build's
    # IOPS / echo IOPS of the same round is the figure with that swing divided out.
    "$PERF" --echo-server "127.0.0.1:$ECHO_PORT" --cpu "$TARGET_CPU" --poll-window-us "$POLL_WINDOW_US" 2>/dev/null &
    PIDS+=("$!")
    wait_for_port "$ECHO_PORT"
    vcs() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}'; }
    # The cache-line round trip between the target's and the generator's CPU, before and
    # after every run: a hypervisor that moves the virtual CPUs to other cores changes the
    # pace of every loopback exchange (docs/performance.md, "Where the spread comes from").
    core_rt() { "$PERF" --core-probe --cpu "$TARGET_CPU,$GEN_CPU" --time 0.2; }
    for r in $(seq "$AB_ROUNDS"); do
        order="base new"
        ((r % 2 == 0)) && order="new base"
        for c in $AB_CASES; do
            opts=${AB_OPTS[$c]#*|}
            echo "bench: ab round $r, $c ($order)" >&2
            rt0=$(core_rt)
            # shellcheck disable=SC2086 # $opts is a list of options
            "$PERF" --raw-tcp --addr "127.0.0.1:$ECHO_PORT" --json $opts --cpu "$GEN_CPU" \
                --time "$AB_TIME" --warmup "$AB_WARMUP" >"$WORK/results/ab-echo-$c-$r.json"
            rt1=$(core_rt)
            echo "$rt0 $rt1" >"$WORK/results/abrt-echo-$c-$r.txt"
            for mode in $order; do
                v0=$(vcs "${TP[$mode]}")
                # shellcheck disable=SC2086 # $opts is a list of options
                "$PERF" --addr "127.0.0.1:${APORT[$mode]}" --nqn "$NQN" --target-pid "${TP[$mode]}" --json \
                    $opts --cpu "$GEN_CPU" --time "$AB_TIME" --warmup "$AB_WARMUP" >"$WORK/results/ab-$mode-$c-$r.json"
                echo "$v0 $(vcs "${TP[$mode]}")" >"$WORK/results/abcs-$mode-$c-$r.txt"
                rt0=$rt1
                rt1=$(core_rt)
                echo "$rt0 $rt1" >"$WORK/results/abrt-$mode-$c-$r.txt"
            done
        done
    done
    LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
    CASE_NAMES=$(for c in $AB_CASES; do echo "$c|${AB_OPTS[$c]%%|*}"; done)
    export WORK AB_ROUNDS AB_TIME AB_WARMUP TARGET_CPU GEN_CPU LOAD_START LOAD_END BASE NVMFD CASE_NAMES POLL_WINDOW_US
    REPORT=$(python3 - <<'PY'
import json, os, statistics, subprocess, datetime, platform
w = os.environ["WORK"] + "/results"
rounds = int(os.environ["AB_ROUNDS"])
cases = [l.split("|", 1) for l in os.environ["CASE_NAMES"].splitlines()]
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
def spread(vals, fmt):
    m = statistics.median(vals)
    return f"{fmt(m)} ({fmt(min(vals))}–{fmt(max(vals))})"
def spread_pct(vals):
    return (max(vals) - min(vals)) / statistics.median(vals) * 100
def changes(pairs, key):
    """new / base − 1 in %, per (base, new) pair of results, sorted."""
    return sorted((n[key] / b[key] - 1) * 100 for b, n in pairs)
out = [f"### A/B: base against this build, 127.0.0.1 ({now})\n",
       f"`BASE={os.environ['BASE']} scripts/bench.sh ab` at `{rev}` (new: `{os.environ['NVMFD']}`), Linux {platform.release()}, "
       f"{os.cpu_count()} CPUs. Two nvmfd, 1 reactor each on CPU {os.environ['TARGET_CPU']}, 256 MiB RAM namespace, "
       f"poll_window_us = {os.environ['POLL_WINDOW_US']}; nvmfd-perf (1 connection) on CPU {os.environ['GEN_CPU']}. "
       f"{rounds} rounds of {os.environ['AB_TIME']} s per target after {os.environ['AB_WARMUP']} s warm-up, order alternating. "
       "Figures: median (min–max) over the rounds; IOPS spread = (max − min) / median; change = median over the rounds "
       "of new / base − 1 (range). Wake-ups = the target's voluntary context switches per I/O. "
       f"Load average (1 min) before/after: {os.environ['LOAD_START']} / {os.environ['LOAD_END']}.\n",
       "Echo = the raw TCP reference peer (nvmfd-perf --echo-server, same CPU, polling alike, the same message sizes "
       "and queue depth), run first in every round: its spread is the machine's; vs echo = IOPS / echo IOPS of the same "
       "round, median (min–max), and the spread of that ratio.\n",
       "Core round trip = the cache-line round trip between the two CPUs (`nvmfd-perf --core-probe`), the slower of "
       "the probes before and after the run, ns.\n",
       "| workload | build | IOPS | IOPS spread | vs echo (spread) | mean µs | p99 µs | target CPU µs / I/O | wake-ups / I/O | core round trip ns | change |",
       "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
# The slower of the two probes around each run; the fastest probe of the whole A/B is the
# placement the machine gives at best, and a run whose probes stayed within twice of it ran
# on that placement throughout.
rt = {(m, c, r): max(map(float, open(f"{w}/abrt-{m}-{c}-{r}.txt").read().split()))
      for m in ("echo", "base", "new") for c, _ in cases for r in range(1, rounds + 1)}
fastest = min(rt.values())
fast = {k: v <= 2 * fastest for k, v in rt.items()}
def rt_col(m, c):
    return spread([rt[(m, c, r)] for r in range(1, rounds + 1)], lambda v: f"{v:.0f}")
steady = ["", f"Runs on the fast placement only (both probes within twice the fastest, {fastest:.0f} ns): "
          "IOPS median (min–max) and spread over those rounds; change over the rounds where base and new both were.\n",
          "| workload | build | rounds | IOPS | IOPS spread | mean µs | change |", "|---|---|---:|---:|---:|---:|---|"]
for c, name in cases:
    E = [json.load(open(f"{w}/ab-echo-{c}-{r}.json"))["result"] for r in range(1, rounds + 1)]
    eiops = [x["iops"] for x in E]
    out.append(f"| {name} | echo | {spread(eiops, lambda v: f'{v:,.0f}')} | "
               f"{spread_pct(eiops):.1f} % | | "
               f"{spread([x['lat_mean_us'] for x in E], lambda v: f'{v:.1f}')} | "
               f"{spread([x['lat_p99_us'] for x in E], lambda v: f'{v:.1f}')} | | | {rt_col('echo', c)} | |")
    rs, cs = {}, {}
    for mode in ("base", "new"):
        rs[mode] = [json.load(open(f"{w}/ab-{mode}-{c}-{r}.json"))["result"] for r in range(1, rounds + 1)]
        cs[mode] = [tuple(map(int, open(f"{w}/abcs-{mode}-{c}-{r}.txt").read().split())) for r in range(1, rounds + 1)]
    for mode in ("base", "new"):
        R = rs[mode]
        iops = [x["iops"] for x in R]
        sp = spread_pct(iops)
        cpu = [x["target_cpu_percent"] / 100 / x["iops"] * 1e6 for x in R if x.get("target_cpu_percent") and x["iops"]]
        wk = [(b - a) / (x["iops"] * float(os.environ["AB_TIME"])) for (a, b), x in zip(cs[mode], R) if x["iops"]]
        change = ""
        if mode == "new":
            lat = changes(zip(rs["base"], R), "lat_mean_us")
            io = changes(zip(rs["base"], R), "iops")
            faster = sum(1 for x in lat if x < 0)
            change = (f"mean latency {statistics.median(lat):+.1f} % ({lat[0]:+.1f} … {lat[-1]:+.1f}), lower in {faster} of {len(lat)}; "
                      f"IOPS {statistics.median(io):+.1f} % ({io[0]:+.1f} … {io[-1]:+.1f})")
        errs = sum(x["errors"] for x in R)
        rel = [x["iops"] / e for x, e in zip(R, eiops) if e]
        rel_sp = spread_pct(rel) if rel else 0
        out.append(f"| {name}{' (errors: %d)' % errs if errs else ''} | {mode} | {spread(iops, lambda v: f'{v:,.0f}')} | {sp:.1f} % | "
                   f"{spread(rel, lambda v: f'{v:.2f}')} ({rel_sp:.1f} %) | "
                   f"{spread([x['lat_mean_us'] for x in R], lambda v: f'{v:.1f}')} | "
                   f"{spread([x['lat_p99_us'] for x in R], lambda v: f'{v:.1f}')} | "
                   f"{spread(cpu, lambda v: f'{v:.2f}') if cpu else '–'} | {spread(wk, lambda v: f'{v:.3f}') if wk else '–'} | "
                   f"{rt_col(mode, c)} | {change} |")
    for mode in ("echo", "base", "new"):
        R = E if mode == "echo" else rs[mode]
        F = [x for r, x in enumerate(R, 1) if fast[(mode, c, r)]]
        if not F:
            steady.append(f"| {name} | {mode} | 0 of {rounds} | – | – | – | |")
            continue
        iops = [x["iops"] for x in F]
        change = ""
        if mode == "new":
            both = [(b, n) for r, (b, n) in enumerate(zip(rs["base"], rs["new"]), 1)
                    if fast[("base", c, r)] and fast[("new", c, r)]]
            if both:
                io = changes(both, "iops")
                lat = changes(both, "lat_mean_us")
                change = (f"IOPS {statistics.median(io):+.1f} % ({io[0]:+.1f} … {io[-1]:+.1f}), mean latency "
                          f"{statistics.median(lat):+.1f} % over {len(both)} rounds")
        steady.append(f"| {name} | {mode} | {len(F)} of {rounds} | {spread(iops, lambda v: f'{v:,.0f}')} | "
                      f"{spread_pct(iops):.1f} % | {spread([x['lat_mean_us'] for x in F], lambda v: f'{v:.1f}')} | {change} |")
print("\n".join(out + steady))
PY
)
    printf '%s\n' "$REPORT"
    OUT=${OUT:-$ROOT/target/bench/ab-$(date -u +%Y%m%d-%H%M%S).md}
    mkdir -p "$(dirname "$OUT")"
    printf '%s\n' "$REPORT" >"$OUT"
    echo "bench: written to $OUT" >&2
    exit 0
fi

# --- polling mode: QD1 latency with poll_window_us off and on, in one run -------------------
# Two nvmfd instances (poll_window_us = 0 and POLL_WINDOW_US, restart-only, hence two daemons)
# and two echo peers polling the same way, all pinned to TARGET_CPU; each round runs the four
# (raw off, raw on, nvmfd off, nvmfd on; the order of off/on alternates from round to round)
# so every pair sees the same machine. Then each daemon's idle CPU with no connection, and
# with IDLE_CONNS idle connections after traffic. The "on" daemon and peer listen on PORT + 10 and
# ECHO_PORT + 10.
if [[ "${1:-}" == "polling" ]]; then
    [[ "$POLL_WINDOW_US" -gt 0 ]] || { echo "bench: polling needs POLL_WINDOW_US > 0" >&2; exit 1; }
    POLL_IOS_OPTS=(-w randread -o 4k -q 1 --cpu "$GEN_CPU" --time "$TIME" --warmup "$WARMUP")
    declare -A TP=() EP=()
    for mode in off on; do
        pw=0 off=0
        [[ $mode == on ]] && pw=$POLL_WINDOW_US off=10
        "$PERF" --echo-server "127.0.0.1:$((ECHO_PORT + off))" --cpu "$TARGET_CPU" --poll-window-us "$pw" 2>/dev/null &
        EP[$mode]=$!
        PIDS+=("${EP[$mode]}")
        target_config "$WORK/nvmfd-$mode.toml" "$((PORT + off))" "reactors = 1
cpus = [$TARGET_CPU]
poll_window_us = $pw
log_level = \"warn\"
control_socket = \"$WORK/control-$mode.sock\"" 'ram_size = "256M"'
        "$NVMFD" --config "$WORK/nvmfd-$mode.toml" 2>"$WORK/nvmfd-$mode.log" &
        TP[$mode]=$!
        PIDS+=("${TP[$mode]}")
        wait_for_port "$((ECHO_PORT + off))"
        wait_for_port "$((PORT + off))"
        echo "bench: preconditioning nvmfd ($mode)" >&2
        "$PERF" --addr "127.0.0.1:$((PORT + off))" --nqn "$NQN" -w write -o 128k -q 8 \
            --ios $(((256 << 20) / 131072)) --cpu "$GEN_CPU" >/dev/null
    done
    for r in $(seq "$RUNS"); do
        order="off on"
        ((r % 2 == 0)) && order="on off"
        echo "bench: QD1 round $r ($order)" >&2
        for mode in $order; do
            off=0
            [[ $mode == on ]] && off=10
            "$PERF" --raw-tcp --addr "127.0.0.1:$((ECHO_PORT + off))" "${POLL_IOS_OPTS[@]}" --json \
                >"$WORK/results/raw-$mode-$r.json"
        done
        for mode in $order; do
            off=0
            [[ $mode == on ]] && off=10
            "$PERF" --addr "127.0.0.1:$((PORT + off))" --nqn "$NQN" --target-pid "${TP[$mode]}" --json \
                "${POLL_IOS_OPTS[@]}" >"$WORK/results/nvme-$mode-$r.json"
        done
    done
    kill "${EP[off]}" "${EP[on]}"
    echo "bench: idle CPU of each daemon, no connection (${IDLE_SECS} s each)" >&2
    IDLE_OFF=$(cpu_percent_over "${TP[off]}" "$IDLE_SECS")
    IDLE_ON=$(cpu_percent_over "${TP[on]}" "$IDLE_SECS")
    echo "bench: $IDLE_CONNS idle connections on the polling daemon" >&2
    open_idle_connections "$((PORT + 10))"
    sleep 1
    CONN_CPU=$(cpu_percent_over "${TP[on]}" "$IDLE_SECS")
    kill "$IDLE_PID"
    LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
    export WORK RUNS TIME WARMUP TARGET_CPU GEN_CPU LOAD_START LOAD_END POLL_WINDOW_US IDLE_OFF IDLE_ON \
        CONN_CPU IDLE_CONNS IDLE_SECS
    REPORT=$(python3 - <<'PY'
import json, os, statistics, subprocess, datetime, platform
w = os.environ["WORK"] + "/results"
runs = int(os.environ["RUNS"])
pw = os.environ["POLL_WINDOW_US"]
def load(prefix):
    return [json.load(open(f"{w}/{prefix}-{r}.json"))["result"] for r in range(1, runs + 1)]
def med(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
out = [f"### QD1 latency, polling off and on, 127.0.0.1 ({now})\n",
       f"`scripts/bench.sh polling` at `{rev}`, Linux {platform.release()}, {os.cpu_count()} CPUs. Two nvmfd (1 reactor each, "
       f"CPU {os.environ['TARGET_CPU']}, 256 MiB RAM namespace, `poll_window_us` 0 and {pw}) and two echo peers polling the "
       f"same way (CPU {os.environ['TARGET_CPU']}); nvmfd-perf 4K random read QD1 from CPU {os.environ['GEN_CPU']}, "
       f"{runs} rounds of {os.environ['TIME']} s per target after {os.environ['WARMUP']} s warm-up, off/on order alternating; "
       f"change = median over the rounds of (on mean latency / off mean latency − 1). "
       f"Load average (1 min) before/after: {os.environ['LOAD_START']} / {os.environ['LOAD_END']}.\n",
       "| target | poll_window_us | IOPS | mean µs (min–max) | p50 µs | p99 µs | target CPU % | mean latency, on vs off |",
       "|---|---:|---:|---:|---:|---:|---:|---:|"]
for kind, label in (("nvme", "nvmfd"), ("raw", "raw TCP (echo peer)")):
    off, on = load(f"{kind}-off"), load(f"{kind}-on")
    ch = sorted((b["lat_mean_us"] / a["lat_mean_us"] - 1) * 100 for a, b in zip(off, on))
    change = f"{statistics.median(ch):+.0f} % ({ch[0]:+.0f} … {ch[-1]:+.0f})"
    for mode, rs in (("0", off), (pw, on)):
        cpu = f"{med(rs, 'target_cpu_percent'):.0f}" if kind == "nvme" else "–"
        lo, hi = min(x["lat_mean_us"] for x in rs), max(x["lat_mean_us"] for x in rs)
        out.append(f"| {label} | {mode} | {med(rs,'iops'):,.0f} | {med(rs,'lat_mean_us'):.1f} ({lo:.1f}–{hi:.1f}) | {med(rs,'lat_p50_us'):.1f} | "
                   f"{med(rs,'lat_p99_us'):.1f} | {cpu} | {change if mode == pw else ''} |")
out.append(f"\nIdle CPU (share of one core over {os.environ['IDLE_SECS']} s): no connection, polling off "
           f"{float(os.environ['IDLE_OFF']):.2f} %, on {float(os.environ['IDLE_ON']):.2f} %; "
           f"{os.environ['IDLE_CONNS']} idle connections on the polling daemon (after its traffic) "
           f"{float(os.environ['CONN_CPU']):.2f} %.")
print("\n".join(out))
PY
)
    printf '%s\n' "$REPORT"
    OUT=${OUT:-$ROOT/target/bench/polling-$(date -u +%Y%m%d-%H%M%S).md}
    mkdir -p "$(dirname "$OUT")"
    printf '%s\n' "$REPORT" >"$OUT"
    echo "bench: written to $OUT" >&2
    exit 0
fi

# --- raw loopback TCP reference -----------------------------------------------------------
# The echo peer runs beside the target on the same CPU (each idles at ~0 while the other is
# measured). Each nvmfd run is paired with a raw TCP run taken just before it, so a pair sees
# the same machine conditions; the ratio is the median of the per-pair ratios.
echo "bench: raw TCP reference peer (echo, on CPU $TARGET_CPU)" >&2
"$PERF" --echo-server "127.0.0.1:$ECHO_PORT" --cpu "$TARGET_CPU" --poll-window-us "$POLL_WINDOW_US" 2>/dev/null &
ECHO_PID=$!
PIDS+=("$ECHO_PID")
wait_for_port "$ECHO_PORT"

# --- the target ----------------------------------------------------------------------------
target_config "$WORK/nvmfd.toml" "$PORT" "reactors = 1
cpus = [$TARGET_CPU]
$MATRIX_GLOBAL
log_level = \"warn\"
control_socket = \"$WORK/control.sock\"" 'ram_size = "1G"'
echo "bench: starting nvmfd (1 reactor on CPU $TARGET_CPU)" >&2
"$NVMFD" --config "$WORK/nvmfd.toml" 2>"$WORK/nvmfd.log" &
TPID=$!
PIDS+=("$TPID")
wait_for_port "$PORT"
PERF_NVME=("$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" --target-pid "$TPID" --json)
# A first connection, so the idle figures are those of a started, used daemon.
"${PERF_NVME[@]}" --ios 1000 -q 8 >/dev/null

echo "bench: target idle for ${IDLE_SECS} s" >&2
IDLE_RSS=$(rss_kib "$TPID")
IDLE_CPU=$(cpu_percent_over "$TPID" "$IDLE_SECS")

# Precondition: write the whole namespace once. Reads of never-written RAM pages fault in
# the zero page on every first touch, which would measure the kernel's page-fault path.
echo "bench: preconditioning the namespace (sequential 128K writes)" >&2
"${PERF_NVME[@]}" -w write -o 128k -q 8 --ios $(((1 << 30) / 131072)) --cpu "$GEN_CPU" >/dev/null

# --- curves: latency against IOPS over queue depth -------------------------------------------
# Each point: a raw TCP run (same message sizes and depth, against the echo peer) then an
# nvmfd run, both from nvmfd-perf on GEN_CPU. The SVG plots p50 and p99 latency (log scale)
# against IOPS, one panel per workload, the depth written next to each nvmfd point.
if [[ "${1:-}" == "curves" ]]; then
    CURVE_QDS=${CURVE_QDS:-"1 2 4 8 16 32 64 128"}
    CURVE_TIME=${CURVE_TIME:-2}
    CURVE_WARMUP=${CURVE_WARMUP:-0.5}
    SVG=${SVG:-docs/latency-vs-iops.svg}
    for w in randread randwrite; do
        for qd in $CURVE_QDS; do
            echo "bench: curves, 4K $w QD$qd" >&2
            "$PERF" --raw-tcp --addr "127.0.0.1:$ECHO_PORT" -w "$w" -o 4k -q "$qd" --cpu "$GEN_CPU" \
                --time "$CURVE_TIME" --warmup "$CURVE_WARMUP" --json >"$WORK/results/curve-raw-$w-$qd.json"
            "${PERF_NVME[@]}" -w "$w" -o 4k -q "$qd" --cpu "$GEN_CPU" \
                --time "$CURVE_TIME" --warmup "$CURVE_WARMUP" >"$WORK/results/curve-nvme-$w-$qd.json"
        done
    done
    export WORK CURVE_QDS CURVE_TIME CURVE_WARMUP SVG POLL_WINDOW_US TARGET_CPU GEN_CPU LOAD_START
    python3 - <<'PY'
import json, math, os, subprocess, datetime

w = os.environ["WORK"] + "/results"
qds = [int(q) for q in os.environ["CURVE_QDS"].split()]
loads = ["randread", "randwrite"]
pts = {}
for load in loads:
    for kind in ["raw", "nvme"]:
        pts[(load, kind)] = [
            (qd, json.load(open(f"{w}/curve-{kind}-{load}-{qd}.json"))["result"]) for qd in qds
        ]

rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
print(f"### Latency against IOPS, 4K, QD {qds[0]}…{qds[-1]} ({now}, `{rev}`)\n")
print(f"`scripts/bench.sh curves`: {os.environ['CURVE_TIME']} s per point after {os.environ['CURVE_WARMUP']} s warm-up, "
      f"1 connection, target 1 reactor on CPU {os.environ['TARGET_CPU']}, generator on CPU {os.environ['GEN_CPU']}, "
      f"poll_window_us = {os.environ['POLL_WINDOW_US']}.\n")
print("| workload | QD | nvmfd IOPS | p50 µs | p99 µs | raw TCP IOPS | p50 µs | p99 µs |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for load in loads:
    for (qd, n), (_, r) in zip(pts[(load, "nvme")], pts[(load, "raw")]):
        print(f"| 4K {load} | {qd} | {n['iops']:,.0f} | {n['lat_p50_us']:.1f} | {n['lat_p99_us']:.1f} "
              f"| {r['iops']:,.0f} | {r['lat_p50_us']:.1f} | {r['lat_p99_us']:.1f} |")

# The figure: two panels side by side, x = IOPS (linear from 0), y = latency (log10).
W, H, M = 460, 360, dict(l=62, r=14, t=34, b=48)
colors = {"nvme": "#1f5fbf", "raw": "#d0641a"}
names = {"nvme": "nvmfd", "raw": "raw TCP"}
def panel(x0, load):
    series = [(kind, q, pts[(load, kind)]) for kind in ["nvme", "raw"] for q in ["lat_p50_us", "lat_p99_us"]]
    xmax = max(p["iops"] for _, _, s in series for _, p in s) * 1.08
    lats = [p[q] for _, q, s in series for _, p in s if p[q] > 0]
    ylo = 10 ** math.floor(math.log10(min(lats)))
    yhi = 10 ** math.ceil(math.log10(max(lats)))
    pw, ph = W - M["l"] - M["r"], H - M["t"] - M["b"]
    X = lambda v: x0 + M["l"] + v / xmax * pw
    Y = lambda v: M["t"] + ph - (math.log10(v) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)) * ph
    o = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-weight="bold">4K {load}, QD {qds[0]}…{qds[-1]}</text>']
    o.append(f'<rect x="{x0 + M["l"]}" y="{M["t"]}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    d = ylo
    while d <= yhi * 1.001:
        for m in [1, 2, 5]:
            v = d * m
            if ylo <= v <= yhi:
                o.append(f'<line x1="{x0 + M["l"]}" x2="{x0 + M["l"] + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
                o.append(f'<text x="{x0 + M["l"] - 4}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="11">{v:g}</text>')
        d *= 10
    # A 1/2/5 × 10^n tick step giving at most 6 ticks.
    mag = 10 ** math.floor(math.log10(xmax / 6))
    step = next(m * mag for m in [1, 2, 5, 10] if xmax / (m * mag) <= 6)
    v = 0
    while v <= xmax:
        o.append(f'<text x="{X(v):.1f}" y="{M["t"] + ph + 16}" text-anchor="middle" font-size="11">{v / 1000:g}k</text>')
        v += step
    o.append(f'<text x="{x0 + M["l"] + pw / 2}" y="{H - 10}" text-anchor="middle" font-size="12">IOPS</text>')
    o.append(f'<text x="{x0 + 14}" y="{M["t"] + ph / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 {x0 + 14} {M["t"] + ph / 2})">latency (µs, log)</text>')
    for kind, q, s in series:
        dash = "" if q == "lat_p50_us" else ' stroke-dasharray="5,3"'
        path = " ".join(f"{X(p['iops']):.1f},{Y(max(p[q], ylo)):.1f}" for _, p in s)
        o.append(f'<polyline points="{path}" fill="none" stroke="{colors[kind]}" stroke-width="1.6"{dash}/>')
        for qd, p in s:
            o.append(f'<circle cx="{X(p["iops"]):.1f}" cy="{Y(max(p[q], ylo)):.1f}" r="2.5" fill="{colors[kind]}"/>')
            if kind == "nvme" and q == "lat_p50_us":
                o.append(f'<text x="{X(p["iops"]) + 4:.1f}" y="{Y(max(p[q], ylo)) + 12:.1f}" font-size="9" fill="{colors[kind]}">{qd}</text>')
    return o
body = panel(0, "randread") + panel(W, "randwrite")
ly = H + 8
legend = []
for i, (kind, q) in enumerate([(k, q) for k in ["nvme", "raw"] for q in ["p50", "p99"]]):
    x = 70 + i * 210
    dash = "" if q == "p50" else ' stroke-dasharray="5,3"'
    legend.append(f'<line x1="{x}" x2="{x + 28}" y1="{ly}" y2="{ly}" stroke="{colors[kind]}" stroke-width="1.6"{dash}/>')
    legend.append(f'<text x="{x + 34}" y="{ly + 4}" font-size="12">{names[kind]} {q}</text>')
note = (f"nvmfd-perf, 1 connection, {os.environ['CURVE_TIME']} s per point; numbers next to nvmfd points: queue depth. "
        f"{now}, {rev}; load average (1 min) {os.environ['LOAD_START']} at the start")
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 40}" font-family="sans-serif" font-size="12">',
       f'<rect width="{2 * W}" height="{H + 40}" fill="white"/>', *body, *legend,
       f'<text x="{W}" y="{H + 32}" text-anchor="middle" font-size="10" fill="#555">{note}</text>', "</svg>"]
open(os.environ["SVG"], "w").write("\n".join(svg) + "\n")
print(f"\nFigure: `{os.environ['SVG']}`.")
PY
    exit 0
fi

# The machine's CPU counters (proc(5): user … steal) around the matrix: on a virtual machine
# the hypervisor's steal time says how much the figures were disturbed from outside.
STAT_START=$(grep '^cpu ' /proc/stat)
for i in "${!CASES[@]}"; do
    name=${CASES[$i]%%|*}
    opts=${CASES[$i]#*|}
    echo "bench: $name" >&2
    for r in $(seq "$RUNS"); do
        # shellcheck disable=SC2086 # $opts is a list of options
        "$PERF" --raw-tcp --addr "127.0.0.1:$ECHO_PORT" $opts --cpu "$GEN_CPU" \
            --time "$TIME" --warmup "$WARMUP" --json >"$WORK/results/raw-$i-$r.json"
        # shellcheck disable=SC2086
        "${PERF_NVME[@]}" $opts --cpu "$GEN_CPU" --time "$TIME" --warmup "$WARMUP" \
            >"$WORK/results/nvme-$i-$r.json"
    done
done
kill "$ECHO_PID"
wait "$ECHO_PID" 2>/dev/null || true

STAT_END=$(grep '^cpu ' /proc/stat)
echo "bench: scale, 1 and $SCALE_CONNS connections at QD$SCALE_QD" >&2
for r in $(seq "$RUNS"); do
    "${PERF_NVME[@]}" -w randread -o 4k -q "$SCALE_QD" -Q 1 --cpu "$GEN_CPU" \
        --time "$TIME" --warmup "$WARMUP" >"$WORK/results/scale1-$r.json"
    "${PERF_NVME[@]}" -w randread -o 4k -q "$SCALE_QD" -Q "$SCALE_CONNS" --cpu "$GEN_CPU" \
        --time "$TIME" --warmup "$WARMUP" >"$WORK/results/scaleN-$r.json"
done

echo "bench: $IDLE_CONNS idle connections" >&2
RSS_BEFORE=$(rss_kib "$TPID")
open_idle_connections "$PORT"
IDLE_SETUP=$(sed -n 's/.* in \([0-9.]*\) s$/\1/p' "$WORK/idle.log")
sleep 1
RSS_CONNECTED=$(rss_kib "$TPID")
CONN_CPU=$(cpu_percent_over "$TPID" "$IDLE_SECS")
kill "$IDLE_PID"
wait "$IDLE_PID" 2>/dev/null || true
# The one-reactor target is done; the two-reactor one runs alone.
kill "$TPID"
wait "$TPID" 2>/dev/null || true
reactors_runs

# --- report ----------------------------------------------------------------------------------
LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
export POLL_WINDOW_US STAT_START STAT_END WORK RUNS TIME LOAD_START LOAD_END WARMUP TARGET_CPU GEN_CPU COMMAND IDLE_RSS IDLE_CPU IDLE_SECS \
    SCALE_CONNS SCALE_QD IDLE_CONNS RSS_BEFORE RSS_CONNECTED CONN_CPU IDLE_SETUP
NAMES=$(printf '%s\n' "${CASES[@]}" | cut -d'|' -f1)
export NAMES
REPORT=$(python3 - <<'PY'
import json, os, statistics, subprocess, datetime, platform

w = os.environ["WORK"] + "/results"
runs = int(os.environ["RUNS"])
names = os.environ["NAMES"].splitlines()

def load(prefix):
    return [json.load(open(f"{w}/{prefix}-{r}.json"))["result"] for r in range(1, runs + 1)]

def med(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")

def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"

def steal_percent():
    a = [int(x) for x in os.environ["STAT_START"].split()[1:9]]
    b = [int(x) for x in os.environ["STAT_END"].split()[1:9]]
    total = sum(b) - sum(a)
    return (b[7] - a[7]) / total * 100 if total else 0.0

rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
out = []
out.append(f"### nvmfd NVMe/TCP on 127.0.0.1 ({now})\n")
out.append(f"`{os.environ['COMMAND']}` at `{rev}` on {os.cpu_count()} × {cpu_model()}, Linux {platform.release()}. "
           f"Target: 1 reactor pinned to CPU {os.environ['TARGET_CPU']}, 1 GiB RAM namespace (4 KiB blocks, written once before the runs), "
           f"poll_window_us = {os.environ['POLL_WINDOW_US']} (the echo peer polls the same way); "
           f"generator: `nvmfd-perf`, 1 connection, pinned to CPU {os.environ['GEN_CPU']}. "
           f"Median of {runs} run(s) of {os.environ['TIME']} s after {os.environ['WARMUP']} s warm-up, with the lowest–highest "
           "over the runs (spread = (max − min) / median of IOPS). "
           "Raw TCP = the same message sizes and queue depth against nvmfd-perf's echo peer (pinned like the target), "
           "each run taken just before an nvmfd run; ratio = median over the runs of nvmfd IOPS / raw TCP IOPS of the same pair "
           "(lowest–highest in brackets). "
           f"Load average (1 min) before/after: {os.environ['LOAD_START']} / {os.environ['LOAD_END']} "
           "(anything else running on these CPUs skews every figure). "
           f"CPU time stolen by the hypervisor during the matrix: {steal_percent():.1f} %.\n")
out.append("| Workload | IOPS | IOPS min–max (spread) | MiB/s | mean µs (min–max) | p50 µs | p99 µs | p99.9 µs | raw TCP IOPS (min–max) | ratio | target CPU % | generator CPU % |")
out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

def rng(rs, key, fmt):
    # The spread over the runs: a figure is read with its noise.
    vals = [r[key] for r in rs if r.get(key) is not None]
    return f"{fmt(min(vals))}–{fmt(max(vals))}" if vals else "–"
for i, name in enumerate(names):
    n, r = load(f"nvme-{i}"), load(f"raw-{i}")
    iops, raw = med(n, "iops"), med(r, "iops")
    ratios = sorted(a["iops"] / b["iops"] * 100 for a, b in zip(n, r))
    ratio = f"{statistics.median(ratios):.0f} % ({ratios[0]:.0f}–{ratios[-1]:.0f})" if len(ratios) > 1 else f"{ratios[0]:.0f} %"
    errs = sum(x["errors"] for x in n)
    spread = (max(x["iops"] for x in n) - min(x["iops"] for x in n)) / iops * 100 if iops else float("nan")
    out.append(f"| {name}{' (errors: %d)' % errs if errs else ''} | {iops:,.0f} | {rng(n, 'iops', lambda v: f'{v:,.0f}')} ({spread:.0f} %) | "
               f"{med(n,'mib_s'):,.1f} | {med(n,'lat_mean_us'):.1f} ({rng(n, 'lat_mean_us', lambda v: f'{v:.1f}')}) | "
               f"{med(n,'lat_p50_us'):.1f} | {med(n,'lat_p99_us'):.1f} | {med(n,'lat_p999_us'):.1f} | "
               f"{raw:,.0f} ({rng(r, 'iops', lambda v: f'{v:,.0f}')}) | "
               f"{ratio} | {med(n,'target_cpu_percent'):.0f} | {med(n,'cpu_percent'):.0f} |")

# The generator's own ceiling ("null target" check): its CPU per I/O against the echo peer.
r = load("raw-1")
gen_iops, gen_cpu = med(r, "iops"), med(r, "cpu_percent")
if gen_cpu > 0:
    out.append(f"\nGenerator ceiling: against the echo peer (4K QD32) `nvmfd-perf` spends {gen_cpu / 100 / gen_iops * 1e6:.2f} µs "
               f"of CPU per I/O, i.e. about {gen_iops / (gen_cpu / 100):,.0f} IOPS per core. The target's own cost without "
               "storage is measured on a null namespace (`null_size`): `PROFILE_STORAGE='null_size = \"8M\"' scripts/bench.sh profile`.")

s1, sn = load("scale1"), load("scaleN")
i1, iN = med(s1, "iops"), med(sn, "iops")
conns, qd = os.environ["SCALE_CONNS"], os.environ["SCALE_QD"]
out.append("")
out.append("| Scale check (4K random read) | IOPS | p50 µs | p99 µs | target CPU % | target RSS MiB |")
out.append("|---|---:|---:|---:|---:|---:|")
for label, rs in ((f"1 connection × QD{qd}", s1), (f"{conns} connections × QD{qd}", sn)):
    out.append(f"| {label} | {med(rs,'iops'):,.0f} | {med(rs,'lat_p50_us'):.1f} | {med(rs,'lat_p99_us'):.1f} | "
               f"{med(rs,'target_cpu_percent'):.0f} | {med(rs,'target_rss_kib') / 1024:.0f} |")
out.append(f"\n{conns} connections reach {iN / i1 * 100:.0f} % of the single-connection IOPS at the same depth.\n")

idle_rss, rss0, rss1 = (int(os.environ[k]) for k in ("IDLE_RSS", "RSS_BEFORE", "RSS_CONNECTED"))
nidle = int(os.environ["IDLE_CONNS"])
out.append("| Idle | target CPU % | target RSS MiB |")
out.append("|---|---:|---:|")
out.append(f"| no connection ({os.environ['IDLE_SECS']} s) | {float(os.environ['IDLE_CPU']):.2f} | {idle_rss / 1024:.1f} |")
out.append(f"| {nidle} idle connections (admin + I/O queues, QD128 each; set up in {os.environ['IDLE_SETUP']} s) | "
           f"{float(os.environ['CONN_CPU']):.2f} | {rss1 / 1024:.1f} (+{(rss1 - rss0) / 1024:.1f}, "
           f"{(rss1 - rss0) / nidle:.0f} KiB per connection) |")
print("\n".join(out))
PY
)
REPORT=$(printf '%s\n\n%s' "$REPORT" "$(reactors_report)")
printf '%s\n' "$REPORT"
OUT=${OUT:-$ROOT/target/bench/bench-$(date -u +%Y%m%d-%H%M%S).md}
mkdir -p "$(dirname "$OUT")"
printf '%s\n' "$REPORT" >"$OUT"
echo "bench: written to $OUT" >&2
