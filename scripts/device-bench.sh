#!/usr/bin/env bash
# Dequant speed on the device machine: `lowbit bench --device cuda --op dequant` for f16 and bf16 (int4 AWQ g128,
# int4 per channel, int8 per channel), JSON lines under $OUT, then a table of time ratios to the D2D copy.
# Set VARIANTS=1 to also time the other tile heights and the GPTQ / compressed-tensors kernels.
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/lowbit-out}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
export LOWBIT_BENCH_VARIANTS=${VARIANTS:-0}
mkdir -p "$OUT"
J="$OUT/bench-dequant.jsonl"
: > "$J"
status=0
run() { "$BIN/lowbit" bench --device cuda --op dequant --dtype f16 --dtype bf16 --json "$@" >> "$J" || status=1; }
run --group 128
LOWBIT_BENCH_VARIANTS=0 run --group -1
LOWBIT_BENCH_VARIANTS=0 run --wbits 8 --group -1
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["wbits"], r["group"], r["K"], r["N"], r["dtype"]): r["us"] for r in rows if r["impl"] == "memcpy"}
print(f"{'wbits':>5} {'group':>5} {'K':>6} {'N':>6} {'dtype':>5} {'impl':<12} {'us':>9} {'TB/s':>6} {'x memcpy':>8}")
for r in rows:
    key = (r["wbits"], r["group"], r["K"], r["N"], r["dtype"])
    ratio = r["us"] / base[key] if key in base else float("nan")
    print(f"{r['wbits']:>5} {r['group']:>5} {r['K']:>6} {r['N']:>6} {r['dtype']:>5} {r['impl']:<12} "
          f"{r['us']:>9.1f} {r['bytes'] / r['us'] / 1e6:>6.2f} {ratio:>8.3f}")
PY
echo "device-bench: status $status"
exit $status
