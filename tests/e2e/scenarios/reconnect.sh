#!/bin/bash
# Target restart under a connected host: connect with a short reconnect delay, kill nvmfd with
# SIGKILL while fio writes, restart it; the host must keep the same /dev/nvmeXnY, reconnect on
# its own, and the I/O must resume and verify. Data written before the crash to the file
# namespace must still read back.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/tcp-basic.toml
NQN=nqn.2026-12.dev.nvmfd:e2e
ADDR=127.0.0.1
PORT=4420
NSID=2 # file-backed: survives the restart (the RAM namespace would come back empty)

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "connect (ctrl-loss-tmo 60, reconnect-delay 1)" \
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2 --ctrl-loss-tmo=60 --reconnect-delay=1
DEV=
find_dev() { DEV=$(wait_ns "$NQN" "$NSID") && echo "nsid $NSID is $DEV"; }
step "namespace device" find_dev
info "namespace $NSID is $DEV"

# 8 MiB of random data at the start of the namespace; fio works above 16 MiB.
write_pattern() {
	head -c 8M /dev/urandom >/tmp/pattern &&
		dd if=/tmp/pattern of="$DEV" bs=1M oflag=direct conv=fsync status=none &&
		md5sum </tmp/pattern | tee /tmp/pattern.md5
}
step "write pattern (8 MiB, O_DIRECT)" write_pattern

FIO_PID=
start_fio() {
	# time_based: I/O keeps running across the outage; verify_backlog checks data as it goes.
	fio --name=reconnect --filename="$DEV" --offset=16M --size=64M --rw=randwrite --bs=16k \
		--direct=1 --ioengine=libaio --iodepth=8 --time_based --runtime=35 \
		--verify=crc32c --verify_fatal=1 --verify_backlog=64 >"$E2E_OUT/fio-reconnect.log" 2>&1 &
	FIO_PID=$!
	sleep 3
	kill -0 "$FIO_PID" || { cat "$E2E_OUT/fio-reconnect.log"; return 1; }
	echo "fio pid $FIO_PID running"
}
step "start background fio" start_fio
on_cleanup kill "$FIO_PID"

step "kill nvmfd (SIGKILL)" kill_nvmfd
step "host notices (controller connecting)" wait_ctrl_state "$NQN" connecting 20
sleep 2
step "restart nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "host reconnects (controller live)" wait_ctrl_state "$NQN" live 40
same_dev() {
	local d
	d=$(ns_dev "$NQN" "$NSID") || { echo "namespace $NSID gone"; return 1; }
	expect_eq "block device after reconnect" "$d" "$DEV" && [ -b "$d" ]
}
step "same block device" same_dev
wait_fio() {
	wait "$FIO_PID"
	local rc=$?
	cat "$E2E_OUT/fio-reconnect.log"
	[ "$rc" = 0 ] || { echo "fio exited $rc"; return 1; }
}
STEP_TIMEOUT=120 step "fio resumed and verified" wait_fio
read_pattern() {
	dd if="$DEV" bs=1M count=8 iflag=direct status=none | md5sum >/tmp/readback.md5
	expect_eq "md5 of the first 8 MiB" "$(cat /tmp/readback.md5)" "$(cat /tmp/pattern.md5)"
}
step "pattern survived the restart" read_pattern
step "dd after reconnect" dd if=/dev/zero of="$DEV" bs=1M count=4 seek=100 oflag=direct conv=fsync
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
