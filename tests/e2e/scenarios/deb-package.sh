#!/bin/bash
# e2e-init: systemd
# e2e-timeout: 480
# The Debian package (scripts/build-deb.sh, shared next to the binary as nvmfd.deb) on a stock
# Debian 12 guest with systemd as PID 1: `dpkg -i` resolves its dependencies from what the guest
# has; it installs the binary, unit, conffile, manual pages, completions and /var/lib/nvmfd and
# enables nothing; the manual pages are there and named by the unit's Documentation=;
# `nvmfd check-config` accepts the shipped configuration; `systemctl enable --now nvmfd`
# serves it: the Linux host discovers, connects and fio writes and verifies 32 MiB; `nvmfd ctl`
# reaches the daemon on the packaged socket path and says when it is not running (exit 3);
# `dpkg -r` stops the service and keeps the edited conffile and /var/lib/nvmfd.
. "$E2E_DIR/lib/steps.sh"
. "$E2E_DIR/lib/host.sh"

DEB=$(dirname "$E2E_NVMFD_BIN")/nvmfd.deb
NQN=nqn.2026-12.dev.nvmfd:ram0 # the shipped configuration's open RAM subsystem
PORT=4420

save_journal() { journalctl -u nvmfd --no-pager -o short-monotonic >"$E2E_OUT/nvmfd.log" 2>&1; }
on_cleanup save_journal
on_cleanup systemctl stop nvmfd
on_cleanup disconnect_all

install_package() {
	[ -f "$DEB" ] || { echo "no package at $DEB (run.sh shares NVMFD_DEB as nvmfd.deb)"; return 1; }
	dpkg-deb --info "$DEB" && dpkg-deb --contents "$DEB" &&
		DEBIAN_FRONTEND=noninteractive dpkg -i "$DEB" &&
		dpkg-query -W -f='${Status} ${Version}\n' nvmfd | tee /tmp/status.txt &&
		expect_grep "installed" '^install ok installed ' /tmp/status.txt
}
step "dpkg -i (dependencies satisfied by the guest)" install_package

contents() {
	dpkg -L nvmfd | sort | tee /tmp/files.txt
	local f
	for f in /usr/sbin/nvmfd /lib/systemd/system/nvmfd.service /etc/nvmfd/nvmfd.toml \
		/usr/share/man/man8/nvmfd.8.gz /usr/share/man/man8/nvmfd-ctl.8.gz \
		/usr/share/man/man5/nvmfd.toml.5.gz /usr/share/bash-completion/completions/nvmfd \
		/usr/share/zsh/vendor-completions/_nvmfd /usr/share/fish/vendor_completions.d/nvmfd.fish \
		/usr/share/doc/nvmfd/examples/nvmfd.toml /var/lib/nvmfd; do
		grep -qx "$f" /tmp/files.txt || { echo "not in the package: $f"; return 1; }
		[ -e "$f" ] || { echo "not installed: $f"; return 1; }
	done
	expect_eq "conffiles" "$(dpkg-query -W -f='${Conffiles}' nvmfd | awk 'NF { print $1 }')" \
		/etc/nvmfd/nvmfd.toml &&
		expect_eq "/var/lib/nvmfd mode" "$(stat -c %a /var/lib/nvmfd)" 700 &&
		expect_eq "enabled by installing" "$(systemctl is-enabled nvmfd 2>&1)" disabled &&
		expect_eq "started by installing" "$(systemctl is-active nvmfd 2>&1)" inactive
}
step "package contents; nothing enabled or started" contents

manual_pages() {
	systemctl show -p Documentation nvmfd | tee /tmp/doc.txt
	local page
	for page in 'nvmfd(8)' 'nvmfd-ctl(8)' 'nvmfd.toml(5)'; do
		expect_fgrep "Documentation= names $page" "man:$page" /tmp/doc.txt || return 1
	done
	for page in man8/nvmfd.8 man8/nvmfd-ctl.8 man5/nvmfd.toml.5; do
		zcat "/usr/share/man/$page.gz" >"/tmp/page.roff" || return 1
		expect_grep "$page title" '^\.TH ' /tmp/page.roff || return 1
		expect_grep "$page sections" '^\.SH "?SEE ALSO' /tmp/page.roff || return 1
	done
	if command -v man >/dev/null; then
		man -P cat nvmfd | head -20 && man -P cat nvmfd.toml >/dev/null
	else
		echo "man-db is not in the guest image: pages checked as roff (man -l renders them in the unit tests)"
	fi
}
step "manual pages installed and named by the unit" manual_pages

check_config() {
	nvmfd check-config | tee /tmp/check.txt &&
		expect_grep "default path checked" '^/etc/nvmfd/nvmfd.toml: OK' /tmp/check.txt &&
		nvmfd check-config --json /etc/nvmfd/nvmfd.toml >/tmp/check.json &&
		expect_eq "json ok" "$(jq -r .ok /tmp/check.json)" true
}
step "nvmfd check-config accepts the shipped configuration" check_config

not_running() {
	nvmfd ctl status >/tmp/ctl.txt 2>&1
	local rc=$?
	cat /tmp/ctl.txt
	expect_eq "exit status" "$rc" 3 &&
		expect_fgrep "hint" 'systemctl status nvmfd' /tmp/ctl.txt
}
step "nvmfd ctl before start: not running (exit 3, hint)" not_running

step "systemctl enable --now nvmfd" systemctl enable --now nvmfd
serving() {
	expect_eq "enabled" "$(systemctl is-enabled nvmfd)" enabled &&
		expect_eq "active" "$(systemctl is-active nvmfd)" active &&
		wait_tcp_listen "$PORT" && nvmfd ctl status
}
step "service active and listening; nvmfd ctl reaches it" serving

step "load host modules" load_host_modules tcp
discover() {
	nvme discover -t tcp -a 127.0.0.1 -s "$PORT" | tee /tmp/discover.txt &&
		expect_grep "ram0 in the discovery log" "subnqn: *$NQN\$" /tmp/discover.txt
}
step "nvme discover" discover
step "nvme connect" nvme connect -t tcp -a 127.0.0.1 -s "$PORT" -n "$NQN"
DEV=
io() {
	DEV=$(wait_ns "$NQN" 1) || return 1
	echo "namespace 1 is $DEV"
	fio_verify "$DEV" 32M
}
step "fio write + verify 32 MiB" io
step "disconnect" nvme disconnect -n "$NQN"

remove_package() {
	echo "# edited by the administrator" >>/etc/nvmfd/nvmfd.toml
	DEBIAN_FRONTEND=noninteractive dpkg -r nvmfd || return 1
	expect_eq "stopped by removal" "$(systemctl is-active nvmfd 2>&1)" inactive &&
		[ ! -e /usr/sbin/nvmfd ] && [ -d /var/lib/nvmfd ] &&
		expect_grep "edited conffile kept" '^# edited by the administrator' /etc/nvmfd/nvmfd.toml
}
step "dpkg -r stops the service, keeps the edited conffile and /var/lib/nvmfd" remove_package
finish
