#!/usr/bin/env bash
# Diagnostics of the fixed costs of the W4A16 kernels (no records): the per-CTA timeline of the Hopper GEMM
# (examples/gemm_trace) on the shapes where it loses to cuBLAS, then Nsight Compute with per-instruction stall
# sampling (SASS source page) of one GEMM launch and one decode launch.
# Binaries: `DEVBIN=.devbin TESTS= bash scripts/prepare-devbin.sh` plus
# `cargo build --release -p lowbit --example gemm_trace && cp target/release/examples/gemm_trace .devbin/`.
# Knobs: SHAPES (MxKxN or conv:BxCxHxWxRxCo list for the timeline), NCU_GEMM (one MxKxN, "" to skip), NCU_DECODE (one MxKxN, "" to skip).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BIN=${BIN:-.devbin}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
SHAPES=${SHAPES:-"64x4096x4096 256x4096x4096 256x14336x4096 1024x4096x4096 1024x4096x14336 4096x4096x4096 conv:1x256x56x56x3x256 conv:8x256x56x56x3x256 conv:8x1024x14x14x1x2048"}
echo "== timeline"
mkdir -p "$OUT/csv"
LOWBIT_TRACE_CSV="$OUT/csv" timeout 200 "$BIN/gemm_trace" $SHAPES 2>&1 | tee "$OUT/trace.txt"
if [ -n "${EXTRA:-}" ]; then
  echo "== timeline $EXTRA"
  timeout 100 "$BIN/gemm_trace" $EXTRA 2>&1 | tee -a "$OUT/trace.txt"
fi
NCU_BIN=/usr/local/cuda/bin/ncu
NCU="$NCU_BIN --cache-control none --clock-control none"
page() {  # $1: report; the stall summary and the per-instruction SASS samples
  $NCU_BIN -i "$1.ncu-rep" --page details --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SpeedOfLight --section LaunchStats --section Occupancy > "$1-details.txt" 2>&1
  $NCU_BIN -i "$1.ncu-rep" --page source --csv --print-source sass > "$1-sass.csv" 2>&1
  grep -E "Duration|Throughput|Stall|Issued|Eligible|Active Warps|Registers|Grid Size" "$1-details.txt" | head -40
}
if [ -n "${NCU_GEMM-256x4096x4096}" ]; then
  echo "== ncu GEMM ${NCU_GEMM-256x4096x4096}"
  timeout 200 $NCU --set full -k regex:w4a16_gemm -s 40 -c 1 -o "$OUT/gemm" \
    "$BIN/gemm_trace" "${NCU_GEMM-256x4096x4096}" > "$OUT/ncu-gemm.log" 2>&1 || tail -5 "$OUT/ncu-gemm.log"
  page "$OUT/gemm"
fi
if [ -n "${NCU_DECODE-1x8192x28672}" ]; then
  echo "== ncu decode ${NCU_DECODE-1x8192x28672}"
  timeout 200 $NCU --set full -k regex:w4a16_linear -s 40 -c 1 -o "$OUT/decode" \
    "$BIN/lowbit" bench --device cuda --op linear --shape "${NCU_DECODE-1x8192x28672}" --json > "$OUT/ncu-decode.log" 2>&1 \
    || tail -5 "$OUT/ncu-decode.log"
  page "$OUT/decode"
fi
rm -f "$OUT"/*.ncu-rep.tmp
