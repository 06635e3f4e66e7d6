#!/usr/bin/env bash
# Stop 45, call 5 (8491fb5): paired decode CTAs with the lane's stage offsets computed once. gemm_trace at M = 1, 16
# over 20 and 20000 launches in a row (compare calls 2-4 at 1a6598d), the paired tests, then QuantLinear on
# 8192 x 28672 at M = 1, 4, 16 (f16, bf16) timed in turn and alone under sustained load.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
for r in 20 20000 20; do
  for m in 16 1; do
    LOWBIT_TRACE_ROUNDS=$r timeout 60 $B/gemm_trace decode:${m}x8192x28672 2>&1 | grep -E "^== |alone" | sed "s/^/rounds $r: /"
  done
done
echo "== gathered_tiles, cluster_split_k ($(el) s)"
timeout 150 $B/tests/cuda_linear gathered_tiles cluster_split_k --test-threads=2 > $OUT/test-gather.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-gather.log | head
echo "== bench ($(el) s)"
LOWBIT_BENCH_SUSTAINED=all timeout 240 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 > $OUT/quant-linear.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(el) s)"; tail -1 $OUT/bench.err
python3 $B/linear-ratios.py $OUT/quant-linear.jsonl
python3 - $OUT/quant-linear.jsonl <<'PY'
import json,sys,collections
g=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); g[(r['M'],r['dtype'])][r['impl']]=r['us']
for k,v in sorted(g.items()):
    s={i:u for i,u in v.items() if i.endswith('_sustained')}
    if s:
        base=min(u for i,u in s.items() if i.startswith('cublas'))
        print('sustained',k,' '.join(f"{i}={u:.1f}" for i,u in s.items()), f"ratio={base/s['lowbit_sustained']:.2f}")
PY
