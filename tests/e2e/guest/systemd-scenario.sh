#!/bin/bash
# Runs one "# e2e-init: systemd" scenario as the e2e-scenario.service unit (see
# guest/systemd-boot.sh), with the same environment and results as guest/init.sh provides to
# the others, then powers the VM off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8
scenario=$1

power_off() {
	sync
	echo o >/proc/sysrq-trigger
	sleep 5
	systemctl poweroff --force --force
}

# What guest/init.sh sets up by hand and systemd does not: configfs (nvmet), and the host's
# admin timeout (a connect to a misbehaving target otherwise blocks for 60 s).
if modprobe configfs && ! mountpoint -q /sys/kernel/config; then
	mount -t configfs configfs /sys/kernel/config
fi
modprobe nvme_core admin_timeout=5

export E2E_OUT=/out E2E_DIR=/e2e E2E_NVMFD_BIN=/opt/nvmfd/nvmfd E2E_SCENARIO="$scenario"
[ -f /out/env ] && . /out/env
mkdir -p /out/steps
echo "INFO guest up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r), scenario $scenario (systemd $(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p') as PID 1)" >/dev/console

bash "/e2e/scenarios/$scenario.sh" </dev/null 2>&1 | tee /out/scenario.log >/dev/console
rc=${PIPESTATUS[0]}

echo "$rc" >/out/exit-code
dmesg >/out/dmesg.txt 2>&1
journalctl -b --no-pager -o short-monotonic >/out/journal.txt 2>&1
echo "INFO scenario $scenario exited $rc after $(cut -d' ' -f1 /proc/uptime) s of guest uptime" >/dev/console
power_off
