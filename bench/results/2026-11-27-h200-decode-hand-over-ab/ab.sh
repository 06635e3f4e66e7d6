#!/usr/bin/env bash
# HAND-OVER A/B: old (HEAD a262451) and new decode kernel, gemm_trace in turn (2 rounds), then lowbit bench in turn,
# then the new test.
set -uo pipefail
B=.devbin
export LOWBIT_CACHE_DIR=/tmp/lc
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
timeout 200 $B/tests/cuda_linear hand_over_in_later_waves --nocapture > $OUT/test-hand-over.log 2>&1; echo "== test hand_over rc=$?"; grep -E "^ok|test result|panicked" $OUT/test-hand-over.log | head -4
S="decode:1x8192x28672 decode:4x8192x28672 decode:16x8192x28672 decode:1x13824x5120 decode:16x13824x5120 decode:1x4096x14336 decode:32x8192x28672"
for round in 1 2; do
  for v in old new; do
    bin=$B/gemm_trace; [ $v = old ] && bin=$B/gemm_trace-old

    timeout 200 $bin $S > $OUT/trace-$v-$round.txt 2>&1
    echo "== $v $round"; grep "^== decode" $OUT/trace-$v-$round.txt | sed 's/ weights rotated.*//'
  done
done
BS="--shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 --shape 1x13824x5120 --shape 16x13824x5120"
for round in 1 2; do
  for v in old new; do
    bin=$B/lowbit; [ $v = old ] && bin=$B/lowbit-old
    timeout 150 $bin bench --op linear --device cuda --dtype f16 $BS --json > $OUT/bench-$v-$round.jsonl 2> $OUT/bench-$v-$round.err
    echo "== bench $v $round"; python3 -c "
import json,sys
for l in open('$OUT/bench-$v-$round.jsonl'):
    if not l.startswith('{'): continue
    x=json.loads(l)
    if x['impl'] in ('cublas_fp16','lowbit','lowbit_graph'): print(x['M'],x['K'],x['N'],x['impl'],round(x['us'],1))
"
  done
done
