#!/usr/bin/env bash
# Stop 54, call 3 (binaries of 243458e in .devbin-f), as typed into the device tool: the decode suite and racecheck on
# its two cluster tests with the entry barrier as one cluster_sync (LB_EXP_ENTRY_BARRIER=1), beside synccheck on
# seven tests of the default kernels.
set -u; B=.devbin-f; export LOWBIT_CACHE_DIR=/tmp/lc; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
( LOWBIT_DECODE_DEFINES=LB_EXP_ENTRY_BARRIER=1 OUT=$OUT/c BUDGET_S=240 THREADS=4 bash scripts/device-suites.sh $B cuda_linear; echo "decode+barrier done $(el)";
  LOWBIT_DECODE_DEFINES=LB_EXP_ENTRY_BARRIER=1 OUT=$OUT/c TOOLS=racecheck PAR=2 PER_S=280 BUDGET_S=$(( 540 - $(el) )) LINES_KEPT=30 bash scripts/device-sanitize.sh $B cuda_linear:cluster_split_k cuda_linear:gathered_tiles; echo "racecheck done $(el)" ) > $OUT/decode.log 2>&1 &
( OUT=$OUT/s TOOLS=synccheck PAR=2 PER_S=200 BUDGET_S=520 LINES_KEPT=30 bash scripts/device-sanitize.sh $B cuda_linear_gemm:split_tiles_in_several_cluster_groups cuda_w8a8:exact_integer_mode_is_bit_exact cuda_linear_gemm:exact_integers_bit_equal_with_and_without_split_k cuda_linear_gemm:stream_k_splits_tiles_between_ctas cuda_linear:exact_integer_mode_is_bit_exact cuda_linear:cluster_split_k cuda_linear_gemm:tiny_batches_on_the_16_token_tile; echo "synccheck done $(el)" ) > $OUT/sync.log 2>&1 &
wait; cat $OUT/decode.log $OUT/sync.log; echo total $(el)
