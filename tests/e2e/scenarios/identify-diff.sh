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
	'.vwc % 2'                   # volatile write cache present (else no Flush/FUA)
	'.sgls % 2'                  # SGLs supported
	'(.sgls / 1048576 | floor) % 2' # SGL offset (in-capsule data) supported
	'(.oaes / 256 | floor) % 2'  # namespace attribute notices
	'.ctratt % 2'                # 128-bit host identifier
	'(.cmic / 2 | floor) % 2'    # may have several controllers (one per host connection)
)
MUST_MATCH_NS=(
	'.nmic % 2'                  # namespace may be attached to several controllers
)

# values FILE EXPR…: each expression's value, one per line, from a single jq run.
values() {
	local f=$1
	shift
	local IFS=,
	jq -r "[$*] | map(tostring) | .[]" "$f"
}
compare_set() { # WHAT NVMET-JSON NVMFD-JSON EXPR…
	local what=$1 a=$2 b=$3 bad=0 i
	shift 3
	local -a va vb
	mapfile -t va < <(values "$a" "$@")
	mapfile -t vb < <(values "$b" "$@")
	[ "${#va[@]}" = $# ] && [ "${#vb[@]}" = $# ] || { echo "jq failed on $a or $b"; return 1; }
	for ((i = 1; i <= $#; i++)); do
		if [ "${va[i - 1]}" = "${vb[i - 1]}" ]; then
			echo "ok: $what ${!i} = ${va[i - 1]}"
		else
			echo "MISMATCH: $what ${!i}: nvmet ${va[i - 1]}, nvmfd ${vb[i - 1]}"
			bad=1
		fi
	done
	return $bad
}
compare() {
	local bad=0
	compare_set id-ctrl "$D/nvmet-id-ctrl.json" "$D/nvmfd-id-ctrl.json" "${MUST_MATCH_CTRL[@]}" || bad=1
	compare_set id-ns "$D/nvmet-id-ns.json" "$D/nvmfd-id-ns.json" "${MUST_MATCH_NS[@]}" || bad=1
	return $bad
}
listing() {
	local k
	local -A a=() b=()
	load_json a "$D/nvmet-id-ctrl.json" && load_json b "$D/nvmfd-id-ctrl.json" || return 1
	{
		printf '%-12s %-42s %s\n' field nvmet nvmfd
		for k in $(printf '%s\n' "${!a[@]}" | sort); do
			[ "${a[$k]}" = "${b[$k]:-}" ] || printf '%-12s %-42s %s\n' "$k" "${a[$k]}" "${b[$k]:-(absent)}"
		done
	} | tee "$D/identify-diff.txt"
}
step "fields that must match" compare
step "differences (informational)" listing
step "disconnect both" nvme disconnect-all
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
