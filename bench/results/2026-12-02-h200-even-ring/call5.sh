#!/usr/bin/env bash
# Stop 54, call 5 (binaries of 243458e in .devbin-f), as typed into the device tool: QuantLinear and the W4 kernels at
# M = 1, 4, 16 on the four shapes, and W8A16 at M = 1, two rounds, each with the decode kernel's entry barrier
# (LB_EXP_ENTRY_BARRIER=1) and then without; eight files at most come back, so each side's rounds share one file.
export LOWBIT_CACHE_DIR=/tmp/lc; W=$(mktemp -d)
for r in 1 2; do for d in on off; do
  if [ $d = on ]; then export LOWBIT_DECODE_DEFINES=LB_EXP_ENTRY_BARRIER=1; else unset LOWBIT_DECODE_DEFINES; fi
  mkdir -p $W/$d$r
  MS="1 4 16" W8_MS="1" SKIP_TESTS=1 DTYPES=f16 BIN=.devbin-f OUT=$W/$d$r timeout 200 bash scripts/device-gemm.sh > $W/$d$r/log.txt 2>&1
  echo "$d$r rc $?"
done; done
for d in on off; do
  cat $W/${d}1/bench-linear.jsonl $W/${d}2/bench-linear.jsonl > $OUT/bench-entry-barrier-$d.jsonl
  for r in 1 2; do echo "== $d$r"; cat $W/$d$r/gpu.txt $W/$d$r/log.txt; done >> $OUT/log-entry-barrier.txt
done
cp $W/on1/dispatch-f16.json $OUT/dispatch-entry-barrier-on.json
