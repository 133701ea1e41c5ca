#!/bin/bash
# e2e-image: trixie
# e2e-timeout: 600
# Reference run for NVMe in-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 §8.13.5): the kernel's
# nvmet (6.12) over TCP on 127.0.0.1 with the stock host (nvme-cli 2.13). Accepted: SHA-256 with
# ffdhe2048, bidirectional (controller key too), the NULL DH group, SHA-512 with ffdhe4096 — each
# with 2 I/O queues and verified I/O. Refused: a wrong host key, no key, a host that is not
# allowed, a wrong controller key. Every refusal's exit status, nvme-cli message and kernel lines
# are saved in out/reference/refused-*.txt (recorded in FINDINGS.md, R-auth-*): the nvmfd
# scenario for DH-HMAC-CHAP must produce the same.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"

NQN=nqn.2026-12.dev.nvmfd:reference-auth
ADDR=127.0.0.1
PORT=4420
HOSTNQN=$(cat /etc/nvme/hostnqn)
# A second host identity (its own host ID: 6.12 refuses one host ID under two host NQNs).
OTHER_NQN=nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000002
OTHER_ID=6e766d66-6400-4e32-8565-326500000002
REF=$E2E_OUT/reference
mkdir -p "$REF"

on_cleanup nvmet_teardown
on_cleanup disconnect_all

step "load modules" load_host_modules tcp
step "crng ready" wait_crng
info "nvme-cli: $(nvme version | head -n1), kernel $(uname -r)"

# Keys in the DHHC-1 secret representation (NVMe Base 2.0 §8.13.5: secret + CRC-32, base64); "01"
# marks a secret to be transformed with SHA-256 and the NQN of its owner before use.
KEY_HOST= KEY_CTRL= KEY_WRONG=
gen_keys() {
	KEY_HOST=$(nvme gen-dhchap-key --nqn="$HOSTNQN" --hmac=1) || return 1
	KEY_CTRL=$(nvme gen-dhchap-key --nqn="$NQN" --hmac=1) || return 1
	KEY_WRONG=$(nvme gen-dhchap-key --nqn="$HOSTNQN" --hmac=1) || return 1
	printf '%s\n' "host $KEY_HOST" "ctrl $KEY_CTRL" "wrong $KEY_WRONG" | tee "$REF/keys.txt"
	[[ $KEY_HOST == DHHC-1:01:* ]] || { echo "MISMATCH: unexpected key format '$KEY_HOST'"; return 1; }
	[ "$KEY_HOST" != "$KEY_WRONG" ]
}
step "gen-dhchap-key" gen_keys

step "backing file" truncate -s 64M /var/tmp/auth0.img
step "nvmet subsystem" nvmet_subsys "$NQN"
step "nvmet namespace" nvmet_ns "$NQN" 1 /var/tmp/auth0.img
step "nvmet host entry" nvmet_host "$HOSTNQN" "$KEY_HOST" "" "hmac(sha256)" ffdhe2048
step "allow only this host" nvmet_allow_host "$NQN" "$HOSTNQN"
step "nvmet tcp port" nvmet_port 1 tcp "$ADDR" "$PORT"
step "nvmet export" nvmet_link 1 "$NQN"
step "port listening" wait_tcp_listen "$PORT"

connect() { nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2 "$@"; }
check_gone() { ! ctrl_of "$NQN" >/dev/null || { echo "controller still present"; return 1; }; }

# accepted NAME HASH DHGROUP CTRL_KEY CONNECT-ARGS…: the target's host entry set to HASH/DHGROUP
# (and CTRL_KEY, empty = unidirectional); the connect succeeds with 2 I/O queues, the host's
# kernel names the negotiated hash and group, fio verifies, disconnect.
accepted() {
	local name=$1 hash=$2 group=$3 ckey=$4 c dev qc
	shift 4
	nvmet_host "$HOSTNQN" "$KEY_HOST" "$ckey" "$hash" "$group" || return 1
	dmesg -C
	connect "$@" || return 1
	dev=$(wait_ns "$NQN" 1) || return 1
	c=$(ctrl_of "$NQN" tcp) || return 1
	qc=$(cat "/sys/class/nvme/$c/queue_count")
	sleep 1
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$REF/accepted-$name.txt"
	echo "controller $c, namespace $dev, queue_count $qc"
	# queue_count = admin queue + I/O queues.
	expect_num "I/O queues" $((qc - 1)) -eq 2 || return 1
	expect_fgrep "kernel names hash $hash and group $group" \
		"$c: qid 0: authenticated with hash $hash dhgroup $group" "$REF/accepted-$name.txt" || return 1
	expect_fgrep "host: 2 I/O queues" "$c: creating 2 I/O queues." "$REF/accepted-$name.txt" || return 1
	if [ -n "$ckey" ]; then
		expect_fgrep "controller authenticated" "$c: qid 0: controller authenticated" \
			"$REF/accepted-$name.txt" || return 1
	fi
	fio_verify "$dev" 8M || return 1
	nvme disconnect -n "$NQN" || return 1
	retry 20 0.25 check_gone
}

step "accept sha256/ffdhe2048" accepted sha256-ffdhe2048 "hmac(sha256)" ffdhe2048 "" \
	--dhchap-secret="$KEY_HOST"
step "accept bidirectional" accepted bidirectional "hmac(sha256)" ffdhe2048 "$KEY_CTRL" \
	--dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_CTRL"
step "accept null DH group" accepted sha256-null "hmac(sha256)" null "" \
	--dhchap-secret="$KEY_HOST"
step "accept sha512/ffdhe4096" accepted sha512-ffdhe4096 "hmac(sha512)" ffdhe4096 "" \
	--dhchap-secret="$KEY_HOST"

# Refusals: the target's entry back to sha256/ffdhe2048 with the right host key. What the host
# shows for each (FINDINGS.md R-auth-*): nvme connect exits 1 with nvme-cli's rendering of the
# kernel's error, and the kernel's own lines name the reason and the error code.
# refused NAME NVME-CLI-TEXT KERNEL-LINE… -- CONNECT-ARGS…
refused() {
	local name=$1 out=$2
	shift 2
	local -a lines=()
	while [ "$1" != -- ]; do
		lines+=("$1")
		shift
	done
	shift
	expect_refused "$name" connect "$@" || return 1
	local f="$REF/refused-$name.txt" l bad=0
	expect_num "nvme connect exit status" "$REFUSED_RC" -eq 1 || bad=1
	expect_fgrep "nvme-cli says '$out'" "$out" <(echo "$REFUSED_OUT") || bad=1
	for l in "${lines[@]}"; do
		expect_fgrep "kernel: $l" "$l" <(echo "$REFUSED_KMSG") || bad=1
	done
	[ "$bad" = 0 ] || return 1
	retry 20 0.25 check_gone
}
step "target entry sha256/ffdhe2048" nvmet_host "$HOSTNQN" "$KEY_HOST" "" "hmac(sha256)" ffdhe2048
# The target's Success1 never comes: it answers the wrong response with DH-HMAC-CHAP Failure1
# (reason 1 "authentication failed"); the host's connect ends in -EKEYREJECTED (-129).
# Under TCG the target's authentication timer can run out first (seen once in four runs):
# nvmet logs "failure1" and "fatal error occurred", the host's AUTH_RECEIVE times out and its
# connect ends in error 880. That is nvmet refusing too, by another path; accepted, and said.
refuse_wrong_key() {
	refused wrong-host-key \
		"could not add new controller: failed to write to nvme-fabrics device" \
		"qid 0: authentication failed, error -129" "failed to connect queue: 0 ret=-129" \
		-- --dhchap-secret="$KEY_WRONG" && return 0
	local l bad=0
	for l in "qid 0 failure1 (1)" "fatal error occurred" "failed to connect queue: 0 ret=880"; do
		expect_fgrep "kernel (nvmet's timeout path): $l" "$l" <(echo "$REFUSED_KMSG") || bad=1
	done
	[ "$bad" = 0 ] && [ "$REFUSED_RC" = 1 ] || return 1
	echo "refused through nvmet's authentication timeout, not Failure1 (TCG timing)"
	retry 20 0.25 check_gone
}
step "refuse wrong host key" refuse_wrong_key
# The Connect response asks for authentication (AUTHREQ); a host without a key gives up before
# sending Negotiate, with -ENOKEY (-126), which nvme-cli renders as a TLS message.
step "refuse no key" refused no-key \
	"could not add new controller: pre-shared TLS key is missing" \
	"qid 0: no key" "qid 0: authentication setup failed" "failed to connect queue: 0 ret=-126" \
	--
# Connect itself fails: status 0x4184 = 16772 (SCT 1 Command Specific, SC 0x84 Connect Invalid
# Host), before any authentication message.
step "refuse host not allowed" refused host-not-allowed \
	"could not add new controller: failed to write to nvme-fabrics device" \
	"Connect for subsystem $NQN is not allowed, hostnqn: $OTHER_NQN" \
	"failed to connect queue: 0 ret=16772" \
	-- --hostnqn="$OTHER_NQN" --hostid="$OTHER_ID" --dhchap-secret="$KEY_HOST"
step "target entry bidirectional" nvmet_host "$HOSTNQN" "$KEY_HOST" "$KEY_CTRL" "hmac(sha256)" ffdhe2048
# The host checks the controller's response in Success1 against its (wrong) controller key and
# sends Failure2 instead of Success2.
step "refuse wrong controller key" refused wrong-ctrl-key \
	"could not add new controller: failed to write to nvme-fabrics device" \
	"qid 0: controller authentication failed" "qid 0: authentication failed, error -129" \
	"failed to connect queue: 0 ret=-129" \
	-- --dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_WRONG"
finish
