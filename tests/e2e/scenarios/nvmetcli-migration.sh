#!/bin/bash
# e2e-timeout: 600 (two targets, sfdisk and jq runs under TCG)
# Migration from the kernel target: nvmet (configfs) serves a file on a 4 KiB-block ext4 as a
# namespace in ANA group 2 (non-optimized) of a subsystem named the way test tools name them
# (`blktests-subsystem-1`, not an NQN); the host writes a GPT partition table and data through
# it. The configuration is saved as `nvmetcli save` saves it, `nvmfd import-nvmetcli` converts
# it, nvmfd serves the converted file, and the host must see the same thing through nvmfd:
# 4096-byte logical blocks, ANA group 2 non-optimized, the same partition table and data.
# nvmetcli itself is not packaged in Debian 12 (and the guest has no network): `nvmet_save`
# (lib/nvmet.sh) writes the JSON nvmetcli writes, from the same configfs files.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/nvmfd.sh"

NQN=blktests-subsystem-1
ADDR=127.0.0.1
PORT=4420
IMG=/var/tmp/migrate-4k.img
SAVED=/var/tmp/nvmet-config.json
IMPORTED=$E2E_OUT/imported.toml
R=$E2E_OUT/migration
mkdir -p "$R"

# nvmet_teardown does not know ANA group directories: remove ours first.
teardown_nvmet() {
	rmdir "$NVMET/ports/1/ana_groups/2" 2>/dev/null
	nvmet_teardown
}
on_cleanup stop_nvmfd
on_cleanup teardown_nvmet
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "tools present" bash -c 'command -v sfdisk && command -v blockdev'
# nvmet serves a file with the inode's block size capped at 4096 (io-cmd-file.c): the image
# must live on a file system with 4 KiB blocks for the 4 KiB case to be exercised at all.
fs_block() {
	local b
	b=$(stat -c %o "$(dirname "$IMG")") || return 1
	expect_eq "block size of $(dirname "$IMG")" "$b" 4096
}
step "4 KiB-block file system" fs_block
step "backing file" truncate -s 128M "$IMG"

nvmet_setup() {
	nvmet_subsys "$NQN" || return 1
	nvmet_port 1 tcp "$ADDR" "$PORT" || return 1
	# A group exists once a port has a directory for it; new groups start inaccessible.
	mkdir "$NVMET/ports/1/ana_groups/2" || return 1
	echo non-optimized >"$NVMET/ports/1/ana_groups/2/ana_state" || return 1
	local d="$NVMET/subsystems/$NQN/namespaces/1"
	mkdir "$d" || return 1
	echo -n "$IMG" >"$d/device_path" || return 1
	echo 2 >"$d/ana_grpid" || return 1
	echo 1 >"$d/enable" || return 1
	nvmet_link 1 "$NQN"
}
step "nvmet: 4 KiB file namespace in ANA group 2" nvmet_setup
step "nvmet listening" wait_tcp_listen "$PORT"

DEV=
CTRL=
connect_and_find() {
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" || return 1
	DEV=$(wait_ns "$NQN" 1) || return 1
	CTRL=/dev/$(ctrl_of "$NQN" tcp) || return 1
	echo "controller $CTRL, namespace $DEV"
}

# What the host sees: logical block size, LBA format, ANA group and state, partitions, data.
# observe LABEL → files $R/LABEL.*
observe() {
	local label=$1 path
	to_file "$R/$label.ss" blockdev --getss "$DEV" || return 1
	to_file "$R/$label.id-ns.json" nvme id-ns "$DEV" -o json >/dev/null || return 1
	jq -r '"lbads=\(.lbafs[.flbas % 16].ds) anagrpid=\(.anagrpid) nsze=\(.nsze)"' \
		"$R/$label.id-ns.json" | tee "$R/$label.id-ns.txt" || return 1
	for path in /sys/class/nvme/"${CTRL#/dev/}"/nvme*c*n1; do
		[ -e "$path/ana_state" ] && cat "$path/ana_state"
	done | tee "$R/$label.ana-state"
	to_file "$R/$label.ana-log.txt" nvme ana-log "$CTRL" >/dev/null || return 1
	# The partition table as sfdisk dumps it, device names normalised.
	sfdisk -d "$DEV" | sed "s|$DEV|DEV|g" | tee "$R/$label.sfdisk" || return 1
	to_file "$R/$label.p1-size" blockdev --getsize64 "${DEV}p1" || return 1
	dd if="$DEV" bs=1M count=32 iflag=direct status=none | md5sum | tee "$R/$label.md5"
}

step "connect to nvmet" connect_and_find
nvmet_expectations() {
	expect_eq "logical block size via nvmet" "$(blockdev --getss "$DEV")" 4096 || return 1
	local f="$R/nvmet.ana-log.txt"
	nvme ana-log "$CTRL" | tee "$f"
	expect_grep "group 2" '^grpid[[:space:]]*:[[:space:]]*2$' "$f" &&
		expect_grep "non-optimized" '^state[[:space:]]*:[[:space:]]*non-optimized$' "$f"
}
step "nvmet: 4096-byte blocks, ANA group 2 non-optimized" nvmet_expectations
partition() {
	printf 'label: gpt\n,16M\n,\n' | sfdisk --no-reread "$DEV" || return 1
	blockdev --rereadpt "$DEV" || return 1
	retry 20 0.25 test -b "${DEV}p1" || return 1
	# Recognisable data in partition 1, written through the 4 KiB namespace.
	dd if=/dev/urandom of="${DEV}p1" bs=1M count=8 oflag=direct status=none
}
step "GPT + data through nvmet" partition
step "observe through nvmet" observe nvmet

step "save the nvmet configuration (nvmetcli format)" nvmet_save "$SAVED"
step "saved configuration" cp -v "$SAVED" "$E2E_OUT/"
step "saved configuration content" cat "$SAVED"
step "disconnect from nvmet" nvme disconnect -n "$NQN"
check_gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "controller gone" retry 20 0.25 check_gone
step "nvmet down" teardown_nvmet

import_config() {
	"$E2E_NVMFD_BIN" import-nvmetcli "$SAVED" >"$IMPORTED" 2>"$R/import-warnings.txt"
	local rc=$?
	cat "$IMPORTED"
	echo "--- warnings:"
	cat "$R/import-warnings.txt"
	[ $rc = 0 ] || return 1
	expect_grep "block_size 4096 carried over" '^block_size = 4096$' "$IMPORTED" &&
		expect_grep "ANA group 2 declared" '^\[\[ana_groups\]\]$' "$IMPORTED" &&
		expect_grep "ANA group 2 non-optimized" '^state = "non-optimized"$' "$IMPORTED" &&
		expect_grep "namespace in group 2" '^ana_group = 2$' "$IMPORTED" &&
		expect_grep "subsystem name kept" "^nqn = \"$NQN\"$" "$IMPORTED"
}
step "nvmfd import-nvmetcli" import_config
step "imported configuration valid" "$E2E_NVMFD_BIN" check-config --config "$IMPORTED"
step "start nvmfd on it" start_nvmfd "$IMPORTED" "$PORT"
step "connect to nvmfd" connect_and_find
step "observe through nvmfd" observe nvmfd

same() { # same SUFFIX WHAT
	if cmp -s "$R/nvmet.$1" "$R/nvmfd.$1"; then
		echo "ok: $2 the same: $(head -c 200 "$R/nvmfd.$1")"
	else
		echo "MISMATCH: $2 differs"
		diff "$R/nvmet.$1" "$R/nvmfd.$1"
		return 1
	fi
}
step "same logical block size (4096)" same ss "logical block size"
step "same LBA format, ANA group and size" same id-ns.txt "Identify Namespace"
step "same ANA state" same ana-state "ANA state"
step "same partition table" same sfdisk "sfdisk dump"
step "same partition 1 size" same p1-size "partition 1 size"
step "same data" same md5 "first 32 MiB"
nvmfd_ana_log() {
	expect_grep "group 2" '^grpid[[:space:]]*:[[:space:]]*2$' "$R/nvmfd.ana-log.txt" &&
		expect_grep "non-optimized" '^state[[:space:]]*:[[:space:]]*non-optimized$' \
			"$R/nvmfd.ana-log.txt"
}
step "nvmfd ana-log: group 2 non-optimized" nvmfd_ana_log
name_warning() {
	expect_grep "name warning in nvmfd's log" "not a well-formed NQN" "$NVMFD_LOG"
}
step "nvmfd warned about the name, served it anyway" name_warning
step "disconnect from nvmfd" nvme disconnect -n "$NQN"
step "controller gone (nvmfd)" retry 20 0.25 check_gone
step "stop nvmfd" stop_nvmfd
step "nvmfd log clean" check_nvmfd_log
finish
