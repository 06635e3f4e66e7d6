#!/usr/bin/env bash
# Stop 48, call 2 (binaries of d00a678): tensor_rate with 1-4 warpgroups; gemm_trace of the K-split tile with
# its main loop split by experiment defines: LB_EXP_MATH_ONLY (each stage filled once, no waits after),
# LB_EXP_NO_MATH (waits and releases only), against neither, twice each.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
timeout 120 $B/tensor_rate > $OUT/tensor_rate.txt 2>&1; grep "K-split" $OUT/tensor_rate.txt
echo "($(el) s)"
for cfg in "64x4096x4096 --ksplit" "128x4096x4096 --ksplit" "64x4096x14336 --ksplit"; do
  for round in 1 2; do
    for d in "" "LB_EXP_MATH_ONLY=1" "LB_EXP_NO_MATH=1"; do
      LOWBIT_GEMM_DEFINES="$d" timeout 150 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
      echo "[${d:-base}] $(grep -E '^== ' /tmp/t.txt | cut -c1-70) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)"
      { echo "# LOWBIT_GEMM_DEFINES='$d' $cfg"; cat /tmp/t.txt; } >> $OUT/trace.txt
    done
    echo "($(el) s)"
  done
done
