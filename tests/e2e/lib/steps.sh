# Step library for guest-side scenario scripts (bash). Source it first:
#
#   . "$E2E_DIR/lib/steps.sh"
#   step "connect" nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN"
#   step "id-ctrl fields" check_id_ctrl          # shell functions work too
#   finish
#
# Each step prints `STEP name`, runs with its output in $E2E_OUT/steps/NN-name.log, then prints
# `PASS name (secs)` or `FAIL name: reason` followed by the last lines of its output and of dmesg,
# runs the registered cleanups and ends the scenario with status 1. run.sh relays these lines and
# names the failing step. External commands get a per-step timeout (STEP_TIMEOUT, default 180 s)
# so a hung host command fails its step readably instead of eating the whole VM timeout.

E2E_OUT=${E2E_OUT:-/out}
E2E_DIR=${E2E_DIR:-/e2e}
STEP_TIMEOUT=${STEP_TIMEOUT:-180}
mkdir -p "$E2E_OUT/steps"
_step_n=0
_cleanups=()
_finished=0

info() { echo "INFO $*"; }

# on_cleanup CMD…: run CMD (best effort, output to cleanup.log) when the scenario ends either way.
# Later registrations run first.
on_cleanup() { _cleanups=("$(printf '%q ' "$@")" "${_cleanups[@]}"); }

_run_cleanups() {
	local c
	for c in "${_cleanups[@]}"; do
		eval "$c" >>"$E2E_OUT/cleanup.log" 2>&1 || true
	done
	_cleanups=()
}

_elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME CMD…
step() {
	local name=$1
	shift
	_step_n=$((_step_n + 1))
	local log
	log="$E2E_OUT/steps/$(printf '%02d' "$_step_n")-$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_').log"
	echo "STEP $name"
	local t0 rc
	t0=$(date +%s.%N)
	if declare -F "$1" >/dev/null; then
		{ echo "+ $*"; "$@"; } >"$log" 2>&1
		rc=$?
	else
		{ echo "+ $*"; timeout -k 5 "$STEP_TIMEOUT" "$@"; } >"$log" 2>&1
		rc=$?
		[ "$rc" = 124 ] && echo "(timed out after $STEP_TIMEOUT s)" >>"$log"
	fi
	if [ "$rc" = 0 ]; then
		echo "PASS $name ($(_elapsed "$t0") s)"
		return 0
	fi
	_fail "$name" "exit status $rc after $(_elapsed "$t0") s" "$log"
}

# fail NAME REASON: fail the scenario outside of a step (e.g. a precondition).
fail() { _fail "$1" "$2" ""; }

_fail() {
	local name=$1 reason=$2 log=$3
	echo "FAIL $name: $reason"
	if [ -n "$log" ] && grep -q '^MISMATCH' "$log"; then
		echo "  --- mismatches:"
		grep '^MISMATCH' "$log" | head -n 20 | sed 's/^/  | /'
	fi
	if [ -n "$log" ]; then
		echo "  --- last output of '$name' (full: ${log#"$E2E_OUT"/}):"
		tail -n "${FAIL_TAIL:-25}" "$log" | sed 's/^/  | /'
	fi
	echo "  --- last kernel messages:"
	dmesg | tail -n 15 | sed 's/^/  | /'
	if [ -n "${NVMFD_LOG:-}" ] && [ -s "$NVMFD_LOG" ]; then
		echo "  --- last nvmfd log lines:"
		tail -n 15 "$NVMFD_LOG" | sed 's/^/  | /'
	fi
	echo "$name" >"$E2E_OUT/failed-step"
	_run_cleanups
	exit 1
}

# finish: end of a scenario that got here: run cleanups, report.
finish() {
	_run_cleanups
	_finished=1
	echo "RESULT PASS ($_step_n steps)"
	exit 0
}

# --- small assertion helpers for use inside step functions (print what was wrong, return 1) ------

# expect_eq WHAT ACTUAL EXPECTED
expect_eq() {
	if [ "$2" = "$3" ]; then
		echo "ok: $1 = $2"
	else
		echo "MISMATCH: $1 is '$2', expected '$3'"
		return 1
	fi
}

# expect_num WHAT ACTUAL OP VALUE   (OP: -eq -ne -gt -ge -lt -le)
expect_num() {
	if ! [[ "$2" =~ ^[0-9]+$ ]]; then
		echo "MISMATCH: $1 is '$2', not a number"
		return 1
	fi
	case $3 in
	-eq | -ne | -gt | -ge | -lt | -le) ;;
	*) echo "expect_num: bad operator $3"; return 1 ;;
	esac
	if command test "$2" "$3" "$4"; then
		echo "ok: $1 = $2 ($3 $4)"
	else
		echo "MISMATCH: $1 is $2, expected $3 $4"
		return 1
	fi
}

# expect_bits WHAT VALUE MASK: every bit of MASK is set in VALUE.
expect_bits() {
	if [ $(($2 & $3)) = $(($3)) ]; then
		echo "ok: $1 = $(printf '%#x' "$2") has bits $(printf '%#x' "$3")"
	else
		echo "MISMATCH: $1 = $(printf '%#x' "$2") lacks bits $(printf '%#x' $(($3 & ~$2)))"
		return 1
	fi
}

# expect_grep WHAT PATTERN FILE: FILE has a line matching the extended regex PATTERN.
expect_grep() {
	if grep -Eq -- "$2" "$3"; then
		echo "ok: $1"
	else
		echo "MISMATCH: $1: no line matching /$2/ in $3:"
		sed 's/^/    /' "$3"
		return 1
	fi
}

# expect_fgrep WHAT TEXT FILE: FILE has a line containing TEXT (a fixed string, e.g. "hmac(sha256)").
expect_fgrep() {
	if grep -Fq -- "$2" "$3"; then
		echo "ok: $1"
	else
		echo "MISMATCH: $1: no line containing '$2' in $3:"
		sed 's/^/    /' "$3"
		return 1
	fi
}

# to_file FILE CMD…: run CMD with stdout into FILE (and echo it into the step log).
to_file() {
	local f=$1
	shift
	"$@" >"$f" || return 1
	cat "$f"
}

# jfield FILE JQ-EXPR: one value from a JSON file ("null" when absent).
jfield() { jq -r "$2" "$1"; }

# load_json ARRAY-NAME FILE: the top-level scalar fields of a JSON object into an associative
# array (declare -A NAME first). One jq run: jq takes about a second to start under TCG.
load_json() {
	local -n _into=$1
	local k v
	while IFS=$'\t' read -r k v; do
		_into[$k]=$v
	done < <(jq -r 'to_entries[] | select(.value | type != "array" and type != "object")
		| "\(.key)\t\(.value)"' "$2")
	[ "${#_into[@]}" -gt 0 ] || { echo "no fields in $2"; return 1; }
}

# retry TRIES DELAY CMD…: for conditions that settle asynchronously (device nodes, reconnects).
retry() {
	local tries=$1 delay=$2 i
	shift 2
	for ((i = 1; i <= tries; i++)); do
		"$@" && return 0
		sleep "$delay"
	done
	echo "still failing after $tries tries: $*"
	return 1
}
