#!/usr/bin/env bash
# Stop 43, call 5: GATHERED TILES on 8192 x 28672 (default) against the stored tiles' two splits (lowbit_gather0) and
# stream-K (lowbit_k1), in one process; then the tests of the new path, quant_linear and the rest of cuda_linear.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
LOWBIT_BENCH_GATHER=0 LOWBIT_BENCH_SPLITS=1 LOWBIT_BENCH_SUSTAINED=0 timeout 190 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 --shape 32x8192x28672 \
  --dispatch $OUT/dispatch-gather.json > $OUT/quant-linear-gathered.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(el) s)"; tail -2 $OUT/bench.err
python3 - $OUT/quant-linear-gathered.jsonl <<'PY'
import json,sys,collections
g=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); g[(r['M'],r['dtype'])][r['impl']]=r['us']
for k,v in sorted(g.items()):
    base=min(v.get('cublas_fp16',1e9),v.get('cublaslt_fp16',1e9))
    if base > 1e8: base = min(g[(k[0],'f16')].get('cublas_fp16',1e9), g[(k[0],'f16')].get('cublaslt_fp16',1e9))
    print(k, ' '.join(f"{i.replace('lowbit','lb')}={u:.1f}({base/u:.2f})" for i,u in v.items() if i.startswith('lowbit')), f"base={base:.1f}")
PY
echo "== gathered_tiles, cluster_split_k ($(el) s)"
timeout 120 $B/tests/cuda_linear gathered_tiles cluster_split_k --test-threads=2 > $OUT/test-gather.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-gather.log | head
echo "== quant_linear ($(el) s)"
timeout 190 $B/tests/quant_linear --test-threads=4 > $OUT/test-ql.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-ql.log | head
left=$(( 500 - $(el) )); echo "== cuda_linear, the rest (${left} s left)"
[ $left -gt 30 ] && timeout $left $B/tests/cuda_linear --skip gathered_tiles --skip cluster_split_k --test-threads=4 > $OUT/test-linear.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-linear.log | head -20
