#!/usr/bin/env bash
# Call 9 (lowbit with the finer turns: 25 rounds of ~2 ms batches, back to back): 4096², M = 256 in eight processes
# (call 3's script), then the whole f16 sweep (call 4's), then M = 1024 and 4096 once more while time is left.
set -u
T0=$(date +%s)
mkdir -p "$OUT/m256" "$OUT/sweep" "$OUT/sweep2"
OUT=$OUT/m256 ROUNDS=8 bash .devbin-m/call3.sh 2>&1 | tail -n 3
OUT=$OUT/sweep bash .devbin-m/call4.sh > "$OUT/sweep/log.txt" 2>&1; echo "sweep rc $?"
left=$(( 420 - $(date +%s) + T0 ))
[ "$left" -gt 90 ] && OUT=$OUT/sweep2 MS="1024 4096" SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-m LOWBIT_CACHE_DIR=/tmp/lc \
  timeout "$left" bash .devbin-m/device-gemm.sh > "$OUT/sweep2/log.txt" 2>&1
echo "done in $(( $(date +%s) - T0 )) s"
