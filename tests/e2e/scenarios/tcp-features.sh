#!/bin/bash
# e2e-timeout: 450 (several fio runs under TCG on a loaded 2-core host)
# What the Linux host does beyond plain I/O, against nvmfd over TCP: two paths to one subsystem
# folded into one multipath device, I/O larger than MDTS (split by the host) and at full queue
# depth, Write Zeroes / Deallocate / Flush, an idle period longer than the keep-alive timeout,
# losing one path under I/O, and a namespace hot-added and removed by a SIGHUP reload (reaching
# the host through a Namespace Attribute Changed AEN).
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=/tmp/nvmfd-features.toml
NQN=nqn.2026-12.dev.nvmfd:e2e-features
ADDR=127.0.0.1
cp "$E2E_DIR/configs/tcp-features.toml" "$CONFIG"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

# ctrl_on_port PORT: the controller (nvmeN) of this subsystem reached through trsvcid PORT.
ctrl_on_port() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
		grep -q "trsvcid=$1\b" "$c/address" && { basename "$c"; return 0; }
	done
	return 1
}

step "load host modules" load_host_modules tcp
step "start nvmfd (ports 4420, 4421)" start_nvmfd "$CONFIG" 4420 4421
step "connect path A (4420)" nvme connect -t tcp -a "$ADDR" -s 4420 -n "$NQN" -i 2
step "connect path B (4421)" nvme connect -t tcp -a "$ADDR" -s 4421 -n "$NQN" -i 2
DEV1='' DEV2=''
find_namespaces() {
	DEV1=$(wait_ns "$NQN" 1) && DEV2=$(wait_ns "$NQN" 2) && echo "nsid 1: $DEV1, nsid 2: $DEV2"
}
step "namespaces appear" find_namespaces
info "namespaces $DEV1 $DEV2"
count_entries() { # DIR REGEX: entries of a sysfs directory whose name matches
	local e n=0
	for e in "$1"/*; do
		[[ "${e##*/}" =~ $2 ]] && n=$((n + 1))
	done
	echo "$n"
}
one_subsystem_two_paths() {
	local s n
	s=$(subsys_dir "$NQN") || { echo "no subsystem for $NQN"; return 1; }
	nvme list-subsys
	# Both controllers under one subsystem and one head device per namespace: the host matched
	# the subsystem NQN and the namespace identifiers (NMIC/CMIC, UUID/NGUID) across the paths.
	n=$(count_entries "$s" '^nvme[0-9]+$')
	expect_num "controllers in $(basename "$s")" "$n" -eq 2 || return 1
	n=$(count_entries "$s" '^nvme[0-9]+n1$')
	expect_num "head devices for nsid 1" "$n" -eq 1 || return 1
	# Each controller holds a hidden per-path disk (nvmeXcYn1) behind the head nvmeXn1.
	local c
	n=0
	for c in $(ctrl_on_port 4420) $(ctrl_on_port 4421); do
		n=$((n + $(count_entries "/sys/class/nvme/$c" '^nvme[0-9]+c[0-9]+n1$')))
	done
	expect_num "path disks for nsid 1" "$n" -eq 2
}
step "one subsystem, two paths" one_subsystem_two_paths
distinct_cntlids() {
	local a b
	a=$(cat "/sys/class/nvme/$(ctrl_on_port 4420)/cntlid") b=$(cat "/sys/class/nvme/$(ctrl_on_port 4421)/cntlid")
	echo "cntlid via 4420: $a, via 4421: $b"
	[ "$a" != "$b" ] || { echo "MISMATCH: both paths got cntlid $a (must be unique in the subsystem)"; return 1; }
}
step "cntlids unique across ports" distinct_cntlids

step "fio 1 MiB blocks (= MDTS)" fio_verify "$DEV1" 32M --bsrange=1m-1m
step "fio 4 MiB blocks (host splits by MDTS)" fio_verify "$DEV1" 32M --bsrange=4m-4m
step "fio queue depth 128" fio_verify "$DEV1" 8M --bsrange=4k-4k --iodepth=128

queue_limit() { # DEV ATTR: a queue limit the host derived from Identify, must be > 0
	local v
	v=$(cat "/sys/block/${1#/dev/}/queue/$2")
	expect_num "$2 of $1" "$v" -gt 0
}
write_zeroes() {
	# ONCS advertises Write Zeroes, so BLKZEROOUT goes out as that command, not as zero writes.
	queue_limit "$DEV2" write_zeroes_max_bytes || return 1
	head -c 1M /dev/urandom >/tmp/rnd &&
		dd if=/tmp/rnd of="$DEV2" bs=1M seek=4 oflag=direct conv=fsync status=none || return 1
	blkdiscard -z -o $((4 << 20)) -l $((1 << 20)) "$DEV2" || return 1
	dd if="$DEV2" bs=1M skip=4 count=1 iflag=direct status=none >/tmp/back || return 1
	if cmp -s /tmp/back <(head -c 1M /dev/zero); then echo "ok: range reads back as zeroes"; else
		echo "MISMATCH: range does not read back as zeroes after Write Zeroes"
		return 1
	fi
}
step "write zeroes" write_zeroes
deallocate() {
	queue_limit "$DEV2" discard_max_bytes || return 1
	blkdiscard -o $((8 << 20)) -l $((1 << 20)) "$DEV2"
}
step "deallocate (DSM)" deallocate
step "flush" nvme flush "$DEV2"

# Copy and Verify (NVM Command Set 1.0 §3.3.1, §3.3.5) by nvme-cli's passthrough: ONCS and
# OCFS advertise them, two source ranges land behind each other at the destination.
copy_ranges() {
	local oncs
	oncs=$(nvme id-ctrl "$DEV2" | awk '/^oncs/ {print $3}')
	expect_num "ONCS Copy (bit 8) and Verify (bit 7) of $oncs" $((oncs & 0x180)) -eq $((0x180)) || return 1
	head -c 8K /dev/urandom >/tmp/src &&
		dd if=/tmp/src of="$DEV2" bs=4K seek=4096 oflag=direct conv=fsync status=none || return 1
	# Sources: LBAs 32768..32775 and 32776..32783 (4 KiB each), in reverse order, to 40960.
	nvme copy "$DEV2" --format=0 --sdlba=40960 --slbs=32776,32768 --blocks=7,7 || return 1
	dd if="$DEV2" bs=4K skip=5120 count=2 iflag=direct status=none >/tmp/copied || return 1
	if cmp -s /tmp/copied <(tail -c 4K /tmp/src; head -c 4K /tmp/src); then
		echo "ok: both ranges read back at the destination"
	else
		echo "MISMATCH: the copied range differs from its sources"
		return 1
	fi
}
step "copy (nvme copy)" copy_ranges
step "verify (nvme verify)" nvme verify "$DEV2" --start-block=0 --block-count=2047

idle_past_kato() {
	# The host's I/O controllers use KATO 5 s; 12 s without I/O needs working keep-alive.
	local before after
	before=$(dmesg | wc -l)
	sleep 12
	dmesg | tail -n +$((before + 1)) | tee /tmp/idle-dmesg
	if grep -Eiq 'keep.?alive|error recovery|reconnect|resetting' /tmp/idle-dmesg; then
		echo "MISMATCH: the host reported trouble while idle (above)"
		return 1
	fi
	after=$(cat "/sys/class/nvme/$(ctrl_on_port 4420)/state")/$(cat "/sys/class/nvme/$(ctrl_on_port 4421)/state")
	expect_eq "controller states after 12 s idle" "$after" live/live
}
step "idle 12 s (> KATO)" idle_past_kato

hot_add() {
	cat >>"$CONFIG" <<-'EOF'

		[[subsystems.namespaces]]
		nsid = 3
		ram_size = "32M"
	EOF
	kill -HUP "$NVMFD_PID" || return 1
	local d
	d=$(wait_ns "$NQN" 3 20) || return 1
	echo "nsid 3 appeared as $d"
	dd if=/dev/zero of="$d" bs=1M count=1 oflag=direct status=none
}
step "hot-add nsid 3 (SIGHUP)" hot_add
hot_remove() {
	cp "$E2E_DIR/configs/tcp-features.toml" "$CONFIG"
	kill -HUP "$NVMFD_PID" || return 1
	local i
	for ((i = 0; i < 200; i++)); do
		ns_dev "$NQN" 3 >/dev/null || { echo "nsid 3 gone after $((i / 10)).$((i % 10)) s"; return 0; }
		sleep 0.1
	done
	echo "MISMATCH: nsid 3 still present 20 s after the reload removed it"
	nvme list
	return 1
}
step "hot-remove nsid 3 (SIGHUP)" hot_remove

lose_path_a() {
	local c
	c=$(ctrl_on_port 4420) || return 1
	nvme disconnect -d "$c" || return 1
	echo "disconnected $c (4420)"
}
step "drop path A" lose_path_a
step "fio over path B only" fio_verify "$DEV1" 8M
step "nvmfd alive" nvmfd_alive
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
