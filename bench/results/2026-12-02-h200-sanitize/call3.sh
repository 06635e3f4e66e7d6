#!/usr/bin/env bash
# Call 3: racecheck on the decode kernel's cluster split-K tests after the entry barrier (call 1 reported pushes into
# CTAs that "might not have entered yet"), and memcheck and synccheck on the K-split test that failed under racecheck.
export LOWBIT_CACHE_DIR=/tmp/lc
TOOLS=racecheck PAR=4 PER_S=380 BUDGET_S=390 bash scripts/device-sanitize.sh .devbin-s \
  cuda_linear:cluster_split_k cuda_linear:gathered_tiles &
sleep 2
TOOLS="memcheck synccheck" PAR=2 PER_S=380 BUDGET_S=390 bash scripts/device-sanitize.sh .devbin-s \
  cuda_linear_gemm:k_split_tile_of_128_tokens
wait
