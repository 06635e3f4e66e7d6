#!/usr/bin/env bash
# Stop 46, call 7 (8751447): M = 16 on 8192 x 28672 by decode layout -- the default (gathered 7-warp tiles, both
# splits in one CTA, mma.sync), the stored 8-warp tiles with mma.sync, and with wgmma (m64n16k16, full warpgroups).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
for round in 1 2; do
  for cfg in "" "--gather off --paired off" "--gather off --paired off --wgmma on" "--gather off --paired off --wgmma on --ctas-per-sm 1"; do
    timeout 60 $B/gemm_trace decode:16x8192x28672 decode:1x8192x28672 $cfg > /tmp/t.txt 2>&1
    echo "round $round [$cfg]: $(grep -E '^== ' /tmp/t.txt | sed -E 's/.*(M=[0-9]+).*: ([0-9.]+ us\/launch)[^,]*, ([0-9]+ CTAs).*/\1 \2 \3/' | tr '\n' ' ')"
    { echo "### [$cfg] round $round"; cat /tmp/t.txt; } >> $OUT/trace-layouts.txt
  done
done
