#!/usr/bin/env bash
# The decode kernel's fixed costs, in one device call: its GPU tests (TESTS, default cuda_linear quant_linear),
# compute-sanitizer memcheck on cluster split-K, the per-CTA timeline (examples/gemm_trace, decode:MxKxN), and
# `lowbit bench --op linear` at M in MS on the four anchor shapes with stream-K forced beside the default
# (LOWBIT_BENCH_SPLITS=1 -> `lowbit_k1`), f16 and bf16 (DTYPES).
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear quant_linear" bash scripts/prepare-devbin.sh` plus
# `cargo build --release -p lowbit --example gemm_trace && cp target/release/examples/gemm_trace .devbin/`.
# Writes to $OUT: test-*.log, memcheck.log, trace.txt, bench-decode.jsonl.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BIN=${BIN:-.devbin}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for t in ${TESTS:-cuda_linear quant_linear}; do
  echo "== test $t"
  timeout 300 "$BIN/tests/$t" --test-threads=4 > "$OUT/test-$t.log" 2>&1 || status=1
  grep -E "^test |test result|panicked|splits [248]" "$OUT/test-$t.log" | head -30
done
if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== memcheck cuda_linear cluster_split_k"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear" --test-threads=1 \
    cluster_split_k 2>&1 | tail -n 6 | tee "$OUT/memcheck.log" || status=1
fi
echo "== timeline"
timeout 120 "$BIN/gemm_trace" ${TRACE:-decode:1x4096x4096 decode:16x4096x4096 decode:1x14336x4096 decode:1x4096x14336 decode:1x8192x28672} 2>&1 | tee "$OUT/trace.txt"
echo "== bench"
shapes=""
for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do
  for m in ${MS:-1 16}; do shapes="$shapes --shape ${m}x$kn"; done
done
for dt in ${DTYPES:-f16}; do
  LOWBIT_BENCH_SPLITS=${SPLITS:-1} timeout 300 "$BIN/lowbit" bench --device cuda --op linear --dtype "$dt" $shapes --json \
    >> "$OUT/bench-decode.jsonl" 2> "$OUT/bench-$dt.err" || status=1
done
python3 - "$OUT/bench-decode.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["dtype"], r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"].startswith("cublas_")}
for r in rows:
    if r["impl"].startswith("cublas_"): continue
    b = base.get((r["dtype"], r["M"], r["K"], r["N"]))
    print(f'{r["dtype"]} M={r["M"]:<3} {r["K"]}x{r["N"]:<6} {r["impl"]:24} {r["us"]:8.2f} us  x{b / r["us"]:.2f}' if b else r)
PY
exit $status
