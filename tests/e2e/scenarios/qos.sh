#!/bin/bash
# e2e-timeout: 900 (five fio runs of up to 30 s each under TCG, and a boot)
# QoS limits seen by the stock Linux host: fio (4 KiB random reads, QD32) on a namespace
# limited to 500 IOPS measures 500 within 5 % over QOS_RUNTIME seconds; `nvmfd ctl set-qos`
# changes it to a 20 MiB/s limit (128 KiB reads, QD8: within 5 %), then, while fio runs,
# to 1,000 IOPS: the same connection (same controller, no new queue) then measures 1,000
# within 5 %. Namespace 2 has no limit: what the guest reaches unlimited comes first, and
# the limits are only judged where it is well above them. `nvmfd ctl qos` and the metrics
# show the limit, the admitted commands and the held time. Every limit has burst_ms = 500
# (see configs/qos.toml: TCG stalls).
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/qos.toml
NQN=nqn.2026-12.dev.nvmfd:qos
ADDR=127.0.0.1
PORT=4420
RUNTIME=${QOS_RUNTIME:-30}
R=$E2E_OUT/qos
mkdir -p "$R"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

ctl() { "$E2E_NVMFD_BIN" ctl -s /run/nvmfd/control.sock "$@"; }

step "load host modules" load_host_modules tcp
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "connect" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
CTRL=
find_ctrl() { CTRL=$(ctrl_of "$NQN" tcp) && echo "controller $CTRL"; }
step "controller" find_ctrl
DEV=()
step "namespaces 1-2 appear" find_namespaces "$NQN" 1 2
CNTLID=$(cat "/sys/class/nvme/$CTRL/cntlid")
info "controller $CTRL (cntlid $CNTLID), namespaces ${DEV[*]}"

# fio_json NAME DEV BS DEPTH SECONDS: random reads, direct, one job; JSON in $R/NAME.json.
fio_json() {
	fio --name="$1" --filename="$2" --rw=randread --bs="$3" --iodepth="$4" --ioengine=libaio \
		--direct=1 --time_based --runtime="$5" --size=128M --output-format=json \
		--output="$R/$1.json" && jq -c '.jobs[0].read | {iops, bw, lat_ns: .lat_ns.mean}' "$R/$1.json"
}
iops_of() { jq -r '.jobs[0].read.iops' "$R/$1.json"; }
kib_of() { jq -r '.jobs[0].read.bw' "$R/$1.json"; }
# within VALUE TARGET: |VALUE - TARGET| <= 5 % of TARGET
within() {
	awk -v v="$1" -v t="$2" 'BEGIN { d = v - t; if (d < 0) d = -d; printf "%.1f vs %s: %.2f %%\n", v, t, 100 * d / t; exit !(d <= 0.05 * t) }'
}
above() { awk -v v="$1" -v t="$2" 'BEGIN { printf "%.1f (needs > %s)\n", v, t; exit !(v > t) }'; }

step "unlimited 4 KiB QD32 on nsid 2 (10 s)" fio_json free-4k "${DEV[2]}" 4k 32 10
step "unlimited 128 KiB QD8 on nsid 2 (10 s)" fio_json free-128k "${DEV[2]}" 128k 8 10
info "unlimited: $(iops_of free-4k) IOPS at 4 KiB, $(kib_of free-128k) KiB/s at 128 KiB"
step "the guest exceeds 1,100 IOPS unlimited" above "$(iops_of free-4k)" 1100
step "the guest exceeds 22 MiB/s unlimited" above "$(kib_of free-128k)" $((22 * 1024))

step "fio 4 KiB QD32 on nsid 1 at 500 IOPS (${RUNTIME} s)" fio_json iops500 "${DEV[1]}" 4k 32 "$RUNTIME"
step "500 IOPS within 5 %" within "$(iops_of iops500)" 500

step "set-qos nsid 1: 20 MiB/s" ctl set-qos "$NQN" --nsid 1 --total-mbps 20 --burst-ms 500
step "fio 128 KiB QD8 on nsid 1 at 20 MiB/s (${RUNTIME} s)" fio_json mbps20 "${DEV[1]}" 128k 8 "$RUNTIME"
step "20 MiB/s within 5 %" within "$(kib_of mbps20)" $((20 * 1024))

step "set-qos nsid 1: 500 IOPS" ctl set-qos "$NQN" --nsid 1 --iops 500 --burst-ms 500
QUEUES_BEFORE=$(grep -c 'I/O queue connected' "$NVMFD_LOG")
# fio across the change: 1 s IOPS samples; set-qos to 1,000 IOPS halfway.
live_change() {
	local half=$((RUNTIME / 2)) pid
	fio --name=live --filename="${DEV[1]}" --rw=randread --bs=4k --iodepth=32 --ioengine=libaio \
		--direct=1 --time_based --runtime=$((2 * half)) --size=128M \
		--write_iops_log="$R/live" --log_avg_msec=1000 --output="$R/live.txt" &
	pid=$!
	sleep "$half"
	ctl set-qos "$NQN" --nsid 1 --iops 1000 --burst-ms 500 || { kill "$pid"; return 1; }
	# What an operator sees meanwhile: the limit, the achieved rate, the held commands.
	sleep 3
	ctl qos "$NQN" --interval 3 | tee "$R/ctl-qos.txt"
	ctl --json qos "$NQN" --interval 3 >"$R/ctl-qos.json"
	wait "$pid"
}
step "fio 4 KiB QD32 on nsid 1, set-qos 1,000 IOPS halfway ($((RUNTIME / 2 * 2)) s)" live_change
# Per-second samples (ms, IOPS, …): the first half without its first 2 s, the second without
# its first 2 s (the change lands within a second).
half_mean() {
	awk -F, -v lo="$1" -v hi="$2" '$1 >= lo * 1000 && $1 < hi * 1000 { s += $2; n++ } END { if (n) printf "%.1f\n", s / n }' "$R"/live_iops*.log
}
H=$((RUNTIME / 2))
LIVE500=$(half_mean 2 "$H")
LIVE1000=$(half_mean $((H + 2)) $((2 * H + 1)))
info "live: ${LIVE500} IOPS before set-qos, ${LIVE1000} IOPS after"
step "before the change: 500 IOPS within 5 %" within "$LIVE500" 500
step "after the change: 1,000 IOPS within 5 %" within "$LIVE1000" 1000
same_controller() {
	local now queues
	now=$(cat "/sys/class/nvme/$CTRL/cntlid")
	queues=$(grep -c 'I/O queue connected' "$NVMFD_LOG")
	echo "cntlid $CNTLID -> $now, I/O queue connects $QUEUES_BEFORE -> $queues"
	[ "$now" = "$CNTLID" ] && [ "$queues" = "$QUEUES_BEFORE" ] && [ "$(ctrl_state "$NQN")" = live ]
}
step "no reconnect: same controller, no new I/O queue" same_controller

ctl_qos_shows_it() {
	cat "$R/ctl-qos.txt"
	jq -c '.[0] | {nsid, limits, iops, held_per_s, mean_held_ms}' "$R/ctl-qos.json"
	expect_eq "limit" "$(jq -r '.[0].limits.iops' "$R/ctl-qos.json")" 1000 &&
		awk -v v="$(jq -r '.[0].iops' "$R/ctl-qos.json")" 'BEGIN { exit !(v > 900 && v < 1100) }' &&
		awk -v v="$(jq -r '.[0].held_per_s' "$R/ctl-qos.json")" 'BEGIN { exit !(v > 0) }'
}
step "ctl qos: limit 1000, ~1000 IOPS achieved, commands held" ctl_qos_shows_it
# The metrics endpoint, asked for OpenMetrics (the parser below reads only that; without the
# Accept header the endpoint answers Prometheus text 0.0.4): the limit, what was admitted,
# the held time.
metrics_show_qos() {
	python3 - "$NQN" <<'PY'
import sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
nqn = sys.argv[1]
req = urllib.request.Request("http://127.0.0.1:9469/metrics",
                             headers={"Accept": "application/openmetrics-text; version=1.0.0"})
with urllib.request.urlopen(req, timeout=20) as r:
    text = r.read().decode()
got = {}
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        if s.name.startswith("nvmfd_qos") and s.labels.get("subsystem") == nqn and s.labels.get("nsid") == "1":
            print(s.name, s.labels, s.value)
            got[(s.name, s.labels.get("quantity"), s.labels.get("direction"))] = s.value
ok = (got.get(("nvmfd_qos_limit", "iops", None)) == 1000
      and got.get(("nvmfd_qos_commands_total", None, None), 0) > 0
      and got.get(("nvmfd_qos_bytes_total", None, "read"), 0) > 0
      and got.get(("nvmfd_qos_held_commands_total", None, None), 0) > 0
      and got.get(("nvmfd_qos_held_seconds_total", None, None), 0) > 0)
sys.exit(0 if ok else "missing or zero nvmfd_qos samples")
PY
}
step "metrics: limit, admitted commands and bytes, held commands and time" metrics_show_qos
step "nvmfd alive after I/O" nvmfd_alive
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
