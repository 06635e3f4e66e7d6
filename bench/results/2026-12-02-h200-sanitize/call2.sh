#!/usr/bin/env bash
# Call 2: racecheck with kernel source lines on the tests whose first racecheck run reported hazards (call 1), the
# failing K-split test run plainly 12 times beside it, then the decode kernel's M = 1 timing after its new entry
# barrier (RECEIVE variants).
export LOWBIT_CACHE_DIR=/tmp/lc
( for i in $(seq 12); do
    timeout 90 .devbin-s/tests/cuda_linear_gemm --exact k_split_tile_of_128_tokens --test-threads 1 > /tmp/s.txt 2>&1
    echo "run $i rc $?"; grep -A3 panicked /tmp/s.txt | cut -c1-600
  done > "$OUT/stress-ksplit128.txt" ) &
LOWBIT_NVRTC_LINEINFO=1 TOOLS=racecheck PAR=4 PER_S=330 BUDGET_S=350 LINES_KEPT=150 bash scripts/device-sanitize.sh .devbin-s \
  cuda_linear_gemm:k_split_tile_of_128_tokens cuda_linear_gemm:k_split_tile_over_whole_and_half_units \
  cuda_linear:gathered_tiles cuda_linear:cluster_split_k
wait
cat "$OUT/stress-ksplit128.txt"
timeout 150 .devbin-s/lowbit bench --device cuda --op linear --dtype f16 --json --shape 1x4096x4096 --shape 1x4096x14336 \
  --shape 1x14336x4096 --shape 1x8192x28672 > "$OUT/bench-m1.jsonl" 2> "$OUT/bench-m1.err"
python3 - "$OUT/bench-m1.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["impl"] in ("lowbit", "lowbit_decode", "cublas_fp16", "cublaslt_fp16", "lowbit_graph"):
        print(r["K"], r["N"], r["impl"], round(r["us"], 2))
PY
