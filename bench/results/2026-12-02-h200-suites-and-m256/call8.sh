#!/usr/bin/env bash
# Call 8 (gemm_trace of cbe95ce): is the 128-token K-split tile's main loop at 256 x 4096^2 its fill? The tile as
# built and with LB_EXP_NO_MATH=1 (stages filled, waited for and released; no conversion, no wgmma), in turn, twice.
BUDGET_S=200 bash .devbin-m/trace-in-turn.sh .devbin-m 2 "256x4096x4096 --ksplit" "|" "LB_EXP_NO_MATH=1|"
