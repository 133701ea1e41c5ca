# Field checks on what the Linux host reads from a target (nvme-cli JSON output). Each is a step
# function: prints every check, returns 1 if any failed, so a failure names the exact field.

# check_discovery JSON NQN TRTYPE ADDR SVCID: the log has an NVM subsystem entry for NQN that a
# host can use as is (address the host connected to, never 0.0.0.0).
check_discovery() {
	local j=$1 nqn=$2 rec bad=0
	rec=$(jq -c --arg n "$nqn" '[.records[] | select(.subnqn == $n)][0]' "$j")
	if [ -z "$rec" ] || [ "$rec" = null ]; then
		echo "MISMATCH: no discovery log entry for $nqn in:"
		cat "$j"
		return 1
	fi
	echo "entry: $rec"
	expect_eq "trtype" "$(jq -r .trtype <<<"$rec")" "$3" || bad=1
	expect_eq "traddr" "$(jq -r .traddr <<<"$rec")" "$4" || bad=1
	expect_eq "trsvcid" "$(jq -r .trsvcid <<<"$rec")" "$5" || bad=1
	expect_eq "adrfam" "$(jq -r .adrfam <<<"$rec")" ipv4 || bad=1
	expect_eq "subtype" "$(jq -r .subtype <<<"$rec")" "nvme subsystem" || bad=1
	return $bad
}

# check_id_ctrl JSON NQN IN_CAPSULE_BYTES MIN_NN: the Identify Controller fields the Linux host
# relies on (see /work/shared/interop-notes.md "Identify Controller").
check_id_ctrl() {
	local j=$1 bad=0 sgls oaes
	expect_eq "subnqn" "$(jfield "$j" .subnqn)" "$2" || bad=1
	# NVMe-oF: IOCCSZ = (SQE 64 bytes + in-capsule data) / 16; the host sizes in-capsule writes by it.
	expect_num "ioccsz" "$(jfield "$j" .ioccsz)" -eq $(((64 + $3) / 16)) || bad=1
	expect_num "iorcsz" "$(jfield "$j" .iorcsz)" -eq 1 || bad=1
	expect_num "icdoff" "$(jfield "$j" .icdoff)" -eq 0 || bad=1
	expect_num "fcatt (dynamic controller model)" "$(jfield "$j" .fcatt)" -eq 0 || bad=1
	expect_num "msdbd" "$(jfield "$j" .msdbd)" -eq 1 || bad=1
	expect_num "cntrltype (I/O controller)" "$(jfield "$j" .cntrltype)" -eq 1 || bad=1
	expect_num "sqes" "$(jfield "$j" .sqes)" -eq 102 || bad=1 # 0x66: 64-byte SQEs
	expect_num "cqes" "$(jfield "$j" .cqes)" -eq 68 || bad=1  # 0x44: 16-byte CQEs
	# Without VWC the host never sends Flush and silently drops FUA.
	expect_bits "vwc (volatile write cache present)" "$(jfield "$j" .vwc)" 0x1 || bad=1
	sgls=$(jfield "$j" .sgls)
	expect_bits "sgls (SGLs supported)" "$sgls" 0x1 || bad=1
	# In-capsule data arrives as an offset SGL (NVMe-TCP 1.0 §3.3, Base spec SGLS bit 20).
	[ "$3" -gt 0 ] && { expect_bits "sgls (SGL offset supported)" "$sgls" 0x100000 || bad=1; }
	oaes=$(jfield "$j" .oaes)
	expect_bits "oaes (namespace attribute notices)" "$oaes" 0x100 || bad=1
	# MDTS is a power of two in units of the minimum page size; 0 (no limit) is legal but nvmfd
	# advertises max_data_transfer.
	expect_num "mdts" "$(jfield "$j" .mdts)" -gt 0 || bad=1
	expect_num "nn" "$(jfield "$j" .nn)" -ge "$4" || bad=1
	expect_num "cntlid" "$(jfield "$j" .cntlid)" -lt 65520 || bad=1 # 0xFFF0.. are reserved
	expect_num "kas (keep alive granularity)" "$(jfield "$j" .kas)" -gt 0 || bad=1
	expect_num "maxcmd" "$(jfield "$j" .maxcmd)" -gt 0 || bad=1
	[[ "$(jfield "$j" .sn)" =~ [^\ ] ]] || { echo "MISMATCH: empty serial number"; bad=1; }
	return $bad
}

# check_id_ns JSON SIZE_BYTES LBADS: capacity and LBA format as configured.
check_id_ns() {
	local j=$1 bad=0 flbas lbads nsze
	flbas=$(jfield "$j" .flbas)
	lbads=$(jq -r ".lbafs[$((flbas & 0xf))].ds" "$j")
	expect_num "lbads (log2 LBA size)" "$lbads" -eq "$3" || bad=1
	nsze=$(jfield "$j" .nsze)
	expect_num "nsze (LBAs)" "$nsze" -eq $(($2 >> $3)) || bad=1
	expect_num "ncap" "$(jfield "$j" .ncap)" -eq "$nsze" || bad=1
	return $bad
}

# check_ns_descs DEV: at least one namespace identifier (UUID/NGUID/EUI64) that multipath can key on.
check_ns_descs() {
	local out
	out=$(nvme ns-descs "$1") || return 1
	echo "$out"
	if grep -Eq '^(uuid|nguid|eui64)[[:space:]]*:' <<<"$out"; then
		echo "ok: namespace identification descriptor present"
	else
		echo "MISMATCH: no UUID/NGUID/EUI64 descriptor"
		return 1
	fi
}

# check_smart_log CTRL: readable and no critical warning.
check_smart_log() {
	local out cw
	out=$(nvme smart-log "$1" -o json) || return 1
	echo "$out"
	cw=$(jq -r .critical_warning <<<"$out")
	expect_num "critical_warning" "$cw" -eq 0
}
