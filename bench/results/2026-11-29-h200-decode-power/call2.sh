#!/usr/bin/env bash
# Stop 45, call 2 (1a6598d + gemm_trace --stages for the decode kernel): ring depth of the paired decode CTA,
# 3 / 4 / 5 stages per ring, 8192 x 28672 at M = 1, 8, 16, timed in turn twice.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT/t
T0=$(date +%s)
for rep in 1 2; do
  for st in 3 4 5; do
    timeout 60 $B/gemm_trace decode:1x8192x28672 decode:8x8192x28672 decode:16x8192x28672 --stages $st > $OUT/t/r$rep-s$st.txt 2>&1
    echo "rep $rep stages $st rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^== |alone" $OUT/t/r$rep-s$st.txt
  done
done
tar czf $OUT/traces.tgz -C $OUT t && rm -rf $OUT/t
