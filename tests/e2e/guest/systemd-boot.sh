#!/bin/bash
# For scenarios marked "# e2e-init: systemd": exec'd by guest/init.sh as PID 1 before it mounts
# anything. Installs a one-shot unit that runs the scenario (guest/systemd-scenario.sh) and
# hands PID 1 over to systemd with that unit as the only start-up goal, so the scenario runs
# under a real service manager (journald, notify socket, cgroups) instead of the busybox-style
# init. The root image is a throw-away snapshot: writing units into /etc is fine.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
scenario=$1

mount -t proc proc /proc 2>/dev/null
if [ ! -x /lib/systemd/systemd ]; then
	echo "FAIL guest: scenario $scenario needs systemd, which the image lacks (image/guest-packages.txt)" >/dev/console
	echo 2 >/out/exit-code
	echo o >/proc/sysrq-trigger
	sleep 5
	exit 1
fi

cat >/etc/systemd/system/e2e-scenario.service <<EOF
[Unit]
Description=nvmfd e2e scenario $scenario
After=basic.target systemd-journald.service
# The scenario ends by powering off itself; if systemd could not even start it, power off too.
OnFailure=poweroff.target

[Service]
Type=oneshot
ExecStart=/bin/bash /e2e/guest/systemd-scenario.sh $scenario
StandardInput=null
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
EOF

# Nothing else is wanted: no getty, no network services, no udev (the image has none).
# --unit: systemd(1) takes the start-up goal on its command line.
exec /lib/systemd/systemd --unit=e2e-scenario.service --show-status=false --log-target=kmsg
