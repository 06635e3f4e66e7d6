#!/usr/bin/env bash
# Stop 46, call 6 (ab8bf40): the decode kernel with and without LB_FOLD_ZEROS on 8192 x 28672 at M = 1 and 16,
# timed in turn (20 launches) and over 5000 launches in a row; then its tests with the fold on.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
for rounds in 20 20 5000; do
  for fold in 0 1; do
    LOWBIT_TRACE_ROUNDS=$rounds LOWBIT_DECODE_DEFINES="LB_FOLD_ZEROS=$fold" timeout 90 $B/gemm_trace \
      decode:1x8192x28672 decode:16x8192x28672 > /tmp/t.txt 2>&1
    echo "rounds $rounds fold $fold: $(grep -E '^== ' /tmp/t.txt | sed -E 's/.*(M=[0-9]+).*: ([0-9.]+ us\/launch).*/\1 \2/' | tr '\n' ' ') ($(el) s)"
    cat /tmp/t.txt >> $OUT/trace-fold$fold.txt
  done
done
left=$(( 380 - $(el) )); echo "== tests with the fold (${left} s left)"
LOWBIT_DECODE_DEFINES="LB_FOLD_ZEROS=1" timeout $left $B/tests/cuda_linear --test-threads=4 gathered_tiles exact_integer \
  pipeline_depths > $OUT/test-fold.log 2>&1
echo rc=$?; grep -E "test result|^test |panicked|max rel|error" $OUT/test-fold.log | head -20
