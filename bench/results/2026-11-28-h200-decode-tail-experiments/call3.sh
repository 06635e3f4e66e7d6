#!/usr/bin/env bash
# RAMP for the decode kernel: per-launch time at LB_RAMP 0 (all stages at once), 1, 2.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
S="decode:1x8192x28672 decode:4x8192x28672 decode:16x8192x28672 decode:1x4096x4096 decode:16x4096x4096 decode:1x13824x5120 decode:1x14336x4096 decode:16x14336x4096"
for round in 1 2; do
for R in 0 1 2; do
  LOWBIT_DECODE_DEFINES="LB_RAMP=$R" timeout 200 $B/gemm_trace $S > $OUT/ramp$R-r$round.txt 2>&1
  echo "RAMP=$R r$round: $(grep '^== decode' $OUT/ramp$R-r$round.txt | sed -E 's/== decode M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us.*/\1x\2x\3 \4/' | tr '\n' ';')"
  echo "   first_full med: $(grep 'first_full' $OUT/ramp$R-r$round.txt | awk '{print $5}' | tr '\n' ' ')  exit max: $(grep '  exit  ' $OUT/ramp$R-r$round.txt | awk '{print $7}' | tr '\n' ' ')"
done
done
