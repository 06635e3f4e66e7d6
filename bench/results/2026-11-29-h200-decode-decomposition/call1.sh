#!/usr/bin/env bash
# Stop 43, call 1: decompose the decode kernel's M = 1 / 16 time on 8192 x 28672 (experiment defines), then
# QuantLinear with --dispatch at M = 129 and 160 (f16, bf16).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT /tmp/tr
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
S="decode:1x8192x28672 decode:16x8192x28672 decode:1x4096x4096"
T0=$(date +%s)
for round in 1 2; do
for cfg in base P X F M MF MPX MPXF; do
  d=""
  [[ $cfg == *P* ]] && d="$d;LB_EXP_NO_PARAMS=1"
  [[ $cfg == *X* ]] && d="$d;LB_EXP_NO_X=1"
  [[ $cfg == *F* ]] && d="$d;LB_EXP_NO_FIXUP=1"
  [[ $cfg == M* ]] && d="$d;LB_EXP_NO_MATH=1"
  LOWBIT_DECODE_DEFINES="$d" timeout 100 $B/gemm_trace $S > /tmp/tr/$cfg-r$round.txt 2>&1
  echo "$cfg r$round: $(grep '^== decode' /tmp/tr/$cfg-r$round.txt | sed -E 's/== decode M=([0-9]+) K=([0-9]+) N=([0-9]+): ([0-9.]+) us.*/\1x\2x\3 \4/' | tr '\n' ';')  exit-max: $(grep '  exit  ' /tmp/tr/$cfg-r$round.txt | awk '{print $(NF-2), $NF}' | tr '\n' ' ')"
  [ $(( $(date +%s) - T0 )) -gt 300 ] && break 2
done
done
tar czf $OUT/traces.tgz -C /tmp tr
echo "== bench ($(( $(date +%s) - T0 )) s)"
LOWBIT_BENCH_SUSTAINED=0 timeout 280 $B/lowbit bench --device cuda --op linear --dtype f16 --dtype bf16 --json \
  --shape {129,160}x{4096x4096,4096x14336,14336x4096,8192x28672} --dispatch $OUT/dispatch-129-160.json > $OUT/quant-linear-m129-m160.jsonl 2> $OUT/bench.err
echo rc=$?
tail -3 $OUT/bench.err
python3 - $OUT/quant-linear-m129-m160.jsonl <<'PY'
import json,sys,collections
g=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); g[(r['dtype'],r['M'],r['K'],r['N'])][r['impl']]=r['us']
for k,v in sorted(g.items()):
    base=min(v.get('cublas_fp16',1e9),v.get('cublaslt_fp16',1e9))
    print(k, ' '.join(f"{i.replace('lowbit','lb')}={u:.1f}({base/u:.2f})" for i,u in v.items() if i.startswith('lowbit')), f"base={base:.1f}")
PY
cat $OUT/dispatch-129-160.json | head -c 3000
