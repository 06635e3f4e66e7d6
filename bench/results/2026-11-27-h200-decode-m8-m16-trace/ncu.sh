#!/usr/bin/env bash
# The Nsight Compute profiles beside this script (decode-m{8,16}-details.txt), as run on the device: one decode launch
# of examples/gemm_trace (built at a6ddd22) at M = 8 and 16 on 8192 x 28672, the 6th launch of the kernel (gemm_trace
# launches it ~20 times; skipping 30 profiled nothing). scripts/device-gemm-trace.sh profiles the same kernel through
# `lowbit bench` (NCU_DECODE=16x8192x28672), with dependent launch on.
set -uo pipefail
GEMM_TRACE=${GEMM_TRACE:-.devbin/gemm_trace}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
NCU_BIN=/usr/local/cuda/bin/ncu
for m in 8 16; do
  timeout 200 $NCU_BIN --cache-control none --clock-control none --set full -k regex:w4a16_linear -s 5 -c 1 \
    -o "$OUT/decode-m$m" "$GEMM_TRACE" "decode:${m}x8192x28672" > "$OUT/ncu-$m.log" 2>&1 || tail -5 "$OUT/ncu-$m.log"
  $NCU_BIN -i "$OUT/decode-m$m.ncu-rep" --page details --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SpeedOfLight --section LaunchStats \
    --section Occupancy > "$OUT/decode-m$m-details.txt" 2>&1
  $NCU_BIN -i "$OUT/decode-m$m.ncu-rep" --page raw --csv > "$OUT/decode-m$m-raw.csv" 2>&1
  echo "== M=$m"
  grep -E "Duration|DRAM Throughput|Stall|Issued Warp|Eligible|Registers Per|Achieved Occupancy|Issue Slots Busy" \
    "$OUT/decode-m$m-details.txt" | head -30
done
rm -f "$OUT"/*.ncu-rep
