#!/usr/bin/env bash
# Issue #7's GEMV route (1x1 convolutions of 1x1 maps at batch <= 16 on the decode kernel with offsets): the convolution,
# decode, QuantLinear and GEMM GPU tests, memcheck on the new route (SKIP_TESTS=1 skips these); then (SKIP_BENCH=1
# skips) `lowbit bench --op conv` on 1x1 cases of pooled features and small maps, int4 and int8, and a decode
# check at M = 1 and 16 (the kernel's store changed: the clamp).
# Binaries: `DEVBIN=.devbin TESTS="cuda_conv cuda_linear quant_linear cuda_linear_gemm" bash
# scripts/prepare-devbin.sh` from a clean, committed tree; carry .devbin. Writes to $OUT: test-*.log, memcheck.log,
# bench-conv-gemv.jsonl, bench-decode.jsonl.
set -uo pipefail
source "$(dirname "$0")/device-prologue.sh"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== cuda_conv tests"
  timeout 200 $BIN/tests/cuda_conv --test-threads=4 2>&1 | grep -E "^test |result|panicked|note" | cut -c1-400 | tee $OUT/test-conv.log
  echo "== cuda_linear, quant_linear, cuda_linear_gemm"
  timeout 200 $BIN/tests/cuda_linear --test-threads=2 2>&1 | grep -E "^test |result|panicked|skipped" | cut -c1-300 | tee $OUT/test-decode.log
  timeout 150 $BIN/tests/quant_linear --test-threads=2 2>&1 | grep -E "^test |result|panicked|skipped" | cut -c1-300 | tee $OUT/test-quant-linear.log
  timeout 200 $BIN/tests/cuda_linear_gemm --test-threads=2 2>&1 | grep -E "^test |result|panicked|skipped" | cut -c1-300 | tee $OUT/test-gemm.log
  echo "== memcheck"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/tests/cuda_conv --test-threads=1 one_by_one \
    2>&1 | tail -n 3 | tee $OUT/memcheck.log
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
echo "== bench conv, 1x1 cases"
convs="--conv 1x2048x1x1,k1s1p0,co1000 --conv 16x2048x1x1,k1s1p0,co1000 --conv 1x512x1x1,k1s1p0,co2048"
convs="$convs --conv 1x1024x4x4,k1s1p0,co2048 --conv 1x2048x7x7,k1s1p0,co512"  # not routed: small maps
for wbits in 4 8; do
  timeout 150 $BIN/lowbit bench --op conv --device cuda --json --wbits $wbits --dtype f16 $convs \
    >> $OUT/bench-conv-gemv.jsonl 2>>$OUT/bench-conv.err || tail -3 $OUT/bench-conv.err
done
python3 -c '
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows: print(r.get("conv"), r["impl"], r["dtype"], r.get("wbits"), round(r["us"],2))' $OUT/bench-conv-gemv.jsonl
echo "== bench decode M=1,16"
timeout 150 $BIN/lowbit bench --device cuda --op linear --dtype f16 --json --shape 1x8192x28672 --shape 16x8192x28672 \
  --shape 1x4096x4096 --shape 16x4096x4096 > $OUT/bench-decode.jsonl 2> $OUT/bench-decode.err || tail -n 5 $OUT/bench-decode.err
python3 - $OUT/bench-decode.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"] == "cublas_fp16"}
for r in rows:
    b = base.get((r["M"], r["K"], r["N"]))
    print(f'{r["M"]:5d} {r["K"]:6d} {r["N"]:6d} {r["impl"]:24s} {r["us"]:9.1f} us  x{b / r["us"]:.2f}')
PY
