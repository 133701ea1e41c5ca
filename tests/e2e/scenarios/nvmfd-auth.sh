#!/bin/bash
# e2e-image: trixie
# e2e-timeout: 900
# NVMe in-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 §8.13) with the stock Linux 6.12 host
# (nvme-cli 2.13) against nvmfd, with the keys and cases of reference-nvmet-auth.sh. First the
# kernel target (nvmet) refuses the four bad cases with those keys (the reference, recorded in
# out/reference/refused-nvmet-*.txt); then nvmfd: accepted with every hash, ffdhe2048, ffdhe8192
# and the NULL group, unidirectional and bidirectional, each with 2 I/O queues and fio verify,
# the target's hash/group/keys set live with `nvmfd ctl set-host-key`; the same four refusals
# must give the same nvme connect exit status and message as nvmet; and re-authentication after
# changing the key on both sides (nvmfd ctl, then sysfs dhchap_secret on the host) under I/O.
# ffdhe8192 with SHA-512 five times each way (count of successes) and re-authentication of a
# live ffdhe8192 controller under I/O: the target's DH runs on its worker pool, off the reactors.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"
. "$E2E_DIR/lib/nvmet.sh"
. "$E2E_DIR/lib/nvmfd.sh"

REF_NQN=nqn.2026-12.dev.nvmfd:reference-auth
NQN=nqn.2026-12.dev.nvmfd:auth
ADDR=127.0.0.1
REF_PORT=4420
PORT=4421
HOSTNQN=$(cat /etc/nvme/hostnqn)
OTHER_NQN=nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000002
OTHER_ID=6e766d66-6400-4e32-8565-326500000002
R=$E2E_OUT/nvmfd-auth
KEYS=/run/nvmfd-auth
SOCK=$KEYS/control.sock
mkdir -p "$R" "$KEYS"
chmod 700 "$KEYS"

on_cleanup stop_nvmfd
on_cleanup nvmet_teardown
on_cleanup disconnect_all

step "load modules" load_host_modules tcp
step "crng ready" wait_crng
info "nvme-cli: $(nvme version | head -n1), kernel $(uname -r)"

KEY_HOST= KEY_CTRL= KEY_WRONG= KEY_NEW=
gen_keys() {
	KEY_HOST=$(nvme gen-dhchap-key --nqn="$HOSTNQN" --hmac=1) || return 1
	KEY_CTRL=$(nvme gen-dhchap-key --nqn="$NQN" --hmac=1) || return 1
	KEY_WRONG=$(nvme gen-dhchap-key --nqn="$HOSTNQN" --hmac=1) || return 1
	KEY_NEW=$(nvme gen-dhchap-key --nqn="$HOSTNQN" --hmac=2) || return 1
	printf '%s\n' "host $KEY_HOST" "ctrl $KEY_CTRL" "wrong $KEY_WRONG" "new $KEY_NEW" | tee "$R/keys.txt"
	[[ $KEY_HOST == DHHC-1:01:* ]] || { echo "MISMATCH: unexpected key format '$KEY_HOST'"; return 1; }
	# Key files for nvmfd, private as it requires.
	(umask 077 && printf '%s\n' "$KEY_HOST" >"$KEYS/host.key" &&
		printf '%s\n' "$KEY_CTRL" >"$KEYS/ctrl.key" && printf '%s\n' "$KEY_NEW" >"$KEYS/new.key")
}
step "gen-dhchap-key" gen_keys

check_gone() { # NQN
	! ctrl_of "$1" >/dev/null || { echo "controller still present"; return 1; }
}

# --- the reference: nvmet refuses the bad cases ------------------------------------------------
ref_connect() { nvme connect -t tcp -a "$ADDR" -s "$REF_PORT" -n "$REF_NQN" -i 2 "$@"; }
ref_refused() { # NAME CONNECT-ARGS…
	local name=$1
	shift
	expect_refused "nvmet-$name" ref_connect "$@" || return 1
	echo "$REFUSED_RC" >"$R/rc-nvmet-$name"
	sed "s/$REF_NQN/SUBNQN/g" <<<"$REFUSED_OUT" >"$R/out-nvmet-$name"
	retry 20 0.25 check_gone "$REF_NQN"
}
step "backing file" truncate -s 64M /var/tmp/auth0.img
step "nvmet subsystem" nvmet_subsys "$REF_NQN"
step "nvmet namespace" nvmet_ns "$REF_NQN" 1 /var/tmp/auth0.img
step "nvmet host entry" nvmet_host "$HOSTNQN" "$KEY_HOST" "" "hmac(sha256)" ffdhe2048
step "nvmet allows only this host" nvmet_allow_host "$REF_NQN" "$HOSTNQN"
step "nvmet tcp port" nvmet_port 1 tcp "$ADDR" "$REF_PORT"
step "nvmet export" nvmet_link 1 "$REF_NQN"
step "nvmet listening" wait_tcp_listen "$REF_PORT"
step "nvmet: wrong host key" ref_refused wrong-host-key --dhchap-secret="$KEY_WRONG"
step "nvmet: no key" ref_refused no-key
step "nvmet: host not allowed" ref_refused host-not-allowed \
	--hostnqn="$OTHER_NQN" --hostid="$OTHER_ID" --dhchap-secret="$KEY_HOST"
step "nvmet entry bidirectional" nvmet_host "$HOSTNQN" "$KEY_HOST" "$KEY_CTRL" "hmac(sha256)" ffdhe2048
step "nvmet: wrong controller key" ref_refused wrong-ctrl-key \
	--dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_WRONG"
step "nvmet teardown" nvmet_teardown

# --- nvmfd ------------------------------------------------------------------------------------
write_config() {
	cat >"$R/nvmfd.toml" <<-EOF
		[global]
		control_socket = "$SOCK"

		[[ports]]
		id = 1
		transport = "tcp"
		address = "$ADDR"
		service = $PORT

		[[subsystems]]
		nqn = "$NQN"

		[[subsystems.hosts]]
		nqn = "$HOSTNQN"
		dhchap_key_file = "$KEYS/host.key"

		[[subsystems.namespaces]]
		nsid = 1
		ram_size = "64M"
	EOF
	cat "$R/nvmfd.toml"
}
step "nvmfd config" write_config
step "config valid" "$E2E_NVMFD_BIN" check-config --config "$R/nvmfd.toml"
step "start nvmfd" start_nvmfd "$R/nvmfd.toml" "$PORT"

ctl() { "$E2E_NVMFD_BIN" ctl --socket "$SOCK" "$@"; }
connect() { nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -i 2 "$@"; }

# accepted NAME HASH DHGROUP CTRL(yes|no) CONNECT-ARGS…: the host's entry set live to HASH/DHGROUP
# (and the controller key); the connect succeeds with 2 I/O queues, the host's kernel names the
# negotiated hash and group, fio verifies, disconnect.
accepted() {
	local name=$1 hash=$2 group=$3 bidi=$4 c dev qc
	shift 4
	local keys=(--key-file "$KEYS/host.key")
	[ "$bidi" = yes ] && keys+=(--ctrl-key-file "$KEYS/ctrl.key")
	ctl set-host-key "$NQN" "$HOSTNQN" "${keys[@]}" --hashes "$hash" --dhgroups "$group" || return 1
	dmesg -C
	connect "$@" || return 1
	dev=$(wait_ns "$NQN" 1) || return 1
	c=$(ctrl_of "$NQN" tcp) || return 1
	qc=$(cat "/sys/class/nvme/$c/queue_count")
	sleep 1
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$R/accepted-$name.txt"
	echo "controller $c, namespace $dev, queue_count $qc"
	expect_num "I/O queues" $((qc - 1)) -eq 2 || return 1
	expect_fgrep "kernel names hash $hash and group $group" \
		"$c: qid 0: authenticated with hash $hash dhgroup $group" "$R/accepted-$name.txt" || return 1
	if [ "$bidi" = yes ]; then
		expect_fgrep "controller authenticated" "$c: qid 0: controller authenticated" \
			"$R/accepted-$name.txt" || return 1
	fi
	fio_verify "$dev" 8M || return 1
	nvme disconnect -n "$NQN" || return 1
	retry 20 0.25 check_gone "$NQN"
}
step "accept sha256/ffdhe2048" accepted sha256-ffdhe2048 "hmac(sha256)" ffdhe2048 no \
	--dhchap-secret="$KEY_HOST"
step "accept sha384/ffdhe2048" accepted sha384-ffdhe2048 "hmac(sha384)" ffdhe2048 no \
	--dhchap-secret="$KEY_HOST"
step "accept sha512/ffdhe2048" accepted sha512-ffdhe2048 "hmac(sha512)" ffdhe2048 no \
	--dhchap-secret="$KEY_HOST"
step "accept bidirectional sha256/ffdhe2048" accepted bidi-sha256-ffdhe2048 "hmac(sha256)" ffdhe2048 yes \
	--dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_CTRL"
step "accept sha512/ffdhe8192" accepted sha512-ffdhe8192 "hmac(sha512)" ffdhe8192 no \
	--dhchap-secret="$KEY_HOST"
step "accept bidirectional sha384/ffdhe8192" accepted bidi-sha384-ffdhe8192 "hmac(sha384)" ffdhe8192 yes \
	--dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_CTRL"
step "accept null DH group" accepted sha256-null "hmac(sha256)" null no \
	--dhchap-secret="$KEY_HOST"

# ffdhe8192 with SHA-512, repeatedly, one way and both ways: the target's exponentiations run on
# its authentication workers, never on the reactor serving the queues, so the connect no longer
# waits behind them (under TCG they take seconds: keep-alive used to expire during the first
# connect). Each attempt: connect with 2 I/O queues, the kernel names hash and group, disconnect.
repeat_8192() { # NAME BIDI(yes|no) ATTEMPTS CONNECT-ARGS…
	local name=$1 bidi=$2 n=$3 ok=0 i c t0 t1 log
	shift 3
	local keys=(--key-file "$KEYS/host.key")
	[ "$bidi" = yes ] && keys+=(--ctrl-key-file "$KEYS/ctrl.key")
	ctl set-host-key "$NQN" "$HOSTNQN" "${keys[@]}" --hashes "hmac(sha512)" \
		--dhgroups ffdhe8192 || return 1
	for i in $(seq 1 "$n"); do
		log="$R/repeat-$name-$i.txt"
		dmesg -C
		t0=$(date +%s.%N)
		if connect "$@" >"$log" 2>&1 && wait_ns "$NQN" 1 >/dev/null && c=$(ctrl_of "$NQN" tcp); then
			t1=$(date +%s.%N)
			sleep 1
			dmesg | sed 's/^\[[ 0-9.]*\] //' >>"$log"
			if grep -qF "$c: qid 0: authenticated with hash hmac(sha512) dhgroup ffdhe8192" "$log" &&
				{ [ "$bidi" = no ] || grep -qF "$c: qid 0: controller authenticated" "$log"; } &&
				[ "$(cat "/sys/class/nvme/$c/queue_count")" = 3 ]; then
				ok=$((ok + 1))
				echo "attempt $i: authenticated ($c), connect took $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s"
			else
				echo "attempt $i: connected but not as expected:"
				cat "$log"
			fi
		else
			dmesg | sed 's/^\[[ 0-9.]*\] //' >>"$log"
			echo "attempt $i: connect failed:"
			cat "$log"
		fi
		nvme disconnect -n "$NQN" >/dev/null 2>&1
		retry 40 0.25 check_gone "$NQN" || return 1
	done
	echo "ffdhe8192/sha512 $name: $ok/$n connects authenticated" | tee "$R/repeat-$name.txt"
	[ "$ok" = "$n" ]
}
step "ffdhe8192/sha512 x5, unidirectional" repeat_8192 uni no 5 --dhchap-secret="$KEY_HOST"
step "ffdhe8192/sha512 x5, bidirectional" repeat_8192 bidi yes 5 \
	--dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_CTRL"

# Re-authentication of a live ffdhe8192 controller (bidirectional) under I/O: writing the host
# key to sysfs dhchap_secret makes the host authenticate every queue again (drivers/nvme/host/
# sysfs.c re-authenticates even when the key is unchanged).
reauth_8192() {
	local c dev pid rc
	ctl set-host-key "$NQN" "$HOSTNQN" --key-file "$KEYS/host.key" --ctrl-key-file "$KEYS/ctrl.key" \
		--hashes "hmac(sha512)" --dhgroups ffdhe8192 || return 1
	connect --dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_CTRL" || return 1
	dev=$(wait_ns "$NQN" 1) || return 1
	c=$(ctrl_of "$NQN" tcp) || return 1
	fio --name=reauth8192 --filename="$dev" --rw=randrw --bs=4k --size=32M --direct=1 \
		--ioengine=libaio --iodepth=8 --time_based --runtime=20 --output="$R/fio-reauth-8192.txt" &
	pid=$!
	sleep 3
	dmesg -C
	echo -n "$KEY_HOST" >"/sys/class/nvme/$c/dhchap_secret" || return 1
	retry 60 0.5 grep_dmesg "$c: qid 0: controller authenticated" || true
	sleep 2
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$R/reauth-8192.txt"
	expect_fgrep "re-authentication started" "$c: re-authenticating controller" "$R/reauth-8192.txt" || return 1
	expect_fgrep "re-authenticated with sha512/ffdhe8192" \
		"$c: qid 0: authenticated with hash hmac(sha512) dhgroup ffdhe8192" "$R/reauth-8192.txt" || return 1
	expect_fgrep "controller authenticated again" "$c: qid 0: controller authenticated" \
		"$R/reauth-8192.txt" || return 1
	[ "$(cat "/sys/class/nvme/$c/state")" = live ] || { echo "MISMATCH: controller not live"; return 1; }
	wait "$pid"
	rc=$?
	tail -n 12 "$R/fio-reauth-8192.txt"
	[ "$rc" = 0 ] || { echo "MISMATCH: fio exit $rc during re-authentication"; return 1; }
	fio_verify "$dev" 8M || return 1
	nvme disconnect -n "$NQN" || return 1
	retry 40 0.25 check_gone "$NQN"
}
grep_dmesg() { dmesg | grep -qF "$1"; }
step "re-authenticate a live ffdhe8192 controller" reauth_8192

# Refusals: the same exit status and nvme-cli message as nvmet's with the same keys.
refused() { # NAME CONNECT-ARGS…
	local name=$1 rc_ref
	shift
	expect_refused "nvmfd-$name" connect "$@" || return 1
	retry 20 0.25 check_gone "$NQN" || return 1
	rc_ref=$(cat "$R/rc-nvmet-$name")
	sed "s/$NQN/SUBNQN/g" <<<"$REFUSED_OUT" >"$R/out-nvmfd-$name"
	echo "nvme connect exit status: nvmfd $REFUSED_RC, nvmet $rc_ref"
	[ "$REFUSED_RC" = "$rc_ref" ] || { echo "MISMATCH: exit status differs from nvmet's"; return 1; }
	if ! diff -u "$R/out-nvmet-$name" "$R/out-nvmfd-$name"; then
		echo "MISMATCH: nvme connect says something else than with nvmet"
		return 1
	fi
	echo "ok: same exit status and message as nvmet"
}
step "entry sha256/ffdhe2048" ctl set-host-key "$NQN" "$HOSTNQN" --key-file "$KEYS/host.key" \
	--hashes "hmac(sha256)" --dhgroups ffdhe2048
step "refuse wrong host key" refused wrong-host-key --dhchap-secret="$KEY_WRONG"
step "refuse no key" refused no-key
step "refuse host not allowed" refused host-not-allowed \
	--hostnqn="$OTHER_NQN" --hostid="$OTHER_ID" --dhchap-secret="$KEY_HOST"
step "entry bidirectional" ctl set-host-key "$NQN" "$HOSTNQN" --key-file "$KEYS/host.key" \
	--ctrl-key-file "$KEYS/ctrl.key" --hashes "hmac(sha256)" --dhgroups ffdhe2048
step "refuse wrong controller key" refused wrong-ctrl-key \
	--dhchap-secret="$KEY_HOST" --dhchap-ctrl-secret="$KEY_WRONG"
check_counted() {
	ctl status | tee "$R/status.txt"
	grep -q "failed authentications: [1-9]" "$R/status.txt" || {
		echo "MISMATCH: failed authentications not counted"
		return 1
	}
	grep "authentication failed" "$NVMFD_LOG" | tail -n 5
	grep -q "authentication failed.*$HOSTNQN from 127.0.0.1" "$NVMFD_LOG" || {
		echo "MISMATCH: no failure logged with host NQN and address"
		return 1
	}
}
step "failures counted and logged" check_counted

# Re-authentication: key changed on the target (ctl) and then on the host (sysfs) while fio runs.
DEV= CTRL= FIO_PID=
reauth_setup() {
	ctl set-host-key "$NQN" "$HOSTNQN" --key-file "$KEYS/host.key" --hashes "hmac(sha256)" \
		--dhgroups ffdhe2048 || return 1
	connect --dhchap-secret="$KEY_HOST" || return 1
	DEV=$(wait_ns "$NQN" 1) || return 1
	CTRL=$(ctrl_of "$NQN" tcp) || return 1
	fio --name=reauth --filename="$DEV" --rw=randrw --bs=4k --size=32M --direct=1 \
		--ioengine=libaio --iodepth=8 --time_based --runtime=15 --output="$R/fio-reauth.txt" &
	FIO_PID=$!
	sleep 3
}
step "connect, I/O running" reauth_setup
step "rotate on the target" ctl set-host-key "$NQN" "$HOSTNQN" --key-file "$KEYS/new.key" \
	--hashes "hmac(sha256)" --dhgroups ffdhe2048
reauth_host() {
	dmesg -C
	echo -n "$KEY_NEW" >"/sys/class/nvme/$CTRL/dhchap_secret" || return 1
	sleep 3
	dmesg | sed 's/^\[[ 0-9.]*\] //' | tee "$R/reauth.txt"
	expect_fgrep "host re-authenticated qid 0" "$CTRL: qid 0: authenticated" "$R/reauth.txt" || return 1
	[ "$(cat "/sys/class/nvme/$CTRL/state")" = live ] || { echo "MISMATCH: controller not live"; return 1; }
}
step "rotate on the host (sysfs)" reauth_host
reauth_io() {
	wait "$FIO_PID"
	local rc=$?
	cat "$R/fio-reauth.txt"
	[ "$rc" = 0 ] || { echo "MISMATCH: fio exit $rc during re-authentication"; return 1; }
	fio_verify "$DEV" 8M || return 1
	nvme disconnect -n "$NQN"
}
step "I/O went on" reauth_io
step "old key refused after rotation" expect_refused "nvmfd-old-key" connect --dhchap-secret="$KEY_HOST"
step "new key accepted" connect --dhchap-secret="$KEY_NEW"
step "new key: namespace" wait_ns "$NQN" 1
step "disconnect" nvme disconnect -n "$NQN"
step "stop nvmfd" stop_nvmfd
step "nvmfd log clean" check_nvmfd_log
finish
