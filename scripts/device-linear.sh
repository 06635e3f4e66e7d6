#!/usr/bin/env bash
# CUDA W4A16 linear on the device machine, in one go: the GPU test binary (tests/cuda_linear: accuracy against the
# f64 reference, batch invariance, determinism, guard words), then `lowbit bench --op linear` (lowbit,
# lowbit_graph and cuBLAS on the four target shapes x M in {1, 4, 16, 64}), then a table of speedups over cuBLAS.
# Expects binaries prepared by `TESTS=cuda_linear scripts/prepare-devbin.sh` in $BIN (default .devbin); writes
# logs and JSON lines under $OUT. Knobs: DTYPES (default "f16"), VARIANTS=1 (also time the grid at one and two CTAs
# per SM), CTAS=66,88 / STAGES=3,4 (also time exactly these grid sizes / pipeline depths, f16, on EXTRA_SHAPES,
# default 1x4096x4096 and 16x4096x4096; rows prefixed "extra_"),
# BASELINE=<dir> (a previous build's `lowbit` in that dir, benched in the same run: "before" rows, impl prefixed
# "base_"; BASELINE_DTYPES limits it, default all), SKIP_TESTS=1, TEST_TIMEOUT (s, default 300), SANITIZE=1
# (compute-sanitizer memcheck on the exact-integer test).
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/lowbit-out}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
export LOWBIT_BENCH_VARIANTS=${VARIANTS:-0}
mkdir -p "$OUT"
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv 2>&1 | tee "$OUT/gpu.txt"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests/cuda_linear"
  start=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" "$BIN/tests/cuda_linear" --test-threads=1 --nocapture 2>&1 \
    | tee "$OUT/test-cuda_linear.log" | grep -v "^ok " || status=1
  grep -c "^ok " "$OUT/test-cuda_linear.log" | sed 's/^/cases passed: /'
  echo "tests took $(( $(date +%s) - start )) s"
fi
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck"
  timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear" --test-threads=1 exact_integer \
    2>&1 | tail -n 20 | tee "$OUT/memcheck.log" || status=1
fi

echo "== bench --op linear"
J="$OUT/bench-linear.jsonl"
: > "$J"
for dt in ${DTYPES:-f16}; do
  "$BIN/lowbit" bench --device cuda --op linear --dtype "$dt" --json ${SHAPES:-} >> "$J" 2> "$OUT/bench-$dt.err" \
    || { status=1; tail -n 5 "$OUT/bench-$dt.err"; }
  if [ -n "${BASELINE:-}" ] && [[ " ${BASELINE_DTYPES:-$dt} " == *" $dt "* ]]; then
    echo "== baseline $BASELINE ($dt)"
    "$BASELINE/lowbit" bench --device cuda --op linear --dtype "$dt" --json ${SHAPES:-} 2> "$OUT/base-$dt.err" \
      | sed 's/"impl":"/"impl":"base_/' >> "$J" || { status=1; tail -n 5 "$OUT/base-$dt.err"; }
  fi
done
if [ -n "${CTAS:-}${STAGES:-}" ]; then
  echo "== grid sizes ${CTAS:-default}, pipeline depths ${STAGES:-default}"
  shapes=""
  for s in ${EXTRA_SHAPES:-1x4096x4096 16x4096x4096}; do shapes="$shapes --shape $s"; done
  LOWBIT_BENCH_CTAS=${CTAS:-} LOWBIT_BENCH_STAGES=${STAGES:-} "$BIN/lowbit" bench --device cuda --op linear \
    --dtype f16 --json $shapes 2> "$OUT/extra.err" \
    | sed 's/"impl":"lowbit/"impl":"extra_lowbit/; s/"impl":"cublas/"impl":"extra_cublas/' >> "$J" \
    || { status=1; tail -n 5 "$OUT/extra.err"; }
fi
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
rows.sort(key=lambda r: (r["dtype"], r["K"] * r["N"], r["K"], r["M"]))
base = {(r["dtype"], r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"].startswith("cublas")}
print(f"{'dtype':>5} {'M':>3} {'K':>6} {'N':>6} {'impl':<14} {'us':>8} {'TB/s':>6} {'x cuBLAS':>8}")
for r in rows:
    b = base.get((r["dtype"], r["M"], r["K"], r["N"]))
    print(f"{r['dtype']:>5} {r['M']:>3} {r['K']:>6} {r['N']:>6} {r['impl']:<14} {r['us']:>8.1f} "
          f"{r['bytes'] / r['us'] / 1e6:>6.2f} {(b / r['us']) if b else float('nan'):>8.2f}")
PY
if [ "${PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "== ncu (M=1, 8192 x 28672, f16)"
  timeout "${PROFILE_TIMEOUT:-150}" ncu --kernel-name w4a16_linear --launch-skip 40 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    "$BIN/lowbit" bench --device cuda --op linear --shape 1x8192x28672 --json > "$OUT/ncu.txt" 2>&1 || status=1
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issued Ipc|Executed Instructions|Issue Slots|Eligible|No Eligible|Stall|Warp Cycles|Achieved Occupancy|Registers|Block Limit|One or More|Waves" \
    "$OUT/ncu.txt" | head -40
fi
echo "device-linear: status $status"
exit $status
