#!/usr/bin/env bash
# Call 4 (binaries of cbe95ce in .devbin-m): issue #5's whole f16 sweep in one process per dtype, at one commit:
# QuantLinear, every W4 kernel and cuBLAS / cuBLASLt on the four anchor shapes x M in {1, 4, 16, 64, 256, 1024, 4096},
# and W8A16 at M = 1; writes the measured dispatch table to $OUT/dispatch-f16.json.
MS="1 4 16 64 256 1024 4096" W8_MS="1" SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-m LOWBIT_CACHE_DIR=/tmp/lc \
  timeout 560 bash .devbin-m/device-gemm.sh
