#!/usr/bin/env bash
# Stop 44, call 3 (309defd): per-CTA timelines of the gathered decode kernel at M = 1, 4, 16 summarised by where
# each CTA sits (first or second CTA of its SM, alone on its SM), two rounds; memcheck on the gathered tests.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
for r in 1 2; do
  mkdir -p /tmp/csv-r$r
  LOWBIT_TRACE_CSV=/tmp/csv-r$r timeout 60 $B/gemm_trace decode:1x8192x28672 decode:4x8192x28672 decode:16x8192x28672 > $OUT/trace-r$r.txt 2>&1
  echo "trace r$r rc=$? ($(el) s)"; grep -E "^== " $OUT/trace-r$r.txt
done
tar czf $OUT/csv.tgz -C /tmp csv-r1 csv-r2
python3 - /tmp/csv-r1 /tmp/csv-r2 <<'PY' | tee $OUT/by-sm-slot.txt
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
            out.append(f"{g}: {len(v)} CTAs, first_full {q('first_full_us'):.1f}, mainloop_end {q('mainloop_end_us'):.1f} (max {max(float(r['mainloop_end_us']) for r in v):.1f}), exit {q('exit_us'):.1f}")
        print(d, f, '|', ' | '.join(out))
PY
echo "== memcheck gathered_tiles ($(el) s)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda_linear --test-threads=1 gathered_tiles --nocapture > $OUT/memcheck.log 2>&1; echo rc=$?
grep -vE "^\s*$" $OUT/memcheck.log | tail -n 8
