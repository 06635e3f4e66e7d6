#!/usr/bin/env bash
# Programmatic dependent launch (the decode kernel's and the GEMM's DEPENDENT LAUNCH): the GPU tests in TESTS,
# memcheck on the back-to-back test of each binary in MEMCHECK, then `lowbit bench --op linear` at M in MS on the
# four anchor shapes, f16 and bf16 (DTYPES), with each kernel also launched without it in the same process
# (`lowbit_nopdl` for the decode kernel at M <= 64, `lowbit_gemm_nopdl` for the GEMM at M >= 64).
# Binaries: `DEVBIN=.devbin TESTS="cuda_linear quant_linear cuda_conv" bash scripts/prepare-devbin.sh`.
# Writes to $OUT: tests.log, bench-pdl.jsonl (and bench.err).
set -uo pipefail
source "$(dirname "$0")/device-prologue.sh"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  {
    for t in ${TESTS:-cuda_linear quant_linear cuda_conv}; do
      timeout 240 "$BIN/tests/$t" --test-threads=4 2>&1 | grep -E "^test |result|panicked|^ok:" | cut -c1-400
    done
    for t in ${MEMCHECK:-cuda_linear}; do
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tests/$t" --test-threads=1 \
        back_to_back 2>&1 | tail -n 3
    done
  } > "$OUT/tests.log" 2>&1
  cat "$OUT/tests.log"
fi
shapes=""
for kn in 8192x28672 4096x4096 4096x14336 14336x4096; do for m in ${MS:-1 16}; do shapes="$shapes --shape ${m}x$kn"; done; done
for d in ${DTYPES:-f16}; do
  LOWBIT_BENCH_NO_PDL=1 timeout 420 "$BIN/lowbit" bench --device cuda --op linear --dtype "$d" --json $shapes \
    >> "$OUT/bench-pdl.jsonl" 2>> "$OUT/bench.err" || tail -n 5 "$OUT/bench.err"
done
python3 - "$OUT/bench-pdl.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["dtype"], r["M"], r["K"], r["N"]): r["us"] for r in rows if r["impl"].startswith("cublas")}
for r in rows:
    if r["impl"] in ("lowbit_dequant_cublas",) or r["impl"].startswith("cublas"): continue
    b = base.get((r["dtype"], r["M"], r["K"], r["N"]))
    print(f'{r["dtype"]} {r["M"]:5d} {r["K"]:6d} {r["N"]:6d} {r["impl"]:20s} {r["us"]:8.1f} us  x{b / r["us"]:.2f}')
PY
