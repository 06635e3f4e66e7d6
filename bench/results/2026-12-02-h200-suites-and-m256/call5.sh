#!/usr/bin/env bash
# Call 5 (binaries of cbe95ce in .devbin-m): which kernels cuBLAS and cuBLASLt run at 256 x 4096 x 4096 (f16), from
# cuBLASLt's trace log (level 2: every launching call with its algorithm) and cuBLAS's debug log.
export LOWBIT_CACHE_DIR=/tmp/lc
CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=/tmp/lt.log CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=/tmp/cublas.log \
  timeout 120 .devbin-m/lowbit bench --device cuda --op linear --dtype f16 --shape 256x4096x4096 > "$OUT/bench.txt" 2>&1
ls -la /tmp/lt.log /tmp/cublas.log
for f in /tmp/lt.log /tmp/cublas.log; do
  [ -f "$f" ] || continue
  head -c 20000 "$f" > "$OUT/$(basename "$f" .log)-head.txt"
  # one line per distinct call, pointers and timestamps stripped
  sed -E 's/0x[0-9a-f]+/P/g; s/^\[[^]]*\]//' "$f" | sort | uniq -c | sort -rn | head -n 60 > "$OUT/$(basename "$f" .log)-distinct.txt"
done
cat "$OUT"/*-distinct.txt | cut -c1-1500
