#!/usr/bin/env bash
# The W4A16 GEMM's split-K global step (cluster groups): the GEMM and QuantLinear GPU tests, memcheck on the
# cluster-groups test (SKIP_TESTS=1 skips these), the per-CTA timeline of the two shapes that take cluster groups
# (examples/gemm_trace), then `lowbit bench --op linear` where they apply (M = 64 and 256 on 14336 x 4096 and
# 4096 x 14336) with the forced GEMM beside QuantLinear.
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear_gemm quant_linear" bash scripts/prepare-devbin.sh` plus
# `cargo build --release -p lowbit --example gemm_trace && cp target/release/examples/gemm_trace .devbin/`.
# Writes to $OUT: tests.log, trace.txt, csv/, bench-linear.jsonl.
set -uo pipefail
source "$(dirname "$0")/device-prologue.sh"
mkdir -p "$OUT/csv"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  {
    timeout 200 "$BIN/tests/cuda_linear_gemm" --test-threads=2 2>&1 | grep -E "^test |result|panicked" | cut -c1-300
    timeout 150 "$BIN/tests/quant_linear" --test-threads=2 2>&1 | grep -E "^test |result|panicked" | cut -c1-300
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear_gemm" --test-threads=1 \
      split_tiles_in_several_cluster_groups 2>&1 | tail -n 3
  } > "$OUT/tests.log" 2>&1
  cat "$OUT/tests.log"
fi
echo "== timeline"
LOWBIT_TRACE_CSV="$OUT/csv" timeout 200 "$BIN/gemm_trace" 64x14336x4096 256x14336x4096 2>&1 | tee "$OUT/trace.txt" |
  grep -v "^  entry\|wait first\|exit after\|items"
echo "== bench"
shapes=""
for s in 64x14336x4096 256x14336x4096 64x4096x14336 256x4096x14336 256x4096x4096; do shapes="$shapes --shape $s"; done
timeout 300 "$BIN/lowbit" bench --device cuda --op linear --dtype f16 --json $shapes > "$OUT/bench-linear.jsonl" \
  2> "$OUT/bench.err" || tail -n 5 "$OUT/bench.err"
python3 - "$OUT/bench-linear.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"] == "cublas_fp16"}
for r in rows:
    b = base.get((r["M"], r["K"], r["N"]))
    print(f'{r["M"]:5d} {r["K"]:6d} {r["N"]:6d} {r["impl"]:24s} {r["us"]:9.1f} us  x{b / r["us"]:.2f}')
PY
