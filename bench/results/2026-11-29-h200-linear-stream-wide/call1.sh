#!/usr/bin/env bash
# Stop 46, call 1: L2 intake per SM by load path (stream_probe l2-paths); STREAM-K on the 96- and 128-token tiles
# where tiles outnumber SMs (gemm_trace, stream on/off; lowbit bench with LOWBIT_BENCH_STREAM=1); the stream tests.
set -u
export LOWBIT_CACHE_DIR=/tmp/lc
B=.devbin-k
mkdir -p $OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
LOWBIT_PROBE=l2-paths timeout 60 $B/stream_probe > $OUT/l2-paths.txt 2>&1; echo "probe rc=$? ($(el) s)"; cat $OUT/l2-paths.txt
for cfg in "192x8192x28672 --tokens 96" "160x8192x28672 --tokens 96" "256x8192x28672 --tokens 128" \
           "192x4096x14336 --tokens 96" "256x4096x14336 --tokens 128" "256x14336x4096 --tokens 128" \
           "1024x4096x14336 --tokens 128"; do
  for st in off on; do
    timeout 40 $B/gemm_trace $cfg --stream $st >> $OUT/trace.txt 2>&1
    grep -E "^== " $OUT/trace.txt | tail -1
    grep -E "^  (mainloop|epilogue|wait first|items/CTA) " $OUT/trace.txt | tail -4
  done
done
echo "traces ($(el) s)"
LOWBIT_BENCH_STREAM=1 LOWBIT_BENCH_SUSTAINED=0 timeout 200 $B/lowbit bench --device cuda --op linear --dtype f16 --json \
  --shape 160x8192x28672 --shape 192x8192x28672 --shape 256x8192x28672 --shape 192x4096x14336 --shape 256x4096x14336 \
  --shape 256x14336x4096 > $OUT/stream.jsonl 2> $OUT/bench.err
echo "bench rc=$? ($(el) s)"; tail -c 300 $OUT/bench.err
python3 $B/linear-ratios.py $OUT/stream.jsonl
left=$(( 560 - $(el) )); echo "== tests (${left} s left)"
timeout $left $B/tests/cuda_linear_gemm --test-threads=4 stream_k the_96_token_tile f16_g128_zeros_token_tails hybrid back_to_back > $OUT/test-gemm.log 2>&1
echo rc=$?; grep -E "test result|^test |panicked" $OUT/test-gemm.log | head -20
