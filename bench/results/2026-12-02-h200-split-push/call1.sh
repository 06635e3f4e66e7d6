#!/usr/bin/env bash
# Call 1 (binaries of da1ab07): three consumer warpgroups in the 64-token K-split tile, LB_EXP_RELAXED_FREE and
# LB_EXP_PREFETCH_XMAP, each against the default, in turn, twice each; then the three-warpgroup GPU test.
# Binaries: gemm_trace and tests/cuda_linear_gemm of the tip (.devbin-k/BUILT); scripts/trace-in-turn.sh copied in.
set -u
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
BUDGET_S=360 bash .devbin-k/trace-in-turn.sh .devbin-k 2 \
  "64x4096x4096 --ksplit;64x4096x14336 --ksplit" "|" "|--ksplit-wgs 3" \
  "LB_EXP_RELAXED_FREE=1|" "LB_EXP_PREFETCH_XMAP=1|"
LOWBIT_CACHE_DIR=/tmp/lc timeout $(( 570 - $(date +%s) + T0 )) .devbin-k/tests/cuda_linear_gemm \
  k_split_tile_of_three --test-threads 1 > $OUT/test-c3.log 2>&1
echo "rc $?"; grep -E "^test |test result|panicked" $OUT/test-c3.log
