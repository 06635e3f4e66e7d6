#!/usr/bin/env bash
# Stop 47, call 5 (the LB_PAIR_STEPS commit): the K-split tile with commit groups of two k16 steps and the next two
# converted together (LB_PAIR_STEPS=1) against one step a group (the default), in turn (gemm_trace).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
for cfg in "64x4096x4096 --ksplit" "128x4096x4096 --ksplit"; do
  for round in 1 2; do
    for d in "" "LB_PAIR_STEPS=1"; do
      LOWBIT_GEMM_DEFINES="$d" timeout 60 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
      echo "[${d:-base}] $(grep -E '^== ' /tmp/t.txt | cut -c1-60) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-60) ($(el) s)"
      { echo "# LOWBIT_GEMM_DEFINES='$d'"; cat /tmp/t.txt; } >> $OUT/trace.txt
    done
  done
done
