#!/usr/bin/env bash
# Stop 45, call 1 (1a6598d): paired decode on 8192 x 28672 -- per-CTA timelines by place, ring depth 3/4/5 per ring
# (QuantLinear f16 at M = 1, 16), an Nsight Compute profile of the M = 16 paired launch, memcheck on gathered_tiles.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
NCU=/usr/local/cuda/bin/ncu
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 60 $B/gemm_trace decode:1x8192x28672 decode:16x8192x28672 > $OUT/trace-paired.txt 2>&1
echo "trace rc=$? ($(el) s)"; grep -E "^== |place|first|second|alone" $OUT/trace-paired.txt | head -20
LOWBIT_BENCH_STAGES=3,4,5 LOWBIT_BENCH_SUSTAINED=0 timeout 150 $B/lowbit bench --device cuda --op linear --dtype f16 --json \
  --shape 1x8192x28672 --shape 16x8192x28672 > $OUT/rings.jsonl 2> $OUT/rings.err
echo "bench rc=$? ($(el) s)"; tail -2 $OUT/rings.err
python3 $B/linear-ratios.py $OUT/rings.jsonl
for s in 3 4 6; do timeout 30 $B/gemm_trace 64x4096x4096 --ksplit --splits $s > $OUT/trace-ksplit-s$s.txt 2>&1; grep -E "^== |mainloop  |epilogue  |wait first" $OUT/trace-ksplit-s$s.txt; done
for m in 16 1; do
  timeout 150 $NCU --cache-control none --clock-control none --set full --import-source yes -k regex:w4a16_linear -s 5 -c 1 \
    -o /tmp/d$m $B/gemm_trace decode:${m}x8192x28672 > $OUT/ncu-$m.log 2>&1 || tail -5 $OUT/ncu-$m.log
  $NCU -i /tmp/d$m.ncu-rep --page details > $OUT/decode-m$m-details.txt 2>&1
  $NCU -i /tmp/d$m.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/decode-m$m-sass.csv.gz
  echo "== ncu M=$m ($(el) s)"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Warp|Eligible|Registers Per|Achieved Occupancy|No Eligible" $OUT/decode-m$m-details.txt | head -12
done
left=$(( 560 - $(el) )); echo "== memcheck gathered_tiles (${left} s left)"
timeout $left /usr/local/cuda/bin/compute-sanitizer --tool memcheck $B/tests/cuda_linear gathered_tiles --test-threads=1 > $OUT/memcheck.log 2>&1
echo rc=$?; grep -E "ERROR SUMMARY|test result|^test " $OUT/memcheck.log | head
