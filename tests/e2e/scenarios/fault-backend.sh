#!/bin/bash
# e2e-timeout: 400 (two fio runs under TCG)
# The fault backend with the stock Linux host (issue 17): a namespace whose reads of LBAs
# 2048..2056 fail with EIO and whose writes to 4096..4104 fail with ENOSPC
# (configs/fault-backend.toml). The host must see Unrecovered Read Error (SCT 2h, SC 81h) for
# those reads and Capacity Exceeded (SCT 0h, SC 81h) for those writes — through nvme-cli's
# passthrough (the status itself), the block layer (dd fails, the kernel logs the status) and
# the controller's error log (an entry naming the LBA) — while every other block of that
# namespace and the other namespace keep working (fio verify during and after); nothing hangs.
# A third rule delays reads of one range of namespace 2 by 5 s (`latency_ms`): other reads
# complete meanwhile, the delayed one succeeds after at least 5 s.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/fault-backend.toml
NQN=nqn.2026-12.dev.nvmfd:e2e-faults
ADDR=127.0.0.1
PORT=4420
R=$E2E_OUT/faults
mkdir -p "$R"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT"
step "connect" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
CTRL= DEV1= DEV2=
find_devs() {
	CTRL=/dev/$(ctrl_of "$NQN" tcp) || return 1
	DEV1=$(wait_ns "$NQN" 1) || return 1
	DEV2=$(wait_ns "$NQN" 2) || return 1
	echo "controller $CTRL, namespaces $DEV1 $DEV2"
}
step "namespaces appear" find_devs

# Passthrough I/O shows the status the target returned, unchanged by the block layer.
BLK=$R/block.bin
head -c 4096 /dev/urandom >"$BLK"
write_into_read_fault() {
	# The read fault does not touch writes: LBAs 2048..2055 take data.
	nvme write "$DEV1" --start-block=2048 --block-count=7 --data-size=4096 --data="$BLK"
}
step "write into the read-fault range succeeds" write_into_read_fault
# passthrough_fails OP SLBA DATA WHAT PATTERN: `nvme OP` of one block at SLBA (DATA: the file
# written or read into) fails, and nvme-cli's output matches PATTERN (the status WHAT).
passthrough_fails() {
	local rc out=$R/$1-fault.txt
	nvme "$1" "$DEV1" --start-block="$2" --block-count=0 --data-size=512 --data="$3" >"$out" 2>&1
	rc=$?
	cat "$out"
	expect_num "nvme $1 exit status" "$rc" -ne 0 || return 1
	expect_grep "$4 reported" "$5" "$out"
}
read_fault_status() {
	passthrough_fails read 2050 "$R/out.bin" "Unrecovered Read Error" \
		'[Uu]nrecovered [Rr]ead|UNRECOVERED_READ|0x[0-9a-f]*281'
}
step "read inside the fault range: Unrecovered Read Error" read_fault_status
read_next_to_fault() {
	# The blocks on either side read fine.
	nvme read "$DEV1" --start-block=2040 --block-count=7 --data-size=4096 --data="$R/before.bin" &&
		nvme read "$DEV1" --start-block=2056 --block-count=7 --data-size=4096 --data="$R/after.bin"
}
step "reads next to the range succeed" read_next_to_fault
block_layer_read() {
	local rc
	dmesg -C
	timeout -k 5 60 dd if="$DEV1" of=/dev/null bs=4096 skip=256 count=1 iflag=direct >"$R/dd-read.txt" 2>&1
	rc=$?
	cat "$R/dd-read.txt"
	dmesg | tee "$R/dmesg-read.txt"
	expect_num "dd exit status (124 = hung)" "$rc" -eq 1 || return 1
	# Unrecovered Read Error is BLK_STS_MEDIUM in the host (nvme_error_status): ENODATA.
	expect_grep "dd saw the media error (ENODATA)" 'No data available' "$R/dd-read.txt" || return 1
	# 6.1 logs the status of a failed request (nvme_log_error): SCT 2h / SC 81h.
	expect_grep "host kernel logged the media error" 'sct 0x2 / sc 0x81|Unrecovered Read Error|critical medium error' \
		"$R/dmesg-read.txt"
}
step "dd read of the range fails with ENODATA (block layer)" block_layer_read
write_fault_status() {
	passthrough_fails write 4100 "$BLK" "Capacity Exceeded" \
		'[Cc]apacity [Ee]xceeded|CAPACITY_EXCEEDED|0x[0-9a-f]*081'
}
step "write inside the ENOSPC range: Capacity Exceeded" write_fault_status
block_layer_write() {
	local rc
	dmesg -C
	timeout -k 5 60 dd if="$BLK" of="$DEV1" bs=4096 seek=512 count=1 oflag=direct >"$R/dd-write.txt" 2>&1
	rc=$?
	cat "$R/dd-write.txt"
	dmesg | tee "$R/dmesg-write.txt"
	expect_num "dd exit status (124 = hung)" "$rc" -eq 1 || return 1
	# Capacity Exceeded maps to BLK_STS_NOSPC in the host (nvme_error_status): ENOSPC.
	expect_grep "dd saw ENOSPC" 'No space left on device' "$R/dd-write.txt"
}
step "dd write of the range fails with ENOSPC (block layer)" block_layer_write
error_log() {
	nvme error-log "$CTRL" -e 64 -o json >"$R/error-log.json" || return 1
	# Entries with this LBA; status_field as nvme-cli prints it (bit 0 phase tag or not):
	# Unrecovered Read Error = SCT 2h SC 81h, Capacity Exceeded = SCT 0h SC 81h.
	local read_sf write_sf
	read_sf=$(jq -r '[.errors[] | select(.lba == 2050)][0].status_field' "$R/error-log.json")
	write_sf=$(jq -r '[.errors[] | select(.lba == 4100)][0].status_field' "$R/error-log.json")
	jq -c '.errors[] | select(.error_count > 0)' "$R/error-log.json" | head -8
	echo "status_field: read @2050 = $read_sf, write @4100 = $write_sf"
	[ "$read_sf" != null ] && [ "$write_sf" != null ] || { echo "MISSING: no entry for LBA 2050 or 4100"; return 1; }
	local r=$((read_sf & 0x7ff)) rs=$(((read_sf >> 1) & 0x7ff))
	local w=$((write_sf & 0x7ff)) ws=$(((write_sf >> 1) & 0x7ff))
	if [ "$r" = $((0x281)) ] || [ "$rs" = $((0x281)) ]; then echo "ok: read entry SCT 2h SC 81h"; else
		echo "MISMATCH: read entry status $read_sf"; return 1; fi
	if [ "$w" = $((0x081)) ] || [ "$ws" = $((0x081)) ]; then echo "ok: write entry SCT 0h SC 81h"; else
		echo "MISMATCH: write entry status $write_sf"; return 1; fi
}
step "error log names both failed commands" error_log
fio_around_faults() {
	# Every block of namespace 1 after the fault ranges, and the whole of namespace 2, in
	# parallel: verified data, no error.
	fio --name=ns1 --filename="$DEV1" --offset=4M --size=32M --rw=randwrite --bsrange=4k-64k \
		--direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 \
		--name=ns2 --filename="$DEV2" --offset=0 --size=32M --rw=randwrite --bsrange=4k-64k \
		--direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 \
		--randrepeat=1 --group_reporting
}
step "fio verify on the rest of ns 1 and on ns 2" fio_around_faults
step "the fault persists (read still fails)" read_fault_status
delayed_read() {
	local t0 pid rc took
	t0=$(date +%s.%N)
	nvme read "$DEV2" --start-block=100000 --block-count=7 --data-size=4096 --data="$R/delayed.bin" \
		>"$R/delayed.txt" 2>&1 &
	pid=$!
	sleep 0.5
	# While it waits (an io_uring timeout, not a sleeping reactor) other reads complete.
	nvme read "$DEV2" --start-block=0 --block-count=7 --data-size=4096 --data="$R/other.bin" || return 1
	nvme read "$DEV1" --start-block=0 --block-count=7 --data-size=4096 --data="$R/other1.bin" || return 1
	echo "two other reads done after $(_elapsed "$t0") s"
	kill -0 "$pid" 2>/dev/null || { echo "MISMATCH: the delayed read ended before the other reads"; return 1; }
	wait "$pid"
	rc=$?
	took=$(_elapsed "$t0")
	cat "$R/delayed.txt"
	expect_num "delayed read exit status" "$rc" -eq 0 || return 1
	echo "delayed read took $took s"
	awk -v t="$took" 'BEGIN { exit !(t >= 5.0) }' || { echo "MISMATCH: took $took s, injected 5 s"; return 1; }
	echo "RESULT-DELAY $took"
}
step "a read delayed 5 s (latency_ms) while other reads complete" delayed_read
step "controller still live" wait_ctrl_state "$NQN" live 5
step "nvmfd alive" nvmfd_alive
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
