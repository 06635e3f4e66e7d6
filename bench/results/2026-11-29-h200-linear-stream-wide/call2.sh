#!/usr/bin/env bash
# Stop 46, call 2: stream_probe l2-paths again, now with the GEMM's stages by copy path (x by cp.async).
set -u
mkdir -p $OUT
LOWBIT_PROBE=l2-paths timeout 120 .devbin-k/stream_probe > $OUT/l2-paths-stages.txt 2>&1; echo "probe rc=$?"; cat $OUT/l2-paths-stages.txt
