#!/bin/bash
# nvmfd with a TCP port (127.0.0.1:4420) and an RDMA port (soft-RoCE, 10.99.0.1:4420, inside the
# guest): a discovery over either transport lists the subsystem on both ports; then a TCP host and
# an RDMA host, connected at once, each read back what the other wrote.
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

# Two hosts on one namespace at once, one over each transport (distinct host NQNs and IDs, so
# nvmfd sees two hosts and two controllers): each reads what the other wrote. I/O goes
# through each controller's own path (io-passthru on /dev/nvmeX with nsid 1), not the
# multipath head that would merge the two into one device.
HOST_TCP=nqn.2014-08.org.nvmexpress:uuid:6e766d66-0000-4000-8000-000000000001
HOST_RDMA=nqn.2014-08.org.nvmexpress:uuid:6e766d66-0000-4000-8000-000000000002
step "host 1 connects over tcp" nvme connect -t tcp -a "$TCP_ADDR" -s "$PORT" -n "$NQN" -i 1 \
	--hostnqn="$HOST_TCP" --hostid=6e766d66-0000-4000-8000-000000000001
step "host 2 connects over rdma" nvme connect -t rdma -a "$RDMA_ADDR" -s "$PORT" -n "$NQN" -i 1 \
	--hostnqn="$HOST_RDMA" --hostid=6e766d66-0000-4000-8000-000000000002
two_hosts() {
	local n
	n=$("$E2E_NVMFD_BIN" ctl -s /run/nvmfd/control.sock controllers "$NQN" | tee "$R/controllers.txt" |
		grep -c "$HOST_TCP\|$HOST_RDMA")
	cat "$R/controllers.txt"
	expect_num "controllers of the two hosts" "$n" -eq 2
}
step "nvmfd sees two hosts" two_hosts
# xfer FROM_TRANSPORT TO_TRANSPORT SLBA: 128 KiB of random data written through one host's
# controller, read back through the other's and compared.
xfer() {
	local from to
	from=/dev/$(ctrl_of "$NQN" "$1") && to=/dev/$(ctrl_of "$NQN" "$2") || return 1
	echo "$1 -> $2"
	passthru_128k "$from" "$to" "$3" "$R/xfer-$1-$3"
}
step "tcp host writes, rdma host reads it" xfer tcp rdma 2048
step "rdma host writes, tcp host reads it" xfer rdma tcp 4096
step "disconnect both hosts" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
