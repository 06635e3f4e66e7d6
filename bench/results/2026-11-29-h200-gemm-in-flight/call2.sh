#!/usr/bin/env bash
# Stop 47, call 2 (the experiment commit after 2a5760c): the GEMM main loop with LB_IN_FLIGHT=2 (two wgmma groups left
# in flight by each step's wait, instead of one) and LB_PREFETCH_WORDS=1 (the next step pair's weight words read a pair
# early), alone and together, against neither, in turn (gemm_trace, LOWBIT_GEMM_DEFINES); then the GEMM tests that did
# not finish in stop 46.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
for cfg in "64x4096x4096 --ksplit" "128x4096x4096 --ksplit" "64x4096x14336 --ksplit" "256x4096x4096 --ksplit --tokens 128" \
           "64x8192x28672" "1024x8192x28672"; do
  for round in 1 2; do
    for d in "" "LB_IN_FLIGHT=2" "LB_PREFETCH_WORDS=1" "LB_IN_FLIGHT=2;LB_PREFETCH_WORDS=1"; do
      LOWBIT_GEMM_DEFINES="$d" timeout 60 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
      echo "[${d:-base}] $(grep -E '^== ' /tmp/t.txt | cut -c1-64) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-60)"
      { echo "# LOWBIT_GEMM_DEFINES='$d'"; cat /tmp/t.txt; } >> $OUT/trace.txt
    done
  done
  echo "($(el) s)"
done
left=$(( 560 - $(el) )); echo "== tests (${left} s left)"
timeout $left $B/tests/cuda_linear_gemm --test-threads=4 k_split stream_k the_96_token_tile tiny_batches strided_rows \
  unsupported_tiles > $OUT/test-gemm.log 2>&1
echo rc=$?; grep -E "test result|^test |panicked" $OUT/test-gemm.log | cut -c1-300 | head -20
