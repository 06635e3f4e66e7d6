#!/usr/bin/env bash
# Stop 54, call 1 (binaries in .devbin-f; BUILT names the commit): the K-split tiles' two fixes (an even ring; the
# exchange's barriers outside the per-warpgroup code) under racecheck and synccheck, then the GEMM suite plainly;
# beside them QuantLinear's suite, then the decode suite twice with LB_EXP_ENTRY_BARRIER=1 (the first run compiles,
# the second tells whether it finishes as the default's 45 s does).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-f
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
(
  WARM=1 TOOLS="racecheck synccheck" PAR=4 PER_S=240 BUDGET_S=330 LINES_KEPT=40 bash scripts/device-sanitize.sh $B \
    cuda_linear_gemm:k_split_tile_of_128_tokens cuda_linear_gemm:k_split_tile_over_whole_and_half_units \
    > $OUT/sanitize.log 2>&1
  echo "sanitize done at $(el) s"
  OUT=$OUT/a BUDGET_S=$(( 560 - $(el) )) THREADS=3 bash scripts/device-suites.sh $B cuda_linear_gemm
  echo "gemm suite done at $(el) s"
) > $OUT/group-a.log 2>&1 &
(
  OUT=$OUT/b BUDGET_S=200 THREADS=2 bash scripts/device-suites.sh $B quant_linear
  echo "quant_linear done at $(el) s"
  export LOWBIT_DECODE_DEFINES=LB_EXP_ENTRY_BARRIER=1
  OUT=$OUT/c1 BUDGET_S=$(( 400 - $(el) )) THREADS=4 bash scripts/device-suites.sh $B cuda_linear
  echo "decode (entry barrier, first) done at $(el) s"
  OUT=$OUT/c2 BUDGET_S=$(( 565 - $(el) )) THREADS=4 bash scripts/device-suites.sh $B cuda_linear
  echo "decode (entry barrier, second) done at $(el) s"
) > $OUT/group-b.log 2>&1 &
wait
cat $OUT/group-a.log $OUT/group-b.log
echo "total $(el) s"
