#!/usr/bin/env bash
# Stop 49, call 2: LB_UNIFORM_WG_ALL=1 (the warpgroup index broadcast in the token-split tiles too, but the 64-token
# ones) against the default, in turn, twice each (gemm_trace --rotate-io, the GEMM's own plans).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
for round in 1 2; do
  for cfg in "256x4096x14336" "1024x14336x4096" "4096x14336x4096" "256x8192x28672" "96x8192x28672"; do
    for d in "" "LB_UNIFORM_WG_ALL=1"; do
      [ $(el) -gt 480 ] && break 3
      LOWBIT_GEMM_DEFINES="$d" timeout 150 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
      echo "[${d:-base}] $(grep -E '^== ' /tmp/t.txt | cut -c1-70) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)"
      { echo "# LOWBIT_GEMM_DEFINES='$d' $cfg"; cat /tmp/t.txt; } >> $OUT/trace.txt
    done
  done
  echo "($(el) s)"
done
