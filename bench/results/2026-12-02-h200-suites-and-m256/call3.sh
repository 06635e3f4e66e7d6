#!/usr/bin/env bash
# Call 3 (binaries of cbe95ce in .devbin-m): issue #5's one open point, f16 4096² at M = 256, in ROUNDS separate
# processes (the first on a cold kernel cache), each `lowbit bench` timing QuantLinear, every W4 kernel and cuBLAS /
# cuBLASLt in turn and under sustained load. Prints each round's ratio to the faster baseline.
set -u
BIN=${BIN:-.devbin-m}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lc}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
J="$OUT/bench-m256.jsonl"
: > "$J"
for r in $(seq 1 "${ROUNDS:-8}"); do
  s=$(date +%s)
  timeout 120 "$BIN/lowbit" bench --device cuda --op linear --dtype f16 --json --shape 256x4096x4096 \
    | sed "s/}\$/,\"round\":$r}/" >> "$J"
  echo "round $r: $(( $(date +%s) - s )) s"
done
python3 - "$J" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for sus in ("", "_sustained"):
    ratios = []
    for r in sorted({x["round"] for x in rows}):
        rr = {x["impl"]: x["us"] for x in rows if x["round"] == r}
        base = min(rr.get("cublas_fp16" + sus, 1e9), rr.get("cublaslt_fp16" + sus, 1e9))
        ours = rr["lowbit" + sus]
        ratios.append(base / ours)
        print(f"round {r}{sus or ' in turn'}: lowbit {ours:6.2f} us, baseline {base:6.2f} us, x{base / ours:.3f}")
    print(f"median{sus or ' in turn'}: x{st.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
PY
