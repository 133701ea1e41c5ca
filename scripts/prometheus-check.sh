#!/usr/bin/env bash
# A real Prometheus scraping nvmfd under load, on loopback: does what the metrics say agree with
# what the load generator measured?
#
#   scripts/prometheus-check.sh            # 4K random read, QD1, 30 s measured
#   WORKLOAD="-w randwrite -o 4k -q 8" scripts/prometheus-check.sh
#
# What it does: builds release (NO_BUILD=1 to skip); starts target/release/nvmfd with a RAM
# namespace and `[metrics] listen`, and Prometheus (Debian package `prometheus`) with a
# temporary configuration and storage directory, scraping it every 500 ms; checks one scrape
# with `promtool check metrics`; runs nvmfd-perf (WARMUP s of warm-up, then TIME s measured);
# asks Prometheus' HTTP API, over nvmfd-perf's measured window (W, its elapsed time, ending when
# it exited), for
#   sum(rate(nvmfd_namespace_commands_total{class=...}[W]))          against nvmfd-perf's IOPS
#   histogram_quantile(0.5, sum by (le) (rate(nvmfd_namespace_latency_seconds_bucket[W])))
#                                                                    against nvmfd-perf's p50
# and prints both pairs. Passes (exit 0) when the rate is within 5 % of the IOPS and the
# target's p50 is at most the host's and at least 40 % of it (the rest is the kernel's TCP
# stack on both sides and the host's own work).
#
# Knobs (environment): PORT=14520 METRICS_PORT=14522 PROM_PORT=14590 TIME=30 WARMUP=5
# TARGET_CPU=0 GEN_CPU=1 WORKLOAD="-w randread -o 4k -q 1" NVMFD=<path> PERF=<path>
# Needs: prometheus and promtool (apt-get install prometheus), curl, python3.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PORT=${PORT:-14520}
METRICS_PORT=${METRICS_PORT:-14522}
PROM_PORT=${PROM_PORT:-14590}
TIME=${TIME:-30}
WARMUP=${WARMUP:-5}
TARGET_CPU=${TARGET_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
WORKLOAD=${WORKLOAD:--w randread -o 4k -q 1}
NQN="nqn.2026-12.dev.nvmfd:promcheck"

for tool in prometheus promtool curl python3; do
    command -v "$tool" >/dev/null || {
        echo "prometheus-check: $tool is needed (apt-get install prometheus curl python3)" >&2
        exit 1
    }
done
if [[ -z "${NO_BUILD:-}" ]]; then
    echo "prometheus-check: building release binaries" >&2
    cargo build --release -q -p nvmfd -p nvmfd-perf
fi
NVMFD=${NVMFD:-$ROOT/target/release/nvmfd}
PERF=${PERF:-$ROOT/target/release/nvmfd-perf}

WORK=$(mktemp -d /tmp/nvmfd-promcheck.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/nvmfd.toml" <<EOF
[global]
reactors = 1
cpus = [$TARGET_CPU]
log_level = "warn"

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
ram_size = "256M"
block_size = 4096

[metrics]
listen = "127.0.0.1:$METRICS_PORT"
EOF
cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 500ms
  scrape_timeout: 450ms
scrape_configs:
  - job_name: nvmfd
    static_configs:
      - targets: ["127.0.0.1:$METRICS_PORT"]
EOF

wait_for() { # url what
    for _ in $(seq 100); do
        curl -sf -o /dev/null "$1" && return 0
        sleep 0.1
    done
    echo "prometheus-check: $2 did not come up" >&2
    exit 1
}

"$NVMFD" --config "$WORK/nvmfd.toml" 2>"$WORK/nvmfd.log" &
PIDS+=("$!")
wait_for "http://127.0.0.1:$METRICS_PORT/metrics" "nvmfd's metrics endpoint"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" 2>"$WORK/prometheus.log" &
PIDS+=("$!")
wait_for "http://127.0.0.1:$PROM_PORT/-/ready" "Prometheus"

# What curl (and promtool) get: the Prometheus text format.
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" >"$WORK/scrape.txt"
if promtool check metrics <"$WORK/scrape.txt" >"$WORK/promtool.out" 2>&1; then
    PROMTOOL="clean ($(wc -l <"$WORK/scrape.txt") lines)"
else
    PROMTOOL="FAILED: $(head -5 "$WORK/promtool.out" | tr '\n' ' ')"
fi

# shellcheck disable=SC2086 # $WORKLOAD is a list of options
"$PERF" --addr "127.0.0.1:$PORT" --nqn "$NQN" $WORKLOAD --cpu "$GEN_CPU" \
    --warmup "$WARMUP" -t "$TIME" --json >"$WORK/perf.json"
END=$(date +%s.%N)
# Prometheus' window is nvmfd-perf's measured one: its elapsed time, ending when it exited (a
# load that varies, as on a shared machine, then still compares like with like).
WINDOW_MS=$(python3 -c "import json; print(round(json.load(open('$WORK/perf.json'))['result']['elapsed_s'] * 1000))")
AT=$END
sleep 2 # the scrapes after the end

query() { # promql → value (first series), or "nan"
    curl -sf "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" \
        --data-urlencode "time=${AT}" |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "nan")'
}
CLASS=read
[[ "$WORKLOAD" == *write* && "$WORKLOAD" != *randrw* ]] && CLASS=write
W="${WINDOW_MS}ms"
RATE=$(query "sum(rate(nvmfd_namespace_commands_total{job=\"nvmfd\",class=\"$CLASS\"}[$W]))")
P50=$(query "histogram_quantile(0.5, sum by (le) (rate(nvmfd_namespace_latency_seconds_bucket{job=\"nvmfd\",class=\"$CLASS\"}[$W])))")
BACKEND_P50=$(query "histogram_quantile(0.5, sum by (le) (rate(nvmfd_namespace_backend_latency_seconds_bucket{job=\"nvmfd\",class=\"$CLASS\"}[$W])))")
# The same over the last three 10 s of the window, to tell a load that changed from a count
# that is off.
RATES10=""
for back in 20 10 0; do
    RATES10+=" $(AT=$(python3 -c "print($AT - $back)") query "sum(rate(nvmfd_namespace_commands_total{job=\"nvmfd\",class=\"$CLASS\"}[10s]))" | cut -d. -f1)"
done
UP=$(query "up{job=\"nvmfd\"}")
SCRAPE=$(query "avg_over_time(scrape_duration_seconds{job=\"nvmfd\"}[$W])")

python3 - "$WORK/perf.json" "$RATE" "$P50" "$UP" "$SCRAPE" "$PROMTOOL" "$WORKLOAD" "$CLASS" "$BACKEND_P50" "$RATES10" "$W" <<'EOF'
import json, math, sys
perf = json.load(open(sys.argv[1]))["result"]
rate, p50, up, scrape = (float(x) for x in sys.argv[2:6])
promtool, workload, cls, backend = sys.argv[6], sys.argv[7], sys.argv[8], float(sys.argv[9])
iops, host_p50 = perf["iops"], perf["lat_p50_us"]
target_p50 = p50 * 1e6
rate_ok = iops > 0 and abs(rate - iops) / iops <= 0.05
lat_ok = 0.4 * host_p50 <= target_p50 <= host_p50
print(f"## Prometheus against nvmfd-perf ({workload}, loopback)\n")
print(f"- promtool check metrics on a scrape: {promtool}")
print(f"- Prometheus target up: {up:.0f}; mean scrape duration {scrape * 1000:.2f} ms")
print(f"- {cls} rate, Prometheus rate(...[{sys.argv[11]}]): {rate:.0f}/s; nvmfd-perf: {iops:.0f} IOPS; "
      f"difference {100 * (rate - iops) / iops:+.2f} % (limit 5 %): {'ok' if rate_ok else 'FAIL'}; "
      f"rate over each 10 s of the window:{sys.argv[10]}/s")
print(f"- p50 latency, target (capsule arrival to response handed to the socket, "
      f"histogram_quantile): {target_p50:.1f} us; host (nvmfd-perf): {host_p50:.1f} us; "
      f"ratio {target_p50 / host_p50:.2f} (between 0.40 and 1.00): {'ok' if lat_ok else 'FAIL'}")
print(f"- backend p50 latency: " + ("none (in-line backend)" if math.isnan(backend) else f"{backend * 1e6:.1f} us"))
sys.exit(0 if rate_ok and lat_ok and promtool.startswith("clean") and up == 1 else 1)
EOF
