#!/usr/bin/env bash
# Stop 47, call 3 (257ebf4): Nsight Compute's per-instruction warp stall samples of the 64-token K-split tile at
# 64 x 4096², the 41st launch, clocks free, the shortest sampling interval, to see where its main loop waits.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
NCU=/usr/local/cuda/bin/ncu
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 $NCU --cache-control none --clock-control none --set full --import-source no --warp-sampling-interval 0 \
  -k regex:'^w4a16_gemm$' -s 40 -c 1 -o $OUT/ks64 $B/gemm_trace 64x4096x4096 --ksplit > $OUT/ncu-ks64.log 2>&1
echo "ncu rc=$?"; tail -3 $OUT/ncu-ks64.log
$NCU -i $OUT/ks64.ncu-rep --page details > $OUT/ks64-details.txt 2>&1
$NCU -i $OUT/ks64.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/ks64-sass.csv.gz
ls -la $OUT; rm -f $OUT/ks64.ncu-rep
grep -E "Duration|Issue Slots Busy|Eligible|Warp Cycles Per Issued" $OUT/ks64-details.txt
