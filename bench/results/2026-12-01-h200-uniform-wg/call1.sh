#!/usr/bin/env bash
# Stop 49, call 1 (binaries of 18c287c): LB_UNIFORM_WG=1 against the default on the K-split tiles, in turn, twice
# each (gemm_trace --ksplit --rotate-io); then the two K-split GPU tests with the define on, in the time left.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
for round in 1 2; do
  for cfg in "64x4096x4096 --ksplit" "128x4096x4096 --ksplit" "64x4096x14336 --ksplit"; do
    for d in "" "LB_UNIFORM_WG=1"; do
      LOWBIT_GEMM_DEFINES="$d" timeout 150 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
      echo "[${d:-base}] $(grep -E '^== ' /tmp/t.txt | cut -c1-70) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)"
      { echo "# LOWBIT_GEMM_DEFINES='$d' $cfg"; cat /tmp/t.txt; } >> $OUT/trace.txt
    done
  done
  echo "($(el) s)"
done
left=$(( 570 - $(el) ))
echo "tests with LB_UNIFORM_WG=1, ${left} s left"
LOWBIT_GEMM_DEFINES="LB_UNIFORM_WG=1" timeout $left $B/tests/cuda_linear_gemm k_split --test-threads 2 \
  > $OUT/test-ksplit.log 2>&1; echo "rc $?"
grep -E "^test |test result" $OUT/test-ksplit.log
echo "($(el) s)"
