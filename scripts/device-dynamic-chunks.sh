#!/usr/bin/env bash
# The decode kernel's dynamic chunks: the decode GPU tests (cuda_linear, quant_linear, cuda_conv), memcheck on
# `dynamic_chunks`, the per-CTA timeline of 8192 x 28672 at M=1 with the static partition and with chunks
# (examples/gemm_trace), then `lowbit bench --op linear` on the wide layer at M in MS with each chunk size of CHUNKS
# forced beside the default (`lowbit_ch0` is the static partition) and stream-K forced on the two layers that
# default to cluster split-K (`lowbit_k1`: splits 1, default chunks).
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear quant_linear cuda_conv" bash scripts/prepare-devbin.sh` plus
# `cargo build --release -p lowbit --example gemm_trace && cp target/release/examples/gemm_trace .devbin/`.
# Writes to $OUT: tests.log, trace.txt, bench-chunks.jsonl, bench-split.jsonl.
set -uo pipefail
source "$(dirname "$0")/device-prologue.sh"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  {
    for t in ${TESTS:-cuda_linear quant_linear cuda_conv}; do
      timeout 240 "$BIN/tests/$t" --test-threads=4 2>&1 | grep -E "^test |result|panicked" | cut -c1-400
    done
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/cuda_linear" --test-threads=1 \
      dynamic_chunks 2>&1 | tail -n 3
  } > "$OUT/tests.log" 2>&1
  cat "$OUT/tests.log"
fi
echo "== timeline"
for c in 0 ${TRACE_CHUNKS:-2 4}; do
  timeout 100 "$BIN/gemm_trace" --decode-chunk "$c" decode:1x8192x28672 2>&1 |
    tee -a "$OUT/trace.txt" | grep -v "^  entry\|wait first"
done
echo "== bench"
shapes=""
for m in ${MS:-1 4 16}; do shapes="$shapes --shape ${m}x8192x28672"; done
LOWBIT_BENCH_CHUNKS=${CHUNKS:-0,1,2,4,8,16} timeout 300 "$BIN/lowbit" bench --device cuda --op linear --dtype f16 \
  --json $shapes > "$OUT/bench-chunks.jsonl" 2> "$OUT/bench.err" || tail -n 5 "$OUT/bench.err"
shapes=""
for kn in 4096x14336 14336x4096 4096x4096; do for m in 1 16; do shapes="$shapes --shape ${m}x$kn"; done; done
LOWBIT_BENCH_SPLITS=1 timeout 200 "$BIN/lowbit" bench --device cuda --op linear --dtype f16 --json $shapes \
  > "$OUT/bench-split.jsonl" 2>> "$OUT/bench.err" || tail -n 5 "$OUT/bench.err"
python3 - "$OUT/bench-chunks.jsonl" "$OUT/bench-split.jsonl" <<'PY'
import json, sys
for f in sys.argv[1:]:
    rows = [json.loads(l) for l in open(f) if l.strip()]
    base = {(r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"] == "cublas_fp16"}
    for r in rows:
        b = base.get((r["M"], r["K"], r["N"]))
        print(f'{r["M"]:5d} {r["K"]:6d} {r["N"]:6d} {r["impl"]:24s} {r["us"]:9.1f} us  x{b / r["us"]:.2f}')
PY
