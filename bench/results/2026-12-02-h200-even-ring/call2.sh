#!/usr/bin/env bash
# Stop 54, call 2 (binaries in .devbin-f; BUILT names the commit): issue #5's whole f16 sweep at the K-split tile's
# fixes, as stop 52's call 4: QuantLinear, every W4 kernel and cuBLAS / cuBLASLt on the four anchor shapes x
# M in {1, 4, 16, 64, 256, 1024, 4096}, and W8A16 at M = 1; the measured dispatch table goes to $OUT/dispatch-f16.json.
MS="1 4 16 64 256 1024 4096" W8_MS="1" SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-f LOWBIT_CACHE_DIR=/tmp/lc \
  timeout 570 bash scripts/device-gemm.sh
