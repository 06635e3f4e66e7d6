#!/usr/bin/env bash
# Stop 45, call 3: why QuantLinear at M = 16 on 8192 x 28672 reads ~39 us in the bench and ~37 in gemm_trace. SM clock
# and power sampled every 20 ms through gemm_trace (shared / rotated x, y) and the bench (M = 1, 16, f16).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20 > $OUT/clocks.csv &
LOG=$!
mark() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $*" | tee -a $OUT/marks.txt; }
sleep 1
mark trace-start; timeout 60 $B/gemm_trace decode:16x8192x28672 decode:1x8192x28672 decode:16x8192x28672 > $OUT/trace-a.txt 2>&1; mark trace-end
grep -E "^== " $OUT/trace-a.txt
mark trace-rot-start; timeout 60 $B/gemm_trace decode:16x8192x28672 decode:16x8192x28672 --rotate-io > $OUT/trace-b.txt 2>&1; mark trace-rot-end
grep -E "^== " $OUT/trace-b.txt
mark bench-start
LOWBIT_BENCH_SUSTAINED=0 timeout 150 $B/lowbit bench --device cuda --op linear --dtype f16 --json \
  --shape 16x8192x28672 > $OUT/m16.jsonl 2> $OUT/m16.err
mark bench-end; python3 $B/linear-ratios.py $OUT/m16.jsonl
mark trace2-start; timeout 60 $B/gemm_trace decode:16x8192x28672 > $OUT/trace-c.txt 2>&1; mark trace2-end
grep -E "^== " $OUT/trace-c.txt
sleep 0.5; kill $LOG
python3 - $OUT/clocks.csv $OUT/marks.txt <<'PY'
import sys
rows=[l.strip().split(', ') for l in open(sys.argv[1]) if l.count(',')>=5]
marks=[l.split() for l in open(sys.argv[2])]
def t(s): h,m,x=s.split(' ')[-1].split(':'); return int(h)*3600+int(m)*60+float(x)
pts=[(t(r[0]),int(r[1].split()[0]),float(r[3].split()[0]),r[5]) for r in rows if 'MHz' in r[1]]
for i in range(0,len(marks)-1):
    a,b=t(marks[i][0]),t(marks[i+1][0])
    sel=[p for p in pts if a<=p[0]<b]
    if not sel: continue
    cl=sorted(p[1] for p in sel); pw=sorted(p[2] for p in sel)
    rs=sorted(set(p[3] for p in sel))
    print(f"{marks[i][1]:>16} -> {marks[i+1][1]:<14} n={len(sel)} sm MHz min {cl[0]} med {cl[len(cl)//2]} max {cl[-1]} | W med {pw[len(pw)//2]:.0f} max {pw[-1]:.0f} | reasons {rs}")
PY
gzip -f $OUT/clocks.csv
