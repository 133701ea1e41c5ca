#!/bin/bash
# e2e-image: trixie
# e2e-timeout: 900
# The README's "Secure it" walkthroughs, as written, on the Debian 13 guest (kernel 6.12 with
# NVMe in-band authentication and NVMe/TCP TLS, nvme-cli 2.13, tlshd): the blocks that follow
# `<!-- walkthrough: NAME -->` lines in README.md (shipped next to the binary by run.sh), run in
# one shell session per walkthrough so that the variables they set (HOSTNQN, HOSTKEY, …) carry
# from the host's commands to the target's, as a reader copying keys from one to the other would.
# Host and target share the guest: the README's example address 192.0.2.10 becomes 127.0.0.1,
# and its example host NQN the guest's own (what the README tells the reader to put there).
#   DH-HMAC-CHAP: gen-dhchap-key (host and controller key), owner-only key files, the README's
#   minimal configuration plus its [[subsystems.hosts]] entry, nvmfd started on that file,
#   `nvmfd ctl set-host-key` (the live alternative, same keys), the bidirectional connect, the
#   host kernel's "authenticated" lines, fio verify.
#   TLS: gen-tls-key --insert for the subsystem and discovery, key files, the README's TLS port
#   and [[tls_keys]] with the minimal configuration's subsystem, `discover --tls`,
#   `connect --tls`, kTLS sessions in nvmfd's log, fio verify.
# Not run here: the package installation and `systemctl enable --now tlshd` (no network and no
# systemd in this guest: the image has the packages, tlshd is started by hand on the
# configuration the README's sed line made).
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

README=/opt/nvmfd/README.md
NQN=nqn.2026-12.com.example:vm-images
EXAMPLE_HOST=nqn.2014-08.com.example:host1
ALLOWED_EXAMPLE=nqn.2014-08.com.example:host2
HOSTNQN_GUEST=$(cat /etc/nvme/hostnqn)
W=/tmp/walkthrough
mkdir -p "$W" /var/lib/nvmfd
: >"$W/vars"
TLSHD_PID=

stop_tlshd() { [ -z "$TLSHD_PID" ] || kill "$TLSHD_PID"; }
on_cleanup stop_tlshd
on_cleanup stop_nvmfd
on_cleanup disconnect_all

block() {
	awk -v marker="<!-- walkthrough: $1 -->" '
		$0 == marker { armed = 1; next }
		armed && /^```/ { if (inside) exit; inside = 1; next }
		inside { print }
	' "$README"
}

BLOCKS=(minimal-config dhchap-host dhchap-target dhchap-config dhchap-ctl dhchap-connect
	tls-tlshd tls-host tls-target tls-config tls-connect)
extract() {
	local b
	for b in "${BLOCKS[@]}"; do
		block "$b" | sed "s/192\.0\.2\.10/127.0.0.1/g" >"$W/$b.txt"
		echo "--- $b"
		cat "$W/$b.txt"
		[ -s "$W/$b.txt" ] || { echo "MISMATCH: no '$b' block in $README"; return 1; }
	done
}
step "README blocks" extract

# run_block NAME: the block in a shell that has the variables the earlier blocks set; the ones it
# sets are kept for the next.
run_block() {
	(
		cd "$W" || exit 1
		# `nvmfd` as the README calls it (installed on PATH).
		PATH=/opt/nvmfd:$PATH
		. "$W/vars"
		set -ex
		. "$W/$1.txt"
		set +x
		# (declare -p fails for a name not set yet, after printing the others)
		declare -p HOSTNQN HOSTKEY CTRLKEY PSK DISCPSK 2>/dev/null >"$W/vars.new" || true
	) || return 1
	mv "$W/vars.new" "$W/vars"
}

step "load modules" load_host_modules tcp
step "crng ready" wait_crng

# --- DH-HMAC-CHAP --------------------------------------------------------------------------------
step "gen-dhchap-key (README, host)" run_block dhchap-host
step "key files (README, target)" run_block dhchap-target
key_files_owner_only() {
	stat -c '%a %n' /etc/nvmfd/keys /etc/nvmfd/keys/*
	[ "$(stat -c %a /etc/nvmfd/keys/host1.key)" = 600 ] && [ "$(stat -c %a /etc/nvmfd/keys/host1-ctrl.key)" = 600 ]
}
step "key files are 0600" key_files_owner_only

DH_CONFIG=/etc/nvmfd/nvmfd.toml
compose_dh() {
	mkdir -p /etc/nvmfd
	{
		cat "$W/minimal-config.txt"
		echo
		sed "s/$EXAMPLE_HOST/$HOSTNQN_GUEST/" "$W/dhchap-config.txt"
	} >"$DH_CONFIG"
	cat "$DH_CONFIG"
	"$E2E_NVMFD_BIN" check-config --config "$DH_CONFIG"
}
step "minimal configuration + [[subsystems.hosts]] (README)" compose_dh
step "start nvmfd" start_nvmfd "$DH_CONFIG" 4420
step "nvmfd ctl set-host-key (README)" run_block dhchap-ctl

DEV=
connect_dh() {
	dmesg -C
	run_block dhchap-connect | tee "$W/dh-connect.out" || return 1
	expect_fgrep "host authenticated" "qid 0: authenticated with hash" "$W/dh-connect.out" || return 1
	dmesg | grep -F 'qid 0: controller authenticated' ||
		{ echo "MISMATCH: no bidirectional authentication in the host's kernel log"; return 1; }
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "namespace $DEV"
	fio_verify "$DEV" 8M
}
step "connect with --dhchap-secret/--dhchap-ctrl-secret (README), fio verify" connect_dh
step "nvmfd logged the authentications" grep -E 'authenticat' "$NVMFD_LOG"
step "disconnect" nvme disconnect -n "$NQN"
gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "controller gone" retry 20 0.25 gone
step "stop nvmfd" stop_nvmfd

# --- TLS -----------------------------------------------------------------------------------------
# The README's tlshd block on the image's own /etc/tlshd.conf (ktls-utils' file): its sed line as
# written; the package is already installed and tlshd is started by hand (no systemd here).
tlshd_conf() {
	grep '^sed ' "$W/tls-tlshd.txt" >"$W/tls-tlshd-sed.txt" || { echo "MISMATCH: no sed line"; return 1; }
	run_block tls-tlshd-sed || return 1
	grep -n keyrings /etc/tlshd.conf
	sed -n '/^\[authenticate\]$/,/^\[/p' /etc/tlshd.conf | grep -qx 'keyrings=.nvme' ||
		{ echo "MISMATCH: no keyrings=.nvme in [authenticate]"; return 1; }
}
step "tlshd.conf keyrings=.nvme (README)" tlshd_conf
start_tlshd() {
	tlshd -s -c /etc/tlshd.conf >>"$E2E_OUT/tlshd.log" 2>&1 </dev/null &
	TLSHD_PID=$!
	sleep 1
	kill -0 "$TLSHD_PID" || { echo "tlshd exited:"; cat "$E2E_OUT/tlshd.log"; return 1; }
}
step "start tlshd" start_tlshd
psk_in_keyring() {
	grep -w psk /proc/keys | tee "$W/psk-keys.txt"
	expect_fgrep "subsystem PSK" "NVMe0R01 $HOSTNQN_GUEST $NQN" "$W/psk-keys.txt"
}
step "gen-tls-key --insert (README, host)" run_block tls-host
step "PSKs in the host keyring" psk_in_keyring
step "PSK files, modprobe tls (README, target)" run_block tls-target

TLS_CONFIG=/etc/nvmfd/nvmfd-tls.toml
compose_tls() {
	{
		sed "s/$EXAMPLE_HOST/$HOSTNQN_GUEST/" "$W/tls-config.txt"
		echo
		# The minimal configuration's subsystem (its port replaced by the TLS one), this host
		# allowed in place of the example's.
		sed -n '/^\[\[subsystems\]\]/,$p' "$W/minimal-config.txt" | sed "s/$ALLOWED_EXAMPLE/$HOSTNQN_GUEST/"
	} >"$TLS_CONFIG"
	cat "$TLS_CONFIG"
	"$E2E_NVMFD_BIN" check-config --config "$TLS_CONFIG"
}
step "TLS port + [[tls_keys]] (README)" compose_tls
step "start nvmfd (TLS)" start_nvmfd "$TLS_CONFIG" 4420

connect_tls() {
	run_block tls-connect | tee "$W/tls-connect.out" || return 1
	grep -q "$NQN" "$W/tls-connect.out" || { echo "MISMATCH: $NQN not in the discovery log"; return 1; }
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "namespace $DEV"
	grep 'TLS 1.3 established' "$NVMFD_LOG"
	expect_num "kTLS sessions" "$(grep 'TLS 1.3 established' "$NVMFD_LOG" | grep -c 'record_layer="kernel TLS"')" -ge 2 || return 1
	fio_verify "$DEV" 8M
}
step "discover --tls, connect --tls (README), fio verify" connect_tls
step "disconnect (TLS)" nvme disconnect -n "$NQN"
step "controller gone (TLS)" retry 20 0.25 gone
step "stop nvmfd (TLS)" stop_nvmfd
step "nvmfd log has no ERROR" check_nvmfd_log
finish
