#!/usr/bin/env bash
# The W4A16 prefill GEMM on the device, in one call: its GPU tests (tests/cuda_linear_gemm), a quick pass of the
# decode tests (tests/cuda_linear), compute-sanitizer memcheck on the exact-integer GEMM test, then
# `lowbit bench --op linear` at prefill sizes (M in $MS, default 64 256 1024 4096) on the four target shapes.
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear_gemm cuda_linear" scripts/prepare-devbin.sh`. Logs/JSON under $OUT.
# Knobs: DTYPES (default f16), MS, SKIP_TESTS=1.
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/lowbit-out}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>&1 | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests/cuda_linear_gemm"
  timeout 240 "$BIN/tests/cuda_linear_gemm" --test-threads=1 --nocapture 2>&1 | tee "$OUT/test-gemm.log" \
    | grep -E "^test |panicked|skipped|result|mean rel" | cut -c1-220 | tail -n 60 || status=1
  echo "== tests/cuda_linear (decode, after the DeviceW4 refactor)"
  timeout 240 "$BIN/tests/cuda_linear" --test-threads=2 2>&1 | tee "$OUT/test-decode.log" | grep -E "panicked|result" || status=1
  if command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck (GEMM, exact integers)"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear_gemm" --test-threads=1 \
      exact_integers 2>&1 | tail -n 8 | tee "$OUT/memcheck.log" || status=1
  fi
fi
echo "== bench --op linear (prefill sizes)"
J="$OUT/bench-linear.jsonl"
: > "$J"
shapes=""
for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do
  for m in ${MS:-64 256 1024 4096}; do shapes="$shapes --shape ${m}x${kn}"; done
done
for dt in ${DTYPES:-f16}; do
  timeout 300 "$BIN/lowbit" bench --device cuda --op linear --dtype "$dt" --json $shapes >> "$J" 2> "$OUT/bench-$dt.err" \
    || { status=1; tail -n 5 "$OUT/bench-$dt.err"; }
done
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["m"], r["k"], r["n"], r["dtype"]): r["us"] for r in rows if r["impl"].startswith("cublas")}
for r in rows:
    b = base.get((r["m"], r["k"], r["n"], r["dtype"]))
    print(f'{r["impl"]:14s} {r["dtype"]} M={r["m"]:5d} K={r["k"]:6d} N={r["n"]:6d} {r["us"]:9.1f} us  x{(b / r["us"]) if b else 0:5.2f}')
PY
echo "device-gemm: status $status"
exit $status
