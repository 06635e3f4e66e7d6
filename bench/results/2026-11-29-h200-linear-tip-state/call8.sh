#!/usr/bin/env bash
# Stop 46, call 8 (bbf7fd4, whose library equals cb05960's): the whole GEMM suite, four threads.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
mkdir -p $OUT
timeout 400 .devbin-k/tests/cuda_linear_gemm --test-threads=4 > $OUT/test-gemm-all.log 2>&1
echo rc=$?; grep -E "test result|^test |panicked" $OUT/test-gemm-all.log | head -30
