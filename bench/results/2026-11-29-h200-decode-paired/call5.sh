#!/usr/bin/env bash
# Stop 44, call 5 (5ea09fa): paired decode CTAs with a producer warp per ring. The gathered tests, per-CTA timelines
# paired / cluster; if pairing wins at M = 1 and 16 (gemm_trace), QuantLinear f16 + bf16 at M = 1..32 with the
# cluster form beside it and the rest of cuda_linear and quant_linear.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
echo "== gathered_tiles, cluster_split_k"
timeout 150 $B/tests/cuda_linear gathered_tiles cluster_split_k --test-threads=2 > $OUT/test-gather.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-gather.log | head
for cfg in "paired:" "cluster:--paired off"; do
  name=${cfg%%:*}; flags=${cfg#*:}; mkdir -p /tmp/csv-$name
  LOWBIT_TRACE_CSV=/tmp/csv-$name timeout 60 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 $flags > $OUT/trace-$name.txt 2>&1
  echo "$name rc=$? ($(el) s)"; grep -E "^== " $OUT/trace-$name.txt
done
tar czf $OUT/csv.tgz -C /tmp csv-paired csv-cluster
python3 - /tmp/csv-paired /tmp/csv-cluster <<'PY' | tee $OUT/by-slot.txt
import csv,sys,os,statistics as st,collections
for d in sys.argv[1:]:
    for f in sorted(os.listdir(d)):
        rows=[r for r in csv.DictReader(open(os.path.join(d,f))) if float(r['exit_us'])>0]
        q=lambda k:st.median(float(r[k]) for r in rows)
        print(d, f, f"{len(rows)} CTAs, first_full {q('first_full_us'):.1f}, mainloop_end {q('mainloop_end_us'):.1f} (min {min(float(r['mainloop_end_us']) for r in rows):.1f}, max {max(float(r['mainloop_end_us']) for r in rows):.1f}), exit max {max(float(r['exit_us']) for r in rows):.1f}")
PY
us() { grep "^== decode M=$1 " $OUT/trace-$2.txt | sed 's/.*: \([0-9.]*\) us.*/\1/'; }
win=$(python3 -c "print(int($(us 1 paired) < $(us 1 cluster) and $(us 16 paired) < $(us 16 cluster)))")
echo "paired wins: $win"
[ "$win" = 1 ] || exit 0
LOWBIT_BENCH_PAIRED=0 LOWBIT_BENCH_SUSTAINED=0 timeout 170 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 --shape 32x8192x28672 \
  --dispatch $OUT/dispatch-8192x28672.json > $OUT/quant-linear.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(el) s)"; tail -1 $OUT/bench.err
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
echo "== quant_linear ($(el) s)"
timeout 170 $B/tests/quant_linear --test-threads=4 > $OUT/test-ql.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-ql.log | head
left=$(( 540 - $(el) )); echo "== cuda_linear, the rest (${left} s left)"
[ $left -gt 30 ] && timeout $left $B/tests/cuda_linear --skip gathered_tiles --skip cluster_split_k --test-threads=4 > $OUT/test-linear.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-linear.log | head -20
