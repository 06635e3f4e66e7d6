#!/usr/bin/env bash
# Stop 49, call 3 (binaries of ca0fac9): QuantLinear and every W4 kernel, f16, the four anchor layers x M in
# {1, 4, 16, 64, 256, 1024, 4096} (scripts/device-gemm.sh, no tests), then bf16 at M = 64 and 96 in the time left.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-k bash .devbin-k/device-gemm.sh > $OUT/device-gemm.log 2>&1; echo "device-gemm rc=$? ($(el) s)"
python3 .devbin-k/linear-ratios.py $OUT/bench-linear.jsonl | sed -E 's/lb_dequant_cublas=[^ ]+ //; s/lb_decode=[^ ]+ //' | cut -c1-170
left=$(( 540 - $(el) ))
[ $left -lt 60 ] && exit 0
shapes=""; for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do shapes="$shapes --shape 64x$kn --shape 96x$kn"; done
LOWBIT_CACHE_DIR=/tmp/lowbit-cache timeout $left .devbin-k/lowbit bench --device cuda --op linear --dtype bf16 --json $shapes \
  --dispatch $OUT/dispatch-bf16.json > $OUT/bench-bf16.jsonl 2> $OUT/bench-bf16.err; echo "bf16 rc=$? ($(el) s)"
python3 .devbin-k/linear-ratios.py $OUT/bench-bf16.jsonl | sed -E 's/lb_dequant_cublas=[^ ]+ //; s/lb_decode=[^ ]+ //' | cut -c1-170
