#!/usr/bin/env bash
# Next session, call 1 (binaries of ee1b37a: .devbin-k/BUILT): is the K-split tile's fill bound by the L2 or by each
# SM? gemm_trace at 64 x 4096^2 with 3 and 4 splits, by default and with LB_EXP_NO_MATH (the fill alone), in turn,
# twice each; then tests/quant_linear (not yet run on the GPU at f017b04's kernels) in the time left.
set -u
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
BUDGET_S=280 bash .devbin-k/trace-in-turn.sh .devbin-k 2 \
  "64x4096x4096 --ksplit --splits 3;64x4096x4096 --ksplit --splits 4" "|" "LB_EXP_NO_MATH=1|"
LOWBIT_CACHE_DIR=/tmp/lc timeout $(( 570 - $(date +%s) + T0 )) .devbin-k/tests/quant_linear --test-threads 4 \
  > $OUT/test-quant-linear.log 2>&1
echo "rc $?"; grep -E "^test |test result|panicked" $OUT/test-quant-linear.log
