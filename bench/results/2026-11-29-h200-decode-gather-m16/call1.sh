#!/usr/bin/env bash
# Stop 44, call 1 (bc15848): gathered tiles over stream-K's grid (one CTA per tile, no fix-up) against the two
# splits; QuantLinear at M = 1..32 on 8192 x 28672 (gathered up to 16 rows, stored tiles above) with the stored
# tiles' two splits beside it; the gathered tests, then quant_linear.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for cfg in "default:" "k1-cps1:--gather on --decode-splits 1 --ctas-per-sm 1" "k1-cps2:--gather on --decode-splits 1 --ctas-per-sm 2"; do
  name=${cfg%%:*}; flags=${cfg#*:}
  timeout 90 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 $flags > $OUT/trace-$name.txt 2>&1
  echo "$name rc=$? ($(el) s)"; grep -E "^== |resident" $OUT/trace-$name.txt
done
LOWBIT_BENCH_GATHER=0 LOWBIT_BENCH_SUSTAINED=0 timeout 200 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 --shape 24x8192x28672 --shape 32x8192x28672 \
  --dispatch $OUT/dispatch-8192x28672.json > $OUT/quant-linear.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(el) s)"; tail -2 $OUT/bench.err
python3 - $OUT/quant-linear.jsonl <<'PY'
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
left=$(( 560 - $(el) )); echo "== quant_linear (${left} s left)"
[ $left -gt 30 ] && timeout $left $B/tests/quant_linear --test-threads=4 > $OUT/test-ql.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-ql.log | head
