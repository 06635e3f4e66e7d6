#!/usr/bin/env bash
# Device call 2 (stop 39): where the K-split tile's time goes (ncu, CTA timelines), and QuantLinear's K-split points.
export LOWBIT_CACHE_DIR=/tmp/lc
D=.devbin-k
NCU=/usr/local/cuda/bin/ncu
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
prof() {  # name, gemm_trace args...
  local name=$1; shift
  timeout 150 $NCU --cache-control none --clock-control none --set full -k regex:'^w4a16_gemm$' -s 40 -c 1 -o $OUT/$name \
    $D/gemm_trace "$@" > $OUT/ncu-$name.log 2>&1 || tail -5 $OUT/ncu-$name.log
  $NCU -i $OUT/$name.ncu-rep --page details > $OUT/$name-details.txt 2>&1
  $NCU -i $OUT/$name.ncu-rep --page raw --csv > $OUT/$name-raw.csv 2>&1
  echo "== $name"; grep -E "Duration|Throughput|Stall|Issued Warp|Eligible|Issue Slots Busy|Bank|Shared" $OUT/$name-details.txt | head -40
  rm -f $OUT/$name.ncu-rep
}
prof ksplit-64x4096x4096 64x4096x4096 --ksplit
prof t128-256x4096x14336 256x4096x14336
timeout 60 $D/gemm_trace 64x4096x4096 --ksplit > $OUT/trace-ksplit.txt 2>&1; tail -25 $OUT/trace-ksplit.txt
LOWBIT_BENCH_SUSTAINED=0 timeout 200 $D/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape 33x4096x4096 --shape 48x4096x4096 --shape 64x4096x4096 --shape 96x4096x4096 --shape 128x4096x4096 \
  --dispatch $OUT/dispatch-4096.json > $OUT/ksplit-points.jsonl 2> $OUT/ksplit-points.err
echo "bench rc $?"
python3 - <<'P'
import json,os
for l in open(os.environ['OUT']+'/ksplit-points.jsonl'):
    try: r=json.loads(l)
    except Exception: continue
    if r.get('op')=='linear': print(r['dtype'], r['M'], r['impl'], round(r['us'],2))
P
