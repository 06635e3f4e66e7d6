#!/usr/bin/env bash
# Stop 47, call 1 (8e8c10c): X BY LOADS in the 64-token K-split tile. The K-split and strided-rows tests; gemm_trace
# A/B (--x-loads off/on, in turn) on the 4096-wide layers at M = 48-128; QuantLinear at M = 48-128, f16 and bf16;
# memcheck on the strided-rows test (x loaded in place by the producer, gaps between the rows).
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 $B/tests/cuda_linear_gemm --test-threads=2 k_split_tile_over_whole strided_rows > $OUT/test-gemm.log 2>&1
echo "tests rc=$? ($(el) s)"; grep -E "test result|^test |panicked" $OUT/test-gemm.log | cut -c1-400 | head
for cfg in 64x4096x4096 128x4096x4096 48x4096x4096 64x4096x14336 64x14336x4096; do
  for xl in off on off on; do
    timeout 40 $B/gemm_trace $cfg --ksplit --rotate-io --x-loads $xl > /tmp/t.txt 2>&1
    echo "x-loads $xl: $(grep -E '^== ' /tmp/t.txt | cut -c1-60)"
    grep -E "^  (mainloop|epilogue|wait first) " /tmp/t.txt
    { echo "# --x-loads $xl"; cat /tmp/t.txt; } >> $OUT/trace.txt
  done
done
echo "traces ($(el) s)"
shapes=""
for s in 48x4096x4096 64x4096x4096 96x4096x4096 128x4096x4096 64x4096x14336 64x14336x4096 128x14336x4096; do
  shapes="$shapes --shape $s"
done
for dt in f16 bf16; do
  timeout 150 $B/lowbit bench --device cuda --op linear --dtype $dt --json $shapes >> $OUT/bench.jsonl 2> $OUT/bench-$dt.err
  echo "bench $dt rc=$? ($(el) s)"; tail -c 300 $OUT/bench-$dt.err
done
python3 $B/linear-ratios.py $OUT/bench.jsonl | sed -E 's/lb_dequant_cublas=[^ ]+ //; s/lb_decode=[^ ]+ //' | cut -c1-170
left=$(( 570 - $(el) )); echo "== memcheck (${left} s left)"
if command -v compute-sanitizer >/dev/null && [ $left -gt 30 ]; then
  timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda_linear_gemm --test-threads=1 \
    strided_rows > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -n 4 $OUT/memcheck.log
fi
