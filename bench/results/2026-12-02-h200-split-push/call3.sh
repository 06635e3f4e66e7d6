#!/usr/bin/env bash
# Call 3 (binaries of f017b04, the split epilogue's round-robin owners and local pushes):
# QuantLinear and every W4 kernel, f16, the four anchor layers x M in {64, 256, 1024} (scripts/device-gemm.sh, no
# tests; the split tests ran in call 2 on the same kernels by experiment defines).
set -u
T0=$(date +%s)
MS="64 256 1024" SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-k timeout 300 bash .devbin-k/device-gemm.sh > $OUT/device-gemm.log 2>&1
echo "device-gemm rc=$? ($(( $(date +%s) - T0 )) s)"
python3 .devbin-k/linear-ratios.py $OUT/bench-linear.jsonl | sed -E 's/lb_dequant_cublas=[^ ]+ //; s/lb_decode=[^ ]+ //' | cut -c1-170
