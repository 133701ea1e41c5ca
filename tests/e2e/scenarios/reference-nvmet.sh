#!/bin/bash
# Reference run: the kernel's nvmet target over TCP on 127.0.0.1, driven by the stock host.
# Proves the harness (and the guest's host stack) independently of nvmfd, and saves
# id-ctrl/id-ns JSON for diffing against nvmfd.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"

NQN=nqn.2026-12.dev.nvmfd:reference
ADDR=127.0.0.1
PORT=4420
REF=$E2E_OUT/reference
mkdir -p "$REF"

on_cleanup nvmet_teardown
on_cleanup disconnect_all

step "load host modules" load_host_modules tcp
step "backing file" truncate -s 256M /var/tmp/ref0.img
step "nvmet subsystem" nvmet_subsys "$NQN"
step "nvmet namespace" nvmet_ns "$NQN" 1 /var/tmp/ref0.img
step "nvmet tcp port" nvmet_port 1 tcp "$ADDR" "$PORT"
step "nvmet export" nvmet_link 1 "$NQN"
step "port listening" wait_tcp_listen "$PORT"

check_discovery() {
	nvme discover -t tcp -a "$ADDR" -s "$PORT" -o json >"$REF/discover.json" || return 1
	cat "$REF/discover.json"
	expect_eq "discovery entry subnqn" \
		"$(jfield "$REF/discover.json" "[.records[] | select(.subnqn == \"$NQN\")][0].traddr")" "$ADDR"
}
step "discover" check_discovery
step "connect" nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
DEV=
find_dev() { DEV=$(wait_ns "$NQN" 1) && echo "namespace 1 is $DEV"; }
step "namespace device" find_dev
CTRL=/dev/$(ctrl_of "$NQN" tcp)
info "controller $CTRL, namespace $DEV"

step "nvme list" expect_grep "nvme list shows $DEV" "${DEV#/dev/}" <(nvme list)
step "id-ctrl" nvme id-ctrl "$CTRL"
step "id-ctrl json" to_file "$REF/id-ctrl.json" nvme id-ctrl "$CTRL" -o json
step "id-ns" nvme id-ns "$DEV"
step "id-ns json" to_file "$REF/id-ns.json" nvme id-ns "$DEV" -o json
step "ns-descs" nvme ns-descs "$DEV"
step "smart-log" nvme smart-log "$CTRL"
step "error-log" nvme error-log "$CTRL"
step "get-feature 7" nvme get-feature "$CTRL" -f 7
step "fio write+verify" fio_verify "$DEV" 64M
step "fio re-verify" fio_reverify "$DEV" 64M
step "disconnect" nvme disconnect -n "$NQN"
check_gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "controller gone" retry 20 0.25 check_gone
finish
