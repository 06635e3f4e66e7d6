#!/usr/bin/env bash
# Stop 48, call 5 (binaries of eba310a, kernels of a360347): tensor_rate with the SM clock (clock64 against
# %globaltimer); gemm_trace after 20 and 4000 rounds, nvidia-smi sampled every 50 ms (call5-smi.txt.gz).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
timeout 120 $B/tensor_rate > $OUT/tensor_rate.txt 2>&1; grep "K-split" $OUT/tensor_rate.txt | grep registers
export LOWBIT_GEMM_DEFINES="LB_EXP_CLOCK=1"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $OUT/smi.txt &
SMI=$!
for round in 1 2; do
  for rounds in 20 4000; do
    mkdir -p $OUT/csv-r$rounds-$round
    echo "start rounds=$rounds round=$round $(date +%H:%M:%S.%N)" >> $OUT/smi.txt
    LOWBIT_TRACE_ROUNDS=$rounds LOWBIT_TRACE_CSV=$OUT/csv-r$rounds-$round timeout 150 $B/gemm_trace 64x4096x4096 --ksplit --rotate-io > /tmp/t.txt 2>&1
    echo "[rounds $rounds] $(grep -E '^== ' /tmp/t.txt | cut -c1-60) | mainloop $(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)"
    python3 - $OUT/csv-r$rounds-$round/64x4096x4096.csv <<'PY'
import csv,sys,statistics as st
r=[x for x in csv.DictReader(open(sys.argv[1])) if float(x['global_step_us'])>0]
ns=[(float(x['mainloop_end_us'])-float(x['first_full_us']))*1e3 for x in r]
cy=[(float(x['global_step_us'])-float(x['entry_us']))*1e3 for x in r]
g=[c/n for c,n in zip(cy,ns) if n>0]
print("   traced launch: main loop cycles med %.0f, ns med %.0f, SM GHz med %.3f" % (st.median(cy), st.median(ns), st.median(g)))
PY
    { echo "# rounds $rounds"; cat /tmp/t.txt; } >> $OUT/trace.txt
  done
  echo "($(el) s)"
done
kill $SMI
