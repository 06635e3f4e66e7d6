#!/usr/bin/env bash
# Call 6 (stream_probe of this session's commit, built here): the GEMM's stages without math, in clusters of two
# CTAs sharing x: copied by each, multicast in halves (remote release at cluster scope, or at CTA scope as CUTLASS
# does), or multicast whole by one CTA. Adds the 128-token K-split tile's stage (32 + 8 KB x 5) and 128 CTAs.
export LOWBIT_CACHE_DIR=/tmp/lc
LOWBIT_PROBE=stages timeout 300 .devbin-m/stream_probe | tee "$OUT/stream-probe-multicast.txt"
