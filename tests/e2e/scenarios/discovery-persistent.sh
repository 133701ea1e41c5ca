#!/bin/bash
# TP 8013 discovery and live RDMA ports with the Linux 6.1 host. nvmfd starts with a unique
# discovery NQN, GENCTR kept in state_dir and one TCP port: `nvme discover` lists the current
# discovery subsystem entry; `nvme discover --persistent --keep-alive-tmo=5` keeps a discovery
# controller that reports the unique NQN and stays live past KATO. SIGHUP reloads then add a
# subsystem (the persistent discovery controller gets the Discovery Log Page Change AEN,
# 0x70f002, seen by the host's nvme_async_event tracepoint; GENCTR grows), add an RDMA port on
# soft-RoCE (an nvme-rdma host connects through it) and remove it again (nothing listens there
# any more, a new connect is refused, the connected host keeps working). After a restart GENCTR
# is not lower.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

BASE=$E2E_DIR/configs/discovery-persistent.toml
R=$E2E_OUT/discovery-persistent
mkdir -p "$R"
CONFIG=$R/nvmfd.toml # the copy the reloads edit
DISC_NQN=nqn.2026-12.dev.nvmfd:e2e-discovery
NQN_A=nqn.2026-12.dev.nvmfd:e2e-a
NQN_B=nqn.2026-12.dev.nvmfd:e2e-b
STATE=/var/lib/nvmfd-e2e
TCP_ADDR=127.0.0.1
RDMA_ADDR=10.99.0.1
PORT=4420
TRACE=/sys/kernel/tracing

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp rdma
step "soft-RoCE rxe0 on dummy0 ($RDMA_ADDR)" rxe_setup "$RDMA_ADDR/24"
start() { cp "$BASE" "$CONFIG" && start_nvmfd "$CONFIG" "$PORT"; }
step "start nvmfd" start

# discover FILE: the discovery log over TCP as JSON; prints GENCTR and the entries.
discover() {
	to_file "$1" nvme discover -t tcp -a "$TCP_ADDR" -s "$PORT" -o json || return 1
	jq -c '.records[] | {subtype, subnqn, trtype, traddr, trsvcid, eflags}' "$1"
	echo "genctr $(jq -r .genctr "$1")"
}
current_entry() {
	discover "$R/discover-1.json" || return 1
	local v bad=0
	jq -r --arg n "$DISC_NQN" '[.records[] | select(.subnqn == $n)][0] | select(. != null)
		| (.subtype, .trtype, .traddr, .trsvcid, (.eflags // "absent"))' \
		"$R/discover-1.json" >"$R/current-entry.txt" || return 1
	mapfile -t v <"$R/current-entry.txt"
	if [ "${#v[@]}" = 0 ]; then
		echo "MISMATCH: no entry for the discovery subsystem $DISC_NQN"
		return 1
	fi
	expect_eq "subtype" "${v[0]}" "current discovery subsystem" || bad=1
	expect_eq "trtype" "${v[1]}" tcp || bad=1
	expect_eq "traddr" "${v[2]}" "$TCP_ADDR" || bad=1
	expect_eq "trsvcid" "${v[3]}" "$PORT" || bad=1
	# nvme-cli 2.4 may not print EFLAGS; when it does, both TP 8013 flags are set.
	if [ "${v[4]}" = absent ]; then
		info "nvme-cli prints no eflags"
	else
		echo "eflags: ${v[4]}"
		[ "${v[4]}" != none ] || { echo "MISMATCH: eflags none"; bad=1; }
	fi
	check_discovery "$R/discover-1.json" "$NQN_A" tcp "$TCP_ADDR" "$PORT" || bad=1
	return $bad
}
step "discover: current discovery subsystem entry (unique NQN)" current_entry
GENCTR_1=$(jq -r .genctr "$R/discover-1.json")
info "GENCTR at start: $GENCTR_1"

# The persistent discovery controller (connected with the well-known NQN, as nvme-cli does).
DISC_CTRL=
persistent() {
	nvme discover -t tcp -a "$TCP_ADDR" -s "$PORT" --persistent --keep-alive-tmo=5 || return 1
	DISC_CTRL=$(ctrl_of "$DISC_NQN" tcp) || {
		echo "MISMATCH: no controller with subsysnqn $DISC_NQN:"
		grep . /sys/class/nvme/nvme*/subsysnqn
		return 1
	}
	echo "persistent discovery controller: $DISC_CTRL"
	grep . /sys/class/nvme/"$DISC_CTRL"/{state,cntlid,transport,subsysnqn,kato} 2>/dev/null
	nvme id-ctrl "/dev/$DISC_CTRL" -o json >"$R/id-ctrl-discovery.json" || return 1
	local bad=0
	expect_eq "Identify SUBNQN" "$(jq -r .subnqn "$R/id-ctrl-discovery.json")" "$DISC_NQN" || bad=1
	expect_eq "CNTRLTYPE" "$(jq -r .cntrltype "$R/id-ctrl-discovery.json")" 2 || bad=1
	expect_bits "OAES discovery log change (bit 31)" "$(jq -r .oaes "$R/id-ctrl-discovery.json")" 0x80000000 || bad=1
	return $bad
}
step "discover --persistent --keep-alive-tmo=5" persistent
CNTLID=$(cat "/sys/class/nvme/$DISC_CTRL/cntlid")
past_kato() {
	sleep 12
	local bad=0
	expect_eq "state after 12 s (KATO 5 s)" "$(cat "/sys/class/nvme/$DISC_CTRL/state")" live || bad=1
	expect_eq "same controller (no reconnect)" "$(cat "/sys/class/nvme/$DISC_CTRL/cntlid")" "$CNTLID" || bad=1
	if grep -n "keep alive timeout expired" "$NVMFD_LOG"; then
		echo "MISMATCH: nvmfd expired a keep-alive"
		bad=1
	fi
	# The timer nvmfd runs for this controller is the host's 5 s (not the 120 s default).
	expect_fgrep "nvmfd's KATO for the controller" \
		"subnqn=$DISC_NQN cntlid=$CNTLID kato_ms=5000" "$NVMFD_LOG" || bad=1
	return $bad
}
step "persistent discovery controller stays live past KATO" past_kato

trace_on() {
	mountpoint -q "$TRACE" || mount -t tracefs tracefs "$TRACE" || return 1
	[ -e "$TRACE/events/nvme/nvme_async_event/enable" ] || { echo "no nvme_async_event tracepoint"; return 1; }
	echo 1 >"$TRACE/events/nvme/nvme_async_event/enable" && echo >"$TRACE/trace"
}
step "host tracepoint nvme:nvme_async_event on" trace_on

# reload: SIGHUP, then wait until nvmfd logged one more "configuration reloaded".
reload() {
	local before i
	before=$(grep -c "configuration reloaded" "$NVMFD_LOG")
	kill -HUP "$NVMFD_PID" || return 1
	for ((i = 0; i < 100; i++)); do
		[ "$(grep -c "configuration reloaded" "$NVMFD_LOG")" -gt "$before" ] && {
			grep "configuration reloaded" "$NVMFD_LOG" | tail -n 1
			return 0
		}
		sleep 0.1
	done
	echo "no 'configuration reloaded' 10 s after SIGHUP:"
	tail -n 20 "$NVMFD_LOG"
	return 1
}
add_subsystem() {
	cat >>"$CONFIG" <<-TOML

		[[subsystems]]
		nqn = "$NQN_B"
		allow_any_host = true

		[[subsystems.namespaces]]
		nsid = 1
		ram_size = "64M"
	TOML
	reload
}
step "SIGHUP reload adds subsystem $NQN_B" add_subsystem
aen() {
	local i
	for ((i = 0; i < 100; i++)); do
		grep -q "$DISC_CTRL.*NVME_AEN=0x0*70f002" "$TRACE/trace" && break
		sleep 0.1
	done
	grep -v '^#' "$TRACE/trace"
	grep -q "$DISC_CTRL.*NVME_AEN=0x0*70f002" "$TRACE/trace" ||
		{ echo "MISMATCH: no Discovery Log Page Change AEN (0x70f002) on $DISC_CTRL"; return 1; }
	expect_eq "state" "$(cat "/sys/class/nvme/$DISC_CTRL/state")" live
}
step "discovery controller gets the log page change AEN" aen
genctr_grew() {
	discover "$R/discover-2.json" || return 1
	check_discovery "$R/discover-2.json" "$NQN_B" tcp "$TCP_ADDR" "$PORT" || return 1
	expect_num "GENCTR after the reload" "$(jq -r .genctr "$R/discover-2.json")" -gt "$GENCTR_1"
}
step "discover: new subsystem listed, GENCTR grew" genctr_grew
GENCTR_2=$(jq -r .genctr "$R/discover-2.json")

# RDMA port added and removed by reloads.
cp "$CONFIG" "$R/nvmfd-tcp-only.toml"
add_rdma() {
	cat >>"$CONFIG" <<-TOML

		[[ports]]
		id = 2
		transport = "rdma"
		address = "$RDMA_ADDR"
		service = $PORT
	TOML
	reload && wait_rdma_listen "$RDMA_ADDR" "$PORT" 10
}
step "SIGHUP reload adds an RDMA port" add_rdma
step "nvme-rdma host connects through the new port" nvme connect -t rdma -a "$RDMA_ADDR" -s "$PORT" -n "$NQN_B" -i 1
rdma_io() { # FILE-SUFFIX SLBA: 128 KiB written and read back through the RDMA controller
	local c
	c=/dev/$(ctrl_of "$NQN_B" rdma) || { echo "no rdma controller for $NQN_B"; return 1; }
	passthru_128k "$c" "$c" "$2" "$R/rdma-$1"
}
step "I/O over the new RDMA port" rdma_io a 0
remove_rdma() {
	cp "$R/nvmfd-tcp-only.toml" "$CONFIG" && reload || return 1
	local i
	for ((i = 0; i < 50; i++)); do
		rdma_listening "$RDMA_ADDR" "$PORT" || break
		sleep 0.1
	done
	rdma resource show cm_id
	if rdma_listening "$RDMA_ADDR" "$PORT"; then
		echo "MISMATCH: still an rdma_cm listener on $RDMA_ADDR:$PORT"
		return 1
	fi
	echo "no rdma_cm listener on $RDMA_ADDR:$PORT"
}
step "SIGHUP reload removes the RDMA port: it stops listening" remove_rdma
refused() {
	expect_refused rdma-port-removed nvme connect -t rdma -a "$RDMA_ADDR" -s "$PORT" -n "$NQN_A" -i 1
}
step "a new nvme-rdma connect is refused" refused
step "the connected RDMA host keeps working" rdma_io b 1024
step "disconnect the RDMA host" nvme disconnect -n "$NQN_B"
step "disconnect the discovery controller" nvme disconnect -d "$DISC_CTRL"

restart() {
	stop_nvmfd && start_nvmfd "$CONFIG" "$PORT" || return 1
	echo "$STATE/discovery.genctr: $(cat "$STATE/discovery.genctr")"
	discover "$R/discover-3.json" || return 1
	expect_num "GENCTR after the restart" "$(jq -r .genctr "$R/discover-3.json")" -gt "$GENCTR_2"
}
step "restart: GENCTR not lower" restart
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
