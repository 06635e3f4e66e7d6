#!/usr/bin/env bash
set -uo pipefail
B=.devbin
export LOWBIT_CACHE_DIR=/tmp/lc
NCU_BIN=/usr/local/cuda/bin/ncu
for m in 8 16; do
  timeout 200 $NCU_BIN --cache-control none --clock-control none --set full -k regex:w4a16_linear -s 30 -c 1 -o $OUT/decode-m$m \
    $B/gemm_trace-old decode:${m}x8192x28672 > $OUT/ncu-$m.log 2>&1 || tail -5 $OUT/ncu-$m.log
  $NCU_BIN -i $OUT/decode-m$m.ncu-rep --page details --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SpeedOfLight --section LaunchStats --section Occupancy > $OUT/decode-m$m-details.txt 2>&1
  $NCU_BIN -i $OUT/decode-m$m.ncu-rep --page raw --csv > $OUT/decode-m$m-raw.csv 2>&1
  echo "== M=$m"; grep -E "Duration|DRAM Throughput|Stall|Issued Warp|Eligible|Registers Per|Achieved Occupancy|Issue Slots Busy" $OUT/decode-m$m-details.txt | head -30
done
rm -f $OUT/*.ncu-rep
