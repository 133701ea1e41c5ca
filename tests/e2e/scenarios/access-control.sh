#!/bin/bash
# Host access control with the stock Linux host: subsystem "acl" allows host NQN A only,
# subsystem "open" allows any host. Host B's discovery log lists "open" but not "acl"; B's
# connect to "acl" is refused with Connect Invalid Host (SCT 1h / SC 84h, DNR: 0x4184), the
# kernel says so, and nvmfd logs the rejection with B's NQN and address; A connects and does I/O.
# Per-host namespace visibility: "open" has namespace 2 shown to A only: A's controller lists
# namespaces 1 and 2, B's lists 1 and has no path device for 2; a SIGHUP reload that shows 2 to
# B raises Namespace Attribute Changed on B's controller, the kernel rescans and the namespace
# appears on B's controller.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmfd.sh"

# Writable copy: the visibility steps edit it and reload.
CONFIG=/tmp/nvmfd-access-control.toml
cp "$E2E_DIR/configs/access-control.toml" "$CONFIG"
ACL=nqn.2026-12.dev.nvmfd:acl
OPEN=nqn.2026-12.dev.nvmfd:open
HOST_A=nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a
HOST_B=nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b
HOSTID_A=aaaaaaaa-0000-4000-8000-00000000000a
HOSTID_B=bbbbbbbb-0000-4000-8000-00000000000b
ADDR=127.0.0.1
PORT=4420
R=$E2E_OUT/access-control
mkdir -p "$R"

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT" 4421

# discover_as HOSTNQN HOSTID FILE
discover_as() {
	to_file "$3" nvme discover -t tcp -a "$ADDR" -s "$PORT" --hostnqn "$1" --hostid "$2"
}
discover_b() {
	discover_as "$HOST_B" "$HOSTID_B" "$R/discover-b.txt" || return 1
	expect_grep "host B sees the open subsystem" "subnqn:[[:space:]]*${OPEN}[[:space:]]*\$" "$R/discover-b.txt" || return 1
	if grep -q -- "$ACL" "$R/discover-b.txt"; then
		echo "MISMATCH: host B's discovery log lists $ACL"
		return 1
	fi
	echo "ok: host B's discovery log does not list $ACL"
}
step "discover as host B: acl not listed" discover_b
discover_a() {
	discover_as "$HOST_A" "$HOSTID_A" "$R/discover-a.txt" || return 1
	expect_grep "host A sees acl" "subnqn:[[:space:]]*${ACL}[[:space:]]*\$" "$R/discover-a.txt" &&
		expect_grep "host A sees open" "subnqn:[[:space:]]*${OPEN}[[:space:]]*\$" "$R/discover-a.txt"
}
step "discover as host A: both listed" discover_a

connect_b_refused() {
	local rc
	dmesg -C
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$ACL" --hostnqn "$HOST_B" --hostid "$HOSTID_B" \
		>"$R/connect-b.txt" 2>&1
	rc=$?
	cat "$R/connect-b.txt"
	dmesg >"$R/dmesg-connect-b.txt"
	cat "$R/dmesg-connect-b.txt"
	if [ "$rc" = 0 ] || ctrl_of "$ACL" >/dev/null; then
		echo "MISMATCH: host B connected to $ACL (nvme connect exit $rc)"
		return 1
	fi
	echo "ok: nvme connect as host B failed (exit $rc)"
	# Linux (drivers/nvme/host/fabrics.c, nvmf_log_connect_error) names the status it got:
	# only Connect Invalid Host yields "is not allowed".
	expect_grep "kernel reports Connect Invalid Host" "Connect for subsystem $ACL is not allowed, hostnqn: $HOST_B" \
		"$R/dmesg-connect-b.txt" &&
		expect_grep "status 0x4184 (DNR, SCT 1h, SC 84h = 16772)" "failed to connect queue: 0 ret=16772" \
			"$R/dmesg-connect-b.txt"
}
step "connect as host B to acl: refused (invalid host)" connect_b_refused
rejection_logged() {
	grep -F "Connect rejected: host not allowed" "$NVMFD_LOG" >"$R/rejections.txt"
	expect_grep "nvmfd logs the rejection with host B's NQN" "hostnqn=$HOST_B" "$R/rejections.txt" &&
		expect_grep "… the subsystem" "subnqn=$ACL" "$R/rejections.txt" &&
		expect_grep "… and the host's address" "remote=$ADDR:[0-9]+" "$R/rejections.txt"
}
step "nvmfd logged the rejection (NQN, address)" rejection_logged
step "host B may use the open subsystem" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$OPEN" \
	--hostnqn "$HOST_B" --hostid "$HOSTID_B"
step "disconnect host B" nvme disconnect -n "$OPEN"

step "connect as host A to acl" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$ACL" \
	--hostnqn "$HOST_A" --hostid "$HOSTID_A" -i 1
DEV=
find_dev() { DEV=$(wait_ns "$ACL" 1) && echo "acl nsid 1 is $DEV"; }
step "host A sees the namespace" find_dev
host_a_io() {
	head -c 1M /dev/urandom >/tmp/a.bin &&
		dd if=/tmp/a.bin of="$DEV" bs=64k oflag=direct status=none &&
		dd if="$DEV" of=/tmp/a.back bs=64k count=16 iflag=direct status=none &&
		cmp /tmp/a.bin /tmp/a.back && echo "ok: 1 MiB written and read back"
}
step "host A I/O verifies" host_a_io
host_a_hostnqn() {
	local c
	c=$(ctrl_of "$ACL") || return 1
	expect_eq "hostnqn of $c" "$(cat "/sys/class/nvme/$c/hostnqn")" "$HOST_A"
}
step "host A's controller carries NQN A" host_a_hostnqn
step "disconnect host A" nvme disconnect -n "$ACL"

# --- per-host namespace visibility on "open" ---
step "connect host A to open" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$OPEN" \
	--hostnqn "$HOST_A" --hostid "$HOSTID_A" -i 1
# Second port: nvme-cli 2.4 takes a second connect to one address and subsystem as "already
# connected" whatever the host NQN.
step "connect host B to open (port 4421)" nvme connect -t tcp -a "$ADDR" -s 4421 -n "$OPEN" \
	--hostnqn "$HOST_B" --hostid "$HOSTID_B" -i 1
CA=
CB=
find_ctrls() {
	CA=$(ctrl_of_host "$OPEN" "$HOST_A") && CB=$(ctrl_of_host "$OPEN" "$HOST_B") &&
		echo "host A: $CA, host B: $CB"
}
step "controllers of host A and host B" find_ctrls
# list_ns CTRL FILE: the active NSIDs nvmfd reports to CTRL (Identify CNS 02h), one line.
list_ns() {
	nvme list-ns "/dev/$1" >"$2" || return 1
	sed -n 's/.*:0x\([0-9a-f]*\).*/\1/p' "$2" | tr '\n' ' ' | sed 's/ $//'
}
# path_nsids CTRL: the NSIDs the kernel has a block device for on CTRL (a path device under
# native multipath, else the controller's namespace), ascending, one line.
path_nsids() {
	local b
	for b in /sys/class/nvme/"$1"/nvme*n*; do
		[ -e "$b/nsid" ] && cat "$b/nsid"
	done | sort -n | tr '\n' ' ' | sed 's/ $//'
}
wait_path_nsids() { # CTRL EXPECTED SECS
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		[ "$(path_nsids "$1")" = "$2" ] && break
		sleep 0.1
	done
	expect_eq "namespaces the kernel has on $1" "$(path_nsids "$1")" "$2"
}
visibility_before() {
	local a b
	a=$(list_ns "$CA" "$R/list-ns-a.txt") || return 1
	b=$(list_ns "$CB" "$R/list-ns-b.txt") || return 1
	cat "$R/list-ns-a.txt" "$R/list-ns-b.txt"
	nvme list -v >"$R/nvme-list-before.txt" 2>&1
	cat "$R/nvme-list-before.txt"
	expect_eq "host A's active namespaces (nvme list-ns)" "$a" "1 2" &&
		expect_eq "host B's active namespaces (nvme list-ns)" "$b" "1" &&
		wait_path_nsids "$CA" "1 2" 10 && wait_path_nsids "$CB" "1" 1 &&
		expect_eq "host B: Identify Namespace of nsid 2 is zeroed (nsze)" \
			"$(nvme id-ns "/dev/$CB" -n 2 -o json | sed -n 's/.*"nsze" *: *\([0-9]*\).*/\1/p')" 0
}
step "host A sees namespaces 1 and 2, host B only 1" visibility_before
show_to_b() {
	sed -i "s|^hosts = \[\"$HOST_A\"\]|hosts = [\"$HOST_A\", \"$HOST_B\"]|" "$CONFIG" || return 1
	grep -n '^hosts' "$CONFIG"
	grep -qF "\"$HOST_B\"]" "$CONFIG" || { echo "config edit failed"; return 1; }
	kill -HUP "$NVMFD_PID" || return 1
	# The kernel rescans on the Namespace Attribute Changed AEN (no udev: sysfs is the truth).
	wait_path_nsids "$CB" "1 2" 20 || return 1
	local b
	b=$(list_ns "$CB" "$R/list-ns-b-after.txt") || return 1
	nvme list -v >"$R/nvme-list-after.txt" 2>&1
	cat "$R/list-ns-b-after.txt" "$R/nvme-list-after.txt"
	expect_eq "host B's active namespaces after the reload" "$b" "1 2" &&
		wait_path_nsids "$CA" "1 2" 1
}
step "reload shows namespace 2 to host B: it appears on B's controller" show_to_b
reload_logged() {
	grep -F "configuration reloaded" "$NVMFD_LOG" >"$R/reloads.txt"
	expect_fgrep "nvmfd's reload summary names the visibility change" \
		"shown to other hosts [(\"$OPEN\", 2)]" "$R/reloads.txt"
}
step "nvmfd logged the visibility change" reload_logged
step "disconnect hosts A and B from open" nvme disconnect -n "$OPEN"
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
