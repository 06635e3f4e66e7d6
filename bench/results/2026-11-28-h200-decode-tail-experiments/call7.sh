#!/usr/bin/env bash
# The decode tests at d64c87b (RAMP as a shape field).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in quant_linear cuda_linear; do
  echo "== $t"; timeout 290 $B/tests/$t --test-threads=4 > $OUT/test-$t.log 2>&1; echo rc=$?
  grep -E "test result|panicked|FAILED" $OUT/test-$t.log | head -10
done
