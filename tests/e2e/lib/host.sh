# Helpers around the stock Linux NVMe-oF host (nvme-cli + nvme-tcp/nvme-rdma) for scenarios.
# All lookups go through sysfs, so they work without udev.

# load_host_modules TRANSPORT…: the host drivers (tcp, rdma) plus crc32c for digests.
load_host_modules() {
	local t
	modprobe crc32c_intel 2>/dev/null || modprobe crc32c_generic
	for t in "$@"; do
		modprobe "nvme_$t" || return 1
	done
}

# tcp_listening PORT: a socket listens on PORT (IPv4 or IPv6), per /proc/net/tcp*.
tcp_listening() {
	local hex
	hex=$(printf ':%04X' "$1")
	# field 2 is local_address:port, field 4 the state (0A = LISTEN)
	awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
		/proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# wait_tcp_listen PORT [SECS]
wait_tcp_listen() {
	local i
	for ((i = 0; i < ${2:-20} * 10; i++)); do
		tcp_listening "$1" && return 0
		sleep 0.1
	done
	echo "nothing listens on TCP port $1 after ${2:-20} s"
	return 1
}

# ctrl_of NQN [TRANSPORT]: name (nvmeN) of a live fabrics controller connected to subsystem NQN.
ctrl_of() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c/subsysnqn" ] || continue
		[ "$(cat "$c/subsysnqn")" = "$1" ] || continue
		[ -z "${2:-}" ] || [ "$(cat "$c/transport")" = "$2" ] || continue
		basename "$c"
		return 0
	done
	return 1
}

# ctrl_of_host NQN HOSTNQN [TRANSPORT]: name (nvmeN) of the fabrics controller that host identity
# HOSTNQN has to subsystem NQN (several host identities of one machine each have their own).
ctrl_of_host() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c/subsysnqn" ] || continue
		[ "$(cat "$c/subsysnqn")" = "$1" ] || continue
		[ "$(cat "$c/hostnqn" 2>/dev/null)" = "$2" ] || continue
		[ -z "${3:-}" ] || [ "$(cat "$c/transport")" = "$3" ] || continue
		basename "$c"
		return 0
	done
	return 1
}

# subsys_dir NQN: the host's nvme-subsystem directory (sysfs) for subsystem NQN.
subsys_dir() {
	local s
	for s in /sys/class/nvme-subsystem/nvme-subsys*; do
		[ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$1" ] && { echo "$s"; return 0; }
	done
	return 1
}

# ns_dev NQN NSID: the block device (/dev/nvmeXnY) for namespace NSID of subsystem NQN. With
# native multipath (Debian's default) the visible node is the subsystem's head device.
ns_dev() {
	local s b
	for s in /sys/class/nvme-subsystem/nvme-subsys*; do
		[ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$1" ] || continue
		for b in "$s"/nvme*n*; do
			[ -e "$b/nsid" ] || continue
			if [ "$(cat "$b/nsid")" = "$2" ]; then
				echo "/dev/$(basename "$b")"
				return 0
			fi
		done
	done
	# Without multipath, namespaces hang off the controller.
	local c
	c=$(ctrl_of "$1") || return 1
	for b in /sys/class/nvme/"$c"/"$c"n*; do
		[ -e "$b/nsid" ] && [ "$(cat "$b/nsid")" = "$2" ] && { echo "/dev/$(basename "$b")"; return 0; }
	done
	return 1
}

# wait_ns NQN NSID [SECS]: the namespace's block device exists (no udev: mknod is devtmpfs's job).
wait_ns() {
	local i d
	for ((i = 0; i < ${3:-15} * 10; i++)); do
		d=$(ns_dev "$1" "$2") && [ -b "$d" ] && { echo "$d"; return 0; }
		sleep 0.1
	done
	echo "no block device for $1 nsid $2 after ${3:-15} s; nvme list:" >&2
	nvme list >&2
	return 1
}

# find_namespaces NQN NSID…: waits for each namespace's block device; DEV[nsid] = its path
# (DEV: an array of the calling scenario).
find_namespaces() {
	local nqn=$1 n d
	shift
	for n in "$@"; do
		d=$(wait_ns "$nqn" "$n") || return 1
		DEV[n]=$d
		echo "nsid $n: $d"
	done
}

# disconnect_all: best-effort cleanup of every fabrics controller.
disconnect_all() { nvme disconnect-all >/dev/null 2>&1 || true; }

# fio_verify DEV SIZE [extra fio args…]: random writes of mixed sizes with crc32c verification of
# everything written (write phase, then read-back-and-verify phase in the same job).
fio_verify() {
	local dev=$1 size=$2
	shift 2
	fio --name=verify --filename="$dev" --rw=randwrite --bsrange=4k-128k --size="$size" \
		--direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 \
		--do_verify=1 --randrepeat=1 --group_reporting --output-format=normal "$@"
}

# fio_reverify DEV SIZE: read back and verify what fio_verify wrote (same seed ⇒ same blocks), so
# data that only survived in a cache on the way is caught too.
fio_reverify() {
	local dev=$1 size=$2
	shift 2
	fio --name=verify --filename="$dev" --rw=randwrite --bsrange=4k-128k --size="$size" \
		--direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 \
		--verify_only --randrepeat=1 --group_reporting "$@"
}

# ctrl_state NQN: sysfs state of the subsystem's controller (live, connecting, resetting, …).
ctrl_state() {
	local c
	c=$(ctrl_of "$1") || { echo "none"; return 0; }
	cat "/sys/class/nvme/$c/state"
}

# wait_ctrl_state NQN STATE [SECS]
wait_ctrl_state() {
	local i s
	for ((i = 0; i < ${3:-30} * 10; i++)); do
		s=$(ctrl_state "$1")
		[ "$s" = "$2" ] && { echo "controller for $1 is $s after $((i / 10)).$((i % 10)) s"; return 0; }
		sleep 0.1
	done
	echo "controller for $1 is '$s', not '$2', after ${3:-30} s"
	return 1
}

# rdma_listening ADDR PORT: an rdma_cm listener (kernel or user space) is bound to ADDR:PORT.
rdma_listening() {
	rdma resource show cm_id 2>/dev/null | grep -w LISTEN | grep -q "src-addr $1:$2 "
}

# wait_rdma_listen ADDR PORT [SECS]
wait_rdma_listen() {
	local i
	for ((i = 0; i < ${3:-20} * 10; i++)); do
		rdma_listening "$1" "$2" && return 0
		sleep 0.1
	done
	echo "no rdma_cm listener on $1:$2 after ${3:-20} s:"
	rdma resource show cm_id
	return 1
}

# wait_crng [SECS]: the kernel's CRNG is seeded. Kernel 6.12 takes DH-HMAC-CHAP challenges and
# TLS key material from it, and a connect issued before it is ready stalls in early boot under
# TCG (run.sh gives trixie guests a virtio-rng device to feed it). /dev/random blocks until then.
wait_crng() {
	if ! timeout "${1:-120}" head -c 1 /dev/random >/dev/null; then
		echo "CRNG not ready after ${1:-120} s"
		return 1
	fi
	dmesg | grep -m1 'crng init done' || echo "CRNG ready (no 'crng init done' line in dmesg)"
}

# expect_refused NAME CMD…: CMD must fail. Records its exit status, stderr/stdout and the kernel
# messages it caused in $E2E_OUT/reference/refused-NAME.txt (the reference results that nvmfd
# scenarios are compared with) and echoes them into the step log. Sets REFUSED_RC, REFUSED_OUT
# (command output) and REFUSED_KMSG (its kernel messages, "[time] " prefixes removed).
expect_refused() {
	local name=$1 f
	shift
	mkdir -p "$E2E_OUT/reference"
	f="$E2E_OUT/reference/refused-$name.txt"
	dmesg -C
	REFUSED_OUT=$("$@" 2>&1)
	REFUSED_RC=$?
	# The host logs some lines after the command returned (teardown of the failed controller).
	sleep 1
	REFUSED_KMSG=$(dmesg | sed 's/^\[[ 0-9.]*\] //')
	{
		echo "command: $*"
		echo "exit status: $REFUSED_RC"
		echo "output:"
		sed 's/^/  /' <<<"$REFUSED_OUT"
		echo "kernel messages:"
		sed 's/^/  /' <<<"$REFUSED_KMSG"
	} | tee "$f"
	if [ "$REFUSED_RC" = 0 ]; then
		echo "MISMATCH: '$*' succeeded, expected a refusal"
		return 1
	fi
}

# passthru_128k FROM_DEV TO_DEV SLBA FILE: 128 KiB of random data (FILE.in) written to namespace
# 1 through controller FROM_DEV (/dev/nvmeN: that controller's own path, not a multipath head),
# read back through TO_DEV (FILE.out) and compared. 512-byte blocks: CDW10 = SLBA, CDW12 = 255.
passthru_128k() {
	dd if=/dev/urandom of="$4.in" bs=128k count=1 status=none
	nvme io-passthru "$1" --opcode=0x01 --namespace-id=1 --data-len=131072 --write \
		--input-file="$4.in" --cdw10="$3" --cdw12=255 || return 1
	nvme io-passthru "$2" --opcode=0x02 --namespace-id=1 --data-len=131072 --read \
		--cdw10="$3" --cdw12=255 --raw-binary >"$4.out" || return 1
	echo "wrote via $1, read via $2, SLBA $3"
	cmp "$4.in" "$4.out"
}
