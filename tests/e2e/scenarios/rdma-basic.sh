#!/bin/bash
# e2e-timeout: 600 (fio on every namespace, twice nvmfd, under TCG on a loaded 2-core host)
# nvmfd over NVMe/RDMA on soft-RoCE inside the guest (see reference-nvmet-rdma for the same run
# against the kernel target): discover, connect with two I/O queues (admin and I/O queues spread
# over both reactors of the two-reactor nvmfd), identify, fio verify on a
# RAM and a file namespace, disconnect, reconnect and re-verify, clean shutdown, no ERROR in
# nvmfd's log.
# Then again with configs/rdma-srq.toml ([rdma] shared_receive_queue + busy_poll_us): connect
# with two I/O queues through per-reactor SRQs (half the configured size each) smaller than the
# queues placed on them, fio verify, idle CPU.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/rdma-basic.toml
NQN=nqn.2026-12.dev.nvmfd:e2e-rdma
ADDR=10.99.0.1
PORT=4420
IN_CAPSULE=8192
R=$E2E_OUT/nvmfd-rdma
mkdir -p "$R"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules rdma
step "soft-RoCE rxe0 on dummy0 ($ADDR)" rxe_setup "$ADDR/24"
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "rdma:$ADDR:$PORT"
discover() {
	to_file "$R/discover.json" nvme discover -t rdma -a "$ADDR" -s "$PORT" -o json &&
		check_discovery "$R/discover.json" "$NQN" rdma "$ADDR" "$PORT"
}
step "discover (rdma)" discover
step "connect (rdma, 2 I/O queues)" nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
CTRL=
find_ctrl() { CTRL=/dev/$(ctrl_of "$NQN" rdma) && echo "controller $CTRL"; }
step "controller" find_ctrl
# The controller's three queues (admin + 2 I/O; the discovery connection before them may still
# count as load) were placed by load on the two reactors: both serve some.
spread() {
	local lines
	lines=$(grep 'accepted NVMe/RDMA connection' "$NVMFD_LOG" | tail -n 3)
	echo "$lines"
	expect_num "queues accepted on reactor 0" "$(grep -c ' reactor=0 ' <<<"$lines")" -ge 1 &&
		expect_num "queues accepted on reactor 1" "$(grep -c ' reactor=1 ' <<<"$lines")" -ge 1
}
step "admin + I/O queues on both reactors" spread
DEV=()
step "namespaces 1-2 appear" find_namespaces "$NQN" 1 2
step "id-ctrl json" to_file "$R/id-ctrl.json" nvme id-ctrl "$CTRL" -o json
step "id-ctrl fields" check_id_ctrl "$R/id-ctrl.json" "$NQN" "$IN_CAPSULE" 2
# NVMe-oF RDMA: the host needs Keyed SGL Data Block support (SGLS bit 2).
keyed_sgls() { expect_bits "sgls (keyed SGL data block)" "$(jfield "$R/id-ctrl.json" .sgls)" 0x4; }
step "id-ctrl keyed SGLs" keyed_sgls
for n in 1 2; do
	step "fio write+verify nsid $n" fio_verify "${DEV[n]}" 64M
	step "fio re-verify nsid $n" fio_reverify "${DEV[n]}" 64M
done
step "nvmfd alive after I/O" nvmfd_alive
step "I/O ran on registered buffers (file namespace, RDMA pool)" nvmfd_fixed_buffers_in_use
step "disconnect" nvme disconnect -n "$NQN"
gone() { ! ctrl_of "$NQN" rdma >/dev/null; }
step "no controller left after disconnect" gone
# Reconnect: a fresh association over new queue pairs reads back what the first one wrote.
step "reconnect (rdma, 2 I/O queues)" nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
step "namespaces 1-2 appear again" find_namespaces "$NQN" 1 2
for n in 1 2; do
	step "fio re-verify nsid $n after reconnect" fio_reverify "${DEV[n]}" 64M
done
step "disconnect again" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log

# --- shared receive queue + busy polling -------------------------------------------------
SRQ_CONFIG=$E2E_DIR/configs/rdma-srq.toml
SRQ_LOG=$R/nvmfd-srq.log
# This run's part of nvmfd.log (it is appended across restarts).
srq_log() { awk '/^=== .* start: /{n++} n==2' "$NVMFD_LOG" >"$SRQ_LOG"; }
step "config valid (srq)" "$E2E_NVMFD_BIN" check-config --config "$SRQ_CONFIG"
step "start nvmfd (srq, busy-poll)" start_nvmfd "$SRQ_CONFIG" "rdma:$ADDR:$PORT"
step "connect (srq, 2 I/O queues)" nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
find_ns1() { DEV[1]=$(wait_ns "$NQN" 1) && echo "nsid 1: ${DEV[1]}"; }
step "namespace 1 appears (srq)" find_ns1
srq_in_use() {
	srq_log
	expect_grep "SRQ created" "shared receive queue created for a device" "$SRQ_LOG" &&
		expect_grep "configured pools, half per reactor" "capsules=128 .*data_buffers=8 " "$SRQ_LOG" &&
		expect_num "connections on the SRQ (admin + 2 I/O)" \
			"$(grep -c 'accepted NVMe/RDMA connection.* srq=true' "$SRQ_LOG")" -ge 3
}
step "admin + 2 I/O queues share the SRQ" srq_in_use
step "fio write+verify nsid 1 (srq, busy-poll)" fio_verify "${DEV[1]}" 32M
step "fio re-verify nsid 1 (srq, busy-poll)" fio_reverify "${DEV[1]}" 32M
# Busy polling must stop after busy_poll_us without work: connected but idle costs ~0 CPU.
idle_cpu() {
	local a b ticks
	a=$(awk '{print $14 + $15}' "/proc/$NVMFD_PID/stat")
	sleep 5
	b=$(awk '{print $14 + $15}' "/proc/$NVMFD_PID/stat")
	ticks=$((b - a))
	echo "nvmfd used $ticks CPU ticks (1/$(getconf CLK_TCK) s) in 5 s connected and idle"
	expect_num "idle CPU ticks in 5 s (one spinning core: ~500)" "$ticks" -le 50
}
step "idle with busy-poll costs no CPU" idle_cpu
step "nvmfd alive after I/O (srq)" nvmfd_alive
step "disconnect (srq)" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM, srq)" stop_nvmfd
busy_polled() {
	srq_log
	grep 'polling after work' "$SRQ_LOG"
	expect_num "completions handled by busy polling" \
		"$(grep 'polling after work' "$SRQ_LOG" | sed -n 's/.*polled_completions=\([0-9]*\).*/\1/p' |
			awk '{s += $1} END {print s + 0}')" -gt 0
}
step "busy polling handled completions" busy_polled
step "nvmfd log has no ERROR (srq)" check_nvmfd_log
finish
