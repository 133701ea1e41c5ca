#!/usr/bin/env bash
# One-command benchmark of nvmfd over NVMe/TCP on 127.0.0.1, printed as a Markdown section
# ready for the README.
#
#   scripts/bench.sh                 # full run (~6 minutes)
#   QUICK=1 scripts/bench.sh         # 1 run of 2 s per case, smaller scale check (~1.5 min)
#   scripts/bench.sh profile         # instructions and syscalls per I/O of the target (callgrind, perf stat)
#   PROFILE_METRICS=1 scripts/bench.sh profile   # the same with [metrics] on
#   scripts/bench.sh tls             # NVMe/TCP over TLS 1.3 (PSK) against plaintext, same run
#
# What it does: builds release; starts nvmfd-perf's echo peer, the raw loopback TCP
# reference (same message sizes and queue depth as each NVMe/TCP case, pinned like the
# target, each nvmfd run paired with a raw run just before it); starts target/release/nvmfd
# with one reactor pinned to TARGET_CPU and a 1 GiB RAM namespace; measures its idle CPU%
# and RSS; runs the matrix from GEN_CPU (RUNS runs each, medians), then the scale checks
# (SCALE_CONNS connections × QD SCALE_QD against one connection at the same depth;
# IDLE_CONNS idle connections: RSS delta and CPU%).
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
IDLE_SECS=${IDLE_SECS:-10}
SCALE_CONNS=${SCALE_CONNS:-64}
SCALE_QD=${SCALE_QD:-128}
IDLE_CONNS=${IDLE_CONNS:-1024}
POLL_WINDOW_US=${POLL_WINDOW_US:-50}
NQN="nqn.2026-12.dev.nvmfd:bench"

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
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
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
    cat >"$WORK/nvmfd.toml" <<EOF
[global]
reactors = 1
cpus = [$TARGET_CPU]
log_level = "warn"
control_socket = "$WORK/control.sock"
${PROFILE_GLOBAL:-}

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = $PORT

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
$PROFILE_STORAGE
block_size = 4096
EOF
    # PROFILE_METRICS=1: the same with command counting and the metrics endpoint on.
    if [[ -n "${PROFILE_METRICS:-}" ]]; then
        printf '\n[metrics]\nlisten = "127.0.0.1:%s"\n' "$((PORT + 2))" >>"$WORK/nvmfd.toml"
    fi
    # name | I/Os (1/5 for 128K: each moves 32 times the bytes) | nvmfd-perf workload options
    PROFILES=(
        "4K randread QD32|$PROFILE_IOS|-w randread -o 4k -q 32"
        "4K randwrite QD32|$PROFILE_IOS|-w randwrite -o 4k -q 32"
        "128K read QD8|$((PROFILE_IOS / 5))|-w read -o 128k -q 8"
    )
    SC="epoll_wait epoll_pwait read readv recvfrom write writev sendmsg io_uring_enter"
    SUMMARY=()
    for k in "${!PROFILES[@]}"; do
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
            ev=$(for s in $SC; do printf 'syscalls:sys_enter_%s,' "$s"; done)
            perf stat -x, -e "${ev%,}" -p "$TPID" -o "$WORK/sys.$k" &
            SPID=$!
            sleep 0.5
            # shellcheck disable=SC2086
            "$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" $opts --cpu "$GEN_CPU" --ios "$ios" >/dev/null
            kill -INT "$SPID"
            wait "$SPID" 2>/dev/null || true
            sys=$(awk -F, -v n="$ios" '/sys_enter_/ && $1+0 > 0 {
                ev = $3; sub(/.*sys_enter_/, "", ev); printf "%s %.3f, ", ev, $1 / n }' "$WORK/sys.$k")
            sys=${sys%, }
            echo "syscalls per I/O (native run): $sys"
            row="$row $sys |"
            kill "$TPID"
            wait "$TPID" 2>/dev/null || true
        else
            row="$row (perf cannot trace syscalls here) |"
        fi
        SUMMARY+=("$row")
        echo
    done
    echo "Command: \`${PROFILE_METRICS:+PROFILE_METRICS=1 }scripts/bench.sh profile\` (PROFILE_IOS=$PROFILE_IOS) at \`$(git rev-parse --short HEAD)\`, $PROFILE_LABEL namespace with 4 KiB blocks${PROFILE_GLOBAL:+, $PROFILE_GLOBAL}."
    echo
    echo "| Workload | I/Os | instructions | instructions / I/O | syscalls / I/O (native run) |"
    echo "|---|---:|---:|---:|---|"
    printf '%s\n' "${SUMMARY[@]}"
    exit 0
fi

# --- tls mode: NVMe/TCP over TLS 1.3 against plaintext nvmfd, in the same run ----------------
# One nvmfd with two ports on the same reactor: plaintext, and tls = "required" with a PSK for
# the generator's host NQN. Each case runs RUNS pairs (plaintext, then TLS, back to back);
# ratio = median over the pairs of TLS IOPS / plaintext IOPS. The record layer is whatever the
# daemon logs for the port (kernel TLS when the kernel has the tls ULP, else user space);
# nvmfd-perf's record layer is always in user space.
if [[ "${1:-}" == "tls" ]]; then
    TLS_PORT=$((PORT + 3))
    HOSTNQN="nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-62656e636801"
    printf 'NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n' >"$WORK/host.psk"
    chmod 600 "$WORK/host.psk"
    cat >"$WORK/nvmfd.toml" <<TOML
[global]
reactors = 1
cpus = [$TARGET_CPU]
max_queue_size = 128
in_capsule_data_size = 8192
max_data_transfer = "1M"
poll_window_us = $POLL_WINDOW_US
log_level = "info"

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = $PORT

[[ports]]
id = 2
transport = "tcp"
address = "127.0.0.1"
service = $TLS_PORT
tls = "required"

[[tls_keys]]
host = "$HOSTNQN"
key_file = "$WORK/host.psk"

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
ram_size = "1G"
block_size = 4096
TOML
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
    RECORD_LAYER=$(sed -n 's/.*TLS 1.3 port.*record_layer="\([^"]*\).*/\1/p' "$WORK/nvmfd.log" | head -1 | sed 's/ (.*//')
    LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
    NAMES=$(printf '%s\n' "${TLS_CASES[@]}" | cut -d'|' -f1)
    export WORK RUNS TIME WARMUP TARGET_CPU GEN_CPU LOAD_START LOAD_END NAMES RECORD_LAYER
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
PY
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
cat >"$WORK/nvmfd.toml" <<EOF
[global]
reactors = 1
cpus = [$TARGET_CPU]
max_queue_size = 128
max_io_queues = 8
in_capsule_data_size = 8192
max_data_transfer = "1M"
poll_window_us = $POLL_WINDOW_US
log_level = "warn"
control_socket = "$WORK/control.sock"

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = $PORT

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
ram_size = "1G"
block_size = 4096
EOF
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
"$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" --idle-connections "$IDLE_CONNS" -q 128 \
    --time $((IDLE_SECS + 600)) --json >"$WORK/results/idle.json" 2>"$WORK/idle.log" &
IDLE_PID=$!
PIDS+=("$IDLE_PID")
for _ in $(seq 600); do
    grep -q "connections open" "$WORK/idle.log" && break
    kill -0 "$IDLE_PID" 2>/dev/null || { cat "$WORK/idle.log" >&2; exit 1; }
    sleep 0.1
done
grep -q "connections open" "$WORK/idle.log" || { echo "bench: idle connections not up" >&2; exit 1; }
IDLE_SETUP=$(sed -n 's/.* in \([0-9.]*\) s$/\1/p' "$WORK/idle.log")
sleep 1
RSS_CONNECTED=$(rss_kib "$TPID")
CONN_CPU=$(cpu_percent_over "$TPID" "$IDLE_SECS")
kill "$IDLE_PID"
wait "$IDLE_PID" 2>/dev/null || true

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
           f"Median of {runs} run(s) of {os.environ['TIME']} s after {os.environ['WARMUP']} s warm-up. "
           "Raw TCP = the same message sizes and queue depth against nvmfd-perf's echo peer (pinned like the target), "
           "each run taken just before an nvmfd run; ratio = median over the runs of nvmfd IOPS / raw TCP IOPS of the same pair "
           "(lowest–highest in brackets). "
           f"Load average (1 min) before/after: {os.environ['LOAD_START']} / {os.environ['LOAD_END']} "
           "(anything else running on these CPUs skews every figure). "
           f"CPU time stolen by the hypervisor during the matrix: {steal_percent():.1f} %.\n")
out.append("| Workload | IOPS | MiB/s | mean µs | p50 µs | p99 µs | p99.9 µs | raw TCP IOPS | ratio | target CPU % | generator CPU % |")
out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for i, name in enumerate(names):
    n, r = load(f"nvme-{i}"), load(f"raw-{i}")
    iops, raw = med(n, "iops"), med(r, "iops")
    ratios = sorted(a["iops"] / b["iops"] * 100 for a, b in zip(n, r))
    ratio = f"{statistics.median(ratios):.0f} % ({ratios[0]:.0f}–{ratios[-1]:.0f})" if len(ratios) > 1 else f"{ratios[0]:.0f} %"
    errs = sum(x["errors"] for x in n)
    out.append(f"| {name}{' (errors: %d)' % errs if errs else ''} | {iops:,.0f} | {med(n,'mib_s'):,.1f} | {med(n,'lat_mean_us'):.1f} | "
               f"{med(n,'lat_p50_us'):.1f} | {med(n,'lat_p99_us'):.1f} | {med(n,'lat_p999_us'):.1f} | {raw:,.0f} | "
               f"{ratio} | {med(n,'target_cpu_percent'):.0f} | {med(n,'cpu_percent'):.0f} |")

# The generator's own ceiling ("null target" check): its CPU per I/O against the echo peer.
r = load("raw-1")
gen_iops, gen_cpu = med(r, "iops"), med(r, "cpu_percent")
if gen_cpu > 0:
    out.append(f"\nGenerator ceiling: against the echo peer (4K QD32) `nvmfd-perf` spends {gen_cpu / 100 / gen_iops * 1e6:.2f} µs "
               f"of CPU per I/O, i.e. about {gen_iops / (gen_cpu / 100):,.0f} IOPS per core; nvmfd has no null backend, "
               "so this stands in for the null-target check.")

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
printf '%s\n' "$REPORT"
OUT=${OUT:-$ROOT/target/bench/bench-$(date -u +%Y%m%d-%H%M%S).md}
mkdir -p "$(dirname "$OUT")"
printf '%s\n' "$REPORT" >"$OUT"
echo "bench: written to $OUT" >&2
