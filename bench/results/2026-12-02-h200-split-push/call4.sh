#!/usr/bin/env bash
# Call 4 (tests/quant_linear of 61aa9f5: f017b04's kernels and the dispatch table with 8192 x 28672, M = 64 on the
# K-split tile): every kernel through QuantLinear and the dispatch across its boundaries.
set -u
LOWBIT_CACHE_DIR=/tmp/lc timeout 160 .devbin-k/tests/quant_linear --test-threads 4 > $OUT/test-quant-linear.log 2>&1
echo "rc $?"; grep -E "^test |test result|panicked" $OUT/test-quant-linear.log
