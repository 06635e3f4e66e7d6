#!/usr/bin/env bash
# Stop 54, call 6 (binaries of the tip in .devbin-g; BUILT names the commit): issue #5's twelve large-M points
# (M = 256, 1024, 4096 x the four anchor shapes, f16) in ROUNDS separate processes, each `lowbit bench` timing
# QuantLinear, every W4 kernel and cuBLAS / cuBLASLt in turn and under sustained load (field `round`). Prints each
# point's median ratio to the faster baseline over the rounds, in turn and sustained.
set -u
BIN=${BIN:-.devbin-g}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lc}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
J="$OUT/bench-large-m.jsonl"
: > "$J"
shapes=""
for kn in 4096x4096 4096x14336 14336x4096 8192x28672; do
  for m in 256 1024 4096; do shapes="$shapes --shape ${m}x${kn}"; done
done
T0=$(date +%s)
for r in $(seq 1 "${ROUNDS:-4}"); do
  s=$(date +%s)
  [ $(( s - T0 )) -gt "${BUDGET_S:-420}" ] && break
  timeout 200 "$BIN/lowbit" bench --device cuda --op linear --dtype f16 --json $shapes \
    | sed "s/}\$/,\"round\":$r}/" >> "$J"
  echo "round $r: $(( $(date +%s) - s )) s"
done
python3 - "$J" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
points = sorted({(x["M"], x["K"], x["N"]) for x in rows})
for p in points:
    line = f"M={p[0]:5d} K={p[1]:6d} N={p[2]:6d}"
    for sus in ("", "_sustained"):
        ratios = []
        for r in sorted({x["round"] for x in rows}):
            rr = {x["impl"]: x["us"] for x in rows if x["round"] == r and (x["M"], x["K"], x["N"]) == p}
            base = min(rr.get("cublas_fp16" + sus, 1e9), rr.get("cublaslt_fp16" + sus, 1e9))
            if "lowbit" + sus in rr:
                ratios.append(base / rr["lowbit" + sus])
        if ratios:
            line += f"  {sus.strip('_') or 'in turn'} x{st.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)})"
    print(line)
PY
