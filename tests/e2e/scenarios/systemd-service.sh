#!/bin/bash
# e2e-init: systemd
# e2e-timeout: 600
# nvmfd as a systemd service (systemd/nvmfd.service, systemd as PID 1 in the guest): the unit
# verifies; `systemctl start` returns with the unit active only once nvmfd sent READY=1 (the
# port listens by then); the Linux host connects and fio verifies on namespace 1 throughout;
# a namespace added to the file + `systemctl reload` reaches the host on the same controller
# (AEN, no reconnect) and goes away again on removal; the control socket (`nvmfd ctl`) lists
# and changes the running target; a broken file makes `systemctl reload` fail while nvmfd
# keeps serving; `systemctl stop` ends cleanly within 5 s. Reports the systemd-analyze
# security exposure of the unit.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"

NQN=nqn.2026-12.dev.nvmfd:svc
PORT=4420
CONF=/etc/nvmfd/nvmfd.toml
UNIT=/etc/systemd/system/nvmfd.service
# run.sh puts the unit next to the binary on the nvmfd share.
UNIT_SRC=$(dirname "$E2E_NVMFD_BIN")/nvmfd.service
NVMFD_LOG="$E2E_OUT/nvmfd.log" # filled from the journal, for the failure report

save_journal() { journalctl -u nvmfd --no-pager -o short-monotonic >"$NVMFD_LOG" 2>&1; }
on_cleanup save_journal
on_cleanup systemctl stop nvmfd
on_cleanup disconnect_all

# shellcheck disable=SC2317 # step functions are called indirectly
ctl() { /usr/sbin/nvmfd ctl "$@"; }
show() { systemctl show -p "$1" --value nvmfd; }

install_service() {
	[ -f "$UNIT_SRC" ] || { echo "no unit at $UNIT_SRC"; return 1; }
	install -m 0755 "$E2E_NVMFD_BIN" /usr/sbin/nvmfd &&
		install -D -m 0644 "$E2E_DIR/configs/systemd-service.toml" "$CONF" &&
		cp "$CONF" /tmp/good.toml &&
		install -d -m 0700 /var/lib/nvmfd &&
		install -m 0644 "$UNIT_SRC" "$UNIT" &&
		systemctl daemon-reload &&
		/usr/sbin/nvmfd check-config --config "$CONF"
}
step "install nvmfd, unit and configuration" install_service

verify_unit() {
	# Warnings about units the minimal guest lacks (network-online.target's providers) are
	# not about nvmfd.service; any line naming nvmfd.service is. The manual pages of
	# Documentation= come with the package (checked by the deb-package scenario), not here.
	systemd-analyze verify --man=no "$UNIT" >/tmp/verify.txt 2>&1
	local rc=$?
	cat /tmp/verify.txt
	if grep -q 'nvmfd.service' /tmp/verify.txt; then
		echo "systemd-analyze verify complains about nvmfd.service"
		return 1
	fi
	[ "$rc" = 0 ] || { echo "systemd-analyze verify exited $rc"; return 1; }
}
step "systemd-analyze verify" verify_unit

step "load host modules" load_host_modules tcp

# Active must imply READY=1, and READY=1 must imply listening: poll the state from the moment
# the start job is queued, and check the port at the first sample that says "active".
start_service() {
	systemctl start --no-block nvmfd || return 1
	local i state seen=""
	for ((i = 0; i < 600; i++)); do
		state=$(show ActiveState)
		case " $seen " in *" $state "*) ;; *) seen="$seen $state" ;; esac
		if [ "$state" = active ]; then
			tcp_listening "$PORT" || { echo "active, but nothing listens on $PORT"; return 1; }
			[ -S /run/nvmfd/control.sock ] || { echo "active, but no control socket"; return 1; }
			echo "states seen:$seen"
			echo "listening on $PORT at the first active sample"
			systemctl show -p Type,ActiveState,SubState,StatusText,MainPID nvmfd
			expect_grep "status text" '^StatusText=serving 1 subsystem' <(systemctl show -p StatusText nvmfd)
			return
		fi
		[ "$state" = failed ] && { systemctl status nvmfd --no-pager; return 1; }
		sleep 0.05
	done
	echo "not active after 30 s (states seen:$seen)"
	systemctl status nvmfd --no-pager
	return 1
}
step "systemctl start: active after READY, port listening" start_service

control_socket_private() {
	expect_eq "control socket mode" "$(stat -c %a /run/nvmfd/control.sock)" 600 &&
		expect_eq "control socket owner" "$(stat -c %U /run/nvmfd/control.sock)" root &&
		expect_eq "/run/nvmfd mode" "$(stat -c %a /run/nvmfd)" 700
}
step "control socket is private" control_socket_private

step "connect" nvme connect -t tcp -a 127.0.0.1 -s "$PORT" -n "$NQN" -i 2
CTRL=
CNTLID=
DEV1=
host_view() {
	CTRL=$(ctrl_of "$NQN") || { echo "no controller"; return 1; }
	CNTLID=$(cat "/sys/class/nvme/$CTRL/cntlid")
	DEV1=$(wait_ns "$NQN" 1) && wait_ns "$NQN" 2 >/dev/null || return 1
	echo "controller $CTRL cntlid $CNTLID, namespace 1 is $DEV1"
}
step "host sees namespaces 1 and 2" host_view
# The file namespace (O_DIRECT through io_uring, Flush = fdatasync) under the unit's system call
# filter: writes with a Flush every 4, then read back and verified.
file_io() {
	local dev
	dev=$(wait_ns "$NQN" 2) && fio_verify "$dev" 16M --fsync=4
}
step "fio write+flush+verify on namespace 2 (file, io_uring)" file_io

ctl_lists_the_host() {
	ctl controllers "$NQN" | tee /tmp/ctrls.txt
	expect_grep "controller $CNTLID of this host with admin + 2 I/O queues" \
		"^$NQN +$CNTLID +$(cat /etc/nvme/hostnqn) +127\.0\.0\.1:[0-9]+ +tcp +1 +3 " /tmp/ctrls.txt &&
		ctl subsystems && ctl ports && ctl status
}
step "nvmfd ctl lists subsystem, port and this host's controller" ctl_lists_the_host

FIO_PID=
start_fio() {
	fio --name=svc --filename="$DEV1" --size=96M --rw=randwrite --bs=16k --direct=1 \
		--ioengine=libaio --iodepth=8 --time_based --runtime=90 \
		--verify=crc32c --verify_fatal=1 --verify_backlog=64 >"$E2E_OUT/fio-svc.log" 2>&1 &
	FIO_PID=$!
	sleep 3
	kill -0 "$FIO_PID" || { cat "$E2E_OUT/fio-svc.log"; return 1; }
	echo "fio pid $FIO_PID running"
}
step "start background fio with verify on namespace 1" start_fio
on_cleanup kill "$FIO_PID"

same_controller() {
	expect_eq "controller" "$(ctrl_of "$NQN")" "$CTRL" &&
		expect_eq "cntlid" "$(cat "/sys/class/nvme/$CTRL/cntlid")" "$CNTLID" &&
		expect_eq "state" "$(cat "/sys/class/nvme/$CTRL/state")" live
}

# ns_gone NQN NSID [SECS]
ns_gone() {
	local i
	for ((i = 0; i < ${3:-20} * 10; i++)); do
		ns_dev "$1" "$2" >/dev/null || { echo "namespace $2 gone after $((i / 10)).$((i % 10)) s"; return 0; }
		sleep 0.1
	done
	echo "namespace $2 still present after ${3:-20} s"
	nvme list
	return 1
}

add_ns3_in_file() {
	cp /tmp/good.toml "$CONF" &&
		printf '\n[[subsystems.namespaces]]\nnsid = 3\nram_size = "32M"\n' >>"$CONF" &&
		systemctl reload nvmfd &&
		wait_ns "$NQN" 3 30 &&
		nvme list | tee /tmp/list.txt &&
		expect_grep "nvme list shows namespace 3" "$(basename "$(ns_dev "$NQN" 3)")" /tmp/list.txt &&
		same_controller
}
step "namespace 3 added to the file + systemctl reload: appears, same controller" add_ns3_in_file

remove_ns3_in_file() {
	cp /tmp/good.toml "$CONF" && systemctl reload nvmfd && ns_gone "$NQN" 3 && same_controller
}
step "namespace 3 removed + systemctl reload: disappears, same controller" remove_ns3_in_file

ctl_add_remove() {
	ctl add-namespace "$NQN" --nsid 4 --path /var/lib/nvmfd/ctl4.img --size 16M &&
		wait_ns "$NQN" 4 30 &&
		ctl namespaces "$NQN" | tee /tmp/ns.txt &&
		expect_grep "ctl lists namespace 4 (file)" "^$NQN +4 +file +16M " /tmp/ns.txt &&
		expect_grep "namespace 1 counted fio's writes" "^$NQN +1 +ram +128M +512 +rw +[0-9]+ +[1-9][0-9]* " /tmp/ns.txt &&
		same_controller &&
		ctl remove-namespace "$NQN" 4 && ns_gone "$NQN" 4 && same_controller
}
step "nvmfd ctl add-namespace / remove-namespace reach the host live" ctl_add_remove

broken_reload() {
	printf '[[subsystems]]\nnqn = "not an nqn"\n' >"$CONF"
	if systemctl reload nvmfd; then
		echo "systemctl reload succeeded on a broken configuration"
		return 1
	fi
	echo "systemctl reload failed, as it should"
	journalctl -u nvmfd --no-pager -o cat | tail -n 20 >/tmp/journal-tail.txt
	cat /tmp/journal-tail.txt
	expect_grep "journal shows the rejection" 'reload refused' /tmp/journal-tail.txt &&
		expect_eq "ActiveState" "$(show ActiveState)" active &&
		same_controller &&
		kill -0 "$FIO_PID" &&
		dd if="$DEV1" of=/dev/null bs=1M count=4 iflag=direct status=none &&
		cp /tmp/good.toml "$CONF"
}
step "broken configuration: systemctl reload fails, nvmfd keeps serving" broken_reload

# A valid file that changes what only a restart can change is refused too, naming the key,
# instead of "reloaded" while the old value silently stays in force.
restart_only_reload() {
	sed 's/^reactors = 2$/reactors = 1/' /tmp/good.toml >"$CONF"
	grep -q '^reactors = 1$' "$CONF" || { echo "test config has no 'reactors = 2' line"; return 1; }
	/usr/sbin/nvmfd check-config --config "$CONF" || return 1
	if systemctl reload nvmfd; then
		echo "systemctl reload succeeded although reactors changed"
		return 1
	fi
	journalctl -u nvmfd --no-pager -o cat | tail -n 5 >/tmp/journal-tail.txt
	cat /tmp/journal-tail.txt
	expect_grep "journal names the key" 'reload refused: .*take effect only on restart.*global.reactors' /tmp/journal-tail.txt &&
		expect_eq "ActiveState" "$(show ActiveState)" active &&
		same_controller &&
		kill -0 "$FIO_PID" &&
		cp /tmp/good.toml "$CONF"
}
step "reactors changed: systemctl reload fails naming global.reactors, nvmfd keeps serving" restart_only_reload

write_config() {
	ctl write-config /var/lib/nvmfd/running.toml &&
		/usr/sbin/nvmfd check-config --config /var/lib/nvmfd/running.toml &&
		ctl write-config &&
		/usr/sbin/nvmfd check-config --config "$CONF" &&
		grep -n 'nqn.2026-12.dev.nvmfd:svc' "$CONF"
}
step "nvmfd ctl write-config (to a path, and back to the unit's file)" write_config

wait_fio() {
	wait "$FIO_PID"
	local rc=$?
	cat "$E2E_OUT/fio-svc.log"
	[ "$rc" = 0 ] || { echo "fio exited $rc"; return 1; }
	grep -q 'err= 0' "$E2E_OUT/fio-svc.log" || { echo "fio reported errors"; return 1; }
}
STEP_TIMEOUT=150 step "fio finished without error (verified)" wait_fio

stop_service() {
	local t0 t1
	t0=$(date +%s%N)
	systemctl stop nvmfd || return 1
	t1=$(date +%s%N)
	local ms=$(((t1 - t0) / 1000000))
	echo "systemctl stop took $ms ms"
	systemctl show -p ActiveState,Result,ExecMainStatus,ExecMainCode nvmfd | tee /tmp/stopped.txt
	expect_eq "ActiveState" "$(show ActiveState)" inactive &&
		expect_eq "Result" "$(show Result)" success &&
		expect_num "stop time (ms)" "$ms" -lt 5000 &&
		expect_eq "control socket removed" "$(test -e /run/nvmfd/control.sock && echo present || echo absent)" absent
}
step "systemctl stop: clean within 5 s with the host connected" stop_service

journal_clean() {
	save_journal
	# The broken reload is logged at ERROR on purpose; nothing else may be.
	if grep -E '(^|[^A-Za-z_])ERROR([^A-Za-z_]|$)' "$NVMFD_LOG" | grep -v 'reload refused'; then
		echo "nvmfd logged errors (above)"
		return 1
	fi
	grep -nE 'panicked at' "$NVMFD_LOG" && return 1
	expect_grep "journal has READY" 'ready' "$NVMFD_LOG"
}
step "journal: no unexpected ERROR" journal_clean

# Lines carry their priority (<N> prefix on the journal stream): `journalctl -p err` lists
# the forced error (the broken reload) and nothing else; INFO lines are not errors. systemd's
# own "Reload failed for nvmfd.service" is an error about the unit too, so the count is taken
# over nvmfd's own lines (SYSLOG_IDENTIFIER), and the whole -p err view is printed.
journal_priorities() {
	journalctl -u nvmfd --no-pager -p err
	journalctl -u nvmfd SYSLOG_IDENTIFIER=nvmfd --no-pager -o cat -p err >/tmp/journal-err.txt
	cat /tmp/journal-err.txt
	expect_num "error lines in the journal" "$(wc -l </tmp/journal-err.txt)" -ge 1 &&
		expect_num "error lines that are not the forced one" \
			"$(grep -cv 'reload refused' /tmp/journal-err.txt)" -eq 0 &&
		journalctl -u nvmfd SYSLOG_IDENTIFIER=nvmfd --no-pager -o cat -p info >/tmp/journal-info.txt &&
		expect_grep "INFO lines reach -p info" 'ready' /tmp/journal-info.txt &&
		expect_num "priority prefixes left in the message text" \
			"$(grep -c '^<[0-7]>' /tmp/journal-info.txt)" -eq 0
}
step "journal: priorities (journalctl -p err shows exactly the forced error)" journal_priorities

security() {
	systemd-analyze security --no-pager nvmfd.service | tee "$E2E_OUT/systemd-analyze-security.txt"
	local level
	level=$(sed -n 's/.*Overall exposure level for nvmfd.service: *\([0-9.]*\).*/\1/p' \
		"$E2E_OUT/systemd-analyze-security.txt")
	[ -n "$level" ] || { echo "no exposure level in the output"; return 1; }
	echo "exposure $level"
	echo "$level" >"$E2E_OUT/exposure"
}
step "systemd-analyze security" security
info "systemd-analyze security nvmfd.service: overall exposure $(cat "$E2E_OUT/exposure")"

step "disconnect" nvme disconnect -n "$NQN"
finish
