#!/usr/bin/env bash
# Next session, call 2 (test binaries of ee1b37a: .devbin-k/BUILT): tests/cuda_conv, then tests/cuda_linear_gemm
# as far as the call goes (the split tests ran in the 2026-12-02 session; the rest did not).
set -u
T0=$(date +%s)
export LOWBIT_CACHE_DIR=/tmp/lc
timeout 200 .devbin-k/tests/cuda_conv --test-threads 4 > $OUT/test-conv.log 2>&1; echo "conv rc $?"
timeout $(( 570 - $(date +%s) + T0 )) .devbin-k/tests/cuda_linear_gemm --test-threads 4 --skip split \
  > $OUT/test-gemm.log 2>&1
echo "gemm rc $?"; grep -hE "^test |test result|panicked" $OUT/test-*.log
