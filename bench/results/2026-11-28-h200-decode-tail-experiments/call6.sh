#!/usr/bin/env bash
# RAMP for the decode kernel's cluster split-K shapes: LB_RAMP 0 (all stages at once) against 1, M = 4..16.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
S="decode:4x4096x4096 decode:8x4096x4096 decode:12x4096x4096 decode:16x4096x4096 decode:8x14336x4096 decode:12x14336x4096 decode:16x14336x4096 decode:8x4096x14336 decode:16x4096x14336 decode:16x13824x5120 decode:16x8192x28672"
for round in 1 2 3; do
for R in 0 1; do
  LOWBIT_DECODE_DEFINES="LB_RAMP=$R" timeout 200 $B/gemm_trace $S > $OUT/ramp$R-r$round.txt 2>&1
  echo "RAMP=$R r$round: $(grep '^== decode' $OUT/ramp$R-r$round.txt | sed -E 's/== decode M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us.*splits ([0-9]+)/\1x\2x\3(s\5) \4/' | tr '\n' ';')"
done
done
