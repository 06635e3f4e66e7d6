#!/usr/bin/env bash
# Stop 47, call 4 (the split-K st.async commit): split-K partials pushed by st.async onto each owner's mbarrier, one
# relaxed cluster barrier before (LB_SPLIT_ASYNC 1, the default), against the two release/acquire cluster barriers
# around st.shared::cluster (LB_SPLIT_ASYNC=0), in turn (gemm_trace); the GEMM's split-K tests, the convolution's
# Hopper path, QuantLinear across its dispatch boundaries, and memcheck on the exact split-K test.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 $B/tests/cuda_linear_gemm --test-threads=4 f16_g128_zeros_token_tails exact_integers split_tiles_in_several \
  hybrid k_split_tile_over_whole back_to_back bf16_narrow > $OUT/test-gemm.log 2>&1
echo "gemm tests rc=$? ($(el) s)"; grep -E "test result|^test |panicked" $OUT/test-gemm.log | cut -c1-300 | head -12
for cfg in "64x4096x4096 --ksplit" "128x4096x4096 --ksplit" "256x4096x4096 --ksplit --tokens 128" "64x4096x4096" \
           "64x14336x4096 --ksplit" "256x4096x14336"; do
  for round in 1 2; do
    for d in "LB_SPLIT_ASYNC=0" ""; do
      LOWBIT_GEMM_DEFINES="$d" timeout 60 $B/gemm_trace $cfg --rotate-io > /tmp/t.txt 2>&1
      echo "[${d:-async}] $(grep -E '^== ' /tmp/t.txt | cut -c1-60) | epilogue $(grep -E '^  epilogue ' /tmp/t.txt | cut -c16-60)"
      { echo "# LOWBIT_GEMM_DEFINES='$d'"; cat /tmp/t.txt; } >> $OUT/trace.txt
    done
  done
done
echo "traces ($(el) s)"
timeout 90 $B/tests/cuda_conv --test-threads=1 hopper_path > $OUT/test-conv.log 2>&1
echo "conv rc=$? ($(el) s)"; grep -E "test result|panicked" $OUT/test-conv.log | head -3
timeout 100 $B/tests/quant_linear --test-threads=1 cuda_every_kernel > $OUT/test-quant-linear.log 2>&1
echo "quant_linear rc=$? ($(el) s)"; grep -E "test result|panicked" $OUT/test-quant-linear.log | head -3
left=$(( 555 - $(el) )); echo "== memcheck (${left} s left)"
if command -v compute-sanitizer >/dev/null && [ $left -gt 30 ]; then
  timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda_linear_gemm --test-threads=1 \
    exact_integers > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -n 3 $OUT/memcheck.log
fi
