#!/usr/bin/env bash
# FLAGGED PARTIALS: timing against the counter fix-up, then the decode tests with it on.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
S="decode:1x8192x28672 decode:4x8192x28672 decode:16x8192x28672 decode:1x13824x5120 decode:16x13824x5120 decode:1x14336x4096"
for round in 1 2; do
for F in 0 1; do
  LOWBIT_DECODE_DEFINES="LB_FLAGGED=$F" timeout 200 $B/gemm_trace $S > $OUT/flag$F-r$round.txt 2>&1
  echo "FLAGGED=$F r$round: $(grep '^== decode' $OUT/flag$F-r$round.txt | sed -E 's/== decode M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us.*/\1x\2x\3 \4/' | tr '\n' ';')"
  grep -E "^==|  exit  " $OUT/flag$F-r$round.txt | tail -n +1 | paste - - | awk '{print "   ",$3,$4,$5,$(NF-4),$(NF-2),$NF}' | head -6
done
done
[ "${TESTS:-0}" = 1 ] || exit 0
echo "== cuda_linear with FLAGGED=1"
LOWBIT_DECODE_DEFINES="LB_FLAGGED=1" timeout 330 $B/tests/cuda_linear --test-threads=4 > $OUT/test-flagged.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-flagged.log | head -40
