# Reservation checks through the stock Linux host (nvme-cli), shared by the reservations
# scenarios. A scenario sets R (a directory for what the host read) before using them.

# The host's event trace shows every AEN it receives (NVME_AEN=<completion DW0>).
TRACE=
trace_aens() {
	local t=/sys/kernel/tracing
	[ -e "$t/trace" ] || mount -t tracefs nodev "$t" 2>/dev/null
	if [ -e "$t/events/nvme/nvme_async_event/enable" ]; then
		echo 1 >"$t/events/nvme/nvme_async_event/enable" && echo >"$t/trace" && TRACE=$t/trace
	fi
	echo "AEN trace: ${TRACE:-not available in this kernel}"
}

# io WHO DEV OPCODE: one 512-byte block (LBA 8) written (01h) or read (02h) through DEV.
io() {
	local f=$R/block
	[ -e "$f" ] || dd if=/dev/urandom of="$f" bs=512 count=1 status=none
	if [ "$3" = write ]; then
		nvme io-passthru "$2" --opcode=0x01 --namespace-id=1 --data-len=512 --write \
			--input-file="$f" --cdw10=8 --cdw12=0
	else
		nvme io-passthru "$2" --opcode=0x02 --namespace-id=1 --data-len=512 --read \
			--cdw10=8 --cdw12=0 --raw-binary >"$R/read-$1"
	fi
}
io_ok() { io "$@" && echo "$3 by $1 through $2 succeeded"; }
# io_conflict WHO DEV OPCODE: the command fails with Reservation Conflict (83h, DNR).
io_conflict() {
	local out
	if out=$(io "$@" 2>&1); then
		echo "MISMATCH: $3 by $1 through $2 succeeded: $out"
		return 1
	fi
	echo "$out"
	grep -Eqi 'RESERVATION_CONFLICT|Reservation Conflict|0x4083' <<<"$out" ||
		{ echo "MISMATCH: not a reservation conflict"; return 1; }
	echo "ok: $3 by $1 refused with Reservation Conflict"
}

# notice WHO DEV COUNT TYPE: log 80h read through DEV: Log Page Count, type (1 registration
# preempted, 2 reservation released, 3 reservation preempted), NSID 1 unless the page is empty.
notice() {
	local f=$R/log80-$1-$3 got want
	nvme get-log "$2" --log-id=0x80 --log-len=64 --raw-binary >"$f" || return 1
	od -An -tx1 "$f"
	# bytes 0-7 count, 8 type, 9 available, 12-15 NSID (little endian)
	got=$(od -An -tu8 -N8 "$f" | tr -d ' ')/$(od -An -tu1 -j8 -N1 "$f" | tr -d ' ')/$(od -An -tu4 -j12 -N4 "$f" | tr -d ' ')
	want=$3/$4/1
	[ "$3" = 0 ] && want=0/0/0
	expect_eq "log 80h on host $1's controller (count/type/nsid)" "$got" "$want"
}

# aen_seen DEV: the host received Reservation Log Page Available (type 6h, info 00h, log 80h)
# on controller DEV.
aen_seen() {
	if [ -z "$TRACE" ]; then
		echo "no AEN trace in this kernel: not checked"
		return 0
	fi
	grep nvme_async_event "$TRACE" || true
	retry 20 0.5 grep -Eq "$(basename "$1"): NVME_AEN=0x0*800006" "$TRACE"
}
