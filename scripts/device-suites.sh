#!/usr/bin/env bash
# GPU test suites on the device, one after another, each timed, inside the device tool's 600 s per call:
#   OUT=$OUT bash scripts/device-suites.sh .devbin quant_linear cuda_linear cuda_dequantize
# Binaries: `DEVBIN=.devbin TESTS="<suites>" scripts/prepare-devbin.sh`. Each suite's log goes to
# $OUT/test-<suite>.log (OUT defaults to /tmp/out); a suite is skipped once less than 20 s of $BUDGET_S
# (default 560) is left.
set -u
BIN=$1
shift
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lc}
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for t in "$@"; do
  left=$(( ${BUDGET_S:-560} - $(date +%s) + T0 ))
  [ "$left" -lt 20 ] && { echo "$t: not run, no time left"; continue; }
  s=$(date +%s)
  timeout "$left" "$BIN/tests/$t" --test-threads "${THREADS:-4}" > "$OUT/test-$t.log" 2>&1
  echo "$t: rc $? in $(( $(date +%s) - s )) s"
done
grep -hE "test result|panicked|FAILED" "$OUT"/test-*.log
