#!/usr/bin/env bash
# Everything the GPU work must show, in one device call: every GPU test (with memcheck on small cases), then the
# dequant and linear benchmarks in f16 and bf16, then a plot. Binaries come from `scripts/prepare-devbin.sh`
# (TESTS="cuda_dequantize cuda_linear"), carried in .devbin. Results land in $OUT (the device tool's folder):
#   device.log              every step's output
#   bench-dequant.jsonl     dequant records (lowbit, memcpy baseline)
#   bench-linear.jsonl      linear records (lowbit, lowbit_graph, cuBLAS baseline)
#   bench.svg               speed-up plot of both
# Commit the .jsonl files under bench/results/ only when the binaries were built from a clean, committed tree
# (their `source_commit` then has no "-dirty" suffix).
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:-/tmp/lowbit-results}
export BIN=${BIN:-.devbin}
export OUT=/tmp/lowbit-out
mkdir -p "$DEST" "$OUT"
main() {
  local status=0
  TESTS="cuda_dequantize cuda_linear" bash scripts/device-test.sh || status=1
  bash scripts/device-bench.sh || status=1
  SKIP_TESTS=1 DTYPES="f16 bf16" bash scripts/device-linear.sh || status=1
  cp "$OUT/bench-dequant.jsonl" "$OUT/bench-linear.jsonl" "$DEST/"
  "$BIN/lowbit" plot "$DEST/bench-dequant.jsonl" "$DEST/bench-linear.jsonl" -o "$DEST/bench.svg" --force || status=1
  echo "device-all: status $status"
  return $status
}
main 2>&1 | tee "$DEST/device.log"
exit "${PIPESTATUS[0]}"
