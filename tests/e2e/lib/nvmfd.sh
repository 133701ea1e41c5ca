# Running the host-built nvmfd (shared read-only over 9p at $E2E_NVMFD_BIN) inside the guest.
# Nothing named NVMFD_* may be exported here: nvmfd reads every NVMFD_* variable as a config
# override (configuration contract) and rejects the unknown ones.
#
#   start_nvmfd CONFIG [PORT…]   start it in the background, wait until each listener is up:
#                                a TCP port number, or rdma:ADDR:PORT for an rdma_cm listener
#   stop_nvmfd                   SIGTERM, then SIGKILL after 10 s
#   kill_nvmfd                   SIGKILL (crash simulation)
#   check_nvmfd_log              no ERROR lines in its log (a step function)
#
# Its log goes to $E2E_OUT/nvmfd.log (appended across restarts). E2E_NVMFD_ARGS (NVMFD_ARGS on
# the run.sh side) replaces the default "--config CONFIG".

E2E_NVMFD_BIN=${E2E_NVMFD_BIN:-/opt/nvmfd/nvmfd}
NVMFD_LOG="$E2E_OUT/nvmfd.log"
NVMFD_PID=

start_nvmfd() {
	local cfg=$1 p
	shift
	if [ ! -x "$E2E_NVMFD_BIN" ]; then
		echo "no nvmfd binary at $E2E_NVMFD_BIN"
		return 1
	fi
	cp "$cfg" "$E2E_OUT/" 2>/dev/null
	echo "=== $(date -u +%T) start: $E2E_NVMFD_BIN ${E2E_NVMFD_ARGS:---config $cfg}" >>"$NVMFD_LOG"
	# shellcheck disable=SC2086
	RUST_LOG=${RUST_LOG:-debug} RUST_BACKTRACE=1 NVMFD_GLOBAL__LOG_LEVEL=debug \
		setsid "$E2E_NVMFD_BIN" ${E2E_NVMFD_ARGS:---config "$cfg"} >>"$NVMFD_LOG" 2>&1 </dev/null &
	NVMFD_PID=$!
	echo "nvmfd pid $NVMFD_PID"
	for p in "${@:-4420}"; do
		local i what
		for ((i = 0; i < 200; i++)); do
			if ! kill -0 "$NVMFD_PID" 2>/dev/null; then
				wait "$NVMFD_PID"
				echo "nvmfd exited with status $? before listening on $p; its log:"
				tail -n 30 "$NVMFD_LOG"
				NVMFD_PID=
				return 1
			fi
			case $p in
			rdma:*) # rdma:ADDR:PORT
				what=${p#rdma:}
				rdma_listening "${what%:*}" "${what##*:}" && break
				;;
			*) tcp_listening "$p" && break ;;
			esac
			sleep 0.1
		done
		if [ "$i" = 200 ]; then
			echo "nvmfd (pid $NVMFD_PID) does not listen on $p after 20 s; its log:"
			tail -n 30 "$NVMFD_LOG"
			return 1
		fi
		echo "listening on $p"
	done
}

stop_nvmfd() {
	[ -n "$NVMFD_PID" ] || return 0
	kill -TERM "$NVMFD_PID" 2>/dev/null
	local i
	for ((i = 0; i < 100; i++)); do
		kill -0 "$NVMFD_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$NVMFD_PID" 2>/dev/null; then
		echo "nvmfd ignored SIGTERM for 10 s; killing it"
		kill -KILL "$NVMFD_PID"
		wait "$NVMFD_PID" 2>/dev/null
		NVMFD_PID=
		return 1
	fi
	wait "$NVMFD_PID" 2>/dev/null
	local rc=$?
	echo "nvmfd exited with status $rc after SIGTERM"
	NVMFD_PID=
	[ "$rc" = 0 ] || [ "$rc" = 143 ]
}

kill_nvmfd() {
	[ -n "$NVMFD_PID" ] || { echo "nvmfd is not running"; return 1; }
	kill -KILL "$NVMFD_PID"
	wait "$NVMFD_PID" 2>/dev/null
	echo "=== $(date -u +%T) killed with SIGKILL" >>"$NVMFD_LOG"
	NVMFD_PID=
}

# nvmfd_alive: still running (a step between I/O phases catches crashes early).
# nvmfd_fixed_buffers_in_use: nvmfd's io_uring rings have transport buffers registered
# (`uring_fixed_buffers` on, and file or block namespace I/O done): the kernel lists each
# registered buffer in the ring descriptor's fdinfo after `UserBufs:` as `N: 0xADDR/LEN`, and
# each empty entry of the sparse table as `N: <none>` (6.13 and later) or as the kernel's dummy
# buffer, `N: 0xffffffffffffffff/LEN` (6.1: LEN 1; 6.12: 4294967295).
nvmfd_fixed_buffers_in_use() {
	local f n=0 bytes=0 line
	for f in /proc/"$NVMFD_PID"/fdinfo/*; do
		grep -q '^UserBufs:' "$f" 2>/dev/null || continue
		while read -r line; do
			n=$((n + 1))
			bytes=$((bytes + ${line##*/}))
		done < <(sed -n '/^UserBufs:/,$p' "$f" | grep -E '^ *[0-9]+: 0x[0-9a-f]+/[0-9]+$' |
			grep -v ': 0xffffffffffffffff/')
	done
	echo "registered buffers: $n, $bytes bytes"
	[ "$n" -gt 0 ]
}

nvmfd_alive() {
	if [ -n "$NVMFD_PID" ] && kill -0 "$NVMFD_PID" 2>/dev/null; then
		echo "nvmfd pid $NVMFD_PID alive"
		return 0
	fi
	echo "nvmfd is not running; last log lines:"
	tail -n 30 "$NVMFD_LOG"
	return 1
}

check_nvmfd_log() {
	# Text format puts the level as a word ("ERROR"); JSON as "level":"ERROR".
	if grep -nE '(^|[^A-Za-z_])ERROR([^A-Za-z_]|$)' "$NVMFD_LOG"; then
		echo "nvmfd logged errors (above)"
		return 1
	fi
	if grep -nE 'panicked at|RUST_BACKTRACE' "$NVMFD_LOG"; then
		echo "nvmfd panicked (above)"
		return 1
	fi
	echo "no ERROR lines in $(wc -l <"$NVMFD_LOG") log lines"
}
