#!/bin/bash
# e2e-timeout: 900 (fio's verify job and 30 s of random reads under TCG on a loaded host)
# The README's walkthrough, as written: nvmfd started as scripts/quickstart.sh starts it (no
# arguments, no /etc/nvmfd/nvmfd.toml: the embedded default), then the host-side blocks of
# "Connect from a Linux host" taken from README.md itself (each follows a
# `<!-- walkthrough: NAME -->` line): modprobe, nvme discover, nvme connect + nvme list, the fio
# job file run with the README's command, nvme disconnect, nvme connect-all; then Ctrl-C (SIGINT)
# as "Stop" says. Also two troubleshooting rows: a connect with nothing listening fails with
# "failed to connect socket: -111" in the host's kernel log; one naming an unknown subsystem with
# "Connect Invalid Data Parameter" (ret=16770) and nvmfd's "Connect rejected: unknown subsystem". run.sh ships README.md next to the
# binary (/opt/nvmfd/README.md), so an edit of the README is what this scenario runs.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

README=/opt/nvmfd/README.md
NQN=nqn.2026-12.dev.nvmfd:ram0
W=/tmp/walkthrough
mkdir -p "$W"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

# block NAME: the fenced block that follows `<!-- walkthrough: NAME -->` in the README.
block() {
	awk -v marker="<!-- walkthrough: $1 -->" '
		$0 == marker { armed = 1; next }
		armed && /^```/ { if (inside) exit; inside = 1; next }
		inside { print }
	' "$README"
}

BLOCKS=(modules discover connect connect-all fio-job fio-run disconnect)
extract() {
	local b
	for b in "${BLOCKS[@]}"; do
		block "$b" >"$W/$b.txt"
		echo "--- $b"
		cat "$W/$b.txt"
		[ -s "$W/$b.txt" ] || { echo "MISMATCH: no '$b' block in $README"; return 1; }
	done
	cp "$W/fio-job.txt" "$W/nvmfd.fio"
}
step "README blocks" extract

# run_block NAME: the block's commands as the reader would type them, from $W (where the job
# file was saved), stopping at the first failing command.
run_block() { (cd "$W" && bash -ex "$W/$1.txt"); }

step "no /etc/nvmfd/nvmfd.toml (quick start serves the embedded default)" test ! -e /etc/nvmfd/nvmfd.toml
step "modprobe (README)" run_block modules

refused_before_start() {
	dmesg -C
	if run_block connect; then
		echo "MISMATCH: connect succeeded with nothing listening"
		return 1
	fi
	dmesg | tee "$W/refused-dmesg.txt"
	grep -q 'failed to connect socket: -111' "$W/refused-dmesg.txt" ||
		{ echo "MISMATCH: no 'failed to connect socket: -111' in the host's kernel log"; return 1; }
}
step "connect with nothing listening: -111 (troubleshooting)" refused_before_start

# As scripts/quickstart.sh ends: `exec target/release/nvmfd "$@"` with no arguments.
start_quickstart() {
	echo "=== $(date -u +%T) start: $E2E_NVMFD_BIN (no arguments)" >>"$NVMFD_LOG"
	setsid "$E2E_NVMFD_BIN" >>"$NVMFD_LOG" 2>&1 </dev/null &
	NVMFD_PID=$!
	wait_tcp_listen 4420 20 || { tail -n 30 "$NVMFD_LOG"; return 1; }
	grep -F 'config=<embedded default>' "$NVMFD_LOG" ||
		{ echo "MISMATCH: nvmfd did not start on its embedded default"; return 1; }
}
step "start nvmfd as the quick start does" start_quickstart

discover() {
	run_block discover | tee "$W/discover.out" || return 1
	grep -q "$NQN" "$W/discover.out" || { echo "MISMATCH: $NQN not in the discovery log"; return 1; }
}
step "nvme discover (README)" discover

DEV=
connect() {
	run_block connect | tee "$W/connect.out" || return 1
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "namespace: $DEV"
	# "nvme list shows a new /dev/nvmeXnY … (model nvmfd); … the first is /dev/nvme0n1"
	grep -F "$DEV" "$W/connect.out" | grep -q nvmfd ||
		{ echo "MISMATCH: nvme list does not show $DEV with model nvmfd"; return 1; }
	[ "$DEV" = /dev/nvme0n1 ] || { echo "MISMATCH: the namespace is $DEV, the README's job file says /dev/nvme0n1"; return 1; }
}
step "nvme connect + nvme list (README)" connect
step "native multipath on (README)" grep -qx Y /sys/module/nvme_core/parameters/multipath

fio_job() {
	grep -qx "filename=$DEV" "$W/nvmfd.fio" || { echo "MISMATCH: the job file does not name $DEV"; return 1; }
	run_block fio-run >"$W/fio.out" 2>&1
	local rc=$?
	cat "$W/fio.out"
	[ "$rc" = 0 ] || return 1
	# Both jobs ran and reported no error; the verify job read back what it wrote.
	local n
	n=$(grep -cE '^(verify|randread-4k): .*err= *0' "$W/fio.out")
	[ "$n" = 2 ] || { echo "MISMATCH: $n of 2 jobs report err= 0"; return 1; }
	grep -qiE 'verify: bad|verify failed' "$W/fio.out" && { echo "MISMATCH: verify errors"; return 1; }
	grep -E '^ *(read|write):' "$W/fio.out"
}
step "fio nvmfd.fio (README job file)" fio_job

gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "nvme disconnect (README)" run_block disconnect
step "controller gone" retry 20 0.25 gone

connect_all() {
	run_block connect-all || return 1
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "namespace: $DEV"
}
step "nvme connect-all (README)" connect_all
step "nvme disconnect after connect-all (README)" run_block disconnect
step "controller gone after connect-all" retry 20 0.25 gone

# Troubleshooting: a subsystem NQN the target does not have.
unknown_subsystem() {
	dmesg -C
	if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-12.dev.nvmfd:typo; then
		echo "MISMATCH: connect to an unknown subsystem succeeded"
		return 1
	fi
	dmesg | tee "$W/unknown-dmesg.txt"
	grep -F 'Connect Invalid Data Parameter, subsysnqn "nqn.2026-12.dev.nvmfd:typo"' "$W/unknown-dmesg.txt" &&
		grep -F 'ret=16770' "$W/unknown-dmesg.txt" &&
		grep -F 'Connect rejected: unknown subsystem' "$NVMFD_LOG"
}
step "connect to an unknown subsystem (troubleshooting)" unknown_subsystem

# "Stop": Ctrl-C (SIGINT) drains, closes and exits 0.
stop_ctrl_c() {
	kill -INT "$NVMFD_PID" || return 1
	local i
	for ((i = 0; i < 100; i++)); do
		kill -0 "$NVMFD_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$NVMFD_PID" 2>/dev/null; then
		echo "nvmfd still running 10 s after SIGINT"
		return 1
	fi
	wait "$NVMFD_PID"
	local rc=$?
	NVMFD_PID=
	echo "nvmfd exited with status $rc after SIGINT"
	[ "$rc" = 0 ]
}
step "Ctrl-C stops nvmfd, exit 0 (README)" stop_ctrl_c
step "nvmfd log has no ERROR" check_nvmfd_log
finish
