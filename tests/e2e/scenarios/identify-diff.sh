#!/bin/bash
# nvmfd and the kernel's nvmet side by side in one guest (nvmfd on 127.0.0.1:4420, nvmet on
# 127.0.0.1:4421): Identify Controller / Namespace fields that describe the NVMe/TCP binding or
# that the Linux host keys behaviour on must agree; every other difference is listed in
# identify-diff.txt for reading.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/tcp-basic.toml
NQN=nqn.2026-12.dev.nvmfd:e2e
REF_NQN=nqn.2026-12.dev.nvmfd:reference
D=$E2E_OUT/identify-diff
mkdir -p "$D"

on_cleanup nvmet_teardown
on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "reference backing file" truncate -s 256M /var/tmp/ref0.img
step "nvmet subsystem" nvmet_subsys "$REF_NQN"
step "nvmet namespace" nvmet_ns "$REF_NQN" 1 /var/tmp/ref0.img
step "nvmet tcp port 4421" nvmet_port 1 tcp 127.0.0.1 4421
step "nvmet export" nvmet_link 1 "$REF_NQN"
step "start nvmfd" start_nvmfd "$CONFIG" 4420
step "connect nvmet" nvme connect -t tcp -a 127.0.0.1 -s 4421 -n "$REF_NQN" -i 2
step "connect nvmfd" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" -i 2
identify() { # NQN PREFIX
	local c d
	c=/dev/$(ctrl_of "$1" tcp) || return 1
	d=$(wait_ns "$1" 1) || return 1
	nvme id-ctrl "$c" -o json >"$D/$2-id-ctrl.json" || return 1
	nvme id-ns "$d" -o json >"$D/$2-id-ns.json" || return 1
	echo "$1: $c $d"
}
step "identify nvmet" identify "$REF_NQN" nvmet
step "identify nvmfd" identify "$NQN" nvmfd

# jq expressions whose values must be equal. Masks keep only the bits that matter here.
MUST_MATCH_CTRL=(
	.sqes .cqes .iorcsz .icdoff .fcatt .msdbd .cntrltype
	'.vwc & 1'                   # volatile write cache present (else no Flush/FUA)
	'.sgls & 1'                  # SGLs supported
	'(.sgls / 1048576 | floor) % 2' # SGL offset (in-capsule data) supported
	'(.oaes / 256 | floor) % 2'  # namespace attribute notices
	'.ctratt % 2'                # 128-bit host identifier
	'(.cmic / 2 | floor) % 2'    # may have several controllers (one per host connection)
)
MUST_MATCH_NS=(
	'.nmic % 2'                  # namespace may be attached to several controllers
)

compare() {
	local bad=0 e a b
	for e in "${MUST_MATCH_CTRL[@]}"; do
		a=$(jq -r "$e" "$D/nvmet-id-ctrl.json") b=$(jq -r "$e" "$D/nvmfd-id-ctrl.json")
		if [ "$a" = "$b" ]; then echo "ok: id-ctrl $e = $a"; else
			echo "MISMATCH: id-ctrl $e: nvmet $a, nvmfd $b"
			bad=1
		fi
	done
	for e in "${MUST_MATCH_NS[@]}"; do
		a=$(jq -r "$e" "$D/nvmet-id-ns.json") b=$(jq -r "$e" "$D/nvmfd-id-ns.json")
		if [ "$a" = "$b" ]; then echo "ok: id-ns $e = $a"; else
			echo "MISMATCH: id-ns $e: nvmet $a, nvmfd $b"
			bad=1
		fi
	done
	return $bad
}
listing() {
	local k
	{
		printf '%-12s %-42s %s\n' field nvmet nvmfd
		for k in $(jq -r 'to_entries[] | select(.value | type != "array" and type != "object") | .key' \
			"$D/nvmet-id-ctrl.json"); do
			a=$(jq -r ".$k" "$D/nvmet-id-ctrl.json") b=$(jq -r ".$k" "$D/nvmfd-id-ctrl.json")
			[ "$a" = "$b" ] || printf '%-12s %-42s %s\n' "$k" "$a" "$b"
		done
	} | tee "$D/identify-diff.txt"
}
step "fields that must match" compare
step "differences (informational)" listing
step "disconnect both" nvme disconnect-all
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
