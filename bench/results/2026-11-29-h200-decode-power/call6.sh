#!/usr/bin/env bash
# Stop 45, call 6: A/B of the paired decode CTA before (gemm_trace_old: the kernel of 1a6598d) and after (8491fb5) the
# lane offsets were computed once, 8192 x 28672 at M = 1, 4, 16, in turn, 20 and 5000 launches in a row; then the
# decode tests in full (cuda_linear, quant_linear) at 8491fb5.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
for rep in 1 2; do
  for r in 20 5000; do
    for m in 1 4 16; do
      for bin in gemm_trace_old gemm_trace; do
        us=$(LOWBIT_TRACE_ROUNDS=$r timeout 60 $B/$bin decode:${m}x8192x28672 2>&1 | grep -E "^== " | sed 's/.*: \([0-9.]*\) us.*/\1/')
        echo "rep=$rep rounds=$r M=$m $bin $us" | tee -a $OUT/ab.txt
      done
    done
  done
done
python3 - $OUT/ab.txt <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    f=dict(x.split('=') for x in l.split()[:3]); b,us=l.split()[3],float(l.split()[4])
    d[(f['rounds'],f['M'],b)].append(us)
for k in sorted(d): print(k, 'median %.2f' % st.median(d[k]), d[k])
PY
echo "== cuda_linear ($(el) s)"
timeout 300 $B/tests/cuda_linear --test-threads=4 > $OUT/test-linear.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-linear.log | head -20
left=$(( 585 - $(el) )); echo "== quant_linear ($(el) s, ${left} s left)"
timeout $left $B/tests/quant_linear --test-threads=4 > $OUT/test-ql.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-ql.log | head
