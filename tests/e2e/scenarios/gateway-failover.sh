#!/bin/bash
# e2e-timeout: 1500
# e2e-net: gateways 29420,29421,29422
# A gateway group on Ceph: three nvmfd gateways on the host (a, b, c on 29420/29421/29422; the
# host side, hosts/gateway-failover.sh, runs a single-node Ceph cluster on loopback and the
# gateways under restart loops) serve one subsystem with one RBD namespace per ANA group (1, 2,
# 3, preferred by a, b, c). The guest reaches them through qemu's restricted user network
# (10.0.2.100:PORT → host 127.0.0.1:PORT) and connects each namespace over three paths (native
# NVMe multipath). fio writes and verifies on the three namespaces throughout while, in turn:
#   1. b gets SIGKILL and stays down for 30 s: group 2 moves; restarted, b gets it back;
#   2. a gets SIGSTOP for 60 s, then SIGCONT: group 1 moves (a fenced first); continued, a finds
#      itself blocklisted, exits, restarts, and gets group 1 back;
#   3. c is cut off from Ceph (iptables owner rule on the host's lo) for 30 s: group 3 moves; on
#      reconnection c finds itself fenced, exits, restarts, fails back.
# Each pause (longest time without a completed I/O on the affected namespace) is measured from
# fio's per-I/O completion log; fio must finish without a verify error.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/host_side.sh"

NQN=nqn.2026-12.dev.nvmfd:gateways
GW=10.0.2.100
PORT_A=29420
PORT_B=29421
PORT_C=29422
LEASE_S=5
DEV=()

# ctrl_at PORT: our controller (nvmeN) connected to PORT.
ctrl_at() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
		grep -q "trsvcid=$1\(,\|$\)" "$c/address" 2>/dev/null || continue
		basename "$c"
		return 0
	done
	return 1
}
# ana_at PORT NSID: the ANA state of namespace NSID's path through that controller.
ana_at() {
	local c d
	c=$(ctrl_at "$1") || return 1
	for d in /sys/class/nvme/"$c"/nvme*c*n"$2"; do
		[ -e "$d/ana_state" ] && { cat "$d/ana_state"; return 0; }
	done
	return 1
}
# wait_ana PORT NSID STATE SECS (wall clock: sysfs walks are slow under TCG)
wait_ana() {
	local s t0=$SECONDS
	while :; do
		s=$(ana_at "$1" "$2")
		[ "$s" = "$3" ] && { echo "nsid $2 via $1: $s after $((SECONDS - t0)) s"; return 0; }
		[ $((SECONDS - t0)) -ge "$4" ] && break
		sleep 0.2
	done
	echo "nsid $2 via $1 is '$s', not '$3', after $4 s"
	return 1
}

# owner_path PORT NSID SECS: NSID is optimized through PORT's live controller and on no other
# live path (a path whose controller is reconnecting keeps its last ANA state in sysfs).
owner_path() {
	local t0=$SECONDS p c ok
	while :; do
		ok=1
		c=$(ctrl_at "$1") && [ "$(cat /sys/class/nvme/"$c"/state)" = live ] &&
			[ "$(ana_at "$1" "$2")" = optimized ] || ok=0
		for p in $PORT_A $PORT_B $PORT_C; do
			[ "$ok" = 1 ] && [ "$p" != "$1" ] || continue
			c=$(ctrl_at "$p") && [ "$(cat /sys/class/nvme/"$c"/state)" = live ] || continue
			[ "$(ana_at "$p" "$2")" = optimized ] && ok=0
		done
		[ "$ok" = 1 ] && { echo "nsid $2 optimized only via $1 after $((SECONDS - t0)) s"; return 0; }
		[ $((SECONDS - t0)) -ge "$3" ] && break
		sleep 0.2
	done
	for p in $PORT_A $PORT_B $PORT_C; do
		c=$(ctrl_at "$p")
		echo "via $p: $c $(cat /sys/class/nvme/"$c"/state 2>/dev/null) $(ana_at "$p" "$2")"
	done
	return 1
}

connect_all_paths() {
	local p
	for p in $PORT_A $PORT_B $PORT_C; do
		# Forever (-1): a killed or fenced gateway comes back and its path with it. KATO 3 s:
		# a frozen gateway's path is given up within a few seconds.
		nvme connect -t tcp -a "$GW" -s "$p" -n "$NQN" --ctrl-loss-tmo=-1 --reconnect-delay=2 \
			--keep-alive-tmo=3 || return 1
	done
	find_namespaces "$NQN" 1 2 3 || return 1
	nvme list-subsys "${DEV[1]}"
}

initial_states() {
	wait_ana $PORT_A 1 optimized 20 && wait_ana $PORT_B 2 optimized 20 && wait_ana $PORT_C 3 optimized 20 &&
		wait_ana $PORT_B 1 inaccessible 5 && wait_ana $PORT_C 1 inaccessible 5 &&
		wait_ana $PORT_A 2 inaccessible 5 && wait_ana $PORT_A 3 inaccessible 5
}

FIO_PID=
start_fio() {
	# Per-I/O completion log with Unix timestamps (ms): a pause is the longest stretch without
	# a completion on a namespace. verify_backlog reads back what was written as it goes.
	fio --output="$E2E_OUT/fio.log" --rw=randwrite --bs=4k --size=32M --direct=1 \
		--ioengine=libaio --iodepth=4 --time_based --runtime=1200 --verify=crc32c \
		--verify_backlog=16 --verify_fatal=1 --write_lat_log=/tmp/lat --log_avg_msec=0 \
		--log_unix_epoch=1 \
		--name=ns1 --filename="${DEV[1]}" --name=ns2 --filename="${DEV[2]}" \
		--name=ns3 --filename="${DEV[3]}" &
	FIO_PID=$!
	sleep 10
	kill -0 "$FIO_PID" || { cat "$E2E_OUT/fio.log"; return 1; }
	echo "fio pid $FIO_PID"
}
stop_fio() {
	kill -INT "$FIO_PID" 2>/dev/null
	wait "$FIO_PID"
	echo "fio exit status $?"
	cat "$E2E_OUT/fio.log"
	cp /tmp/lat_clat.*.log "$E2E_OUT/" 2>/dev/null
	! grep -Eq 'verify:|bad magic|mismatch|err= *[1-9]' "$E2E_OUT/fio.log" || {
		echo "fio reported an error"
		return 1
	}
	grep -q 'err= 0' "$E2E_OUT/fio.log"
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }
# window NAME JOB FROM_MS LIMIT_MS: a time window to measure once fio has written its logs
# (at its end): from FROM to now, on fio job JOB (= nsid).
window() { echo "$1 $2 $3 $(now_ms) $4" >>/tmp/windows; }
# pause JOB FROM_MS TO_MS: the longest gap (ms) between completions of fio job JOB (1-based)
# within [FROM, TO], counting the edges of the window.
pause() {
	awk -F', *' -v from="$2" -v to="$3" '
		$1 >= from && $1 <= to { t[n++] = $1 }
		END {
			prev = from; max = 0
			for (i = 0; i < n; i++) { if (t[i] - prev > max) max = t[i] - prev; prev = t[i] }
			if (to - prev > max) max = to - prev
			print max
		}' "$E2E_OUT/lat_clat.$1.log"
}
pauses() {
	local name job from to limit p rc=0
	while read -r name job from to limit; do
		p=$(pause "$job" "$from" "$to")
		echo "$name: longest I/O pause on nsid $job: $p ms (limit $limit ms, window $((to - from)) ms)" |
			tee -a "$E2E_OUT/pauses.txt"
		[ "$p" -le "$limit" ] || rc=1
	done </tmp/windows
	return $rc
}
# optimized_elsewhere NSID PORT SECS: some path other than PORT reports NSID optimized.
optimized_elsewhere() {
	local p t0=$SECONDS
	while :; do
		for p in $PORT_A $PORT_B $PORT_C; do
			[ "$p" = "$2" ] && continue
			[ "$(ana_at "$p" "$1")" = optimized ] && { echo "nsid $1 optimized via $p after $((SECONDS - t0)) s"; return 0; }
		done
		[ $((SECONDS - t0)) -ge "$3" ] && break
		sleep 0.2
	done
	echo "nsid $1 not optimized on another path after $3 s"
	return 1
}

gw_log() { cat "$E2E_OUT/host/nvmfd-$1.log"; }

on_cleanup stop_fio
on_cleanup disconnect_all

step "network to the host's gateways (restricted user net)" net_up
step "load host modules" load_host_modules tcp
step "native multipath is on" expect_eq "nvme_core multipath" "$(cat /sys/module/nvme_core/parameters/multipath)" Y
step "connect three paths (a, b, c)" connect_all_paths
info "namespaces: ${DEV[1]} ${DEV[2]} ${DEV[3]}"
step "ANA: each group optimized on its preferred gateway only" initial_states
step "fio write+verify on the three namespaces" start_fio

# 1. SIGKILL b (group 2), kept down for 30 s (longer than the lease: the others take over).
T=$(now_ms)
step "keep b down once it dies" request down b
step "SIGKILL gateway b" request kill b
step "group 2 optimized on another path" optimized_elsewhere 2 $PORT_B 30
sleep 3
window sigkill-failover 2 "$T" 10000
step "blocklist after SIGKILL" request blocklist
sleep 20
step "let b restart" request up b
T=$(now_ms)
step "b restarted, group 2 fails back to b" owner_path $PORT_B 2 90
sleep 3
window sigkill-failback 2 "$T" 10000

# 2. SIGSTOP a (group 1) for 60 s.
T=$(now_ms)
step "SIGSTOP gateway a" request stop a
step "group 1 optimized on another path" optimized_elsewhere 1 $PORT_A 30
sleep 3
window sigstop-failover 1 "$T" $(((LEASE_S + 5) * 1000))
step "gateways seen by b while a is stopped" request gateways b
step "blocklist while a is stopped" request blocklist
STOPPED=$T
LEFT=$((60 - ($(now_ms) - STOPPED) / 1000))
[ "$LEFT" -gt 0 ] && sleep "$LEFT"
step "SIGCONT gateway a (60 s after SIGSTOP)" request cont a
fenced() { # fenced ID: its log says it was fenced and how many image ops the OSDs refused
	local i
	for ((i = 0; i < 300; i++)); do
		gw_log "$1" | grep -q 'fenced; image operations the OSDs refused since' && break
		sleep 0.1
	done
	gw_log "$1" | grep -E 'blocklisted|refused|lease not renewed|fencing' | tail -n 8
	gw_log "$1" | grep -q 'fenced; image operations the OSDs refused since'
}
step "continued a finds itself fenced and exits" fenced a
T=$(now_ms)
step "a restarted, group 1 fails back to a" owner_path $PORT_A 1 120
sleep 3
window sigstop-failback 1 "$T" 10000

# 3. Cut c (group 3) off from Ceph for 30 s.
T=$(now_ms)
step "cut gateway c off from Ceph" request cut c
step "group 3 optimized on another path" optimized_elsewhere 3 $PORT_C 40
sleep 3
window cutoff-failover 3 "$T" $(((LEASE_S + 5) * 1000))
step "gateways seen by a while c is cut off" request gateways a
CUT=$T
LEFT=$((30 - ($(now_ms) - CUT) / 1000))
[ "$LEFT" -gt 0 ] && sleep "$LEFT"
step "reconnect gateway c to Ceph (after 30 s)" request uncut c
step "reconnected c finds itself fenced and exits" fenced c
T=$(now_ms)
step "c restarted, group 3 fails back to c" owner_path $PORT_C 3 120
sleep 3
window cutoff-failback 3 "$T" 10000
sleep 5
step "final states" initial_states
step "fio finished without a verify error" stop_fio
step "blocklist at the end" request blocklist
step "I/O pauses within their limits" pauses
while read -r l; do info "$l"; done <"$E2E_OUT/pauses.txt"
finish
