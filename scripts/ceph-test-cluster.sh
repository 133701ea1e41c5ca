#!/usr/bin/env bash
# A real single-node Ceph cluster (one monitor, one BlueStore OSD, pool "rbd") on loopback,
# everything under one folder, no containers and no systemd. For nvmfd's RBD integration
# test and for trying RBD namespaces by hand.
#
#   scripts/ceph-test-cluster.sh start DIR   # ~15 s; prints DIR/ceph.conf when ready
#   scripts/ceph-test-cluster.sh stop DIR    # SIGTERM each daemon by pid file, then rm -rf DIR
#   scripts/ceph-test-cluster.sh deps        # apt-get the Ceph packages (Debian 12: Pacific)
#
# Clients use `-c DIR/ceph.conf` (client.admin's keyring is named there), e.g.
#   rbd -c DIR/ceph.conf create rbd/disk0 --size 1G
# and nvmfd: rbd = "rbd/disk0", ceph_conf = "DIR/ceph.conf".
#
# Why the settings below: pool size 1 with CRUSH choosing among OSDs (not hosts) is what lets
# one OSD hold every placement group; the BlueStore block file lives outside the OSD folder
# (a `block` symlink inside pointing into itself loops); osd_client_watch_timeout is short so
# that a client killed with -9 (nvmfd crash tests) does not hold image watches for 30 s.
# Everything binds to 127.0.0.1 only.
set -euo pipefail

die() { echo "ceph-test-cluster: $*" >&2; exit 1; }

deps() {
    local pkgs=(ceph-mon ceph-osd ceph-common librbd-dev librados-dev uuid-runtime)
    export DEBIAN_FRONTEND=noninteractive
    # A fresh machine may have no package lists yet: update once and retry.
    apt-get install -y --no-install-recommends "${pkgs[@]}" ||
        { apt-get update && apt-get install -y --no-install-recommends "${pkgs[@]}"; }
}

free_port() {
    # A port nothing listens on, from the dynamic range; the monitor binds it moments later.
    local port
    for _ in $(seq 50); do
        port=$((20000 + RANDOM % 30000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    die "no free port found"
}

# wait_for SECONDS DESCRIPTION COMMAND...
wait_for() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what (logs: $D/log)"
        sleep 0.5
    done
}

osd_up() { ceph -c "$D/ceph.conf" osd dump 2>/dev/null | grep -q '^osd\.0 up'; }

start() {
    for tool in ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd uuidgen; do
        command -v "$tool" >/dev/null || die "$tool not found (run: $0 deps)"
    done
    [ -e "$D" ] && [ -n "$(ls -A "$D" 2>/dev/null)" ] && die "$D exists and is not empty"
    mkdir -p "$D"/{mon,osd/ceph-0,run,log}
    D=$(cd "$D" && pwd)
    local port fsid osd_uuid osd_secret started=$SECONDS
    port=$(free_port)
    fsid=$(uuidgen)
    cat >"$D/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = v2:127.0.0.1:$port
mon_initial_members = a
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_msgr2 = true
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
keyring = $D/keyring.admin
run_dir = $D/run
admin_socket = $D/run/\$name.asok
pid_file = $D/run/\$name.pid
log_file = $D/log/\$name.log
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
auth_allow_insecure_global_id_reclaim = false

[client]
# One admin socket per client process (several tests and nvmfd run side by side).
admin_socket = $D/run/\$name.\$pid.asok

[mon]
mon_data = $D/mon/\$cluster-\$id

[osd]
osd_data = $D/osd/\$cluster-\$id
keyring = $D/osd/\$cluster-\$id/keyring
osd_objectstore = bluestore
bluestore_block_path = $D/\$cluster-\$id.block
bluestore_block_create = true
bluestore_block_size = 4294967296
bluestore_fsck_on_mkfs = false
osd_client_watch_timeout = 5
osd_memory_target = 939524096
EOF
    ceph-authtool --create-keyring "$D/keyring.mon" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$D/keyring.admin" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
    ceph-authtool "$D/keyring.mon" --import-keyring "$D/keyring.admin" >/dev/null
    monmaptool --create --addv a "[v2:127.0.0.1:$port]" --fsid "$fsid" "$D/monmap" >/dev/null
    ceph-mon -c "$D/ceph.conf" --mkfs -i a --monmap "$D/monmap" --keyring "$D/keyring.mon"
    ceph-mon -c "$D/ceph.conf" -i a 2>>"$D/log/mon.a.stderr"
    wait_for 30 "the monitor" ceph -c "$D/ceph.conf" --connect-timeout 5 mon stat

    osd_uuid=$(uuidgen)
    osd_secret=$(ceph-authtool --gen-print-key)
    local id
    id=$(echo "{\"cephx_secret\": \"$osd_secret\"}" |
        ceph -c "$D/ceph.conf" osd new "$osd_uuid" -i -)
    [ "$id" = 0 ] || die "expected osd id 0, got '$id'"
    ceph-authtool --create-keyring "$D/osd/ceph-0/keyring" --name osd.0 --add-key "$osd_secret" >/dev/null
    ceph-osd -c "$D/ceph.conf" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>>"$D/log/mkfs.log"
    ceph-osd -c "$D/ceph.conf" -i 0 2>>"$D/log/osd.0.stderr"
    wait_for 60 "osd.0 up" osd_up

    ceph -c "$D/ceph.conf" osd pool create rbd 8 8 >/dev/null 2>&1
    rbd -c "$D/ceph.conf" pool init rbd
    echo "ceph-test-cluster: up in $((SECONDS - started))s" >&2
    echo "$D/ceph.conf"
}

stop() {
    [ -d "$D" ] || return 0
    local pids=() pidfile pid
    for pidfile in "$D"/run/*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        # Only our own daemons: the pid must still run a ceph binary with this config.
        if grep -qa "$D/ceph.conf" "/proc/$pid/cmdline" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
        fi
    done
    local deadline=$((SECONDS + 20))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.2
        done
    done
    rm -rf "$D"
}

case "${1:-}" in
start) [ $# -eq 2 ] || die "usage: $0 start DIR"; D=$2; start ;;
stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; D=$2; stop ;;
deps) deps ;;
*) die "usage: $0 start DIR | stop DIR | deps" ;;
esac
