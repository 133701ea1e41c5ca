#!/bin/bash
# Reference for rdma-basic: the kernel's nvmet over NVMe/RDMA on soft-RoCE (rdma_rxe on a dummy
# netdev with a guest-private address; qemu has no NIC, so nothing leaves the guest), driven by
# the stock host: discover, connect with two I/O queues, fio verify, disconnect.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"

NQN=nqn.2026-12.dev.nvmfd:reference
ADDR=10.99.0.1
PORT=4420
REF=$E2E_OUT/reference-rdma
mkdir -p "$REF"

on_cleanup nvmet_teardown
on_cleanup disconnect_all

step "load host modules" load_host_modules rdma
step "soft-RoCE rxe0 on dummy0 ($ADDR)" rxe_setup "$ADDR/24"
step "backing file" truncate -s 256M /var/tmp/ref0.img
step "nvmet subsystem" nvmet_subsys "$NQN"
step "nvmet namespace" nvmet_ns "$NQN" 1 /var/tmp/ref0.img
step "nvmet rdma port" nvmet_port 1 rdma "$ADDR" "$PORT"
step "nvmet export" nvmet_link 1 "$NQN"
step "rdma_cm listener" wait_rdma_listen "$ADDR" "$PORT"
discover() {
	to_file "$REF/discover.json" nvme discover -t rdma -a "$ADDR" -s "$PORT" -o json &&
		check_discovery "$REF/discover.json" "$NQN" rdma "$ADDR" "$PORT"
}
. "$E2E_DIR/lib/checks.sh"
step "discover (rdma)" discover
step "connect (rdma, 2 I/O queues)" nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
DEV=
find_dev() { DEV=$(wait_ns "$NQN" 1) && echo "namespace 1 is $DEV"; }
step "namespace device" find_dev
CTRL=/dev/$(ctrl_of "$NQN" rdma)
step "id-ctrl json" to_file "$REF/id-ctrl.json" nvme id-ctrl "$CTRL" -o json
step "fio write+verify" fio_verify "$DEV" 64M
step "fio re-verify" fio_reverify "$DEV" 64M
step "disconnect" nvme disconnect -n "$NQN"
finish
