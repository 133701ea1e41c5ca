#!/bin/bash
# e2e-timeout: 600 (fio on every namespace under TCG on a loaded 2-core host)
# nvmfd over NVMe/TCP on 127.0.0.1:4420 with the stock Linux host: discovery, connect with two
# I/O queues, the admin commands nvme-cli issues, fio with crc32c verification on a RAM, a 512 B
# file and a 4096 B file namespace, clean disconnect and shutdown, no ERROR in nvmfd's log.
# tcp-digest runs the same with header and data digests (E2E_DIGESTS=1).
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/tcp-basic.toml
NQN=nqn.2026-12.dev.nvmfd:e2e
ADDR=127.0.0.1
PORT=4420
IN_CAPSULE=8192
FIO_SIZE=${FIO_SIZE:-64M}
R=$E2E_OUT/nvmfd-identify
mkdir -p "$R"
CONNECT_OPTS=(-i 2)
[ "${E2E_DIGESTS:-0}" = 1 ] && CONNECT_OPTS+=(--hdr-digest --data-digest)

on_cleanup stop_nvmfd
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
step "start nvmfd" start_nvmfd "$CONFIG" "$PORT"

discover() {
	to_file "$R/discover.json" nvme discover -t tcp -a "$ADDR" -s "$PORT" -o json &&
		check_discovery "$R/discover.json" "$NQN" tcp "$ADDR" "$PORT"
}
step "discover" discover
step "connect" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" "${CONNECT_OPTS[@]}"
CTRL=
find_ctrl() { CTRL=/dev/$(ctrl_of "$NQN" tcp) && echo "controller $CTRL"; }
step "controller" find_ctrl
DEV=()
step "namespaces 1-3 appear" find_namespaces "$NQN" 1 2 3
info "controller $CTRL, namespaces ${DEV[*]}"

list_shows_all() {
	local out n bad=0
	out=$(nvme list) || return 1
	echo "$out"
	for n in 1 2 3; do
		grep -qw -- "${DEV[n]}" <<<"$out" || { echo "MISMATCH: ${DEV[n]} missing"; bad=1; }
	done
	return $bad
}
step "nvme list" list_shows_all
step "id-ctrl" nvme id-ctrl "$CTRL"
step "id-ctrl json" to_file "$R/id-ctrl.json" nvme id-ctrl "$CTRL" -o json
step "id-ctrl fields" check_id_ctrl "$R/id-ctrl.json" "$NQN" "$IN_CAPSULE" 3
step "id-ns 1" nvme id-ns "${DEV[1]}"
for n in 1 2 3; do
	step "id-ns $n json" to_file "$R/id-ns-$n.json" nvme id-ns "${DEV[n]}" -o json
done
step "id-ns 1 fields (256 MiB, 512 B)" check_id_ns "$R/id-ns-1.json" $((256 << 20)) 9
step "id-ns 2 fields (256 MiB, 512 B)" check_id_ns "$R/id-ns-2.json" $((256 << 20)) 9
step "id-ns 3 fields (256 MiB, 4096 B)" check_id_ns "$R/id-ns-3.json" $((256 << 20)) 12
step "ns-descs" check_ns_descs "${DEV[1]}"
step "smart-log" check_smart_log "$CTRL"
step "error-log" nvme error-log "$CTRL"
step "get-feature 7 (number of queues)" nvme get-feature "$CTRL" -f 7

for n in ${FIO_NSIDS:-1 2 3}; do
	step "fio write+verify nsid $n" fio_verify "${DEV[n]}" "$FIO_SIZE"
	step "fio re-verify nsid $n" fio_reverify "${DEV[n]}" "$FIO_SIZE"
done
step "nvmfd alive after I/O" nvmfd_alive
if [ "${E2E_DIGESTS:-0}" = 1 ]; then
	# The host gives no sysfs view of what ICResp granted, so nvmfd's debug log is the witness
	# that the I/O above really ran with both digests: admin + 2 I/O queues.
	digests_logged() {
		local n
		grep -i digest "$NVMFD_LOG"
		n=$(grep -Eic 'digest.*header: *true.*data: *true' "$NVMFD_LOG")
		expect_num "connections logged with header+data digests" "$n" -ge 3
	}
	step "nvmfd used both digests" digests_logged
fi
step "disconnect" nvme disconnect -n "$NQN"
check_gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "controller gone" retry 20 0.25 check_gone
step "stop nvmfd (SIGTERM)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
