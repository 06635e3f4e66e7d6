#!/usr/bin/env bash
# A/B timing of GEMM settings on the device, in turn: for each round, each shape, each setting, one gemm_trace
# process (`--rotate-io`). A setting is `DEFINES|ARGS`: LOWBIT_GEMM_DEFINES (experiment defines) and extra gemm_trace
# arguments, either may be empty. Prints one line per run and appends every full trace to $OUT/trace.txt.
#   scripts/trace-in-turn.sh BIN 2 "64x4096x4096 --ksplit;256x4096x4096" "|" "LB_EXP_X=1|" "|--look-ksplit 3"
# Stops starting runs after $BUDGET_S seconds (default 480), inside the device tool's 600 s per call.
set -u
BIN=$1 ROUNDS=$2 SHAPES=$3
shift 3
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lc}
T0=$(date +%s)
IFS=';' read -ra configs <<< "$SHAPES"
for round in $(seq "$ROUNDS"); do
  for cfg in "${configs[@]}"; do
    for setting in "$@"; do
      [ $(( $(date +%s) - T0 )) -gt "${BUDGET_S:-480}" ] && { echo "(budget spent)"; exit 0; }
      defines=${setting%%|*} args=${setting#*|}
      # shellcheck disable=SC2086  # cfg and args are word lists
      LOWBIT_GEMM_DEFINES="$defines" timeout 150 "$BIN/gemm_trace" $cfg --rotate-io $args > /tmp/t.txt 2>&1
      line=$(grep -E '^== ' /tmp/t.txt | cut -c1-70) loop=$(grep -E '^  mainloop ' /tmp/t.txt | cut -c16-70)
      echo "[${setting}] $line | mainloop $loop"
      { echo "# LOWBIT_GEMM_DEFINES='$defines' $cfg $args"; cat /tmp/t.txt; } >> "$OUT/trace.txt"
    done
  done
  echo "(round $round: $(( $(date +%s) - T0 )) s)"
done
