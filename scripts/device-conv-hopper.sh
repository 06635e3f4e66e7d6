#!/usr/bin/env bash
# The Hopper convolution path's device run (the call that made bench/results/2026-11-21-h200-conv-hopper.jsonl):
# the cuda_conv GPU tests, `lowbit bench --op conv` on the four anchor convolutions (int4 with f16 and f32 input,
# then int8; f16 int4 also times the mma.sync kernel as `lowbit_mmasync`), compute-sanitizer memcheck on the Hopper,
# every-tile and MNN-bytes tests, and ncu kernel durations (pack vs GEMM) per case.
# With cuda_conv_int8 among the binaries it also runs that test (ConvInt8, both routes) under memcheck.
# Binaries: `DEVBIN=.devbin TESTS="cuda_conv cuda_conv_int8" bash scripts/prepare-devbin.sh` from a clean, committed
# tree; carry .devbin.
# Writes to $OUT: test-conv.log, bench-conv.jsonl, bench-conv.err (cuDNN's chosen algorithm per case), memcheck.log.
set -uo pipefail
source "$(dirname "$0")/device-prologue.sh"
echo "== cuda_conv tests"
timeout 150 $BIN/tests/cuda_conv --test-threads=4 2>&1 | grep -E "^test |result|panicked|hopper=true" | cut -c1-250 | tee $OUT/test-conv.log
if [ -x $BIN/tests/cuda_conv_int8 ]; then
  echo "== cuda_conv_int8 tests (memcheck)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/tests/cuda_conv_int8 --test-threads=1 2>&1 |
    grep -E "^test |result|panicked|ERROR SUMMARY" | tee $OUT/test-conv-int8.log
fi
echo "== bench conv int4 f16 f32"
timeout 150 $BIN/lowbit bench --op conv --device cuda --json --wbits 4 --dtype f16 --dtype f32 > $OUT/bench-conv.jsonl 2>$OUT/bench-conv.err || tail -3 $OUT/bench-conv.err
echo "== bench conv int8"
timeout 100 $BIN/lowbit bench --op conv --device cuda --json --wbits 8 >> $OUT/bench-conv.jsonl 2>>$OUT/bench-conv.err || tail -3 $OUT/bench-conv.err
python3 -c '
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows: print(r.get("conv"), r["impl"], r["dtype"], r.get("wbits"), round(r["us"],1))' $OUT/bench-conv.jsonl
echo "== memcheck"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/tests/cuda_conv --test-threads=1 hopper every_tile mnn_int4 2>&1 | tail -n 3 | tee $OUT/memcheck.log

NCU="/usr/local/cuda/bin/ncu --cache-control none --clock-control none"
for c in 8x1024x14x14,k1s1p0,co2048 8x256x56x56,k3s1p1 1x256x56x56,k3s1p1 32x512x28x28,k3s1p1; do
  echo "== ncu $c"
  timeout 100 $NCU -k regex:"w4a16_gemm|conv_pack" --launch-skip 6 --launch-count 2 --metrics gpu__time_duration.sum \
    $BIN/lowbit bench --op conv --device cuda --wbits 4 --dtype f16 --conv $c 2>&1 | grep -E "\(|duration" | cut -c1-120
done
