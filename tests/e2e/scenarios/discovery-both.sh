#!/bin/bash
# nvmfd with a TCP port (127.0.0.1:4420) and an RDMA port (soft-RoCE, 10.99.0.1:4420, inside the
# guest): a discovery over either transport lists the subsystem on both ports.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/discovery-both.toml
NQN=nqn.2026-12.dev.nvmfd:e2e-both
TCP_ADDR=127.0.0.1
RDMA_ADDR=10.99.0.1
PORT=4420
R=$E2E_OUT/discovery-both
mkdir -p "$R"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp rdma
step "soft-RoCE rxe0 on dummy0 ($RDMA_ADDR)" rxe_setup "$RDMA_ADDR/24"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT" "rdma:$RDMA_ADDR:$PORT"
both_entries() { # JSON
	local bad=0
	check_discovery "$1" "$NQN" tcp "$TCP_ADDR" "$PORT" || bad=1
	jq --arg n "$NQN" '.records |= map(select(.trtype == "rdma"))' "$1" >"$1.rdma"
	check_discovery "$1.rdma" "$NQN" rdma "$RDMA_ADDR" "$PORT" || bad=1
	return $bad
}
over_tcp() {
	to_file "$R/discover-tcp.json" nvme discover -t tcp -a "$TCP_ADDR" -s "$PORT" -o json &&
		both_entries "$R/discover-tcp.json"
}
over_rdma() {
	to_file "$R/discover-rdma.json" nvme discover -t rdma -a "$RDMA_ADDR" -s "$PORT" -o json &&
		both_entries "$R/discover-rdma.json"
}
step "discover over tcp lists both ports" over_tcp
step "discover over rdma lists both ports" over_rdma
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
