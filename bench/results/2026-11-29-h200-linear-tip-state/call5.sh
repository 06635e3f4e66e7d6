#!/usr/bin/env bash
# Stop 46, call 5 (92b1eba): QuantLinear and every W4 kernel, bf16, the four anchor layers x M in {1, 4, 16, 64, 256}.
set -u
mkdir -p $OUT
SKIP_TESTS=1 DTYPES=bf16 MS="1 4 16 64 256" BIN=.devbin-k bash .devbin-k/device-gemm.sh > $OUT/device-gemm-bf16.log 2>&1
echo "device-gemm rc=$?"
python3 .devbin-k/linear-ratios.py $OUT/bench-linear.jsonl | sed -E 's/lb_dequant_cublas=[^ ]+ //; s/lb_decode=[^ ]+ //' | cut -c1-170
