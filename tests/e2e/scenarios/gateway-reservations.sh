#!/bin/bash
# e2e-timeout: 900
# e2e-net: gateways 44430,44431
# Reservations through two gateways of a gateway group, with the stock Linux host: the host side
# (hosts/gateway-reservations.sh) runs a single-node Ceph cluster on loopback and two nvmfd
# gateways, g1 on 44430 and g2 on 44431, exporting one RBD image as namespace 1 (the group's
# reservation state in one RADOS object); the guest reaches them through qemu's restricted user
# network (10.0.2.100:PORT → host 127.0.0.1:PORT). Two host identities of this guest: host A
# connects to g1 only, host B to g2 only; nvme-cli's resv-* commands go to each host's
# controller character device. A registers (PTPL) and acquires Write Exclusive through g1; B
# registers through g2; `resv-report --eds` through either gateway shows the same holder, keys
# and generation; B's write through g2 fails with Reservation Conflict; B preempts A through
# g2: A's controller on g1 gets the Reservation Log Page Available event and a Registration
# Preempted log 80h page, and A's write through g1 conflicts; both gateways are killed with
# SIGKILL and started again: the hosts reconnect and the same state is reported through both.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/resv.sh"
. "$E2E_DIR/lib/host_side.sh"
HOST_REPLY_SECS=120

NQN=nqn.2026-12.dev.nvmfd:group-resv
GW=10.0.2.100
PORT_1=44430
PORT_2=44431
ID_A=6e766d66-7265-4000-8000-0000000000a1
ID_B=6e766d66-7265-4000-8000-0000000000b2
HOST_A=nqn.2014-08.org.nvmexpress:uuid:$ID_A
HOST_B=nqn.2014-08.org.nvmexpress:uuid:$ID_B
HEX_A=${ID_A//-/}
HEX_B=${ID_B//-/}
KEY_A=11
KEY_B=22
R=$E2E_OUT/reservations
mkdir -p "$R"
A=
B=

on_cleanup disconnect_all

# connect_as HOSTNQN HOSTID PORT: one controller of that host identity through one gateway,
# which comes back by itself after the gateway restarts (reconnect every second).
connect_as() {
	nvme connect -t tcp -a "$GW" -s "$3" -n "$NQN" -i 1 --hostnqn="$1" --hostid="$2" \
		--ctrl-loss-tmo=120 --reconnect-delay=1
}
find_ctrls() {
	A=/dev/$(ctrl_of_host "$NQN" "$HOST_A" tcp) && B=/dev/$(ctrl_of_host "$NQN" "$HOST_B" tcp) ||
		return 1
	grep -q "trsvcid=$PORT_1" "/sys/class/nvme/$(basename "$A")/address" || return 1
	grep -q "trsvcid=$PORT_2" "/sys/class/nvme/$(basename "$B")/address" || return 1
	echo "host A: $A (g1, $PORT_1), host B: $B (g2, $PORT_2)"
}

# report WHO DEV EXPECTED: resv-report --eds as JSON through DEV, summarized as
# "gen=G rtype=T regctl=N ptpls=P hostid:rkey:rcsts,…" (registrants in registration order).
report() {
	local f=$R/report-$1.json got
	to_file "$f" nvme resv-report "$2" -n 1 --eds -o json || return 1
	got=$(jq -r '"gen=\(.gen) rtype=\(.rtype) regctl=\(.regctl) ptpls=\(.ptpls) " +
		([.regctlext[] | "\(.hostid):\(.rkey):\(.rcsts)"] | join(","))' "$f")
	expect_eq "reservation status seen by $1" "$got" "$3"
}

step "network to the host's gateways" net_up
step "load host modules" load_host_modules tcp
step "trace the host's asynchronous events" trace_aens
step "host A connects to gateway g1" connect_as "$HOST_A" "$ID_A" $PORT_1
step "host B connects to gateway g2" connect_as "$HOST_B" "$ID_B" $PORT_2
step "one controller per host, on its gateway" find_ctrls
info "host A is $A (g1), host B is $B (g2)"

step "host A registers through g1 (key $KEY_A, PTPL set)" \
	nvme resv-register "$A" -n 1 --nrkey=$KEY_A --rrega=0 --cptpl=3
step "host A acquires Write Exclusive through g1" \
	nvme resv-acquire "$A" -n 1 --crkey=$KEY_A --rtype=1 --racqa=0
step "host B registers through g2 (key $KEY_B)" nvme resv-register "$B" -n 1 --nrkey=$KEY_B --rrega=0
WANT="gen=2 rtype=1 regctl=2 ptpls=1 $HEX_A:$KEY_A:1,$HEX_B:$KEY_B:0"
step "report through g1" report A "$A" "$WANT"
step "report through g2" report B "$B" "$WANT"
step "host B's write through g2: reservation conflict" io_conflict B "$B" write
step "host B reads through g2 (Write Exclusive)" io_ok B "$B" read
step "host A writes through g1 (holder)" io_ok A "$A" write
step "host B preempts host A through g2" \
	nvme resv-acquire "$B" -n 1 --crkey=$KEY_B --prkey=$KEY_A --rtype=1 --racqa=1
step "host A's write through g1 right after: reservation conflict" io_conflict A "$A" write
step "host A's controller on g1 got the event" aen_seen "$A"
step "host A's log 80h on g1: registration preempted" notice A "$A" 1 1
step "host B (the preempting host) has no notification" notice B "$B" 0 0
WANT="gen=3 rtype=1 regctl=1 ptpls=1 $HEX_B:$KEY_B:1"
step "report through g1 after the preempt" report A2 "$A" "$WANT"
step "report through g2 after the preempt" report B2 "$B" "$WANT"
step "the state in RADOS" request objects

step "kill both gateways (SIGKILL) and start them again" request restart-all
both_live() {
	local s
	for s in "$A" "$B"; do
		[ "$(cat "/sys/class/nvme/$(basename "$s")/state")" = live ] || return 1
	done
	echo "$A and $B are live again"
}
step "both controllers reconnect" retry 120 1 both_live
step "report through g1 after the restart" report A3 "$A" "$WANT"
step "report through g2 after the restart" report B3 "$B" "$WANT"
step "host A is still fenced through g1" io_conflict A "$A" write
step "host B writes through g2" io_ok B "$B" write
finish
