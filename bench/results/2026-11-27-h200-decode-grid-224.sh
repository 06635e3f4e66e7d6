#!/usr/bin/env bash
# Stream-K grid sweep on 8192x28672 (decode kernel): 224 = 2 x 112 tiles (every CTA half a tile, no range crosses a
# tile boundary) against the default 264 = 2 x 132 SMs.
set -uo pipefail
export LOWBIT_CACHE_DIR=/tmp/lc
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
S="--shape 1x8192x28672 --shape 4x8192x28672 --shape 16x8192x28672 --shape 8x8192x28672"
for round in 1 2; do
  LOWBIT_BENCH_CTAS=224,264,240 timeout 200 .devbin/lowbit bench --op linear --device cuda --dtype f16 --dtype bf16 $S --json > $OUT/ctas-$round.jsonl 2> $OUT/ctas-$round.err
done
python3 - <<'PY'
import json,os,collections
for r in (1,2):
    rows=[json.loads(l) for l in open(os.environ['OUT']+f'/ctas-{r}.jsonl') if l.startswith('{')]
    d=collections.defaultdict(dict)
    for x in rows: d[(x['dtype'],x['M'])][x['impl']]=x['us']
    for k in sorted(d): print(r,k,{i:round(v,1) for i,v in sorted(d[k].items()) if 'graph' not in i})
PY
