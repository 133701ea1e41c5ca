#!/bin/bash
# PID 1 of the e2e guest (exec'd by the initramfs after switch_root). Sets up the bare minimum a
# Debian userland needs without systemd/udev, runs one scenario, leaves its exit code and logs on
# the results share (/out) and powers off. Whatever happens, the VM must end: every path below
# reaches poweroff, and run.sh kills qemu after its timeout anyway.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8

# Scenarios marked "# e2e-init: systemd" run under systemd as PID 1 (guest/systemd-boot.sh).
scenario=$(cat /out/scenario 2>/dev/null)
if [ -n "$scenario" ] && grep -qs '^# e2e-init: *systemd' "/e2e/scenarios/$scenario.sh"; then
	exec bash /e2e/guest/systemd-boot.sh "$scenario"
fi

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
# udev would create these; bash process substitution and scripts need them.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
modprobe configfs && mount -t configfs configfs /sys/kernel/config
ip link set lo up
hostname nvmfd-e2e

power_off() {
	sync
	echo o >/proc/sysrq-trigger
	sleep 5
	busybox poweroff -f
}

scenario=$(cat /out/scenario 2>/dev/null)
if [ -z "$scenario" ] || [ ! -f "/e2e/scenarios/$scenario.sh" ]; then
	echo "FAIL guest: unknown scenario '$scenario'" >/dev/console
	echo 2 >/out/exit-code
	power_off
fi

# Without udev nothing is loaded on demand. admin_timeout=5: a connect to a misbehaving target
# otherwise blocks for the default 60 s before the host gives up.
modprobe nvme_core admin_timeout=5

export E2E_OUT=/out E2E_DIR=/e2e E2E_NVMFD_BIN=/opt/nvmfd/nvmfd E2E_SCENARIO="$scenario"
[ -f /out/env ] && . /out/env
mkdir -p /out/steps
echo "INFO guest up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r), scenario $scenario" >/dev/console

bash "/e2e/scenarios/$scenario.sh" </dev/null 2>&1 | tee /out/scenario.log >/dev/console
rc=${PIPESTATUS[0]}

echo "$rc" >/out/exit-code
dmesg >/out/dmesg.txt 2>&1
echo "INFO scenario $scenario exited $rc after $(cut -d' ' -f1 /proc/uptime) s of guest uptime" >/dev/console
power_off
