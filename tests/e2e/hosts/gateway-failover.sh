#!/bin/bash
# Host side of the gateway-failover scenario (run.sh calls it before the guest boots and after it
# ends):  gateway-failover.sh start|stop OUTDIR
#
# start: a single-node Ceph cluster on loopback (scripts/ceph-test-cluster.sh) with three RBD
# images, and three nvmfd gateways of one gateway group on 127.0.0.1:29420/29421/29422 (a, b, c;
# ANA groups 1, 2, 3, one image each), each under a supervisor loop that restarts it 2 s after
# it exits (as systemd's Restart=on-failure would). Gateway c runs as uid 60123 so that it alone
# can be cut off from Ceph by an iptables owner rule on lo (its NVMe/TCP port stays reachable).
# Then it serves the guest's requests: the guest writes a file into OUTDIR/host-requests/, this
# side runs it and writes OUTDIR/host-replies/<same name> (first line "ok <epoch secs>").
#   kill ID | stop ID | cont ID     SIGKILL / SIGSTOP / SIGCONT the gateway's nvmfd
#   down ID | up ID                 keep the gateway from being restarted / let it restart
#   cut c | uncut c                 drop / restore c's traffic to Ceph
#   gateways ID                     `nvmfd ctl gateways` of that gateway
#   blocklist                       `ceph osd blocklist ls`
# stop: stops the gateways (SIGTERM), the request loop and the cluster; removes the iptables rule;
# keeps every log in OUTDIR/host/.
#
# The gateways run NVMFD_GATEWAY_BIN (default: NVMFD_BIN), which must be built with the rbd
# feature (librados/librbd).
set -uo pipefail
cmd=$1
out=$2
repo=${E2E_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${NVMFD_GATEWAY_BIN:-${NVMFD_BIN:-$repo/target/release/nvmfd}}
state=$out/host
ids=(a b c)
ports=(29420 29421 29422)
cut_uid=60123
NQN=nqn.2026-12.dev.nvmfd:gateways

log() { echo "[gateway-failover host $(date -u +%T)] $*"; }
port_of() { case $1 in a) echo 29420 ;; b) echo 29421 ;; c) echo 29422 ;; esac; }
cut_rule() { echo "OUTPUT -o lo -m owner --uid-owner $cut_uid -p tcp ! --sport $(port_of c) -j DROP"; }

config() { # config ID CEPHCONF
	local id=$1 conf=$2 i lo hi
	case $id in a) i=0 ;; b) i=1 ;; c) i=2 ;; esac
	lo=$((1 + i * 1000))
	hi=$((lo + 999))
	cat <<EOF
[global]
reactors = 1
cntlid_min = $lo
cntlid_max = $hi
control_socket = "$state/$id.sock"
log_level = "info"

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = $(port_of "$id")

[[ana_groups]]
id = 2
[[ana_groups]]
id = 3

[[subsystems]]
nqn = "$NQN"
allow_any_host = true
EOF
	for g in 1 2 3; do
		cat <<EOF
[[subsystems.namespaces]]
nsid = $g
rbd = "rbd/gw$g"
ana_group = $g
uuid = "$g$g$g$g$g$g$g$g-0000-4000-8000-00000000000$g"
EOF
	done
	cat <<EOF

[gateway_group]
name = "e2e"
gateway = "$id"
pool = "rbd"
namespace = "nvmfd-gateways"
ceph_conf = "$conf"
lease_ms = 5000
renew_ms = 1000
failback_hold_ms = 15000
handover_drain_ms = 2000
members = [{ id = "a", prefers = [1] }, { id = "b", prefers = [2] }, { id = "c", prefers = [3] }]
EOF
}

supervise() { # supervise ID: run the gateway, restart it 2 s after it exits, until down-ID
	local id=$1 rc
	local -a run=("$bin" --config "$state/$id.toml")
	[ "$id" = c ] && run=(setpriv --reuid="$cut_uid" --regid="$cut_uid" --clear-groups "${run[@]}")
	while [ ! -e "$state/down-$id" ]; do
		"${run[@]}" >>"$state/nvmfd-$id.log" 2>&1 &
		echo $! >"$state/$id.pid"
		echo "$(date -u +%T.%N) started pid $!" >>"$state/$id.runs"
		wait $!
		rc=$?
		echo "$(date -u +%T.%N) exited $rc" >>"$state/$id.runs"
		[ -e "$state/down-$id" ] && break
		sleep 2
		while [ -e "$state/hold-$id" ] && [ ! -e "$state/down-$id" ]; do sleep 0.2; done
	done
}

owner_of() { # owner_of GROUP: the gateway that reports GROUP optimized (by its ctl)
	local id
	for id in "${ids[@]}"; do
		"$bin" ctl --socket "$state/$id.sock" --json gateways 2>/dev/null |
			jq -e --argjson g "$1" '(.result // .) | .groups[] | select(.group == $g and .state == "optimized")' >/dev/null 2>&1 &&
			echo "$id"
	done
}

serve_requests() {
	mkdir -p "$out/host-requests" "$out/host-replies"
	local f n req id arg
	while [ ! -e "$state/down-requests" ]; do
		for f in "$out"/host-requests/*; do
			[ -f "$f" ] || continue
			n=$(basename "$f")
			[ -e "$out/host-replies/$n" ] && continue
			read -r req arg <"$f"
			id=$arg
			log "request $n: $req $arg"
			{
				echo "ok $(date +%s.%N)"
				case $req in
				kill) kill -KILL "$(cat "$state/$id.pid")" ;;
				down) touch "$state/hold-$id" ;;
				up) rm -f "$state/hold-$id" ;;
				stop) kill -STOP "$(cat "$state/$id.pid")" ;;
				cont) kill -CONT "$(cat "$state/$id.pid")" ;;
				cut) iptables -I $(cut_rule) && iptables -S OUTPUT ;;
				uncut) iptables -D $(cut_rule) && iptables -S OUTPUT ;;
				gateways) "$bin" ctl --socket "$state/$id.sock" gateways ;;
				blocklist) ceph -c "$(cat "$state/ceph-dir")/ceph.conf" osd blocklist ls 2>&1 ;;
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
	command -v iptables >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null
	command -v jq >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends jq >/dev/null
	# Short path: the cluster's admin sockets must fit in sun_path.
	local cluster=/tmp/nvmfd-e2e-gateways.$$
	echo "$cluster" >"$state/ceph-dir"
	"$repo/scripts/ceph-test-cluster.sh" start "$cluster" || return 1
	local conf=$cluster/ceph.conf g id i
	for g in 1 2 3; do
		# No exclusive-lock: ANA gives each image one writer and the group's blocklist fences
		# the old one (docs/gateway-groups.md).
		rbd -c "$conf" create "rbd/gw$g" --size 256M --image-feature layering || return 1
	done
	# Gateway c's own copy of the client settings, readable by its uid.
	mkdir -p "$state/ceph-c"
	sed -e "s#^\(\s*keyring\s*=\s*\).*#\1$state/ceph-c/keyring#" \
		-e "s#^log_file = .*#log_file = $state/ceph-c/\$name.log#" \
		-e "s#^admin_socket = .*#admin_socket = $state/ceph-c/\$name.\$pid.asok#" \
		-e "s#^run_dir = .*#run_dir = $state/ceph-c#" "$conf" >"$state/ceph-c/ceph.conf"
	cp "$(sed -n 's/^\s*keyring\s*=\s*//p' "$conf" | head -n1)" "$state/ceph-c/keyring"
	chown -R "$cut_uid:$cut_uid" "$state/ceph-c"
	for id in "${ids[@]}"; do
		if [ "$id" = c ]; then config c "$state/ceph-c/ceph.conf"; else config "$id" "$conf"; fi >"$state/$id.toml"
		"$bin" check-config --config "$state/$id.toml" || return 1
	done
	chmod 0777 "$state"
	for id in "${ids[@]}"; do
		supervise "$id" &
		echo $! >"$state/$id.supervisor"
	done
	# Up when each group is owned by its preferred gateway.
	for ((i = 0; i < 300; i++)); do
		[ "$(owner_of 1)" = a ] && [ "$(owner_of 2)" = b ] && [ "$(owner_of 3)" = c ] && break
		sleep 0.2
	done
	for id in "${ids[@]}"; do "$bin" ctl --socket "$state/$id.sock" gateways; done
	[ "$(owner_of 1)" = a ] && [ "$(owner_of 2)" = b ] && [ "$(owner_of 3)" = c ] || {
		log "groups not owned by their preferred gateways after 60 s"
		tail -n 20 "$state"/nvmfd-*.log
		return 1
	}
	serve_requests >"$state/requests.log" 2>&1 &
	echo $! >"$state/requests.pid"
	log "gateways up; requests served from $out/host-requests"
	touch "$out/host-ready"
}

stop() {
	local id pid
	touch "$state/down-requests"
	for id in "${ids[@]}"; do
		touch "$state/down-$id"
		pid=$(cat "$state/$id.pid" 2>/dev/null) || continue
		kill -CONT "$pid" 2>/dev/null
		kill -TERM "$pid" 2>/dev/null
	done
	while iptables -D $(cut_rule) 2>/dev/null; do :; done
	for id in "${ids[@]}"; do
		pid=$(cat "$state/$id.supervisor" 2>/dev/null) || continue
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$(cat "$state/$id.pid" 2>/dev/null)" 2>/dev/null
	done
	pid=$(cat "$state/requests.pid" 2>/dev/null) && kill "$pid" 2>/dev/null
	local cluster
	cluster=$(cat "$state/ceph-dir" 2>/dev/null) || cluster=
	if [ -n "$cluster" ] && [ -f "$cluster/ceph.conf" ]; then
		ceph -c "$cluster/ceph.conf" osd blocklist ls >"$state/blocklist-final.txt" 2>&1
		"$repo/scripts/ceph-test-cluster.sh" stop "$cluster"
	fi
	# The cluster's folder is removed by the script; the gateways' logs stay in $state.
	log "stopped"
}

case $cmd in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop OUTDIR" >&2; exit 2 ;;
esac
