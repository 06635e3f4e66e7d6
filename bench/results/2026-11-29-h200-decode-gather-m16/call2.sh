#!/usr/bin/env bash
# Stop 44, call 2 (309defd): the gathered decode kernel's per-CTA timelines with SM ids (is the main loop's spread
# per SM?), two rounds at M = 1 and 16; a deeper pipeline A/B; then the whole cuda_linear and memcheck on the gathered
# path.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT/csv-r1 $OUT/csv-r2
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
for r in 1 2; do
  LOWBIT_TRACE_CSV=$OUT/csv-r$r timeout 60 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 > $OUT/trace-r$r.txt 2>&1
  echo "trace r$r rc=$? ($(el) s)"; grep -E "^== " $OUT/trace-r$r.txt
done
LOWBIT_TRACE_CSV=$OUT/csv-stream timeout 60 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 --gather off --decode-splits 1 > $OUT/trace-stream.txt 2>&1
echo "trace stream-K rc=$? ($(el) s)"; grep -E "^== " $OUT/trace-stream.txt
LOWBIT_BENCH_STAGES=4 LOWBIT_BENCH_SUSTAINED=0 timeout 120 $B/lowbit bench --device cuda --op linear --dtype f16 --json \
  --shape 1x8192x28672 --shape 16x8192x28672 > $OUT/stages.jsonl 2> $OUT/stages.err
echo "bench rc=$? ($(el) s)"; tail -1 $OUT/stages.err
python3 - $OUT/stages.jsonl <<'PY'
import json,sys,collections
g=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); g[(r['M'],r['dtype'])][r['impl']]=r['us']
for k,v in sorted(g.items()):
    base=min(v.get('cublas_fp16',1e9),v.get('cublaslt_fp16',1e9))
    print(k, ' '.join(f"{i.replace('lowbit','lb')}={u:.1f}({base/u:.2f})" for i,u in v.items() if i.startswith('lowbit')), f"base={base:.1f}")
PY
echo "== cuda_linear ($(el) s)"
timeout 260 $B/tests/cuda_linear --test-threads=4 > $OUT/test-linear.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-linear.log | head -20
left=$(( 570 - $(el) )); echo "== memcheck gathered_tiles (${left} s left)"
[ $left -gt 30 ] && timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda_linear --test-threads=1 gathered_tiles > $OUT/memcheck.log 2>&1; echo rc=$?
tail -n 4 $OUT/memcheck.log
