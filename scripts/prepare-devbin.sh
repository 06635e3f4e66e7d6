#!/usr/bin/env bash
# Builds the release binaries and GPU test binaries here (no CUDA needed) and copies them into .devbin/ (git-ignored),
# ready for the device tool: run(command="bash scripts/device-test.sh; bash scripts/device-bench.sh", carry=[".devbin"]).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p lowbit-cli
DEVBIN=${DEVBIN:-.devbin}  # a git-ignored folder (.devbin*) to carry
mkdir -p "$DEVBIN/tests"
cp target/release/lowbit "$DEVBIN/"
for t in ${TESTS:-cuda_dequantize}; do
  exe=$(cargo test --release -p lowbit --test "$t" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"): print(m["executable"])' | tail -n 1)
  cp "$exe" "$DEVBIN/tests/$t"
done
ls -la "$DEVBIN" "$DEVBIN/tests"
