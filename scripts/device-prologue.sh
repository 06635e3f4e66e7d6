# Sourced by the device scripts: $OUT (created), $BIN, the kernel cache, libcudnn on the library path, and the GPU's
# name, driver and clock in $OUT/gpu.txt.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BIN=${BIN:-.devbin}
export LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-/tmp/lowbit-cache}
source "$(dirname "${BASH_SOURCE[0]}")/cudnn-env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
