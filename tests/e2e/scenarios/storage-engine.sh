#!/bin/bash
# e2e-image: trixie
# e2e-timeout: 900 (three namespaces discarded and formatted under a concurrent reader, TCG)
# Storage engine (issue 17): nvmfd runs inside the trixie guest (kernel 6.12: the discard-only
# plan of block devices is BLOCK_URING_CMD_DISCARD, 6.12+) with one reactor and serves
#   se-file   a file on the guest's ext4 (IORING_OP_FALLOCATE punch hole / zero range),
#   se-loop   a loop device (fallocate on the device: write-zeroes that may unmap),
#   se-thin   a dm-thin volume (discard only: BLOCK_URING_CMD_DISCARD),
#   se-reader a RAM namespace read by a second host identity (its own controller).
# Checks: Identify DLFEAT (CNS 00h) and DMRSL/WZSL (CNS 06h, one subsystem per backend so the
# controller-wide limits are that backend's) equal what the device's queue limits give; data
# written to the thin volume is given back to the pool by `blkdiscard`; `blkdiscard` and
# `mkfs.ext4` of each namespace complete while the reader's fio randread sees no completion
# slower than 100 ms (no blocking call on the reactor; NVMe Base 2.0 has no limit, this is the
# issue's criterion). Latencies are TCG figures: they prove the reactor never stalls, not speed.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

# No udev in the guest: dmsetup creates /dev/mapper nodes itself.
export DM_DISABLE_UDEV=1

ADDR=127.0.0.1
PORT=4420
PFX=nqn.2026-12.dev.nvmfd
# Two host identities: A discards and formats, B (second controller) reads.
HOSTID_A=7d1c6c4e-4f0a-4b7e-9d55-0a0e0c1a0001
HOSTID_B=7d1c6c4e-4f0a-4b7e-9d55-0a0e0c1a0002
HOSTNQN_A=nqn.2014-08.org.nvmexpress:uuid:$HOSTID_A
HOSTNQN_B=nqn.2014-08.org.nvmexpress:uuid:$HOSTID_B
MAX_CLAT_NS=100000000 # 100 ms
R=$E2E_OUT/storage
mkdir -p "$R"
SIZE_MB=256
THIN_WRITE_MB=32

LOOP_DEV= META_DEV= DATA_DEV=
on_cleanup stop_nvmfd
on_cleanup disconnect_all

backing() {
	modprobe loop || return 1
	modprobe dm_thin_pool || return 1
	truncate -s "${SIZE_MB}M" /var/tmp/se-file.img /var/tmp/se-loop.img /var/tmp/se-thin-data.img || return 1
	# Metadata device: zeroed (a fresh pool formats metadata whose superblock reads as zeroes).
	dd if=/dev/zero of=/var/tmp/se-thin-meta.img bs=1M count=16 status=none || return 1
	LOOP_DEV=$(losetup --find --show /var/tmp/se-loop.img) || return 1
	META_DEV=$(losetup --find --show /var/tmp/se-thin-meta.img) || return 1
	DATA_DEV=$(losetup --find --show /var/tmp/se-thin-data.img) || return 1
	local sectors=$((SIZE_MB * 2048))
	# 128 sectors = 64 KiB pool blocks, low water mark 0.
	dmsetup create se-pool --table "0 $sectors thin-pool $META_DEV $DATA_DEV 128 0" || return 1
	dmsetup message se-pool 0 "create_thin 0" || return 1
	dmsetup create se-thin --table "0 $sectors thin /dev/mapper/se-pool 0" || return 1
	[ -b /dev/mapper/se-thin ] || { echo "no /dev/mapper/se-thin"; return 1; }
	losetup -a
	dmsetup table
	dmsetup status
}
step "loop devices and dm-thin pool" backing
on_cleanup losetup -d "$LOOP_DEV" "$META_DEV" "$DATA_DEV"
on_cleanup dmsetup remove se-pool
on_cleanup dmsetup remove se-thin

make_config() {
	sed "s|@LOOP_DEV@|$LOOP_DEV|" "$E2E_DIR/configs/storage-engine.toml" >"$R/storage-engine.toml" &&
		cat "$R/storage-engine.toml"
}
step "config" make_config
step "load host modules" load_host_modules tcp
step "start nvmfd" start_nvmfd "$R/storage-engine.toml" "$PORT"

connect_all() {
	local s
	for s in file loop thin; do
		nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$PFX:se-$s" -i 2 \
			--hostnqn="$HOSTNQN_A" --hostid="$HOSTID_A" || return 1
	done
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$PFX:se-reader" -i 2 \
		--hostnqn="$HOSTNQN_B" --hostid="$HOSTID_B" || return 1
	nvme list
}
step "connect (host A: file, loop, thin; host B: reader)" connect_all
declare -A DEV=() CTRL=() BACKING=([file]=/var/tmp/se-file.img [loop]=LOOP [thin]=/dev/mapper/se-thin)
BACKING[loop]=$LOOP_DEV
find_devs() {
	local s
	for s in file loop thin reader; do
		DEV[$s]=$(wait_ns "$PFX:se-$s" 1) || return 1
		CTRL[$s]=$(ctrl_of "$PFX:se-$s") || return 1
		echo "se-$s: ${DEV[$s]} on /dev/${CTRL[$s]}"
	done
	# Two host identities, two controllers of one nvmfd.
	expect_eq "reader's host NQN" "$(cat "/sys/class/nvme/${CTRL[reader]}/hostnqn")" "$HOSTNQN_B" || return 1
	expect_eq "thin's host NQN" "$(cat "/sys/class/nvme/${CTRL[thin]}/hostnqn")" "$HOSTNQN_A"
}
step "namespace devices" find_devs
for s in file loop thin reader; do info "se-$s is ${DEV[$s]} (/dev/${CTRL[$s]})"; done

# What nvmfd's backend must report for a block device, from its queue limits (Documentation/
# ABI/stable/sysfs-block): with write-zeroes, Deallocate is an unmapping write-zeroes (DLFEAT
# 001b read zeroes + bit 3), its limit the write-zeroes limit; with discard only, no zeroes are
# promised (DLFEAT 0) and the limit is the discard limit. DMRSL in LBAs (NVM Command Set 1.0
# §4.1.5.2), WZSL as a power of two of 4 KiB pages (0 = no limit). A file reports no limits.
expected_limits() { # KIND → "dlfeat dmrsl wzsl"
	local kind=$1
	if [ "$kind" = file ]; then
		echo "9 0 0"
		return
	fi
	# By device number: without udev /dev/mapper/se-thin is a node of its own, not a link to dm-N.
	local q dev=${BACKING[$kind]}
	q=/sys/dev/block/$((0x$(stat -Lc %t "$dev"))):$((0x$(stat -Lc %T "$dev")))/queue
	local dc wz lbs dlfeat dmax dmrsl pages wzsl=0
	dc=$(cat "$q/discard_max_bytes")
	wz=$(cat "$q/write_zeroes_max_bytes")
	lbs=$(cat "$q/logical_block_size")
	echo "  ${BACKING[$kind]}: discard_max_bytes=$dc write_zeroes_max_bytes=$wz logical_block_size=$lbs" >&2
	if [ "$wz" -gt 0 ]; then dlfeat=9 dmax=$wz; else dlfeat=0 dmax=$dc; fi
	dmrsl=$((dmax / lbs))
	[ "$dmrsl" -le 4294967295 ] || dmrsl=4294967295
	[ "$dmax" -gt 0 ] && [ "$dmrsl" = 0 ] && dmrsl=1
	pages=$((wz / 4096))
	if [ "$pages" -ge 2 ]; then
		while [ $((pages >> (wzsl + 1))) -gt 0 ]; do wzsl=$((wzsl + 1)); done
	fi
	echo "$dlfeat $dmrsl $wzsl"
}

check_limits() {
	local s bad=0 want dlfeat dmrsl wzsl
	for s in file loop thin; do
		echo "== se-$s (${BACKING[$s]})"
		want=$(expected_limits "$s") || return 1
		read -r dlfeat dmrsl wzsl <<<"$want"
		nvme id-ns "${DEV[$s]}" -o json >"$R/id-ns-$s.json" || return 1
		nvme nvm-id-ctrl "/dev/${CTRL[$s]}" -o json >"$R/nvm-id-ctrl-$s.json" || return 1
		cat "$R/nvm-id-ctrl-$s.json"
		local got_dlfeat got_dmrsl got_wzsl
		got_dlfeat=$(jq -r .dlfeat "$R/id-ns-$s.json")
		got_dmrsl=$(jq -r .dmrsl "$R/nvm-id-ctrl-$s.json")
		got_wzsl=$(jq -r .wzsl "$R/nvm-id-ctrl-$s.json")
		expect_eq "se-$s DLFEAT" "$got_dlfeat" "$dlfeat" || bad=1
		expect_eq "se-$s DMRSL" "$got_dmrsl" "$dmrsl" || bad=1
		expect_eq "se-$s WZSL" "$got_wzsl" "$wzsl" || bad=1
		echo "RESULT-LIMITS se-$s dlfeat=$got_dlfeat dmrsl=$got_dmrsl wzsl=$got_wzsl" \
			"(host: discard_max_bytes=$(cat "/sys/block/$(basename "${DEV[$s]}")/queue/discard_max_bytes")" \
			"write_zeroes_max_bytes=$(cat "/sys/block/$(basename "${DEV[$s]}")/queue/write_zeroes_max_bytes"))" |
			tee -a "$R/limits.txt"
	done
	return $bad
}
step "DLFEAT, DMRSL, WZSL as the backends report" check_limits
while read -r l; do info "${l#RESULT-LIMITS }"; done <"$R/limits.txt"

# used data blocks of the pool: `dmsetup status` of a thin-pool is
# "start len thin-pool transid used_meta/total_meta used_data/total_data …".
pool_used() { dmsetup status se-pool | awk '{ split($6, a, "/"); print a[1] }'; }
USED0= USED1= USED2=
thin_write() {
	USED0=$(pool_used)
	dd if=/dev/urandom of="$R/thin-data.bin" bs=1M count="$THIN_WRITE_MB" status=none || return 1
	dd if="$R/thin-data.bin" of="${DEV[thin]}" bs=1M oflag=direct status=none || return 1
	USED1=$(pool_used)
	dmsetup status se-pool
	echo "pool used data blocks (64 KiB): before $USED0, after writing ${THIN_WRITE_MB} MiB $USED1"
	# Read back through the host, past nvmfd and dm-thin.
	cmp <(dd if="${DEV[thin]}" bs=1M count="$THIN_WRITE_MB" iflag=direct status=none) "$R/thin-data.bin" ||
		return 1
	expect_num "pool blocks after writing" "$USED1" -ge $((USED0 + THIN_WRITE_MB * 16))
}
step "write ${THIN_WRITE_MB} MiB to the thin volume through the host" thin_write
thin_discard() {
	blkdiscard -v "${DEV[thin]}" || return 1
	USED2=$(pool_used)
	dmsetup status se-pool
	echo "pool used data blocks: before $USED0, written $USED1, after blkdiscard $USED2"
	expect_num "pool blocks after blkdiscard" "$USED2" -eq "$USED0"
}
step "blkdiscard gives the thin pool its blocks back" thin_discard
info "thin pool used data blocks: before $USED0, after writing $USED1, after blkdiscard $USED2"

# Reader (host B) on the RAM namespace: fio randread until told to stop (SIGINT: fio ends its
# jobs and still writes its JSON report).
READER_PID=
start_reader() { # TAG
	fio --name=reader --filename="${DEV[reader]}" --rw=randread --bs=4k --direct=1 \
		--ioengine=libaio --iodepth=4 --time_based --runtime=600 --output-format=json \
		--output="$R/reader-$1.json" >"$R/reader-$1.out" 2>&1 &
	READER_PID=$!
	echo "reader pid $READER_PID"
	sleep 3
	kill -0 "$READER_PID" || { cat "$R/reader-$1.out"; return 1; }
}
stop_reader() { # TAG
	[ -n "$READER_PID" ] || return 1
	sleep 2
	kill -INT "$READER_PID"
	wait "$READER_PID"
	local rc=$?
	READER_PID=
	cat "$R/reader-$1.out"
	# fio ends its jobs on SIGINT and reports as usual; I/O errors show in the report's "error".
	echo "fio exited $rc after SIGINT"
	# fio writes "fio: terminating on signal 2" into the report file before the JSON.
	sed -n '/^{/,$p' "$R/reader-$1.json" >"$R/reader-$1.clean.json"
	[ -s "$R/reader-$1.clean.json" ] || { echo "no fio report"; cat "$R/reader-$1.json"; return 1; }
	local p999 max n errs
	p999=$(jq -r '.jobs[0].read.clat_ns.percentile["99.900000"]' "$R/reader-$1.clean.json") || return 1
	max=$(jq -r '.jobs[0].read.clat_ns.max' "$R/reader-$1.clean.json")
	n=$(jq -r '.jobs[0].read.total_ios' "$R/reader-$1.clean.json")
	errs=$(jq -r '.jobs[0].error' "$R/reader-$1.clean.json")
	echo "RESULT-LAT $1 reads=$n p99.9=$((p999 / 1000)) us max=$((max / 1000)) us" | tee -a "$R/latency.txt"
	expect_eq "reader errors" "$errs" 0 || return 1
	expect_num "reader completions" "$n" -gt 0 || return 1
	[ "$1" = idle ] || echo "$1 $max" >>"$R/max-clat.txt"
}
# The latency criterion over every namespace at the end, so one run reports all the figures.
check_latency() {
	local s max bad=0
	cat "$R/latency.txt"
	while read -r s max; do
		expect_num "reader max clat (ns) during se-$s blkdiscard + mkfs" "$max" -le "$MAX_CLAT_NS" || bad=1
	done <"$R/max-clat.txt"
	return $bad
}
timed() { # what CMD…: run CMD (at most OP_TIMEOUT s), note its duration
	local t0 rc
	t0=$(date +%s.%N)
	timeout -k 5 "$OP_TIMEOUT" "${@:2}"
	rc=$?
	[ "$rc" = 124 ] && echo "$1 did not complete in $OP_TIMEOUT s"
	echo "RESULT-OP $1 $(_elapsed "$t0") s (exit $rc)" | tee -a "$R/ops.txt"
	return $rc
}
on_cleanup kill_reader
kill_reader() { [ -z "$READER_PID" ] || kill "$READER_PID"; }

# The reader alone first: its figures under TCG without discard or mkfs load, for comparison
# (reported, not checked).
step "idle: reader (host B) starts" start_reader idle
sleep 10
step "idle: reader stops (figures)" stop_reader idle
info "$(grep "^RESULT-LAT idle " "$R/latency.txt" | sed 's/^RESULT-LAT //')"
# Block devices first: their figures are wanted even if a later namespace fails.
OP_TIMEOUT=${OP_TIMEOUT:-150}
for s in loop thin file; do
	step "se-$s: reader (host B) starts" start_reader "$s"
	step "se-$s: blkdiscard whole namespace" timed "$s blkdiscard" blkdiscard -v "${DEV[$s]}"
	step "se-$s: mkfs.ext4 (discards)" timed "$s mkfs.ext4" mkfs.ext4 -F -q "${DEV[$s]}"
	step "se-$s: reader stops (figures)" stop_reader "$s"
	info "$(grep "^RESULT-LAT $s " "$R/latency.txt" | sed 's/^RESULT-LAT //')"
done
while read -r l; do info "${l#RESULT-OP }"; done <"$R/ops.txt"
step "reader saw no completion > 100 ms (any namespace)" check_latency
step "thin pool after mkfs" dmsetup status se-pool
step "nvmfd alive" nvmfd_alive
step "I/O ran on registered buffers" nvmfd_fixed_buffers_in_use
step "disconnect" nvme disconnect-all
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
