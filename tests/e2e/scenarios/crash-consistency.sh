#!/bin/bash
# e2e-timeout: 480 (a write loop across a SIGKILL and restart under TCG)
# Crash consistency of a file namespace: a host loop writes 64 KiB blocks, each with content
# unique to its index and this run, and after every 4 writes sends a Flush; once the Flush has
# completed it records the highest index written. nvmfd is killed with SIGKILL mid-loop and
# restarted; the host reconnects (ctrl-loss-tmo 60 s > the outage) and the loop goes on. At the
# end every block recorded as flushed must read back exactly as written (NVMe Base 2.0 §6.8:
# a completed Flush makes every write completed before it non-volatile).
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/crash-consistency.toml
NQN=nqn.2026-12.dev.nvmfd:crash
ADDR=127.0.0.1
PORT=4420
BLOCKS=${CRASH_BLOCKS:-160} # 64 KiB each: 10 MiB, well inside the 64 MiB namespace
RUN=$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
R=$E2E_OUT/crash
mkdir -p "$R"
RECORD=$R/flushed # one line per completed Flush: the highest block index written before it
STOP=$R/stop

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "connect (ctrl-loss-tmo 60, reconnect-delay 1)" \
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 1 --ctrl-loss-tmo=60 --reconnect-delay=1
DEV=
find_dev() { DEV=$(wait_ns "$NQN" 1) && echo "nsid 1 is $DEV"; }
step "namespace device" find_dev
info "namespace is $DEV, run id $RUN"

# block N: 1024 lines of 64 bytes naming the block and the run (one awk: cheap under TCG).
block() {
	awk -v n="$1" -v run="$RUN" 'BEGIN {
		s = sprintf("block %08d run %s ", n, run)
		while (length(s) < 63) s = s "."
		for (i = 0; i < 1024; i++) print s
	}'
}

write_loop() {
	local n=0 flushed=-1
	while [ "$n" -lt "$BLOCKS" ] && [ ! -e "$STOP" ]; do
		if ! block "$n" | dd of="$DEV" bs=64k seek="$n" count=1 iflag=fullblock oflag=direct \
			conv=notrunc status=none; then
			echo "write $n failed"
			return 1
		fi
		n=$((n + 1))
		if [ $((n % 4)) = 0 ]; then
			# Flush (NVMe opcode 00h) on the namespace; only a successful completion counts.
			# nvme-cli's flush is a passthrough command, which the Linux host fails at once
			# (REQ_FAILFAST_DRIVER) when it is in flight at the crash or issued while the
			# controller reconnects, unlike the block writes, which it requeues. So a failed
			# Flush is sent again (for up to 90 s: ctrl-loss-tmo is 60 s); nothing is recorded
			# until one completes.
			local tries=0
			until nvme flush "$DEV" -n 1 >/dev/null 2>&1; do
				tries=$((tries + 1))
				[ "$tries" -lt 90 ] || { echo "flush after $n failed $tries times"; return 1; }
				echo "flush after $n failed (try $tries), sending it again"
				sleep 1
			done
			flushed=$((n - 1))
			echo "$flushed" >>"$RECORD"
		fi
	done
	echo "loop wrote $n blocks, last flushed index $flushed"
}

LOOP_PID=
start_loop() {
	: >"$RECORD"
	rm -f "$STOP"
	write_loop >"$R/loop.log" 2>&1 &
	LOOP_PID=$!
	echo "write loop pid $LOOP_PID"
}
step "start write+flush loop" start_loop
on_cleanup kill "$LOOP_PID"

flushes() { wc -l <"$RECORD"; }
# wait_flushes N SECS: at least N flushes recorded.
wait_flushes() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		[ "$(flushes)" -ge "$1" ] && { echo "$(flushes) flushes, last index $(tail -n1 "$RECORD")"; return 0; }
		kill -0 "$LOOP_PID" 2>/dev/null || { echo "loop ended early:"; cat "$R/loop.log"; return 1; }
		sleep 0.1
	done
	echo "only $(flushes) flushes after $2 s"
	cat "$R/loop.log"
	return 1
}
step "loop running (5 flushes)" wait_flushes 5 90
BEFORE=
kill_mid_run() {
	kill_nvmfd || return 1
	BEFORE=$(tail -n1 "$RECORD")
	echo "nvmfd killed; $(flushes) flushes recorded, last flushed index $BEFORE"
}
step "kill nvmfd (SIGKILL) mid-loop" kill_mid_run
info "flushed before the crash: blocks 0..$BEFORE"
step "host notices (controller connecting)" wait_ctrl_state "$NQN" connecting 20
sleep 2
step "restart nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "host reconnects (controller live)" wait_ctrl_state "$NQN" live 40
progress_after() {
	local want=$(($(flushes) + 5))
	wait_flushes "$want" 90
}
step "loop resumes (5 more flushes)" progress_after
stop_loop() {
	touch "$STOP"
	wait "$LOOP_PID"
	local rc=$?
	cat "$R/loop.log"
	LOOP_PID=
	[ "$rc" = 0 ]
}
STEP_TIMEOUT=120 step "stop loop" stop_loop

# Every block up to the last recorded flush reads back as written (one read of the range,
# the expected bytes from one awk run, one cmp; per-block commands are slow under TCG).
verify_flushed() {
	local last bad
	last=$(tail -n1 "$RECORD")
	expect_num "last flushed index" "$last" -ge "$BEFORE" || return 1
	dd if="$DEV" of="$R/readback.bin" bs=64k count=$((last + 1)) iflag=direct status=none || return 1
	awk -v last="$last" -v run="$RUN" 'BEGIN {
		for (n = 0; n <= last; n++) {
			s = sprintf("block %08d run %s ", n, run)
			while (length(s) < 63) s = s "."
			for (i = 0; i < 1024; i++) print s
		}
	}' >"$R/expected.bin"
	if cmp -s "$R/expected.bin" "$R/readback.bin"; then
		echo "ok: blocks 0..$last (flushed before or after the crash) read back intact"
		return 0
	fi
	bad=$(cmp -l "$R/expected.bin" "$R/readback.bin" | awk '{ print int(($1 - 1) / 65536) }' | uniq | head -n 20 | tr '\n' ' ')
	echo "MISMATCH: blocks differing from what was written and flushed: $bad"
	return 1
}
STEP_TIMEOUT=240 step "every flushed block verifies" verify_flushed
# The image on the guest's disk, read past nvmfd: the same bytes (nothing only in a cache).
verify_image() {
	local last
	last=$(tail -n1 "$RECORD")
	dd if=/var/tmp/nvmfd-crash.img bs=64k count=$((last + 1)) iflag=direct status=none |
		cmp - "$R/readback.bin" && echo "ok: image file matches the host's view"
}
step "image file matches" verify_image
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
