#!/usr/bin/env bash
# Call 5 (binaries of ee1b37a): QuantLinear and every W4 kernel at M = 256, 1024 and 4096, bf16, no tests.
MS="256 1024 4096" SKIP_TESTS=1 DTYPES=bf16 BIN=.devbin-k LOWBIT_CACHE_DIR=/tmp/lc timeout 220 bash .devbin-k/device-gemm.sh
