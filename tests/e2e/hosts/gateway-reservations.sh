#!/bin/bash
# Host side of the gateway-reservations scenario (run.sh calls it before the guest boots and
# after it ends):  gateway-reservations.sh start|stop OUTDIR
#
# start: a single-node Ceph cluster on loopback (scripts/ceph-test-cluster.sh) with one RBD
# image, and two nvmfd gateways of one gateway group on 127.0.0.1:44430 (g1) and 44431 (g2)
# exporting it as namespace 1 of one subsystem. Both report the namespace's ANA group as
# accessible (standby state non-optimized), so that each host's commands reach the gateway it
# is connected to. Then it serves the guest's requests: the guest writes a file into
# OUTDIR/host-requests/, this side runs it and writes OUTDIR/host-replies/<same name> (first
# line "ok <epoch secs>"):
#   restart-all     SIGKILL both gateways, then start both again (listening)
#   objects         `rados listomapvals` of the group's reservation object
# stop: stops the gateways (SIGTERM), the request loop and the cluster; keeps every log in
# OUTDIR/host/.
#
# The gateways run NVMFD_GATEWAY_BIN (default: NVMFD_BIN), built with the rbd feature.
set -uo pipefail
cmd=$1
out=$2
repo=${E2E_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${NVMFD_GATEWAY_BIN:-${NVMFD_BIN:-$repo/target/release/nvmfd}}
state=$out/host
ids=(g1 g2)
NQN=nqn.2026-12.dev.nvmfd:group-resv

log() { echo "[gateway-reservations host $(date -u +%T)] $*"; }
port_of() { case $1 in g1) echo 44430 ;; g2) echo 44431 ;; esac; }

config() { # config ID CEPHCONF
	local id=$1 conf=$2 lo
	case $id in g1) lo=1 ;; g2) lo=1001 ;; esac
	cat <<EOC
[global]
reactors = 1
cntlid_min = $lo
cntlid_max = $((lo + 999))
control_socket = "$state/$id.sock"
log_level = "info"

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = $(port_of "$id")

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
rbd = "rbd/resv"
uuid = "5e5e5e5e-0000-4000-8000-000000000001"

[gateway_group]
name = "e2e-resv"
gateway = "$id"
pool = "rbd"
ceph_conf = "$conf"
lease_ms = 5000
renew_ms = 1000
standby_state = "non-optimized"
members = [{ id = "g1", prefers = [1] }, { id = "g2" }]
EOC
}

start_gateway() { # start_gateway ID: run it, wait until it listens
	local id=$1 i
	"$bin" --config "$state/$id.toml" >>"$state/nvmfd-$id.log" 2>&1 &
	echo $! >"$state/$id.pid"
	for ((i = 0; i < 300; i++)); do
		(exec 3<>"/dev/tcp/127.0.0.1/$(port_of "$id")") 2>/dev/null && return 0
		kill -0 "$(cat "$state/$id.pid")" 2>/dev/null || { log "$id exited"; tail -n 20 "$state/nvmfd-$id.log"; return 1; }
		sleep 0.2
	done
	log "$id not listening after 60 s"
	return 1
}

restart_all() {
	local id
	for id in "${ids[@]}"; do kill -KILL "$(cat "$state/$id.pid")"; done
	for id in "${ids[@]}"; do
		while kill -0 "$(cat "$state/$id.pid")" 2>/dev/null; do sleep 0.1; done
	done
	echo "both gateways killed (SIGKILL)"
	for id in "${ids[@]}"; do start_gateway "$id" || return 1; done
	echo "both gateways listening again"
}

serve_requests() {
	mkdir -p "$out/host-requests" "$out/host-replies"
	local f n req conf
	conf=$(cat "$state/ceph-dir")/ceph.conf
	while [ ! -e "$state/down-requests" ]; do
		for f in "$out"/host-requests/*; do
			[ -f "$f" ] || continue
			n=$(basename "$f")
			[ -e "$out/host-replies/$n" ] && continue
			read -r req <"$f"
			log "request $n: $req"
			{
				echo "ok $(date +%s.%N)"
				case $req in
				restart-all) restart_all ;;
				objects)
					local o
					for o in $(rados -c "$conf" -p rbd ls | grep '^e2e-resv\.reservations\.'); do
						echo "$o:"
						rados -c "$conf" -p rbd listomapvals "$o"
					done
					;;
				*) echo "unknown request $req" ;;
				esac
			} >"$out/host-replies/$n.tmp" 2>&1
			mv "$out/host-replies/$n.tmp" "$out/host-replies/$n"
		done
		sleep 0.1
	done
}

start() {
	mkdir -p "$state"
	rm -f "$state"/down-*
	# Short path: the cluster's admin sockets must fit in sun_path.
	local cluster=/tmp/nvmfd-e2e-resv.$$ id
	echo "$cluster" >"$state/ceph-dir"
	"$repo/scripts/ceph-test-cluster.sh" start "$cluster" || return 1
	local conf=$cluster/ceph.conf
	rbd -c "$conf" create rbd/resv --size 64M --image-feature layering || return 1
	for id in "${ids[@]}"; do
		config "$id" "$conf" >"$state/$id.toml"
		"$bin" check-config --config "$state/$id.toml" || return 1
	done
	chmod 0777 "$state"
	for id in "${ids[@]}"; do start_gateway "$id" || return 1; done
	serve_requests >"$state/requests.log" 2>&1 &
	echo $! >"$state/requests.pid"
	log "gateways up; requests served from $out/host-requests"
	touch "$out/host-ready"
}

stop() {
	local id pid
	touch "$state/down-requests"
	for id in "${ids[@]}"; do
		pid=$(cat "$state/$id.pid" 2>/dev/null) || continue
		kill -TERM "$pid" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$pid" 2>/dev/null
	done
	pid=$(cat "$state/requests.pid" 2>/dev/null) && kill "$pid" 2>/dev/null
	local cluster
	cluster=$(cat "$state/ceph-dir" 2>/dev/null) || cluster=
	if [ -n "$cluster" ] && [ -f "$cluster/ceph.conf" ]; then
		"$repo/scripts/ceph-test-cluster.sh" stop "$cluster"
	fi
	log "stopped"
}

case $cmd in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop OUTDIR" >&2; exit 2 ;;
esac
