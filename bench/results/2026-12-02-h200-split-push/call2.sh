#!/usr/bin/env bash
# Call 2: the split epilogue's push. LB_EXP_LOCAL_PUSH (own pairs by st.shared) and
# LB_EXP_SPREAD_OWNERS (pairs owned round-robin) against the default, in turn; then the split tests with both on.
# Binaries: gemm_trace, tests/cuda_linear_gemm and tests/cuda_conv of 583012c (.devbin-k/BUILT).
set -u
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
BUDGET_S=250 bash .devbin-k/trace-in-turn.sh .devbin-k 2 "64x4096x4096 --ksplit;256x4096x4096" \
  "|" "LB_EXP_LOCAL_PUSH=1|" "LB_EXP_LOCAL_PUSH=1;LB_EXP_SPREAD_OWNERS=1|"
export LOWBIT_CACHE_DIR=/tmp/lc LOWBIT_GEMM_DEFINES='LB_EXP_LOCAL_PUSH=1;LB_EXP_SPREAD_OWNERS=1'
left=$(( 575 - $(date +%s) + T0 ))
echo "tests with $LOWBIT_GEMM_DEFINES, $left s left"
timeout $(( left - 10 )) .devbin-k/tests/cuda_conv hopper_path > $OUT/test-conv.log 2>&1 &
timeout $(( left - 10 )) .devbin-k/tests/cuda_linear_gemm split > $OUT/test-split.log 2>&1
echo "rc $?"; wait; echo "conv rc $?"
grep -hE "^test |test result|panicked" $OUT/test-split.log $OUT/test-conv.log
