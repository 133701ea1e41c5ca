#!/bin/bash
# e2e-timeout: 600 (fio, five connects and three nvmfd starts under TCG)
# Metrics and health as an operator sees them: nvmfd with `[metrics] listen` and a state
# directory; while fio runs a fixed number of 4 KiB random reads and writes, /metrics is scraped
# and parsed with prometheus_client's OpenMetrics parser (python3-prometheus-client); the
# namespace's read/write command counters grow by fio's issued reads and writes (within 1 %),
# `nvmfd ctl top --once --json` shows the same totals as the scrape, and `nvme smart-log`
# counters keep growing across a disconnect + reconnect, a clean restart (power cycles + 1) and
# a SIGKILL restart (power cycles + 1, unsafe shutdowns + 1).
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/ops-metrics.toml
NQN=nqn.2026-12.dev.nvmfd:ops
PORT=4420
METRICS=http://127.0.0.1:9469/metrics
SOCK=/run/nvmfd/control.sock
STATE=/var/lib/nvmfd-e2e
# 4 KiB random I/O over 32 MiB: 8192 I/Os, each block once (fio's random map), ~70 % reads.
FIO_SIZE=32M
R=$E2E_OUT/ops
mkdir -p "$R"
rm -rf "$STATE"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

# scrape NAME: GET /metrics, parse it with the OpenMetrics parser (any error fails), keep the
# text ($R/NAME.txt) and the namespace's read/write command totals ($R/NAME.json).
scrape() {
	python3 - "$METRICS" "$NQN" "$R/$1" <<'PY'
import json, sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
url, nqn, out = sys.argv[1:]
# Ask for OpenMetrics as Prometheus does (without Accept the answer is the text format 0.0.4).
req = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
with urllib.request.urlopen(req, timeout=20) as r:
    ctype = r.headers.get("Content-Type", "")
    text = r.read().decode()
open(out + ".txt", "w").write(text)
counts = {"read": 0, "write": 0}
families = samples = 0
for fam in text_string_to_metric_families(text):
    families += 1
    for s in fam.samples:
        samples += 1
        l = s.labels
        if (s.name == "nvmfd_namespace_commands_total" and l.get("subsystem") == nqn
                and l.get("nsid") == "1" and l.get("class") in counts):
            counts[l["class"]] += int(s.value)
res = dict(content_type=ctype, families=families, samples=samples, **counts)
json.dump(res, open(out + ".json", "w"))
print(json.dumps(res))
if not ctype.startswith("application/openmetrics-text") or families == 0:
    sys.exit("not an OpenMetrics answer")
PY
}

# smart NAME: the controller-level SMART / Health log (NSID FFFFFFFFh) into $R/NAME.json.
smart() { to_file "$R/$1.json" nvme smart-log "/dev/$CTRL" -o json; }
sfield() { jq -r ".$2" "$R/$1.json"; }

CTRL=
DEV=
connect() {
	nvme connect -t tcp -a 127.0.0.1 -s "$PORT" -n "$NQN" -i 2 || return 1
	CTRL=$(retry 50 0.1 ctrl_of "$NQN" tcp) || return 1
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "controller $CTRL, namespace $DEV"
}
disconnect() { nvme disconnect -n "$NQN"; }

# fio_rw NAME SIZE: 4 KiB random reads and writes, each block of SIZE once; JSON in $R/NAME.json.
fio_rw() {
	fio --name=ops --filename="$DEV" --rw=randrw --rwmixread=70 --bs=4k --size="$2" \
		--direct=1 --ioengine=libaio --iodepth=8 --randrepeat=1 \
		--output-format=json --output="$R/$1.json"
}

step "load host modules" load_host_modules tcp
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "connect" connect
# The host's own reads at connect (partition scan) are done once the disk node exists.
sleep 1
step "scrape before fio" scrape before

fio_with_scrapes() {
	fio_rw fio "$FIO_SIZE" &
	local pid=$! during=0 i
	for ((i = 1; i <= 60; i++)); do
		sleep 1
		kill -0 "$pid" 2>/dev/null || break
		scrape "during-$i" || { wait "$pid"; return 1; }
		# Counted only when fio was still running after the scrape too.
		kill -0 "$pid" 2>/dev/null && during=$((during + 1)) && echo "scrape $i while fio runs"
	done
	wait "$pid" || { echo "fio failed"; return 1; }
	expect_num "scrapes parsed while fio ran" "$during" -ge 1
}
step "fio randrw, /metrics scraped and parsed while it runs" fio_with_scrapes
# Queues publish their counters at most every 100 ms.
sleep 1
step "scrape after fio" scrape after

# within_1pct WHAT ACTUAL EXPECTED
within_1pct() {
	local diff=$(($2 - $3))
	diff=${diff#-}
	if [ $((diff * 100)) -le "$3" ] && [ "$3" -gt 0 ]; then
		echo "ok: $1 = $2, fio $3 (difference $diff)"
	else
		echo "MISMATCH: $1 = $2, fio issued $3 (difference $diff, more than 1 %)"
		return 1
	fi
}
FIO_READS=
FIO_WRITES=
counters_match_fio() {
	FIO_READS=$(jq '[.jobs[].read.total_ios] | add' "$R/fio.json")
	FIO_WRITES=$(jq '[.jobs[].write.total_ios] | add' "$R/fio.json")
	R0=$(jq .read "$R/before.json") W0=$(jq .write "$R/before.json")
	R1=$(jq .read "$R/after.json") W1=$(jq .write "$R/after.json")
	within_1pct "read commands counted during fio" $((R1 - R0)) "$FIO_READS" &&
		within_1pct "write commands counted during fio" $((W1 - W0)) "$FIO_WRITES"
}
step "metrics read/write counters match fio's I/O counts (1 %)" counters_match_fio
info "fio issued $FIO_READS reads, $FIO_WRITES writes; /metrics read $R0 -> $R1 (+$((R1 - R0))), write $W0 -> $W1 (+$((W1 - W0)))"

top_agrees() {
	to_file "$R/top.json" "$E2E_NVMFD_BIN" ctl --socket "$SOCK" top --once --json || return 1
	local tr tw
	tr=$(jq --arg n "$NQN" '.namespaces[] | select(.nqn == $n and .nsid == 1) | .read_commands' "$R/top.json")
	tw=$(jq --arg n "$NQN" '.namespaces[] | select(.nqn == $n and .nsid == 1) | .write_commands' "$R/top.json")
	expect_eq "ctl top read commands = /metrics" "$tr" "$(jq .read "$R/after.json")" &&
		expect_eq "ctl top write commands = /metrics" "$tw" "$(jq .write "$R/after.json")"
}
step "ctl top --once --json agrees with the scrape" top_agrees

step "smart-log after fio" smart smart-1
smart_counts_fio() {
	local r w
	r=$(sfield smart-1 host_read_commands) w=$(sfield smart-1 host_write_commands)
	expect_num "SMART host read commands" "$r" -ge "$FIO_READS" &&
		expect_num "SMART host write commands" "$w" -ge "$FIO_WRITES" &&
		expect_num "SMART power cycles" "$(sfield smart-1 power_cycles)" -eq 1 &&
		expect_num "SMART unsafe shutdowns" "$(sfield smart-1 unsafe_shutdowns)" -eq 0
}
step "smart-log counts fio's commands" smart_counts_fio

# grew BEFORE AFTER: every I/O counter of smart-log AFTER is above BEFORE's.
grew() {
	local f bad=0 a b
	for f in data_units_read data_units_written host_read_commands host_write_commands; do
		a=$(sfield "$1" "$f") b=$(sfield "$2" "$f")
		if [ "$b" -gt "$a" ]; then echo "ok: $f $a -> $b"; else
			echo "MISMATCH: $f $a -> $b (did not grow)"
			bad=1
		fi
	done
	return $bad
}
# not_lower BEFORE AFTER: nothing went back (right after a reconnect or restart).
not_lower() {
	local f bad=0 a b
	for f in data_units_read data_units_written host_read_commands host_write_commands power_on_hours; do
		a=$(sfield "$1" "$f") b=$(sfield "$2" "$f")
		if [ "$b" -ge "$a" ]; then echo "ok: $f $a -> $b"; else
			echo "MISMATCH: $f $a -> $b (went back)"
			bad=1
		fi
	done
	return $bad
}
more_io() { fio_rw "$1" 4M; }

# 1. disconnect + reconnect: a new controller, the same counters.
step "disconnect" disconnect
step "reconnect" connect
step "smart-log after reconnect" smart smart-2
step "smart-log kept across the reconnect" not_lower smart-1 smart-2
step "fio after reconnect" more_io fio-2
step "smart-log after reconnect + fio" smart smart-3
step "smart-log grows after the reconnect" grew smart-1 smart-3

# 2. clean restart: counters saved at shutdown, one more power cycle, no unsafe shutdown.
step "disconnect before clean restart" disconnect
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "health.json says clean shutdown" expect_eq clean_shutdown "$(jq .clean_shutdown "$STATE/health.json")" true
step "start nvmfd again" start_nvmfd "$CONFIG" "$PORT"
step "connect after clean restart" connect
step "smart-log after clean restart" smart smart-4
step "smart-log kept across the clean restart" not_lower smart-3 smart-4
clean_cycles() {
	expect_num "power cycles" "$(sfield smart-4 power_cycles)" -eq 2 &&
		expect_num "unsafe shutdowns" "$(sfield smart-4 unsafe_shutdowns)" -eq 0
}
step "clean restart: power cycles 2, unsafe shutdowns 0" clean_cycles
step "fio after clean restart" more_io fio-3
step "smart-log after clean restart + fio" smart smart-5
step "smart-log grows after the clean restart" grew smart-3 smart-5

# 3. SIGKILL: what was saved (every 10 s while counters change) survives; one unsafe shutdown.
step "disconnect before SIGKILL" disconnect
# Past one save period, so the counts of fio-3 are in health.json.
sleep 12
step "kill -9 nvmfd" kill_nvmfd
step "health.json says not shut down cleanly" expect_eq clean_shutdown "$(jq .clean_shutdown "$STATE/health.json")" false
step "start nvmfd after SIGKILL" start_nvmfd "$CONFIG" "$PORT"
step "connect after SIGKILL restart" connect
step "smart-log after SIGKILL restart" smart smart-6
step "smart-log kept across the SIGKILL restart" not_lower smart-5 smart-6
unsafe_counted() {
	expect_num "power cycles" "$(sfield smart-6 power_cycles)" -eq 3 &&
		expect_num "unsafe shutdowns" "$(sfield smart-6 unsafe_shutdowns)" -eq 1
}
step "SIGKILL restart: power cycles 3, unsafe shutdowns 1" unsafe_counted
step "fio after SIGKILL restart" more_io fio-4
step "smart-log after SIGKILL restart + fio" smart smart-7
step "smart-log grows after the SIGKILL restart" grew smart-5 smart-7
for s in smart-1 smart-3 smart-5 smart-7; do
	info "$s: read cmds $(sfield $s host_read_commands), write cmds $(sfield $s host_write_commands), units read $(sfield $s data_units_read), written $(sfield $s data_units_written), power cycles $(sfield $s power_cycles), unsafe $(sfield $s unsafe_shutdowns)"
done
step "disconnect at the end" disconnect
step "stop nvmfd" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
