#!/usr/bin/env bash
# Call 4 (binaries of ee1b37a): QuantLinear and every W4 kernel at M = 4096, f16, no tests.
MS="4096" SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-k LOWBIT_CACHE_DIR=/tmp/lc timeout 300 bash .devbin-k/device-gemm.sh
