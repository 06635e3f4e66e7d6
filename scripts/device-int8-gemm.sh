#!/usr/bin/env bash
# The int8 layout's device run (issue #7's int8 weights, #5's W8A16): the GEMM, decode, QuantLinear and convolution
# GPU tests, memcheck on the int8-layout tests (SKIP_TESTS=1 skips these), then (SKIP_BENCH=1 skips) `lowbit bench
# --op conv` with int8 and int4 weights and `lowbit bench --op linear --wbits 8` at M in $W8_MS (default
# 1 16 64 256 1024), the two-int4-plane kernels (`lowbit_*_planes`) beside QuantLinear's.
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear_gemm cuda_conv cuda_linear quant_linear" bash
# scripts/prepare-devbin.sh` from a clean, committed tree; carry .devbin. Writes to $OUT: test-*.log, memcheck.log,
# bench-conv.jsonl, bench-linear-w8.jsonl.
set -uo pipefail
source "$(dirname "$0")/device-prologue.sh"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== cuda_linear_gemm tests"
  timeout 200 $BIN/tests/cuda_linear_gemm --test-threads=2 2>&1 | grep -E "^test |result|panicked|skipped" | cut -c1-300 | tee $OUT/test-gemm.log
  echo "== cuda_linear int8_layout, quant_linear"
  timeout 120 $BIN/tests/cuda_linear --test-threads=1 int8_layout 2>&1 | grep -E "^test |result|panicked|skipped" | cut -c1-300 | tee $OUT/test-decode.log
  timeout 150 $BIN/tests/quant_linear --test-threads=2 2>&1 | grep -E "^test |result|panicked|skipped" | cut -c1-300 | tee $OUT/test-quant-linear.log
  echo "== cuda_conv tests"
  timeout 150 $BIN/tests/cuda_conv --test-threads=4 2>&1 | grep -E "^test |result|panicked" | cut -c1-300 | tee $OUT/test-conv.log
  echo "== memcheck"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/tests/cuda_linear_gemm --test-threads=1 \
    int8_layout 2>&1 | tail -n 3 | tee $OUT/memcheck.log
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/tests/cuda_conv --test-threads=1 hopper \
    2>&1 | tail -n 3 | tee -a $OUT/memcheck.log
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/tests/cuda_linear --test-threads=1 int8_layout \
    2>&1 | tail -n 3 | tee -a $OUT/memcheck.log
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
if [ "${SKIP_CONV:-0}" != 1 ]; then
echo "== bench conv int8, int4 (f16)"
timeout 120 $BIN/lowbit bench --op conv --device cuda --json --wbits 8 --dtype f16 > $OUT/bench-conv.jsonl 2>$OUT/bench-conv.err || tail -3 $OUT/bench-conv.err
timeout 100 $BIN/lowbit bench --op conv --device cuda --json --wbits 4 --dtype f16 >> $OUT/bench-conv.jsonl 2>>$OUT/bench-conv.err || tail -3 $OUT/bench-conv.err
python3 -c '
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows: print(r.get("conv"), r["impl"], r["dtype"], r.get("wbits"), round(r["us"],1))' $OUT/bench-conv.jsonl
fi
echo "== bench linear --wbits 8"
shapes=""
for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do
  for m in ${W8_MS:-1 16 64 256 1024}; do shapes="$shapes --shape ${m}x${kn}"; done
done
timeout 400 $BIN/lowbit bench --device cuda --op linear --wbits 8 --dtype f16 --json $shapes \
  --dispatch $OUT/dispatch-w8.json > $OUT/bench-linear-w8.jsonl \
  2> $OUT/bench-w8.err || tail -n 5 $OUT/bench-w8.err
python3 - $OUT/bench-linear-w8.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"].startswith("cublas")}
for r in rows:
    b = base.get((r["M"], r["K"], r["N"]))
    print(f'{r["M"]:5d} {r["K"]:6d} {r["N"]:6d} {r["impl"]:24s} {r["us"]:9.1f} us  x{b / r["us"]:.2f}')
PY
