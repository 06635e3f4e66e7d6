#!/usr/bin/env bash
# Stop 48, call 6 (binaries of c4653c0): warpgroup 0's main loop in SM cycles and in ns at the same two moments
# (before the exchange), base and LB_EXP_MATH_ONLY.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
for d in "LB_EXP_CLOCK=1" "LB_EXP_CLOCK=1" "LB_EXP_CLOCK=1;LB_EXP_MATH_ONLY=1"; do
  tag=$(echo "$d" | tr ';=' '_-')-$(el)
  mkdir -p $OUT/csv-$tag
  LOWBIT_GEMM_DEFINES="$d" LOWBIT_TRACE_CSV=$OUT/csv-$tag timeout 150 $B/gemm_trace 64x4096x4096 --ksplit --rotate-io > /tmp/t.txt 2>&1
  echo "[$d] $(grep -E '^== ' /tmp/t.txt | cut -c1-60) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)"
  python3 - $OUT/csv-$tag/64x4096x4096.csv <<'PY'
import csv,sys,statistics as st
r=[x for x in csv.DictReader(open(sys.argv[1])) if float(x['global_step_us'])>0]
f=lambda k: [float(x[k]) for x in r]
cy=[(g-e)*1e3 for g,e in zip(f('global_step_us'),f('entry_us'))]
ns=[(s-ff)*1e3 for s,ff in zip(f('step_loaded_us'),f('first_full_us'))]
ex=[(m-s)*1e3 for m,s in zip(f('mainloop_end_us'),f('step_loaded_us'))]
g=[c/n for c,n in zip(cy,ns) if n>0]
print("   warpgroup 0's main loop: cycles med %.0f, ns med %.0f, SM GHz med %.3f (min %.3f max %.3f); then to mainloop_end (exchange, warpgroup 1) ns med %.0f" % (st.median(cy), st.median(ns), st.median(g), min(g), max(g), st.median(ex)))
PY
  { echo "# $d"; cat /tmp/t.txt; } >> $OUT/trace.txt
  echo "($(el) s)"
done
