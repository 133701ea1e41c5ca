#!/bin/bash
# e2e-image: trixie
# e2e-timeout: 600
# nvmfd with NVMe/TCP over TLS 1.3 (retained PSKs, NVMe/TCP Transport Specification 1.1 §3.6),
# the same host stack as reference-nvmet-tls (FINDINGS R-tls-*): PSKs made by `nvme gen-tls-key
# --insert` (the host's TLS PSK in the .nvme keyring, the configured PSK in nvmfd's key files),
# tlshd doing the host's handshakes, nvmfd its own (OpenSSL) with the record layer in the
# kernel (kTLS). Discovery and a 2-I/O-queue connect over TLS with verified I/O (and, on a
# second subsystem added by reload with its PSK set by `nvmfd ctl set-tls-key`, TLS and
# DH-HMAC-CHAP together on one connection; on a third, a SHA-384 PSK, which tlshd 1.0
# binds to SHA-256 and nvmfd, as nvmet, runs under TLS_CHACHA20_POLY1305_SHA256); plaintext
# discovery and connect to the TLS-required port are refused as nvmet refuses them; a host
# whose PSK nvmfd does not know fails the handshake.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/checks.sh"
. "$E2E_DIR/lib/nvmfd.sh"

CONFIG=$E2E_DIR/configs/tls.toml
NQN=nqn.2026-12.dev.nvmfd:tls
DISC_NQN=nqn.2014-08.org.nvmexpress.discovery
ADDR=127.0.0.1
PORT=4420
HOSTNQN=$(cat /etc/nvme/hostnqn)
KEYS=/run/nvmfd/tls
R=$E2E_OUT/nvmfd-tls
mkdir -p "$R"
TLSHD_PID=

stop_tlshd() { [ -z "$TLSHD_PID" ] || kill "$TLSHD_PID"; }
on_cleanup stop_tlshd
on_cleanup stop_nvmfd
on_cleanup disconnect_all

load_modules() {
	load_host_modules tcp || return 1
	# kTLS for nvmfd's sockets (and the host's).
	modprobe tls || return 1
	grep -w tls /proc/sys/net/ipv4/tcp_available_ulp
}
step "load modules" load_modules
step "crng ready" wait_crng
step "host NQN of the config" expect_eq "hostnqn" "$HOSTNQN" \
	"nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001"
info "nvme-cli: $(nvme version | head -n1), kernel $(uname -r)"

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

# gen-tls-key prints the configured PSK and inserts the TLS PSK derived from it under the
# identity "NVMe0R01 <hostnqn> <subnqn>"; nvmfd derives the same TLS PSK from the printed key.
# With HMAC 2 the key is a SHA-384 one (48 bytes, "NVMeTLSkey-1:02:", identity "NVMe0R02 …").
gen_key() { # SUBNQN FILE [HMAC]
	local out hmac=${3:-1}
	out=$(nvme gen-tls-key --hostnqn="$HOSTNQN" --subsysnqn="$1" --hmac="$hmac" --insert) || return 1
	echo "$out"
	grep -o "NVMeTLSkey-1:0$hmac:[A-Za-z0-9+/=]*:" <<<"$out" | head -n1 >"$2"
	chmod 600 "$2"
	[ -s "$2" ] || { echo "no key in gen-tls-key's output"; return 1; }
}
gen_keys() {
	mkdir -p "$KEYS" && chmod 700 "$KEYS"
	gen_key "$NQN" "$KEYS/io.psk" || return 1
	gen_key "$DISC_NQN" "$KEYS/discovery.psk" || return 1
	grep -w psk /proc/keys | tee "$R/psk-keys.txt"
	expect_fgrep "PSK for the subsystem" "NVMe0R01 $HOSTNQN $NQN" "$R/psk-keys.txt"
}
step "gen-tls-key --insert" gen_keys
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$CONFIG"
# A writable copy: the TLS-and-authentication step adds a subsystem to it and reloads.
LIVE_CONFIG=/run/nvmfd/tls.toml
step "copy config" cp "$CONFIG" "$LIVE_CONFIG"
step "start nvmfd" start_nvmfd "$LIVE_CONFIG" "$PORT"
step "kTLS record layer logged" grep -F 'TLS 1.3 port port_id=1 policy="required" record_layer="kernel TLS' "$NVMFD_LOG"

discover_tls() {
	nvme discover -t tcp -a "$ADDR" -s "$PORT" --tls -o json >"$R/discover-tls.json" || return 1
	cat "$R/discover-tls.json"
	local -a v
	mapfile -t v < <(jq -r --arg n "$NQN" '[.records[] | select(.subnqn == $n)][0]
		| (.traddr, .treq, .sectype)' "$R/discover-tls.json")
	# As nvmet's entries (R-tls-2): TREQ "required" + SQ flow control disable, SECTYPE TLS 1.3.
	expect_eq "traddr" "${v[0]}" "$ADDR" || return 1
	expect_eq "treq" "${v[1]}" "required, sq flow control disable supported" || return 1
	expect_eq "sectype" "${v[2]}" tls13
}
step "discover --tls" discover_tls

# tls_connected NQN VERSION: after `nvme connect … --tls -i 2` to NQN: its namespace 1
# (TLS_DEV) and controller (TLS_CTRL) appear, with 2 I/O queues, and the controller's tls_key
# is the keyring's PSK whose description starts "VERSION HOSTNQN NQN" (NVMe0R01: SHA-256,
# NVMe0R02: SHA-384 identity).
tls_connected() {
	local nqn=$1 version=$2
	TLS_DEV=$(wait_ns "$nqn" 1) || return 1
	TLS_CTRL=$(ctrl_of "$nqn" tcp) || return 1
	echo "controller $TLS_CTRL, namespace $TLS_DEV"
	grep -H . "/sys/class/nvme/$TLS_CTRL"/{queue_count,tls_key} 2>/dev/null
	expect_num "I/O queues" $(($(cat "/sys/class/nvme/$TLS_CTRL/queue_count") - 1)) -eq 2 || return 1
	expect_eq "tls_key" "$(cat "/sys/class/nvme/$TLS_CTRL/tls_key")" \
		"$(awk -v id="$version $HOSTNQN $nqn:" '$8 == "psk" && index($0, id) { print $1 }' /proc/keys)"
}

connect_tls() {
	dmesg -C
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2 --tls || return 1
	tls_connected "$NQN" NVMe0R01 || return 1
	# nvmfd's side: one handshake per queue (admin + 2 I/O) plus the discovery one.
	expect_num "nvmfd TLS sessions" "$(grep -c 'TLS 1.3 established' "$NVMFD_LOG")" -eq 4 || return 1
	# Each of them with the record layer in the kernel (the user-space one is the fallback).
	expect_num "kTLS sessions" "$(grep 'TLS 1.3 established' "$NVMFD_LOG" | grep -c 'record_layer="kernel TLS"')" -eq 4 || return 1
	grep 'TLS 1.3 established' "$NVMFD_LOG" | tail -n 1
	fio_verify "$TLS_DEV" 32M
}
step "connect --tls, fio verify" connect_tls
step "disconnect" nvme disconnect -n "$NQN"
check_gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }
step "controller gone" retry 20 0.25 check_gone

# connect-all from the discovery log: the entry's TREQ/TSAS tell nvme-cli to use TLS.
connect_all_tls() {
	nvme connect-all -t tcp -a "$ADDR" -s "$PORT" --tls || return 1
	local dev
	dev=$(wait_ns "$NQN" 1) || return 1
	echo "namespace $dev"
	fio_verify "$dev" 8M || return 1
	nvme disconnect -n "$NQN" || return 1
	retry 20 0.25 check_gone
}
step "connect-all --tls" connect_all_tls

# As R-tls-4/5: exit status 1, nvme-cli's text, and the host waiting for ICResp sees a reset.
refuse_plain() { # NAME NVME-CLI-TEXT CMD…
	local name=$1 out=$2
	shift 2
	expect_refused "$name" "$@" || return 1
	local bad=0
	expect_num "exit status" "$REFUSED_RC" -eq 1 || bad=1
	expect_fgrep "nvme-cli says '$out'" "$out" <(echo "$REFUSED_OUT") || bad=1
	expect_fgrep "kernel: no ICResp" "nvme_tcp: queue 0: failed to receive icresp, error -104" \
		<(echo "$REFUSED_KMSG") || bad=1
	[ "$bad" = 0 ]
}
step "refuse plaintext discover" refuse_plain plaintext-discover \
	"failed to add controller, error failed to write to nvme-fabrics device" \
	nvme discover -t tcp -a "$ADDR" -s "$PORT"
step "refuse plaintext connect" refuse_plain plaintext-connect \
	"could not add new controller: failed to write to nvme-fabrics device" \
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2

# A PSK nvmfd does not have: a new key for the subsystem replaces the host's TLS PSK under the
# same identity; nvmfd still derives from the old configured key, so the handshake fails.
wrong_psk() {
	nvme gen-tls-key --hostnqn="$HOSTNQN" --subsysnqn="$NQN" --insert || return 1
	expect_refused wrong-psk nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2 --tls || return 1
	retry 20 0.25 grep -q "TLS: connection refused" "$NVMFD_LOG" || return 1
	grep "TLS: connection refused" "$NVMFD_LOG" | tail -n 3
}
step "wrong PSK fails the handshake" wrong_psk

# TLS and DH-HMAC-CHAP on one connection: a subsystem whose host must authenticate (key in
# the configuration, added by a reload), its TLS PSK added live with `nvmfd ctl set-tls-key`;
# every queue runs the handshake, then authenticates inside TLS.
AUTH_NQN=nqn.2026-12.dev.nvmfd:tls-auth
tls_and_auth() {
	local secret
	gen_key "$AUTH_NQN" "$KEYS/auth.psk" || return 1
	secret=$(nvme gen-dhchap-key --nqn="$HOSTNQN" --hmac=1) || return 1
	printf '%s\n' "$secret" >"$KEYS/host.key"
	chmod 600 "$KEYS/host.key"
	cat >>"$LIVE_CONFIG" <<-EOF

		[[subsystems]]
		nqn = "$AUTH_NQN"

		[[subsystems.hosts]]
		nqn = "$HOSTNQN"
		dhchap_key_file = "$KEYS/host.key"
		dhchap_hashes = ["hmac(sha256)"]
		dhchap_dhgroups = ["ffdhe2048"]

		[[subsystems.namespaces]]
		nsid = 1
		ram_size = "16M"
	EOF
	"$E2E_NVMFD_BIN" ctl --socket /run/nvmfd/control.sock reload || return 1
	"$E2E_NVMFD_BIN" ctl --socket /run/nvmfd/control.sock set-tls-key "$HOSTNQN" \
		--subsystem "$AUTH_NQN" --key-file "$KEYS/auth.psk" || return 1
	retry 20 0.25 grep -q "TLS keys replaced" "$NVMFD_LOG" || return 1
	dmesg -C
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$AUTH_NQN" -i 2 --tls \
		--dhchap-secret="$secret" || return 1
	tls_connected "$AUTH_NQN" NVMe0R01 || return 1
	sleep 1
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$R/tls-auth-dmesg.txt"
	expect_fgrep "host authenticated inside TLS" \
		"$TLS_CTRL: qid 0: authenticated with hash hmac(sha256) dhgroup ffdhe2048" "$R/tls-auth-dmesg.txt" || return 1
	expect_num "nvmfd TLS sessions for it" \
		"$(grep 'TLS 1.3 established' "$NVMFD_LOG" | grep -c "$AUTH_NQN")" -eq 3 || return 1
	fio_verify "$TLS_DEV" 8M || return 1
	nvme disconnect -n "$AUTH_NQN" || return 1
	retry 20 0.25 check_gone_nqn "$AUTH_NQN"
}
check_gone_nqn() { ! ctrl_of "$1" >/dev/null || { echo "controller still present"; return 1; }; }
step "TLS and DH-HMAC-CHAP on one connection" tls_and_auth

# A SHA-384 PSK with the Linux host: a subsystem added by a reload, its configured PSK from
# `nvme gen-tls-key --hmac=2` set live by `nvmfd ctl set-tls-key`; tlshd offers the 48-byte
# TLS PSK under "NVMe0R02 …". TLS 1.3 binds a PSK to one hash (RFC 8446 §4.2.11; SHA-384 here,
# NVMe/TCP §3.6.1.3), but tlshd 1.0 (GnuTLS) binds it to SHA-256 (a 32-byte binder) and offers
# TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256. nvmet (with tlshd) runs it as a
# SHA-256 PSK under ChaCha20 (FINDINGS.md, 2026-12-04 20:10); nvmfd does the same, says so once
# per connection, and hands the ChaCha20-Poly1305 keys to kTLS.
SHA384_NQN=nqn.2026-12.dev.nvmfd:tls-sha384
log_count_above() { [ "$(grep -c "$1" "$NVMFD_LOG")" -gt "$2" ]; }
tls_sha384() {
	gen_key "$SHA384_NQN" "$KEYS/sha384.psk" 2 || return 1
	expect_num "configured PSK length (base64 of 48 bytes + CRC-32)" \
		"$(cut -d: -f3 "$KEYS/sha384.psk" | tr -d '\n' | wc -c)" -eq 72 || return 1
	cat >>"$LIVE_CONFIG" <<-EOF

		[[subsystems]]
		nqn = "$SHA384_NQN"
		allow_any_host = true

		[[subsystems.namespaces]]
		nsid = 1
		ram_size = "48M"
	EOF
	"$E2E_NVMFD_BIN" ctl --socket /run/nvmfd/control.sock reload || return 1
	local replaced
	replaced=$(grep -c "TLS keys replaced" "$NVMFD_LOG")
	"$E2E_NVMFD_BIN" ctl --socket /run/nvmfd/control.sock set-tls-key "$HOSTNQN" \
		--subsystem "$SHA384_NQN" --key-file "$KEYS/sha384.psk" || return 1
	retry 20 0.25 log_count_above "TLS keys replaced" "$replaced" || return 1
	nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$SHA384_NQN" -i 2 --tls || return 1
	tls_connected "$SHA384_NQN" NVMe0R02 || return 1
	# nvmfd's side: admin + 2 I/O queues, each run as a SHA-256 PSK under ChaCha20 in kTLS.
	grep "$SHA384_NQN" "$NVMFD_LOG" | grep -E "bound its|TLS 1.3 established" | tee "$R/sha384-sessions.txt"
	expect_num "nvmfd: SHA-384 identity bound to SHA-256, said per connection" \
		"$(grep -F "the host bound its SHA-384 PSK identity to SHA-256 (as tlshd 1.0 does); used as a SHA-256 PSK" "$R/sha384-sessions.txt" |
			grep -cF "identity=NVMe0R02 $HOSTNQN $SHA384_NQN")" -eq 3 ||
		return 1
	expect_num "nvmfd: ChaCha20 sessions in kTLS" \
		"$(grep 'TLS 1.3 established' "$R/sha384-sessions.txt" | grep 'cipher="TLS_CHACHA20_POLY1305_SHA256"' | grep -c 'record_layer="kernel TLS"')" -eq 3 ||
		return 1
	fio_verify "$TLS_DEV" 32M || return 1
	nvme disconnect -n "$SHA384_NQN" || return 1
	retry 20 0.25 check_gone_nqn "$SHA384_NQN" || return 1
	# tlshd's side: the NVMe0R02 identity, the suite it ended with.
	grep -A6 "Using psk identity NVMe0R02" "$E2E_OUT/tlshd.log" | tee "$R/sha384-tlshd.txt"
	expect_num "tlshd: ChaCha20 sessions" \
		"$(grep -c 'Session description: .*CHACHA20-POLY1305' "$R/sha384-tlshd.txt")" -eq 3
}
step "SHA-384 PSK from tlshd 1.0 (SHA-256 binder): ChaCha20, fio verify" tls_sha384
step "nvmfd alive" nvmfd_alive
step "nvmfd stops" stop_nvmfd
step "no ERROR in nvmfd log" check_nvmfd_log
save_tlshd_log() { cp "$E2E_OUT/tlshd.log" "$R/tlshd.log"; tail -n 40 "$E2E_OUT/tlshd.log"; }
step "tlshd log" save_tlshd_log
finish
