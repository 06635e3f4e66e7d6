#!/usr/bin/env bash
# Stop 44, call 4 (bb3ef5b): BOTH SPLITS IN ONE CTA. The gathered tests first (cluster_split_k runs 28672 x 512 on
# the new default), per-CTA timelines of 8192 x 28672 with and without pairing, then QuantLinear f16 at M = 1, 16
# with the cluster form beside it.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
echo "== gathered_tiles, cluster_split_k"
timeout 150 $B/tests/cuda_linear gathered_tiles cluster_split_k --test-threads=2 > $OUT/test-gather.log 2>&1; echo rc=$?
grep -E "^test |test result|panicked" $OUT/test-gather.log | head
for cfg in "paired:" "cluster:--paired off"; do
  name=${cfg%%:*}; flags=${cfg#*:}; mkdir -p /tmp/csv-$name
  LOWBIT_TRACE_CSV=/tmp/csv-$name timeout 60 $B/gemm_trace decode:1x8192x28672 decode:4x8192x28672 decode:16x8192x28672 $flags > $OUT/trace-$name.txt 2>&1
  echo "$name rc=$? ($(el) s)"; grep -E "^== " $OUT/trace-$name.txt
done
tar czf $OUT/csv.tgz -C /tmp csv-paired csv-cluster
python3 - /tmp/csv-paired /tmp/csv-cluster <<'PY' | tee $OUT/by-sm-slot.txt
import csv,sys,os,statistics as st,collections
for d in sys.argv[1:]:
    for f in sorted(os.listdir(d)):
        rows=[r for r in csv.DictReader(open(os.path.join(d,f))) if float(r['exit_us'])>0]
        per_sm=collections.Counter(int(r['sm']) for r in rows)
        seen=set(); groups=collections.defaultdict(list)
        for r in sorted(rows,key=lambda r:int(r['cta'])):
            sm=int(r['sm'])
            g='alone' if per_sm[sm]==1 else ('first' if sm not in seen else 'second')
            seen.add(sm); groups[g].append(r)
        out=[]
        for g in ('first','second','alone'):
            v=groups[g]
            if not v: continue
            q=lambda k:st.median(float(r[k]) for r in v)
            out.append(f"{g}: {len(v)} CTAs, first_full {q('first_full_us'):.1f}, mainloop_end {q('mainloop_end_us'):.1f} (max {max(float(r['mainloop_end_us']) for r in v):.1f}), exit {q('exit_us'):.1f} (max {max(float(r['exit_us']) for r in v):.1f})")
        print(d, f, '|', ' | '.join(out))
PY
LOWBIT_BENCH_PAIRED=0 LOWBIT_BENCH_SUSTAINED=0 timeout 120 $B/lowbit bench --device cuda --op linear --dtype f16 --json \
  --shape 1x8192x28672 --shape 16x8192x28672 > $OUT/paired.jsonl 2> $OUT/paired.err
echo "bench rc=$? ($(el) s)"; tail -1 $OUT/paired.err
python3 - $OUT/paired.jsonl <<'PY'
import json,sys,collections
g=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); g[(r['M'],r['dtype'])][r['impl']]=r['us']
for k,v in sorted(g.items()):
    base=min(v.get('cublas_fp16',1e9),v.get('cublaslt_fp16',1e9))
    print(k, ' '.join(f"{i.replace('lowbit','lb')}={u:.1f}({base/u:.2f})" for i,u in v.items() if i.startswith('lowbit')), f"base={base:.1f}")
PY
