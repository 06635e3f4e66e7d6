#!/usr/bin/env bash
# The 96-token GEMM tile: per-launch times against the 128- and 64-token tiles, its tests, QuantLinear at M = 96/192.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc LOWBIT_BENCH_SUSTAINED=0
B=.devbin-k
mkdir -p $OUT
S="192x8192x28672 192x4096x14336 192x14336x4096 192x4096x4096 96x8192x28672 160x8192x28672"
for T in 96 128 64; do
  timeout 150 $B/gemm_trace $S --tokens $T > $OUT/trace-t$T.txt 2>&1
  echo "tokens $T: $(grep '^== M=' $OUT/trace-t$T.txt | sed -E 's/== M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us.*split (.*), stages.*/\1x\2x\3 \4 [\5]/' | tr '\n' ';')"
  grep "mainloop " $OUT/trace-t$T.txt | awk '{print "    mainloop med", $5}' | tr '\n' ' '; echo
done
echo "== tests"
timeout 200 $B/tests/cuda_linear_gemm --test-threads=4 the_96_token_tile f16_g128_zeros_token_tails > $OUT/test-gemm.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-gemm.log | head; grep -A4 panicked $OUT/test-gemm.log | head -8
echo "== bench"
shapes=""; for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do for m in 96 160 192; do shapes="$shapes --shape ${m}x$kn"; done; done
timeout 150 $B/lowbit bench --device cuda --op linear --dtype f16 $shapes --json > $OUT/bench.jsonl 2> $OUT/bench.err; echo rc=$?
python3 - $OUT/bench.jsonl <<'PY'
import json,sys,collections
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); d[(r["dtype"],r["K"],r["N"],r["M"])][r["impl"]]=r["us"]
for k,v in sorted(d.items()):
    base=min(u for i,u in v.items() if i.startswith("cublas"))
    print(k, "base %.1f"%base, " ".join("%s %.1f(%.2fx)"%(i.replace("lowbit","lb"),u,base/u) for i,u in v.items() if i.startswith("lowbit") and "dequant" not in i and "decode" not in i))
PY
echo "== quant_linear"
timeout 200 $B/tests/quant_linear --test-threads=4 > $OUT/test-ql.log 2>&1; echo rc=$?
grep -E "test result|panicked" $OUT/test-ql.log | head -5
