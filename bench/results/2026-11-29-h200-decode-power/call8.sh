#!/usr/bin/env bash
# Stop 45, call 8 (31d16d1's binaries): QuantLinear f16 on the four anchor layers at M = 1 and 16, timed in turn, by
# graph replay and alone under sustained load (LOWBIT_BENCH_SUSTAINED=all).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
LOWBIT_BENCH_SUSTAINED=all timeout 215 $B/lowbit bench --device cuda --op linear --dtype f16 --json \
  --shape 1x4096x4096 --shape 16x4096x4096 --shape 1x4096x14336 --shape 16x4096x14336 \
  --shape 1x14336x4096 --shape 16x14336x4096 --shape 1x8192x28672 --shape 16x8192x28672 > $OUT/anchors.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"; tail -c 300 $OUT/bench.err
python3 $B/linear-ratios.py $OUT/anchors.jsonl
