#!/usr/bin/env bash
# Stop 48, call 1 (binaries of 46c9a34): tensor_rate, the K-split step probe's first run.
set -x
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
export LOWBIT_CACHE_DIR=/tmp/lc
timeout 120 .devbin-k/tensor_rate | tee $OUT/tensor_rate.txt
