#!/usr/bin/env bash
# CUDA W8A8 on the device machine in one call: the GPU tests (tests/cuda_w8a8: quantizer bit for bit, both GEMM
# kernels against the f64 reference, exact modes, guard words), then `lowbit bench --op w8a8` (lowbit, lowbit_gemm,
# lowbit_mma, lowbit_smoothquant, cuBLAS fp16, cuBLASLt int8 on the four target shapes x M in {1024, 4096}) with a
# table of ratios to cuBLAS fp16 and cuBLASLt int8, then compute-sanitizer memcheck on the small exact cases, then
# Nsight Compute on one GEMM launch.
# Binaries: `DEVBIN=.devbin-w8a8 TESTS=cuda_w8a8 bash scripts/prepare-devbin.sh` (from a clean tree when the JSON is
# to be committed). Writes under $OUT: device.log (everything), test.log, memcheck.log, bench-w8a8.jsonl, bench.err,
# ncu.txt (Nsight Compute sections of one GEMM launch).
# Knobs: DTYPES (default "f16"), SHAPES ("--shape MxKxN ..."), SKIP_TESTS=1, SANITIZE=0, PROFILE=0 (no ncu),
# TEST_TIMEOUT (s, 100).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.devbin-w8a8}
DEST=${OUT:-/tmp/lowbit-out}
mkdir -p "$DEST"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
export PATH=$PATH:/usr/local/cuda/bin
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}

main() {
  local status=0 start
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
  if [ "${SKIP_TESTS:-0}" != 1 ]; then
    echo "== tests/cuda_w8a8"
    start=$(date +%s)
    # (scheme_accuracy reads the fixture by its build-time path and needs no GPU: it runs in CI.)
    timeout "${TEST_TIMEOUT:-100}" "$BIN/tests/cuda_w8a8" --test-threads=1 --nocapture --skip scheme_accuracy \
      > "$DEST/test.log" 2>&1 || status=1
    grep -E "^test |panicked|FAILED|test result|skipped" "$DEST/test.log"
    echo "tests took $(( $(date +%s) - start )) s"
  fi
  echo "== bench --op w8a8"
  local J="$DEST/bench-w8a8.jsonl"
  : > "$J"
  for dt in ${DTYPES:-f16}; do
    timeout 130 "$BIN/lowbit" bench --device cuda --op w8a8 --dtype "$dt" --json ${SHAPES:-} >> "$J" 2>> "$DEST/bench.err" \
      || { status=1; tail -n 5 "$DEST/bench.err"; }
  done
  python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
key = lambda r: (r["dtype"], r["M"], r["K"], r["N"])
base = {}
for r in rows:
    if r["impl"].startswith("cublas_"): base.setdefault(key(r), {})["fp"] = r["us"]
    if r["impl"] == "cublaslt_int8": base.setdefault(key(r), {})["i8"] = r["us"]
print(f"{'dtype':>5} {'M':>5} {'K':>6} {'N':>6} {'impl':<19} {'us':>9} {'TOPS':>6} {'x cuBLAS':>8} {'x LtInt8':>8}")
for r in sorted(rows, key=lambda r: (key(r), r["impl"])):
    b = base.get(key(r), {})
    tops = 2 * r["M"] * r["K"] * r["N"] / r["us"] / 1e6
    f = lambda k: f"{b[k] / r['us']:8.2f}" if k in b else "       -"
    print(f"{r['dtype']:>5} {r['M']:>5} {r['K']:>6} {r['N']:>6} {r['impl']:<19} {r['us']:>9.1f} {tops:>6.0f} {f('fp')} {f('i8')}")
PY
  if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck (exact modes: every kernel, partial tiles, K = 3884)"
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_w8a8" --test-threads=1 \
      exact_integer_mode_is_bit_exact > "$DEST/memcheck.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|test result|Invalid|out of bounds" "$DEST/memcheck.log" | head -20
  fi
  if [ "${PROFILE:-1}" = 1 ] && command -v ncu >/dev/null; then
    echo "== ncu: the first GEMM launch (default kernel) at 4096 x 4096 x 4096, f16, blocks of 128"
    timeout 90 ncu --kernel-name regex:"w8a8_(gemm|wgmma)" --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
      "$BIN/lowbit" bench --device cuda --op w8a8 --shape 4096x4096x4096 --json > "$DEST/ncu.txt" 2>&1 || status=1
    grep -E "Duration|Throughput|Busy|Stall|Eligible|Issued|Registers|Achieved|Hit Rate|Bandwidth" "$DEST/ncu.txt" | head -40
  fi
  echo "device-w8a8: status $status"
  return $status
}
main 2>&1 | tee "$DEST/device.log"
exit "${PIPESTATUS[0]}"
