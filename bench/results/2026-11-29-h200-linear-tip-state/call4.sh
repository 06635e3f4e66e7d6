#!/usr/bin/env bash
# Stop 46, call 4 (92b1eba; its library, kernels and dispatch table equal cb05960's): the refactored stream_probe's
# L2 part once, then QuantLinear and every W4 kernel, f16, the four anchor layers x M in {1, 4, 16, 64, 256, 1024, 4096}.
set -u
mkdir -p $OUT
LOWBIT_PROBE=l2-paths timeout 60 .devbin-k/stream_probe > $OUT/l2-paths-92b1eba.txt 2>&1; echo "probe rc=$?"
grep -E "x 6 |1024 threads|K-split" $OUT/l2-paths-92b1eba.txt
SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-k bash .devbin-k/device-gemm.sh > $OUT/device-gemm.log 2>&1; echo "device-gemm rc=$?"
python3 .devbin-k/linear-ratios.py $OUT/bench-linear.jsonl | sed -E 's/lb_dequant_cublas=[^ ]+ //; s/lb_decode=[^ ]+ //' | cut -c1-170
