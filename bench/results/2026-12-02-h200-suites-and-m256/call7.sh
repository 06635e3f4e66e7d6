#!/usr/bin/env bash
# Call 7 (stream_probe built here after call 6, with the `exchange` kernel): the stages of call 6 again, then the
# split-K exchange between the two CTAs of a cluster through DSMEM or through global memory.
export LOWBIT_CACHE_DIR=/tmp/lc
LOWBIT_PROBE=stages timeout 300 .devbin-m/stream_probe | tee "$OUT/stream-probe-exchange.txt"
