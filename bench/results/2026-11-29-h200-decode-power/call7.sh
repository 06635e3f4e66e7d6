#!/usr/bin/env bash
# Stop 45, call 7 (the tip): the paired tests, gemm_trace at M = 1, 16 (old kernel beside it), then QuantLinear on
# 8192 x 28672 at M = 1, 4, 16 (f16, bf16), timed in turn and alone under sustained load (LOWBIT_BENCH_SUSTAINED=all).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
timeout 120 $B/tests/cuda_linear gathered_tiles cluster_split_k --test-threads=2 > $OUT/test-gather.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-gather.log | head
for m in 1 16; do for bin in gemm_trace_old gemm_trace; do
  echo "$bin $(timeout 60 $B/$bin decode:${m}x8192x28672 2>&1 | grep -E '^== ')"
done; done
echo "== bench ($(el) s)"
LOWBIT_BENCH_SUSTAINED=all timeout 240 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 > $OUT/quant-linear.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(el) s)"; tail -1 $OUT/bench.err
python3 $B/linear-ratios.py $OUT/quant-linear.jsonl
