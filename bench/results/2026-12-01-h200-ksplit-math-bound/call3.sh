#!/usr/bin/env bash
# Stop 48, call 3 (binaries of a360347): 64 x 4096^2 on the K-split tile, with LB_EXP_CLOCK (warpgroup 0's main
# loop in SM cycles as the global_step stamp), alone and with LB_EXP_MATH_ONLY and LB_EXP_NO_EARLY (no stage drain).
# Caution: the CSV's mainloop_end stamp follows the warpgroups' exchange, so cycles / (mainloop_end - first_full)
# under-reads the clock; call 6 stamps the same moment in ns.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
for round in 1 2; do
  for d in "LB_EXP_CLOCK=1" "LB_EXP_CLOCK=1;LB_EXP_MATH_ONLY=1" "LB_EXP_CLOCK=1;LB_EXP_NO_EARLY=1" "LB_EXP_CLOCK=1;LB_EXP_MATH_ONLY=1;LB_EXP_NO_EARLY=1"; do
    tag=$(echo "$d" | tr ';=' '_-')
    mkdir -p $OUT/csv-$tag-$round
    LOWBIT_TRACE_CSV=$OUT/csv-$tag-$round LOWBIT_GEMM_DEFINES="$d" timeout 150 $B/gemm_trace 64x4096x4096 --ksplit --rotate-io > /tmp/t.txt 2>&1
    echo "[$d] $(grep -E '^== ' /tmp/t.txt | cut -c1-70) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)"
    { echo "# LOWBIT_GEMM_DEFINES='$d' 64x4096x4096 --ksplit"; cat /tmp/t.txt; } >> $OUT/trace.txt
  done
  echo "($(el) s)"
done
