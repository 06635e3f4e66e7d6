#!/usr/bin/env bash
# Call 4: the decode suite plainly after the entry-barrier change, beside synccheck with kernel source lines on the
# K-split tests (call 3: "divergent thread(s)" at a barrier of the 128-token tile).
export LOWBIT_CACHE_DIR=/tmp/lc
BUDGET_S=190 THREADS=4 bash scripts/device-suites.sh .devbin-s cuda_linear &
LOWBIT_NVRTC_LINEINFO=1 TOOLS=synccheck PAR=2 PER_S=190 BUDGET_S=195 LINES_KEPT=40 bash scripts/device-sanitize.sh .devbin-s \
  cuda_linear_gemm:k_split_tile_of_128_tokens cuda_linear_gemm:k_split_tile_over_whole_and_half_units
wait
