#!/usr/bin/env bash
# Stop 43, call 4 (a200c8f: 8192 x 28672 int4 on two splits at two CTAs per SM): QuantLinear and every forced
# kernel at M = 1..32 (the table's decode rows), f16 and bf16; then the decode tests.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
LOWBIT_BENCH_SUSTAINED=0 timeout 200 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 --shape 24x8192x28672 --shape 32x8192x28672 \
  --dispatch $OUT/dispatch-8192x28672.json > $OUT/quant-linear-two-splits.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"; tail -2 $OUT/bench.err
python3 - $OUT/quant-linear-two-splits.jsonl <<'PY'
import json,sys,collections
g=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); g[(r['dtype'],r['M'],r['K'],r['N'])][r['impl']]=r['us']
for k,v in sorted(g.items()):
    base=min(v.get('cublas_fp16',1e9),v.get('cublaslt_fp16',1e9))
    print(k, ' '.join(f"{i.replace('lowbit','lb')}={u:.1f}({base/u:.2f})" for i,u in v.items() if i.startswith('lowbit')), f"base={base:.1f}")
PY
grep -o '"m": [0-9]*,\|"kernel": "[a-z_]*"' $OUT/dispatch-8192x28672.json | paste - - | tr '\n' ' '; echo
echo "== cluster_split_k"
timeout 200 $B/tests/cuda_linear cluster_split_k --test-threads=2 > $OUT/test-cluster.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-cluster.log | head
echo "== quant_linear ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/tests/quant_linear --test-threads=4 > $OUT/test-ql.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-ql.log | head
left=$(( 570 - ($(date +%s) - T0) ))
echo "== cuda_linear, the rest (${left} s left)"
timeout $left $B/tests/cuda_linear --skip cluster_split_k --test-threads=4 > $OUT/test-linear.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-linear.log | head -20
