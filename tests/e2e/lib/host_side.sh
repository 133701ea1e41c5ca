# The host side of a scenario (tests/e2e/hosts/NAME.sh, run on the machine that boots the
# guest: a Ceph cluster, gateways) and the guest talk through the shared output directory:
# the host side touches host-ready once it is up, the guest writes numbered requests into
# host-requests/ (renamed in, so a request is never read half-written) and the host side
# answers each in host-replies/ with a first line "ok …" or anything else.

HOST_REQ=0
# request WORDS…: ask the host side and print its reply; fails when the reply does not start
# with "ok", or when none came within HOST_REPLY_SECS (default 30).
request() {
	HOST_REQ=$((HOST_REQ + 1))
	local n i
	n=$(printf '%03d' "$HOST_REQ")
	mkdir -p "$E2E_OUT/host-requests-new" "$E2E_OUT/host-requests"
	echo "$*" >"$E2E_OUT/host-requests-new/$n"
	mv "$E2E_OUT/host-requests-new/$n" "$E2E_OUT/host-requests/$n"
	for ((i = 0; i < ${HOST_REPLY_SECS:-30} * 10; i++)); do
		if [ -f "$E2E_OUT/host-replies/$n" ]; then
			echo "host: $* →"
			cat "$E2E_OUT/host-replies/$n"
			head -n1 "$E2E_OUT/host-replies/$n" | grep -q '^ok'
			return
		fi
		sleep 0.1
	done
	echo "no reply from the host side to '$*' in ${HOST_REPLY_SECS:-30} s"
	return 1
}

# net_up: the guest's end of qemu's user network (10.0.2.15; the host is 10.0.2.100), then
# up to 10 s for the host side to be ready.
net_up() {
	modprobe virtio_net || return 1
	ip link set lo up && ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 || return 1
	ip addr show eth0
	local i
	for ((i = 0; i < 100; i++)); do
		[ -e "$E2E_OUT/host-ready" ] && { echo "host side ready"; return 0; }
		sleep 0.1
	done
	echo "host side not ready"
	return 1
}
