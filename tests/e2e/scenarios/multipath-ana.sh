#!/bin/bash
# e2e-timeout: 600
# Two gateways, one volume: two nvmfd processes (A on 4420, B on 4421) export the same file as
# the same namespace (same subsystem NQN, NGUID, UUID) with disjoint controller ID ranges. The
# host (native NVMe multipath, Debian's default) sees one /dev/nvmeXn1 with two paths; ANA says
# A is optimized and B non-optimized. fio writes and verifies through the multipath device
# while A is killed with SIGKILL (I/O fails over to B), B is promoted to optimized by a config
# reload (SIGHUP → ANA change event → the host re-reads the ANA log), A comes back, and the
# states are switched back by reloads; then B goes inaccessible and back through
# `nvmfd ctl set-ana-state`. fio must finish without a single error.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

NQN=nqn.2026-12.dev.nvmfd:multipath
ADDR=127.0.0.1
PORT_A=4420
PORT_B=4421
# The configurations are edited for the reloads, so each gateway runs from its own copy.
CFG_A=/tmp/multipath-ana-a.toml
CFG_B=/tmp/multipath-ana-b.toml
cp "$E2E_DIR/configs/multipath-ana-a.toml" "$CFG_A"
cp "$E2E_DIR/configs/multipath-ana-b.toml" "$CFG_B"
rm -f /var/tmp/nvmfd-multipath.img

# Two daemons: lib/nvmfd.sh tracks one, so switch its variables around each call.
PID_A=
PID_B=
gw() { # gw A|B: make lib/nvmfd.sh act on that gateway
	NVMFD_LOG="$E2E_OUT/nvmfd-$1.log"
	if [ "$1" = A ]; then NVMFD_PID=$PID_A; else NVMFD_PID=$PID_B; fi
}
gw_save() { if [ "$1" = A ]; then PID_A=$NVMFD_PID; else PID_B=$NVMFD_PID; fi; }
start_gw() { gw "$1" && start_nvmfd "$2" "$3"; local rc=$?; gw_save "$1"; return $rc; }
kill_gw() { gw "$1" && kill_nvmfd; local rc=$?; gw_save "$1"; return $rc; }
stop_gw() { gw "$1" && stop_nvmfd; local rc=$?; gw_save "$1"; return $rc; }
log_ok() { gw "$1" && check_nvmfd_log; }

# set_state CFG STATE: ANA group 1's state in a gateway's configuration file.
set_state() { sed -i "s/^state = .*/state = \"$2\"/" "$1" && grep -n '^state' "$1"; }
# reload_gw A|B STATE: rewrite the gateway's ANA state and SIGHUP it.
reload_gw() {
	local cfg pid log="$E2E_OUT/nvmfd-$1.log" before i
	if [ "$1" = A ]; then cfg=$CFG_A pid=$PID_A; else cfg=$CFG_B pid=$PID_B; fi
	before=$(grep -c 'configuration reloaded' "$log")
	set_state "$cfg" "$2" && kill -HUP "$pid" || return 1
	for ((i = 0; i < 100; i++)); do
		[ "$(grep -c 'configuration reloaded' "$log")" -gt "$before" ] && break
		sleep 0.1
	done
	grep -n 'reload' "$log" | tail -n 3
	[ "$(grep -c 'configuration reloaded' "$log")" -gt "$before" ]
}

# ctrl_at PORT: the host controller (nvmeN) connected to PORT for our subsystem.
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
# path_dir PORT: sysfs directory of namespace 1 through that controller (nvmeXcYn1).
path_dir() {
	local c d
	c=$(ctrl_at "$1") || return 1
	for d in /sys/class/nvme/"$c"/nvme*c*n1; do
		[ -e "$d/ana_state" ] && { echo "$d"; return 0; }
	done
	return 1
}
ana_state_at() { local d; d=$(path_dir "$1") && cat "$d/ana_state"; }
# wait_ana PORT STATE [SECS]
wait_ana() {
	local i s
	for ((i = 0; i < ${3:-30} * 10; i++)); do
		s=$(ana_state_at "$1")
		[ "$s" = "$2" ] && { echo "path via $1: $s after $((i / 10)).$((i % 10)) s"; return 0; }
		sleep 0.1
	done
	echo "path via $1 is '$s', not '$2', after ${3:-30} s"
	return 1
}
# wait_ctrl PORT STATE [SECS]
wait_ctrl() {
	local i c s
	for ((i = 0; i < ${3:-30} * 10; i++)); do
		c=$(ctrl_at "$1") && s=$(cat "/sys/class/nvme/$c/state")
		[ "$s" = "$2" ] && { echo "$c (port $1) is $s after $((i / 10)).$((i % 10)) s"; return 0; }
		sleep 0.1
	done
	echo "controller on port $1 is '$s', not '$2', after ${3:-30} s"
	return 1
}
# path_ios PORT: reads + writes completed through that path (block layer stat fields 1 and 5).
path_ios() { local d; d=$(path_dir "$1") && awk '{ print $1 + $5 }' "$d/stat"; }
# grows PORT SECS: I/O completes through that path within SECS.
grows() {
	local a b
	a=$(path_ios "$1") || return 1
	sleep "$2"
	b=$(path_ios "$1") || return 1
	echo "path via $1: $a -> $b I/Os in $2 s"
	expect_num "I/Os through port $1 in $2 s" "$((b - a))" -gt 0
}
# idle PORT SECS: no I/O through that path within SECS (a non-optimized path while an
# optimized one is live).
idle() {
	local a b
	a=$(path_ios "$1") || return 1
	sleep "$2"
	b=$(path_ios "$1") || return 1
	echo "path via $1: $a -> $b I/Os in $2 s"
	expect_num "I/Os through port $1 in $2 s" "$((b - a))" -eq 0
}

on_cleanup stop_gw B
on_cleanup stop_gw A
on_cleanup disconnect_all

multipath_on() {
	expect_eq "nvme_core multipath" "$(cat /sys/module/nvme_core/parameters/multipath)" Y
}
step "native multipath is on" multipath_on
step "load host modules" load_host_modules tcp
step "start gateway A (4420, cntlid 1-100, optimized)" start_gw A "$CFG_A" "$PORT_A"
step "start gateway B (4421, cntlid 101-200, non-optimized)" start_gw B "$CFG_B" "$PORT_B"
for p in "$PORT_A" "$PORT_B"; do
	step "connect via $p" nvme connect -t tcp -a "$ADDR" -s "$p" -n "$NQN" -i 2 \
		--ctrl-loss-tmo=120 --reconnect-delay=1
done
DEV=
# count_entries DIR REGEX: entries of a sysfs directory whose name matches.
count_entries() {
	local e n=0
	for e in "$1"/*; do
		[[ "${e##*/}" =~ $2 ]] && n=$((n + 1))
	done
	echo "$n"
}
one_namespace() {
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "namespace 1 is $DEV"
	local s c n=0
	s=$(subsys_dir "$NQN") || { echo "no nvme-subsystem for $NQN"; return 1; }
	ls "$s"
	# One subsystem holding both controllers and one head device (nvmeXn1) for nsid 1: the
	# host matched NQN, NGUID and UUID across the two gateways.
	expect_num "controllers in $(basename "$s")" "$(count_entries "$s" '^nvme[0-9]+$')" -eq 2 &&
		expect_num "head devices for nsid 1" "$(count_entries "$s" '^nvme[0-9]+n1$')" -eq 1 || return 1
	# Each controller holds one hidden path disk (nvmeXcYn1) behind the head.
	for c in $(ctrl_at "$PORT_A") $(ctrl_at "$PORT_B"); do
		ls -d /sys/class/nvme/"$c"/nvme*c*n1
		n=$((n + $(count_entries "/sys/class/nvme/$c" '^nvme[0-9]+c[0-9]+n1$')))
	done
	expect_num "path disks for nsid 1" "$n" -eq 2
}
step "one namespace, two paths" one_namespace
info "multipath device $DEV; A is $(ctrl_at $PORT_A), B is $(ctrl_at $PORT_B)"
cntlids() {
	local a b
	a=$(cat "/sys/class/nvme/$(ctrl_at $PORT_A)/cntlid") && b=$(cat "/sys/class/nvme/$(ctrl_at $PORT_B)/cntlid")
	echo "cntlid A=$a B=$b"
	expect_num "A's cntlid" "$a" -le 100 && expect_num "B's cntlid" "$b" -ge 101 &&
		expect_num "B's cntlid" "$b" -le 200
}
step "controller IDs from each gateway's range" cntlids
step "ANA: A optimized" wait_ana "$PORT_A" optimized 10
step "ANA: B non-optimized" wait_ana "$PORT_B" non-optimized 10
list_subsys() {
	to_file "$E2E_OUT/list-subsys.txt" nvme list-subsys "$DEV" || return 1
	expect_grep "A listed live and optimized" "tcp traddr=$ADDR,trsvcid=$PORT_A.* live optimized" "$E2E_OUT/list-subsys.txt" &&
		expect_grep "B listed live and non-optimized" "tcp traddr=$ADDR,trsvcid=$PORT_B.* live non-optimized" "$E2E_OUT/list-subsys.txt"
}
step "nvme list-subsys shows both paths" list_subsys
ana_log() { # ana_log PORT STATE: nvme ana-log through that controller shows group 1 in STATE
	local f="$E2E_OUT/ana-log-$1-$2.txt"
	to_file "$f" nvme ana-log "/dev/$(ctrl_at "$1")" || return 1
	expect_grep "group 1" '^grpid[[:space:]]*:[[:space:]]*1$' "$f" &&
		expect_grep "nsid 1 in it" 'nsid[[:space:]]*:[[:space:]]*1$' "$f" &&
		expect_grep "state $2" "^state[[:space:]]*:[[:space:]]*$2$" "$f"
}
step "nvme ana-log via A" ana_log "$PORT_A" optimized
step "nvme ana-log via B" ana_log "$PORT_B" non-optimized

FIO_PID=
start_fio() {
	# time_based: I/O keeps running through the failover and back; verify_backlog checks
	# what was written as it goes, verify_fatal stops at the first mismatch.
	fio --name=multipath --filename="$DEV" --size=64M --rw=randwrite --bs=16k \
		--direct=1 --ioengine=libaio --iodepth=8 --time_based --runtime=120 \
		--verify=crc32c --verify_fatal=1 --verify_backlog=64 >"$E2E_OUT/fio-multipath.log" 2>&1 &
	FIO_PID=$!
	sleep 3
	kill -0 "$FIO_PID" || { cat "$E2E_OUT/fio-multipath.log"; return 1; }
	echo "fio pid $FIO_PID running"
}
step "start background fio (verify)" start_fio
on_cleanup kill "$FIO_PID"
step "I/O goes through optimized A" grows "$PORT_A" 3
step "none through non-optimized B" idle "$PORT_B" 3

step "kill gateway A (SIGKILL)" kill_gw A
step "host notices (A connecting)" wait_ctrl "$PORT_A" connecting 20
step "I/O fails over to B" grows "$PORT_B" 5
step "promote B: reload with optimized" reload_gw B optimized
step "host follows the ANA change (B optimized)" wait_ana "$PORT_B" optimized 20

step "restart gateway A" start_gw A "$CFG_A" "$PORT_A"
step "host reconnects to A" wait_ctrl "$PORT_A" live 40
step "ANA: A optimized again" wait_ana "$PORT_A" optimized 20
step "switch back: reload B with non-optimized" reload_gw B non-optimized
step "host follows (B non-optimized)" wait_ana "$PORT_B" non-optimized 20
step "I/O back on A" grows "$PORT_A" 5
step "B idle again" idle "$PORT_B" 3

# Inaccessible through B: the host stops using the path; a raw read through that path's
# controller gets the path status (Asymmetric Access Inaccessible) from nvmfd.
# This round goes through the control CLI instead of the file (set-ana-state, live).
ctl_b() { "$E2E_NVMFD_BIN" ctl -s /run/nvmfd/control-b.sock "$@"; }
step "B inaccessible via nvmfd ctl set-ana-state" ctl_b set-ana-state 1 inaccessible
step "host follows (B inaccessible)" wait_ana "$PORT_B" inaccessible 20
raw_read_b() {
	local c out
	c=$(ctrl_at "$PORT_B") || return 1
	out=$(nvme io-passthru "/dev/$c" --opcode=0x02 --namespace-id=1 --data-len=512 \
		--read --cdw10=0 --cdw11=0 --cdw12=0 2>&1)
	echo "$out"
	echo "$out" | grep -qi 'inaccessible\|0x302\|0x2302'
}
step "raw read via B: ANA inaccessible status" raw_read_b
refused() { ! "$@"; }
step "nvmfd ctl refuses a port B does not have" refused ctl_b set-ana-state 1 optimized --port 1
step "B non-optimized via nvmfd ctl set-ana-state --port 2" ctl_b set-ana-state 1 non-optimized --port 2
step "host follows (B non-optimized, again)" wait_ana "$PORT_B" non-optimized 20

wait_fio() {
	wait "$FIO_PID"
	local rc=$?
	cat "$E2E_OUT/fio-multipath.log"
	[ "$rc" = 0 ] || { echo "fio exited $rc"; return 1; }
	expect_grep "fio reports no errors" 'err= *0' "$E2E_OUT/fio-multipath.log"
}
STEP_TIMEOUT=200 step "fio finished without an error" wait_fio
step "disconnect" nvme disconnect -n "$NQN"
step "stop gateway B (SIGTERM)" stop_gw B
step "stop gateway A (SIGTERM)" stop_gw A
step "gateway A log has no ERROR" log_ok A
step "gateway B log has no ERROR" log_ok B
finish
