#!/usr/bin/env bash
# Stop 43, call 3: is a balanced cluster split-K grid (tiles x 2 = 264 CTAs) faster per byte than stream-K?
# 8192 x 33792 has 132 tiles of 256 columns: 2 splits fill both CTA slots of every SM.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
S="decode:1x8192x28672 decode:16x8192x28672 decode:1x8192x33792 decode:16x8192x33792 decode:1x8192x32768 decode:16x8192x32768"
for round in 1 2; do
for sp in default 2; do
  f=""; [ $sp = 2 ] && f="--decode-splits 2"
  timeout 150 $B/gemm_trace $S $f > $OUT/splits-$sp-r$round.txt 2>&1
  echo "splits=$sp r$round: $(grep '^== decode' $OUT/splits-$sp-r$round.txt | sed -E 's/== decode M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us[^,]*, ([0-9]+) CTAs.*/\1x\2x\3 \4 (\5)/' | tr '\n' ';')"
  echo "   exit max: $(grep '  exit  ' $OUT/splits-$sp-r$round.txt | awk '{print $NF}' | tr '\n' ' ')"
done
done
