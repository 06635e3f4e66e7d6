#!/usr/bin/env bash
# PREFETCH BEFORE THE WAIT: decode kernel per-launch time at several LB_PREFETCH settings.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p $OUT
for round in 1 2; do
for P in 0 4 8 16 2; do
  t0=$(date +%s)
  LOWBIT_DECODE_DEFINES="LB_PREFETCH=$P" timeout 200 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 decode:1x4096x4096 decode:1x13824x5120 decode:16x14336x4096 > $OUT/trace-p$P-r$round.txt 2>&1
  echo "P=$P round $round ($(( $(date +%s) - t0 )) s): $(grep '^== decode' $OUT/trace-p$P-r$round.txt | sed -E 's/== decode M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us.*/\1x\2x\3 \4/' | tr '\n' ';')"
done
done
