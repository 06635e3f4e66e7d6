#!/usr/bin/env bash
# QuantLinear and its W4A16 kernels on the device, in one call: the GPU tests (tests/cuda_linear_gemm,
# tests/quant_linear, and tests/cuda_linear when DECODE_TESTS=1), compute-sanitizer memcheck on the exact-integer
# and back-to-back GEMM tests and the QuantLinear dispatch test, then `lowbit bench --op linear` on the four target shapes x
# M in $MS (default 1 4 16 64 256 1024 4096), writing QuantLinear's measured dispatch table to $OUT/dispatch.json.
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear_gemm quant_linear cuda_linear" scripts/prepare-devbin.sh`.
# Logs/JSON under $OUT. Knobs: DTYPES (default f16), MS, SKIP_TESTS=1, DECODE_TESTS=1, W8_MS="1 64 ..." (also
# bench 8-bit weights, f16, at those M).
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/lowbit-out}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>&1 | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests/cuda_linear_gemm"
  timeout 300 "$BIN/tests/cuda_linear_gemm" --test-threads=2 --nocapture 2>&1 | tee "$OUT/test-gemm.log" \
    | grep -E "^test |panicked|skipped|result|mean rel" | cut -c1-220 | tail -n 60 || status=1
  echo "== tests/quant_linear"
  timeout 240 "$BIN/tests/quant_linear" --test-threads=1 --nocapture 2>&1 | tee "$OUT/test-quant-linear.log" \
    | grep -E "^test |panicked|skipped|result" | cut -c1-200 || status=1
  if [ "${DECODE_TESTS:-0}" = 1 ]; then
    echo "== tests/cuda_linear (decode)"
    timeout 240 "$BIN/tests/cuda_linear" --test-threads=2 2>&1 | tee "$OUT/test-decode.log" | grep -E "panicked|result" || status=1
  fi
  if command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck (GEMM, exact integers)"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear_gemm" --test-threads=1 \
      exact_integers 2>&1 | tail -n 4 | tee "$OUT/memcheck.log" || status=1
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear_gemm" --test-threads=1 \
      back_to_back 2>&1 | tail -n 4 | tee -a "$OUT/memcheck.log" || status=1
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/quant_linear" --test-threads=1 \
      cuda_every_kernel 2>&1 | tail -n 4 | tee -a "$OUT/memcheck.log" || status=1
  fi
fi
echo "== bench --op linear"
J="$OUT/bench-linear.jsonl"
: > "$J"
shapes=""
for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do
  for m in ${MS:-1 4 16 64 256 1024 4096}; do shapes="$shapes --shape ${m}x${kn}"; done
done
for dt in ${DTYPES:-f16}; do
  timeout 400 "$BIN/lowbit" bench --device cuda --op linear --dtype "$dt" --json $shapes \
    --dispatch "$OUT/dispatch-$dt.json" >> "$J" 2> "$OUT/bench-$dt.err" || { status=1; tail -n 5 "$OUT/bench-$dt.err"; }
done
if [ -n "${W8_MS:-}" ]; then
  echo "== bench --op linear --wbits 8 (W8A16, f16)"
  shapes=""
  for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do
    for m in $W8_MS; do shapes="$shapes --shape ${m}x${kn}"; done
  done
  timeout 300 "$BIN/lowbit" bench --device cuda --op linear --wbits 8 --dtype f16 --json $shapes \
    --dispatch "$OUT/dispatch-f16.json" >> "$J" \
    2> "$OUT/bench-w8.err" || { status=1; tail -n 5 "$OUT/bench-w8.err"; }
fi
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# Records timed alone under sustained load (`_sustained`) are compared with each other only.
key = lambda r: (r["M"], r["K"], r["N"], r["dtype"], r.get("wbits"), "_sustained" in r["impl"])
base = {}
for r in rows:  # the faster of cuBLAS and cuBLASLt
    if r["impl"].replace("_sustained", "") in ("cublas_fp16", "cublas_bf16", "cublaslt_fp16", "cublaslt_bf16"):
        base[key(r)] = min(base.get(key(r), r["us"]), r["us"])
for r in rows:
    b = base.get(key(r))
    print(f'{r["impl"]:22s} {r["dtype"]} w{r.get("wbits")} M={r["M"]:5d} K={r["K"]:6d} N={r["N"]:6d} {r["us"]:9.1f} us  x{(b / r["us"]) if b else 0:5.2f}')
PY
echo "device-gemm: status $status"
exit $status
