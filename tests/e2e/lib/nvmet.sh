# The kernel's own NVMe target (nvmet), configured through configfs, as the reference that
# nvmfd's behaviour is compared with (Documentation/nvme/nvmet… / nvmetcli do the same writes).
#
#   nvmet_subsys NQN                         allow-any-host subsystem
#   nvmet_ns NQN NSID PATH                   namespace backed by a file or block device
#   nvmet_port ID TRTYPE ADDR SVCID          tcp or rdma, IPv4
#   nvmet_link ID NQN                        export NQN on port ID
#   nvmet_host / nvmet_allow_host            DH-HMAC-CHAP host entries (below)
#   nvmet_port_tls ID                        TLS 1.3 required on port ID
#   nvmet_teardown                           remove everything (reverse order)

NVMET=/sys/kernel/config/nvmet

nvmet_subsys() {
	modprobe nvmet || return 1
	mkdir "$NVMET/subsystems/$1" || return 1
	echo 1 >"$NVMET/subsystems/$1/attr_allow_any_host"
}

nvmet_ns() {
	local d="$NVMET/subsystems/$1/namespaces/$2"
	mkdir "$d" || return 1
	echo -n "$3" >"$d/device_path" || return 1
	echo 1 >"$d/enable"
}

nvmet_port() {
	modprobe "nvmet_$2" || return 1
	local d="$NVMET/ports/$1"
	mkdir "$d" || return 1
	echo "$2" >"$d/addr_trtype"
	echo ipv4 >"$d/addr_adrfam"
	echo "$3" >"$d/addr_traddr"
	echo "$4" >"$d/addr_trsvcid"
}

nvmet_link() {
	ln -s "$NVMET/subsystems/$2" "$NVMET/ports/$1/subsystems/$2"
}

nvmet_teardown() {
	local p s n h
	[ -d "$NVMET" ] || return 0
	for p in "$NVMET"/ports/*; do
		[ -d "$p" ] || continue
		for s in "$p"/subsystems/*; do [ -L "$s" ] && rm "$s"; done
		rmdir "$p"
	done
	for s in "$NVMET"/subsystems/*; do
		[ -d "$s" ] || continue
		for n in "$s"/namespaces/*; do
			[ -d "$n" ] || continue
			echo 0 >"$n/enable"
			rmdir "$n"
		done
		for h in "$s"/allowed_hosts/*; do [ -L "$h" ] && rm "$h"; done
		rmdir "$s"
	done
	# `if`, not `&&`: with no host directory the glob stays literal and a false test as the
	# last command would make the whole teardown fail.
	for h in "$NVMET"/hosts/*; do
		if [ -d "$h" ]; then rmdir "$h" || return 1; fi
	done
}

# rxe_setup [ADDR/PREFIX]: soft-RoCE device rxe0 on a dummy netdev with a guest-private address.
# Everything stays inside the guest (qemu runs with -nic none); on `lo` rxe comes up but rdma_cm
# route resolution fails, hence the dummy interface.
rxe_setup() {
	local addr=${1:-10.99.0.1/24}
	modprobe dummy numdummies=0 || return 1
	# rxe computes its ICRC with the kernel's "crc32" crypto algorithm; nothing autoloads it here.
	modprobe crc32_generic || return 1
	modprobe rdma_rxe || return 1
	modprobe rdma_ucm || return 1
	modprobe ib_uverbs || return 1
	ip link add dummy0 type dummy || return 1
	ip addr add "$addr" dev dummy0 || return 1
	ip link set dummy0 up || return 1
	rdma link add rxe0 type rxe netdev dummy0 || return 1
	rdma link show
	ibv_devices
}

# In-band authentication (DH-HMAC-CHAP, kernel 6.x configfs: hosts/<NQN>/dhchap_*):
#   nvmet_host HOSTNQN KEY [CTRL_KEY] [HASH] [DHGROUP]   host entry with its secrets
#   nvmet_allow_host NQN HOSTNQN                         only allowed hosts may connect to NQN
nvmet_host() {
	local d="$NVMET/hosts/$1"
	[ -d "$d" ] || mkdir "$d" || return 1
	echo -n "$2" >"$d/dhchap_key" || return 1
	echo -n "${3:-}" >"$d/dhchap_ctrl_key" || return 1
	echo -n "${4:-hmac(sha256)}" >"$d/dhchap_hash" || return 1
	echo -n "${5:-ffdhe2048}" >"$d/dhchap_dhgroup" || return 1
	grep -H . "$d"/dhchap_hash "$d"/dhchap_dhgroup
}

nvmet_allow_host() {
	echo 0 >"$NVMET/subsystems/$1/attr_allow_any_host" || return 1
	ln -s "$NVMET/hosts/$2" "$NVMET/subsystems/$1/allowed_hosts/$2"
}

# nvmet_port_tls ID: the port requires TLS 1.3 (secure channel required; tlshd does the
# handshake with the PSK from the .nvme keyring). Set before the port is linked to a subsystem.
nvmet_port_tls() {
	local d="$NVMET/ports/$1"
	echo tls1.3 >"$d/addr_tsas" || return 1
	echo required >"$d/addr_treq" || return 1
	grep -H . "$d"/addr_tsas "$d"/addr_treq
}

# nvmet_save FILE: the configfs tree as JSON in the shape `nvmetcli save` writes (nvmetcli is not
# packaged in Debian 12 and the guest has no network to fetch it). As nvmetcli does, an object's
# attribute file GROUP_NAME becomes "GROUP": {"NAME": "<contents>"}; a namespace's group also
# appears as "ana_grpid", ports list their ANA groups, linked subsystems and referrals.
_json_str() {
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	printf '"%s"' "$s"
}
_json_join() { # _json_join OPEN CLOSE PART…
	local open=$1 close=$2 out= sep=
	shift 2
	for p in "$@"; do
		out+="$sep$p"
		sep=", "
	done
	printf '%s%s%s' "$open" "$out" "$close"
}
# _json_groups DIR GROUP…: one "GROUP": {…} member per GROUP, printed one per line.
_json_groups() {
	local dir=$1 g f name
	shift
	for g in "$@"; do
		local members=()
		for f in "$dir/${g}_"*; do
			[ -f "$f" ] || continue
			name=${f##*/}
			members+=("$(_json_str "${name#"${g}_"}"): $(_json_str "$(cat "$f" 2>/dev/null)")")
		done
		printf '%s: %s\n' "$(_json_str "$g")" "$(_json_join '{' '}' "${members[@]}")"
	done
}
nvmet_save() {
	local hosts=() ports=() subsystems=() h p s n l g
	for h in "$NVMET"/hosts/*; do
		[ -d "$h" ] && hosts+=("{\"nqn\": $(_json_str "${h##*/}")}")
	done
	for p in "$NVMET"/ports/*; do
		[ -d "$p" ] || continue
		local parts=("\"portid\": ${p##*/}") groups=() links=() referrals=()
		mapfile -t -O ${#parts[@]} parts < <(_json_groups "$p" addr param)
		for g in "$p"/ana_groups/*; do
			[ -d "$g" ] || continue
			groups+=("{\"grpid\": ${g##*/}, $(_json_groups "$g" ana)}")
		done
		for l in "$p"/subsystems/*; do
			[ -L "$l" ] && links+=("$(_json_str "${l##*/}")")
		done
		for l in "$p"/referrals/*; do
			[ -d "$l" ] || continue
			referrals+=("{\"name\": $(_json_str "${l##*/}"), \"enable\": $(cat "$l/enable"), $(_json_groups "$l" addr)}")
		done
		parts+=("\"ana_groups\": $(_json_join '[' ']' "${groups[@]}")"
			"\"subsystems\": $(_json_join '[' ']' "${links[@]}")"
			"\"referrals\": $(_json_join '[' ']' "${referrals[@]}")")
		ports+=("$(_json_join '{' '}' "${parts[@]}")")
	done
	for s in "$NVMET"/subsystems/*; do
		[ -d "$s" ] || continue
		local parts=("\"nqn\": $(_json_str "${s##*/}")") allowed=() namespaces=()
		mapfile -t -O 1 parts < <(_json_groups "$s" attr)
		for l in "$s"/allowed_hosts/*; do
			[ -L "$l" ] && allowed+=("$(_json_str "${l##*/}")")
		done
		for n in "$s"/namespaces/*; do
			[ -d "$n" ] || continue
			local ns=("\"nsid\": ${n##*/}" "\"enable\": $(cat "$n/enable")"
				"\"ana_grpid\": $(cat "$n/ana_grpid")")
			mapfile -t -O 3 ns < <(_json_groups "$n" device ana resv)
			namespaces+=("$(_json_join '{' '}' "${ns[@]}")")
		done
		parts+=("\"allowed_hosts\": $(_json_join '[' ']' "${allowed[@]}")"
			"\"namespaces\": $(_json_join '[' ']' "${namespaces[@]}")")
		subsystems+=("$(_json_join '{' '}' "${parts[@]}")")
	done
	_json_join '{' '}' "\"hosts\": $(_json_join '[' ']' "${hosts[@]}")" \
		"\"ports\": $(_json_join '[' ']' "${ports[@]}")" \
		"\"subsystems\": $(_json_join '[' ']' "${subsystems[@]}")" | jq . >"$1"
}
