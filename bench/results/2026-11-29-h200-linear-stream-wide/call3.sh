#!/usr/bin/env bash
# Stop 46, call 3: STREAM-K on the 96- and 128-token tiles of 8192 x 28672, whole tiles against stream, in short bursts
# and sustained (LOWBIT_TRACE_ROUNDS), with the SM clock read after each.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
for rounds in 0 12000; do
  for cfg in "192x8192x28672 --tokens 96" "160x8192x28672 --tokens 96" "256x8192x28672 --tokens 128"; do
    for st in off on off on; do
      if [ $rounds = 0 ]; then timeout 60 $B/gemm_trace $cfg --stream $st > /tmp/t.txt 2>&1
      else LOWBIT_TRACE_ROUNDS=$rounds timeout 60 $B/gemm_trace $cfg --stream $st > /tmp/t.txt 2>&1; fi
      echo "rounds $rounds stream $st: $(grep -E '^== ' /tmp/t.txt | cut -c1-60) | $(nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader)"
      cat /tmp/t.txt >> $OUT/trace-r$rounds.txt
    done
  done
done
