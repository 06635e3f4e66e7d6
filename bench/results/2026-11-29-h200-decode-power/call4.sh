#!/usr/bin/env bash
# Stop 45, call 4: the decode kernel at M = 1 and 16 on 8192 x 28672 timed over 20 to 20000 launches in a row
# (gemm_trace, LOWBIT_TRACE_ROUNDS), SM clock sampled alongside.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader -lms 20 > $OUT/clocks.csv &
LOG=$!
for r in 20 2000 20000 20; do
  for m in 16 1 16; do
    LOWBIT_TRACE_ROUNDS=$r timeout 60 $B/gemm_trace decode:${m}x8192x28672 2>&1 | grep -E "^== " | sed "s/^/rounds $r: /"
  done
done
sleep 0.3; kill $LOG
awk -F', ' '{print $2}' $OUT/clocks.csv | sort | uniq -c
