#!/usr/bin/env bash
# QuantLinear at M = 1..16 on the cluster split-K layers at d64c87b (RAMP for clusters of 8 splits).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc LOWBIT_BENCH_SUSTAINED=0
B=.devbin-k
mkdir -p $OUT
shapes=""
for kn in 4096x4096 14336x4096; do for m in 1 4 8 16; do shapes="$shapes --shape ${m}x$kn"; done; done
for dt in f16 bf16; do
  timeout 140 $B/lowbit bench --device cuda --op linear --dtype $dt $shapes --json >> $OUT/bench.jsonl 2> $OUT/bench-$dt.err; echo "$dt rc=$?"
done
python3 - $OUT/bench.jsonl <<'PY'
import json,sys,collections
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); d[(r["dtype"],r["K"],r["N"],r["M"])][r["impl"]]=r["us"]
for k,v in sorted(d.items()):
    base=min(u for i,u in v.items() if i.startswith("cublas"))
    print(k, "base %.1f"%base, " ".join("%s %.1f(%.2fx)"%(i.replace("lowbit","lb"),u,base/u) for i,u in v.items() if i.startswith("lowbit") and "dequant" not in i))
PY
