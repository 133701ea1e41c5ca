#!/bin/bash
# e2e-timeout: 600 (debug or release nvmfd-perf and nvmfd under TCG on a loaded 2-core host)
# nvmfd-perf --transport rdma (the host-side NVMe/RDMA initiator: rdma_cm with the NVMe/RDMA
# private data, Fabrics Connect on the admin and I/O queues, keyed SGL data blocks in
# registered memory) against nvmfd on soft-RoCE inside the guest: 4 KiB randread, randwrite
# in-capsule and randwrite by keyed SGL (the target fetches the data with RDMA READ), 16 KiB
# randrw, and randread on two busy-polling worker threads, 3 s each on 2 I/O queues; every
# I/O completes without error. Then sequential writes by each
# path on their own namespace, read back through the kernel's nvme-rdma host: the blocks hold
# nvmfd-perf's payload. nvmfd's log has no ERROR. Under TCG the figures are not performance.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/perf-rdma.toml
NQN=nqn.2026-12.dev.nvmfd:e2e-perf-rdma
ADDR=10.99.0.1
PORT=4420
PERF=${E2E_NVMFD_BIN%/*}/nvmfd-perf
R=$E2E_OUT/perf-rdma
mkdir -p "$R"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

have_perf() { [ -x "$PERF" ] && "$PERF" --version; }
step "nvmfd-perf in the guest" have_perf
step "load host modules" load_host_modules rdma
step "soft-RoCE rxe0 on dummy0 ($ADDR)" rxe_setup "$ADDR/24"
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "rdma:$ADDR:$PORT"

# perf_run NAME KIND ARGS…: a 3 s run on 2 I/O queues, QD 8, JSON kept as NAME.json; KIND
# reads or writes: every I/O was one; rw: both kinds ran. nvmfd-perf itself exits non-zero
# when an I/O completed with an error status.
perf_run() {
	local name=$1 kind=$2 mode
	shift 2
	to_file "$R/$name.json" "$PERF" --transport rdma --addr "$ADDR:$PORT" --nqn "$NQN" \
		--queues 2 --qd 8 --time 3 --json "$@" || return 1
	mode=$(jq -r '.run.mode' "$R/$name.json")
	expect_eq "mode" "$mode" nvme-rdma || return 1
	declare -A res
	eval "$(jq -r '.result | "res[ios]=\(.ios) res[reads]=\(.reads) res[writes]=\(.writes) res[errors]=\(.errors) res[iops]=\(.iops | floor)"' "$R/$name.json")"
	info "$name: ${res[ios]} I/Os, ${res[iops]} IOPS under TCG (not a performance figure)"
	expect_num "$name I/Os" "${res[ios]}" -gt 0 &&
		expect_num "$name errors" "${res[errors]}" -eq 0 || return 1
	case $kind in
	reads | writes) expect_num "$name $kind" "${res[$kind]}" -eq "${res[ios]}" ;;
	rw) expect_num "$name reads" "${res[reads]}" -gt 0 && expect_num "$name writes" "${res[writes]}" -gt 0 ;;
	esac
}
step "4K randread (RDMA WRITE by the target)" perf_run randread reads -w randread --bs 4k
step "4K randwrite in-capsule" perf_run randwrite-incapsule writes -w randwrite --bs 4k
step "4K randwrite keyed (RDMA READ by the target)" perf_run randwrite-keyed writes \
	-w randwrite --bs 4k --in-capsule 0
step "16K randrw 50 % (keyed both ways)" perf_run randrw-16k rw -w randrw -M 50 --bs 16k
step "4K randread, 2 threads polling their CQs (--busy-poll)" perf_run randread-busy reads \
	-w randread --bs 4k --threads 2 --busy-poll
queues_seen() {
	expect_num "NVMe/RDMA connections accepted (admin + 2 I/O per run)" \
		"$(grep -c 'accepted NVMe/RDMA connection' "$NVMFD_LOG")" -ge 15
}
step "nvmfd accepted every queue" queues_seen
step "nvmfd alive after the runs" nvmfd_alive

# Data path check: 64 sequential 4 KiB writes from LBA 0, keyed on nsid 1 and in-capsule on
# nsid 2, then the kernel host reads 256 KiB of each back: every 4 KiB is nvmfd-perf's payload
# (run::payload: xorshift32 from 0x9e3779b9, low byte of each step).
seq_write() { # NSID ARGS…
	local nsid=$1
	shift
	"$PERF" --transport rdma --addr "$ADDR:$PORT" --nqn "$NQN" --nsid "$nsid" \
		-w write --bs 4k --qd 4 --queues 1 --ios 64 "$@"
}
step "64 sequential keyed writes to nsid 1" seq_write 1 --in-capsule 0
step "64 sequential in-capsule writes to nsid 2" seq_write 2
step "kernel host connects (nvme-rdma)" nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN"
DEV=()
step "namespaces 1-2 appear" find_namespaces "$NQN" 1 2
read_back() { # NSID
	dd if="${DEV[$1]}" of="$R/ns$1.bin" bs=4096 count=64 iflag=direct status=none || return 1
	python3 - "$R/ns$1.bin" <<'PY'
import sys
x, chunk = 0x9E3779B9, bytearray()
for _ in range(4096):
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    chunk.append(x & 0xFF)
data = open(sys.argv[1], "rb").read()
bad = [i for i in range(64) if data[i * 4096:(i + 1) * 4096] != chunk]
print(f"{64 - len(bad)} of 64 blocks of 4 KiB hold the payload" + (f"; differ: {bad[:8]}" if bad else ""))
sys.exit(1 if bad or len(data) != 64 * 4096 else 0)
PY
}
step "nsid 1 reads back the keyed writes" read_back 1
step "nsid 2 reads back the in-capsule writes" read_back 2
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
