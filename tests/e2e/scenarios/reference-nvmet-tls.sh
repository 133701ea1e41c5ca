#!/bin/bash
# e2e-image: trixie
# e2e-timeout: 600
# Reference run for NVMe/TCP over TLS 1.3 (NVMe/TCP Transport Specification, retained PSKs):
# the kernel's nvmet (6.12) on 127.0.0.1 with a port that requires TLS, tlshd doing both
# handshakes (host and target share this kernel and its .nvme keyring), the stock host with
# nvme-cli 2.13. PSKs made by `nvme gen-tls-key --insert`. Discovery and an I/O connect over TLS
# work with verified I/O; plaintext discovery and connect to the TLS-only port are refused. The
# observable results are saved in out/reference/ (recorded in FINDINGS.md, R-tls-*): the nvmfd
# scenario for TLS must produce the same.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"

NQN=nqn.2026-12.dev.nvmfd:reference-tls
DISC_NQN=nqn.2014-08.org.nvmexpress.discovery
ADDR=127.0.0.1
PORT=4420
HOSTNQN=$(cat /etc/nvme/hostnqn)
REF=$E2E_OUT/reference
mkdir -p "$REF"
TLSHD_PID=

stop_tlshd() { [ -z "$TLSHD_PID" ] || kill "$TLSHD_PID"; }
on_cleanup stop_tlshd
on_cleanup nvmet_teardown
on_cleanup disconnect_all

load_modules() {
	load_host_modules tcp || return 1
	modprobe nvmet_tcp || return 1
	modprobe tls || return 1
	# The .nvme keyring belongs to nvme_keyring (a dependency of nvme_tcp and nvmet_tcp).
	grep -w '\.nvme' /proc/keys
}
step "load modules" load_modules
step "crng ready" wait_crng
info "nvme-cli: $(nvme version | head -n1), kernel $(uname -r)"

# tlshd: user-space TLS handshakes for the kernel (handshake netlink family), PSKs from the
# .nvme keyring. Logs to stderr (-s) at a level that names the identity and the outcome.
start_tlshd() {
	cat >/etc/tlshd.conf <<-'CONF'
		[debug]
		loglevel=3
		tls=0
		nl=0
		[authenticate]
		keyrings=.nvme
	CONF
	tlshd -s -c /etc/tlshd.conf >>"$E2E_OUT/tlshd.log" 2>&1 </dev/null &
	TLSHD_PID=$!
	sleep 1
	kill -0 "$TLSHD_PID" || { echo "tlshd exited:"; cat "$E2E_OUT/tlshd.log"; return 1; }
	echo "tlshd pid $TLSHD_PID"
}
step "start tlshd" start_tlshd

# Retained PSKs in the interchange format ("NVMeTLSkey-1:01:<base64>:"), inserted as "psk" keys
# whose description is the TLS PSK identity "NVMe0R01 <hostnqn> <subnqn>" that the 6.12 host looks
# up by default: one for the I/O subsystem, one for the discovery subsystem.
gen_keys() {
	nvme gen-tls-key --hostnqn="$HOSTNQN" --subsysnqn="$NQN" --insert || return 1
	nvme gen-tls-key --hostnqn="$HOSTNQN" --subsysnqn="$DISC_NQN" --insert || return 1
	grep -w psk /proc/keys | tee "$REF/psk-keys.txt"
	expect_fgrep "PSK for the subsystem" "NVMe0R01 $HOSTNQN $NQN" "$REF/psk-keys.txt"
}
step "gen-tls-key --insert" gen_keys

step "backing file" truncate -s 64M /var/tmp/tls0.img
step "nvmet subsystem" nvmet_subsys "$NQN"
step "nvmet namespace" nvmet_ns "$NQN" 1 /var/tmp/tls0.img
step "nvmet tcp port" nvmet_port 1 tcp "$ADDR" "$PORT"
step "port requires TLS 1.3" nvmet_port_tls 1
step "nvmet export" nvmet_link 1 "$NQN"
step "port listening" wait_tcp_listen "$PORT"

discover_tls() {
	dmesg -C
	nvme discover -t tcp -a "$ADDR" -s "$PORT" --tls -o json >"$REF/discover-tls.json" || return 1
	cat "$REF/discover-tls.json"
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$REF/discover-tls-kmsg.txt"
	local -a v
	mapfile -t v < <(jq -r --arg n "$NQN" '[.records[] | select(.subnqn == $n)][0]
		| (.traddr, .treq, .sectype)' "$REF/discover-tls.json")
	# nvme-cli's rendering of TREQ (bits 1:0 = 01b "required"; bit 2 "SQ flow control disable
	# supported") and TSAS.SECTYPE (01h "TLS 1.3") of the entry.
	expect_eq "traddr" "${v[0]}" "$ADDR" || return 1
	expect_eq "treq" "${v[1]}" "required, sq flow control disable supported" || return 1
	expect_eq "sectype" "${v[2]}" tls13
}
step "discover --tls" discover_tls

tlshd_count() { # WHAT TEXT N: tlshd logged TEXT N times
	expect_num "$1" "$(grep -cF "$2" "$E2E_OUT/tlshd.log")" -eq "$3"
}

connect_tls() {
	local dev c
	dmesg -C
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2 --tls || return 1
	dev=$(wait_ns "$NQN" 1) || return 1
	c=$(ctrl_of "$NQN" tcp) || return 1
	echo "controller $c, namespace $dev"
	grep -H . "/sys/class/nvme/$c"/{queue_count,tls_key,tls_configured_key,tls_keyring} 2>/dev/null
	sleep 1
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$REF/connect-tls-kmsg.txt"
	expect_num "I/O queues" $(($(cat "/sys/class/nvme/$c/queue_count") - 1)) -eq 2 || return 1
	# The controller's tls_key is the serial of the PSK tlshd used: the subsystem's.
	expect_eq "tls_key" "$(cat "/sys/class/nvme/$c/tls_key")" \
		"$(awk -v id="NVMe0R01 $HOSTNQN $NQN:" '$8 == "psk" && index($0, id) { print $1 }' /proc/keys)" ||
		return 1
	# One handshake per queue (admin + 2 I/O), each seen by both tlshd ends (which may log a
	# moment after the kernel has the socket back, hence the retry).
	retry 20 0.25 tlshd_count "successful tlshd handshakes so far (discovery: 2, connect: 6)" \
		'Handshake with localhost (127.0.0.1) was successful' 8 || return 1
	fio_verify "$dev" 8M
}
step "connect --tls, fio verify" connect_tls
step "disconnect" nvme disconnect -n "$NQN"
check_gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "controller gone" retry 20 0.25 check_gone

# A plaintext ICReq on the TLS-only port: the target hands the socket to tlshd as a TLS server,
# which fails on the non-TLS record, and the connection is closed; the host sees a reset while
# waiting for ICResp (-ECONNRESET = -104). nvme-cli exits 1.
refuse_plain() { # NAME NVME-CLI-TEXT CMD…
	local name=$1 out=$2
	shift 2
	expect_refused "$name" "$@" || return 1
	local bad=0
	expect_num "exit status" "$REFUSED_RC" -eq 1 || bad=1
	expect_fgrep "nvme-cli says '$out'" "$out" <(echo "$REFUSED_OUT") || bad=1
	expect_fgrep "kernel: no ICResp" "nvme_tcp: queue 0: failed to receive icresp, error -104" \
		<(echo "$REFUSED_KMSG") || bad=1
	[ "$bad" = 0 ] || return 1
	retry 20 0.25 check_gone
}
step "refuse plaintext discover" refuse_plain plaintext-discover \
	"failed to add controller, error failed to write to nvme-fabrics device" \
	nvme discover -t tcp -a "$ADDR" -s "$PORT"
step "refuse plaintext connect" refuse_plain plaintext-connect \
	"could not add new controller: failed to write to nvme-fabrics device" \
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2
save_tlshd_log() {
	retry 20 0.25 tlshd_count "failed tlshd handshakes (the two plaintext attempts)" \
		"Handshake with 'localhost' (127.0.0.1) failed" 2 || return 1
	cp "$E2E_OUT/tlshd.log" "$REF/tlshd.log"
	cat "$E2E_OUT/tlshd.log"
}
step "tlshd log" save_tlshd_log
finish
