#!/usr/bin/env bash
# compute-sanitizer over chosen GPU tests on the device (testing.md: "memcheck and racecheck from time to time"):
#   OUT=$OUT TOOLS="racecheck synccheck" bash scripts/device-sanitize.sh .devbin \
#     cuda_linear_gemm:k_split_tile_of_128_tokens cuda_linear:cluster_split_k ...
# Each entry is SUITE:TEST (an exact test name of the suite's binary, built by `scripts/prepare-devbin.sh`). Every
# (tool, test) pair is one process, PAR of them at once (default 4), each cut off after PER_S seconds (default 240);
# no new one starts once BUDGET_S (default 540) is spent. Writes $OUT/sanitize-<tool>.txt (OUT defaults to /tmp/out):
# per test the tool's verdict line, its exit status, its time, a failed test's message, and the first hazards it
# printed (--print-limit 10; LINES_KEPT lines, default 80). LOWBIT_NVRTC_LINEINFO=1 makes the reports name kernel
# source lines. WARM=1 first runs every listed test plainly (PAR at once, WARM_S seconds each, default 150), so
# that their kernels are in LOWBIT_CACHE_DIR before the tools run and a cold cache does not eat the tools' limits
# (the same environment, so the same cache keys: LOWBIT_*_DEFINES, LOWBIT_NVRTC_LINEINFO).
set -u
BIN=$1
shift
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lc}
SAN=${SAN:-/usr/local/cuda/bin/compute-sanitizer}
T0=$(date +%s)
WORK=$(mktemp -d)  # per invocation: two may run at once
export BIN SAN WORK T0 PER_S=${PER_S:-240} BUDGET_S=${BUDGET_S:-540}
"$SAN" --version | tail -n 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

one() {  # $1: tool, $2: SUITE:TEST
  local tool=$1 suite=${2%%:*} test=${2#*:}
  local log="$WORK/$tool.$suite.$test.log" left=$(( BUDGET_S - $(date +%s) + T0 ))
  if [ "$left" -lt 20 ]; then echo "$tool $suite $test: not run, no time left" > "$log"; return; fi
  [ "$left" -gt "$PER_S" ] && left=$PER_S
  local s=$(date +%s)
  timeout "$left" "$SAN" --tool "$tool" --print-limit 10 --error-exitcode 9 \
    "$BIN/tests/$suite" --exact "$test" --test-threads 1 > "$log.raw" 2>&1
  local rc=$?
  {
    echo "## $tool $suite $test: rc $rc in $(( $(date +%s) - s )) s"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$log.raw"
    grep -A 3 "panicked" "$log.raw" | cut -c1-600
    # The first hazards or errors as printed, without the host backtraces.
    grep -E "^=========" "$log.raw" | grep -vE "Host Frame|SUMMARY" | head -n "${LINES_KEPT:-80}"
  } > "$log"
}
export -f one
if [ "${WARM:-0}" = 1 ]; then
  s=$(date +%s)
  for entry in "$@"; do echo "$entry"; done | xargs -P "${PAR:-4}" -L 1 bash -c \
    'timeout "${WARM_S:-150}" "$BIN/tests/${0%%:*}" --exact "${0#*:}" --test-threads 1 > /dev/null 2>&1; echo "warm ${0}: rc $?"'
  echo "warmed in $(( $(date +%s) - s )) s"
fi
for tool in ${TOOLS:-racecheck}; do
  for entry in "$@"; do echo "$tool $entry"; done
done | xargs -P "${PAR:-4}" -L 1 bash -c 'one "$0" "$1"'
for tool in ${TOOLS:-racecheck}; do
  cat "$WORK/$tool".*.log > "$OUT/sanitize-$tool.txt" 2>/dev/null
  grep -h "^## " "$OUT/sanitize-$tool.txt"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize-$tool.txt" | sort | uniq -c
done
echo "total $(( $(date +%s) - T0 )) s"
