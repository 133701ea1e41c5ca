# Field checks on what the Linux host reads from a target (nvme-cli JSON output). Each is a step
# function: prints every check, returns 1 if any failed, so a failure names the exact field.

# check_discovery JSON NQN TRTYPE ADDR SVCID: the log has an NVM subsystem entry for NQN that a
# host can use as is (address the host connected to, never 0.0.0.0).
check_discovery() {
	local j=$1 nqn=$2 bad=0
	local -a v
	# One jq run (about a second each under TCG): trtype traddr trsvcid adrfam subtype.
	mapfile -t v < <(jq -r --arg n "$nqn" '[.records[] | select(.subnqn == $n)][0]
		| if . == null then empty else (.trtype, .traddr, .trsvcid, .adrfam, .subtype) end' "$j")
	if [ "${#v[@]}" != 5 ]; then
		echo "MISMATCH: no discovery log entry for $nqn in:"
		cat "$j"
		return 1
	fi
	expect_eq "trtype" "${v[0]}" "$3" || bad=1
	expect_eq "traddr" "${v[1]}" "$4" || bad=1
	expect_eq "trsvcid" "${v[2]}" "$5" || bad=1
	expect_eq "adrfam" "${v[3]}" ipv4 || bad=1
	expect_eq "subtype" "${v[4]}" "nvme subsystem" || bad=1
	return $bad
}

# check_id_ctrl JSON NQN IN_CAPSULE_BYTES MIN_NN: the Identify Controller fields the Linux host
# relies on (see /work/shared/interop-notes.md "Identify Controller").
check_id_ctrl() {
	local bad=0
	local -A f=()
	load_json f "$1" || return 1
	expect_eq "subnqn" "${f[subnqn]}" "$2" || bad=1
	# NVMe-oF: IOCCSZ = (SQE 64 bytes + in-capsule data) / 16; the host sizes in-capsule writes by it.
	expect_num "ioccsz" "${f[ioccsz]}" -eq $(((64 + $3) / 16)) || bad=1
	expect_num "iorcsz" "${f[iorcsz]}" -eq 1 || bad=1
	expect_num "icdoff" "${f[icdoff]}" -eq 0 || bad=1
	expect_num "fcatt (dynamic controller model)" "${f[fcatt]}" -eq 0 || bad=1
	expect_num "msdbd" "${f[msdbd]}" -eq 1 || bad=1
	expect_num "cntrltype (I/O controller)" "${f[cntrltype]}" -eq 1 || bad=1
	expect_num "sqes" "${f[sqes]}" -eq 102 || bad=1 # 0x66: 64-byte SQEs
	expect_num "cqes" "${f[cqes]}" -eq 68 || bad=1  # 0x44: 16-byte CQEs
	# Without VWC the host never sends Flush and silently drops FUA.
	expect_bits "vwc (volatile write cache present)" "${f[vwc]}" 0x1 || bad=1
	expect_bits "sgls (SGLs supported)" "${f[sgls]}" 0x1 || bad=1
	# In-capsule data arrives as an offset SGL (NVMe-TCP 1.0 §3.3, Base spec SGLS bit 20).
	if [ "$3" -gt 0 ]; then
		expect_bits "sgls (SGL offset supported)" "${f[sgls]}" 0x100000 || bad=1
	fi
	expect_bits "oaes (namespace attribute notices)" "${f[oaes]}" 0x100 || bad=1
	# MDTS is a power of two in units of the minimum page size; 0 (no limit) is legal but nvmfd
	# advertises max_data_transfer.
	expect_num "mdts" "${f[mdts]}" -gt 0 || bad=1
	expect_num "nn" "${f[nn]}" -ge "$4" || bad=1
	expect_num "cntlid" "${f[cntlid]}" -lt 65520 || bad=1 # 0xFFF0.. are reserved
	expect_num "kas (keep alive granularity)" "${f[kas]}" -gt 0 || bad=1
	expect_num "maxcmd" "${f[maxcmd]}" -gt 0 || bad=1
	[[ "${f[sn]}" =~ [^\ ] ]] || { echo "MISMATCH: empty serial number"; bad=1; }
	return $bad
}

# check_id_ns JSON SIZE_BYTES LBADS: capacity and LBA format as configured.
check_id_ns() {
	local bad=0 lbads
	local -A f=()
	load_json f "$1" || return 1
	lbads=$(jq -r ".lbafs[$((f[flbas] & 0xf))].ds" "$1")
	expect_num "lbads (log2 LBA size)" "$lbads" -eq "$3" || bad=1
	expect_num "nsze (LBAs)" "${f[nsze]}" -eq $(($2 >> $3)) || bad=1
	expect_num "ncap" "${f[ncap]}" -eq "${f[nsze]}" || bad=1
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
