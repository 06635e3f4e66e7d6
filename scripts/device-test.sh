#!/usr/bin/env bash
# GPU checks on the device machine, in one go: `lowbit doctor`, the GPU test binaries (TESTS, default
# cuda_dequantize), and compute-sanitizer memcheck on the small cases. Expects the binaries prepared by
# scripts/prepare-devbin.sh in $BIN (default .devbin); writes logs under $OUT (default /tmp/lowbit-out).
# Exit status: non-zero if any step failed.
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/lowbit-out}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
mkdir -p "$OUT"
status=0
step() { echo "== $*"; }

step "GPU state"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv 2>&1 | tee "$OUT/gpu.txt"

step "lowbit doctor"
"$BIN/lowbit" doctor 2>&1 | tee "$OUT/doctor.log" || status=1

for name in ${TESTS:-cuda_dequantize}; do
  step "test $name"
  "$BIN/tests/$name" --test-threads=4 2>&1 | tee "$OUT/test-$name.log" || status=1
done

if command -v compute-sanitizer >/dev/null && [ -x "$BIN/tests/cuda_dequantize" ]; then
  step "compute-sanitizer memcheck (small cases)"
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_dequantize" --test-threads=1 \
    k_not_a_multiple act_order bad_ int8_per_channel kernel_variants 2>&1 | tail -n 30 | tee "$OUT/memcheck.log" || status=1
fi
echo "device-test: status $status"
exit $status
