#!/usr/bin/env bash
# Call 6 (gemm_trace of ee1b37a): 256 x 4096^2 on the 128-token K-split tile (QuantLinear's choice there) and on the
# 128-token token-split tile (256 columns) forced to 4 and 3 splits, one round.
BUDGET_S=90 bash .devbin-k/trace-in-turn.sh .devbin-k 1 \
  "256x4096x4096 --ksplit;256x4096x4096 --tokens 128 --splits 4;256x4096x4096 --tokens 128 --splits 3" "|"
