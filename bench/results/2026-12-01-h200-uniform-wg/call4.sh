#!/usr/bin/env bash
# Stop 49, call 4 (binaries of ca0fac9): the GPU tests of the tiles this stop changed (96-token, K-split) and
# QuantLinear's, in parallel, inside ~400 s.
set -u
export LOWBIT_CACHE_DIR=/tmp/lowbit-cache
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
timeout 400 .devbin-k/tests/cuda_linear_gemm the_96_token_tile exact_integers --test-threads 2 > $OUT/test-gemm.log 2>&1 &
timeout 400 .devbin-k/tests/cuda_linear_gemm k_split --test-threads 2 > $OUT/test-ksplit.log 2>&1 &
timeout 400 .devbin-k/tests/quant_linear --test-threads 2 > $OUT/test-quant-linear.log 2>&1 &
wait
grep -hE "^test .*(ok|FAILED)$|test result|panicked" $OUT/test-*.log
echo "($(el) s)"
