#!/usr/bin/env bash
# Stop 48, call 4 (binaries of 1a96be4, kernels of a360347): the K-split tile at 2, 3 and 4 splits; sustained_clock
# at 64 x 4096^2 (its 3-split run did not finish inside 60 s, the kernels' first compile).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
export LOWBIT_GEMM_DEFINES="LB_EXP_CLOCK=1"
for round in 1 2; do
  for cfg in "64x4096x4096 --ksplit --splits 3" "64x4096x4096 --ksplit --splits 4" "64x4096x4096 --ksplit --splits 2" "128x4096x4096 --ksplit --splits 4" "128x4096x4096 --ksplit"; do
    tag=$(echo "$cfg" | tr ' ' '_')
    mkdir -p $OUT/csv-$tag-$round
    LOWBIT_TRACE_CSV=$OUT/csv-$tag-$round timeout 150 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
    echo "[$cfg] $(grep -E '^== ' /tmp/t.txt | cut -c1-190) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70) | epi $(grep -E '^  epilogue ' /tmp/t.txt | cut -c16-70)"
    { echo "# $cfg"; cat /tmp/t.txt; } >> $OUT/trace.txt
  done
  echo "($(el) s)"
done
unset LOWBIT_GEMM_DEFINES
for sp in 3 4; do
  timeout 60 $B/sustained_clock 64x4096x4096 --ksplit --splits $sp --seconds 2 > $OUT/sustained-splits$sp.txt 2>&1
  tail -5 $OUT/sustained-splits$sp.txt
done
echo "($(el) s)"
