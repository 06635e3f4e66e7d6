#!/usr/bin/env bash
# Stop 49, call 5 (binaries of ca0fac9; run as one command line): the rest of tests/cuda_linear_gemm, four threads.
export LOWBIT_CACHE_DIR=/tmp/lowbit-cache; timeout 350 .devbin-k/tests/cuda_linear_gemm --test-threads 4 --skip k_split --skip stream_k --skip the_96_token_tile --skip exact_integers > $OUT/test-gemm-rest.log 2>&1; echo rc=$?
