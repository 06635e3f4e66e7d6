#!/usr/bin/env bash
# Per-CTA timelines of the decode kernel, 6 processes, to see whether the slow streams sit on the same SMs.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT /tmp/csv
for r in 1 2 3 4 5 6; do
  mkdir -p /tmp/csv/r$r
  LOWBIT_TRACE_CSV=/tmp/csv/r$r timeout 100 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 decode:1x13824x5120 > /tmp/csv/r$r/out.txt 2>&1
  grep '^== decode' /tmp/csv/r$r/out.txt
done
nvidia-smi -q | grep -i -A3 "gpc\|Multiprocessor" | head -20
tar czf $OUT/csv.tgz -C /tmp csv
ls -la $OUT
