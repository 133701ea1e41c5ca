#!/bin/bash
# e2e-timeout: 600 (two host identities, a SIGKILL and restart, soft-RoCE set-up under TCG)
# Reservations (NVMe Base 2.0 §8.19) with the stock Linux host: two host identities of this
# guest (distinct host NQNs and host IDs, so nvmfd sees two hosts, each with its own controller)
# on one file namespace. nvme-cli's resv-* commands go to each host's controller character
# device (/dev/nvmeX, namespace 1): with native multipath both controllers are paths of one head
# device, which would not say which host sent a command. Register from both, Write Exclusive by
# A, report from both, B's write fails with Reservation Conflict, release; Exclusive Access -
# Registrants Only by A, B preempts A, A's Reservation Notification log (80h) shows the
# preemption and A's controller got the Reservation Log Page Available event; nvmfd is killed
# with SIGKILL and restarted: the reservation (PTPL set by A's register) is still reported and
# still fences A. Then host A again over RDMA (soft-RoCE) while B stays on TCP: B registers and
# acquires over TCP, A's write over RDMA conflicts, A's report over RDMA shows B's reservation,
# B preempts A (Preempt and Abort) and A's log page arrives over RDMA.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/resv.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/reservations.toml
NQN=nqn.2026-12.dev.nvmfd:e2e-resv
TCP_ADDR=127.0.0.1
RDMA_ADDR=10.99.0.1
PORT=4420
PORT_B=4421
STATE_DIR=/var/lib/nvmfd/reservations
ID_A=6e766d66-7265-4000-8000-00000000000a
ID_B=6e766d66-7265-4000-8000-00000000000b
HOST_A=nqn.2014-08.org.nvmexpress:uuid:$ID_A
HOST_B=nqn.2014-08.org.nvmexpress:uuid:$ID_B
# The Host Identifier as nvme-cli prints it in a report: the 16 bytes in hex.
HEX_A=${ID_A//-/}
HEX_B=${ID_B//-/}
KEY_A=11
KEY_B=22
R=$E2E_OUT/reservations
mkdir -p "$R"
A=
B=

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp rdma
step "soft-RoCE rxe0 on dummy0 ($RDMA_ADDR)" rxe_setup "$RDMA_ADDR/24"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT" "$PORT_B" "rdma:$RDMA_ADDR:$PORT"

step "trace the host's asynchronous events" trace_aens

# connect_as HOSTNQN HOSTID TRANSPORT ADDR PORT: one controller of that host identity, which
# comes back by itself after nvmfd restarts (ctrl-loss-tmo 60 s, reconnect every second).
connect_as() {
	nvme connect -t "$3" -a "$4" -s "$5" -n "$NQN" -i 1 --hostnqn="$1" --hostid="$2" \
		--ctrl-loss-tmo=60 --reconnect-delay=1
}
# Host B uses the second TCP port: nvme-cli 2.4 refuses a second connect to the same address
# and subsystem as "already connected" whatever the host NQN (and --duplicate-connect does not
# lift that check).
step "host A connects over tcp" connect_as "$HOST_A" "$ID_A" tcp "$TCP_ADDR" "$PORT"
step "host B connects over tcp (second port)" connect_as "$HOST_B" "$ID_B" tcp "$TCP_ADDR" "$PORT_B"
find_ctrls() {
	A=/dev/$(ctrl_of_host "$NQN" "$HOST_A" "$1") && B=/dev/$(ctrl_of_host "$NQN" "$HOST_B" tcp) ||
		return 1
	echo "host A: $A ($1), host B: $B (tcp)"
	[ "$A" != "$B" ]
}
step "two controllers, one per host" find_ctrls tcp
info "host A is $A, host B is $B"

# report WHO DEV EXPECTED: resv-report --eds as JSON through DEV, summarized as
# "rtype=T regctl=N ptpls=P hostid:rkey:rcsts,…" (registrants in registration order).
report() {
	local f=$R/report-$1.json got
	to_file "$f" nvme resv-report "$2" -n 1 --eds -o json || return 1
	got=$(jq -r '"rtype=\(.rtype) regctl=\(.regctl) ptpls=\(.ptpls) " +
		([.regctlext[] | "\(.hostid):\(.rkey):\(.rcsts)"] | join(","))' "$f")
	expect_eq "reservation status seen by $1" "$got" "$3"
}

step "host A registers (key $KEY_A, PTPL set)" \
	nvme resv-register "$A" -n 1 --nrkey=$KEY_A --rrega=0 --cptpl=3
step "host B registers (key $KEY_B)" nvme resv-register "$B" -n 1 --nrkey=$KEY_B --rrega=0
step "host A acquires Write Exclusive" \
	nvme resv-acquire "$A" -n 1 --crkey=$KEY_A --rtype=1 --racqa=0
step "report from host A" report A "$A" "rtype=1 regctl=2 ptpls=1 $HEX_A:$KEY_A:1,$HEX_B:$KEY_B:0"
step "report from host B" report B "$B" "rtype=1 regctl=2 ptpls=1 $HEX_A:$KEY_A:1,$HEX_B:$KEY_B:0"
step "host B's write: reservation conflict" io_conflict B "$B" write
step "host B reads (Write Exclusive)" io_ok B "$B" read
step "host A writes (holder)" io_ok A "$A" write
step "host A releases" nvme resv-release "$A" -n 1 --crkey=$KEY_A --rtype=1 --rrela=0
step "host B writes after the release" io_ok B "$B" write
step "host A acquires Exclusive Access - Registrants Only" \
	nvme resv-acquire "$A" -n 1 --crkey=$KEY_A --rtype=4 --racqa=0
step "host B, a registrant, writes" io_ok B "$B" write
step "host B preempts host A" \
	nvme resv-acquire "$B" -n 1 --crkey=$KEY_B --prkey=$KEY_A --rtype=4 --racqa=1
step "host A, preempted, cannot read" io_conflict A "$A" read
step "host A got the event" aen_seen "$A"
step "host A's log 80h: registration preempted" notice A "$A" 1 1
step "host A's log 80h is empty once read" notice A "$A" 0 0
step "host B (the preempting host) has no notification" notice B "$B" 0 0
step "report after the preempt" report B2 "$B" "rtype=4 regctl=1 ptpls=1 $HEX_B:$KEY_B:1"
state_file() { ls -l "$STATE_DIR" && ls "$STATE_DIR"/reservations-*.bin; }
step "the PTPL state is on disk" state_file

step "kill nvmfd (SIGKILL)" kill_nvmfd
step "restart nvmfd" start_nvmfd "$CONFIG" "$PORT" "$PORT_B" "rdma:$RDMA_ADDR:$PORT"
both_live() {
	local s
	for s in "$A" "$B"; do
		[ "$(cat "/sys/class/nvme/$(basename "$s")/state")" = live ] || return 1
	done
	echo "$A and $B are live again"
}
step "both controllers reconnect" retry 60 1 both_live
step "report after the restart (host A)" report A3 "$A" "rtype=4 regctl=1 ptpls=1 $HEX_B:$KEY_B:1"
step "report after the restart (host B)" report B3 "$B" "rtype=4 regctl=1 ptpls=1 $HEX_B:$KEY_B:1"
step "host A is still fenced after the restart" io_conflict A "$A" write
step "host B still writes" io_ok B "$B" write

# TCP and RDMA: host A comes back over RDMA, host B stays on TCP. Its new controller may get
# the old one's name: the AEN trace starts afresh.
clear_trace() { [ -z "$TRACE" ] || echo >"$TRACE"; }
step "clear the AEN trace" clear_trace
step "host B clears the namespace" nvme resv-release "$B" -n 1 --crkey=$KEY_B --rrela=1
step "host A leaves tcp" nvme disconnect -d "$(basename "$A")"
step "host A connects over rdma" connect_as "$HOST_A" "$ID_A" rdma "$RDMA_ADDR" "$PORT"
step "host A over rdma, host B over tcp" find_ctrls rdma
info "host A is $A (rdma), host B is $B (tcp)"
step "host B registers over tcp" nvme resv-register "$B" -n 1 --nrkey=$KEY_B --rrega=0
step "host B acquires Write Exclusive over tcp" \
	nvme resv-acquire "$B" -n 1 --crkey=$KEY_B --rtype=1 --racqa=0
step "host A registers over rdma" nvme resv-register "$A" -n 1 --nrkey=$KEY_A --rrega=0
step "host A's write over rdma: reservation conflict" io_conflict A "$A" write
step "host A reads over rdma" io_ok A "$A" read
step "report over rdma (host A)" report A4 "$A" "rtype=1 regctl=2 ptpls=1 $HEX_B:$KEY_B:1,$HEX_A:$KEY_A:0"
# Preempt and Abort (racqa 2): completes once the writes in flight have drained (none here;
# daemon/tests/reservations.rs holds one in flight), with PTPL set: through the persistence
# thread and the command's second run.
step "host B preempts host A over tcp (Preempt and Abort)" \
	nvme resv-acquire "$B" -n 1 --crkey=$KEY_B --prkey=$KEY_A --rtype=1 --racqa=2
step "host A got the event over rdma" aen_seen "$A"
step "host A's log 80h over rdma" notice A4 "$A" 1 1
step "report over rdma after the preempt" report A5 "$A" "rtype=1 regctl=1 ptpls=1 $HEX_B:$KEY_B:1"

step "disconnect both hosts" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
