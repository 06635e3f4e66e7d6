#!/usr/bin/env bash
# The CUDA convolution's device run, in one call: the cuda_conv GPU tests, compute-sanitizer memcheck on the small
# cases (every tile, the direct path, bad arguments), then `lowbit bench --op conv` against cuDNN fp16 on the four
# anchor convolutions (int4 with every tile forced as variants, f16 and f32 activations; then int8).
# Binaries: `DEVBIN=.devbin-conv TESTS=cuda_conv bash scripts/prepare-devbin.sh` (build from a clean, committed tree
# when the records are to be kept), carried in .devbin-conv. libcudnn is taken from PyTorch's install.
# Writes to $OUT: device-conv.log (every step) and bench-conv.jsonl (the records).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.devbin-conv}
DEST=${OUT:-/tmp/lowbit-conv}
mkdir -p "$DEST"
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
source "$(dirname "$0")/cudnn-env.sh"

main() {
  local status=0
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv
  echo "cudnn from '${cudnn_lib}' ($(ls "${cudnn_lib:-/nonexistent}" 2>/dev/null | grep -c cudnn) files); ldconfig: $(ldconfig -p | grep -c libcudnn)"
  echo "== test cuda_conv"
  timeout 75 "$BIN/tests/cuda_conv" --test-threads=4 || status=1
  echo "== bench conv int4 (+ tile variants, f16 and f32)"
  LOWBIT_BENCH_VARIANTS=1 timeout 50 "$BIN/lowbit" bench --op conv --device cuda --json --wbits 4 \
    --dtype f16 --dtype f32 >"$DEST/bench-conv.jsonl" || status=1
  echo "== bench conv int8"
  timeout 30 "$BIN/lowbit" bench --op conv --device cuda --json --wbits 8 >>"$DEST/bench-conv.jsonl" || status=1
  cat "$DEST/bench-conv.jsonl"
  if command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck (small cases)"
    timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_conv" --test-threads=1 \
      every_tile mnn_int4 bad_arguments 2>&1 | tail -n 25 || status=1
  fi
  echo "device-conv: status $status"
  return $status
}
main 2>&1 | tee "$DEST/device-conv.log"
exit "${PIPESTATUS[0]}"
