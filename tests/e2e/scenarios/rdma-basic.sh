#!/bin/bash
# e2e-timeout: 450 (fio on every namespace under TCG on a loaded 2-core host)
# nvmfd over NVMe/RDMA on soft-RoCE inside the guest (see reference-nvmet-rdma for the same run
# against the kernel target): discover, connect with two I/O queues, identify, fio verify on a
# RAM and a file namespace, disconnect, clean shutdown, no ERROR in nvmfd's log.
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
DEV=()
find_namespaces() {
	local n d
	for n in 1 2; do
		d=$(wait_ns "$NQN" "$n") || return 1
		DEV[n]=$d
		echo "nsid $n: $d"
	done
}
step "namespaces 1-2 appear" find_namespaces
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
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
