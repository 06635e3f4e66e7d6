#!/usr/bin/env python3
"""Summarises `lowbit bench --op linear --json` records: per (M, K, N, dtype), each lowbit implementation's time and
its ratio to the faster of cuBLAS and cuBLASLt in the same run (bf16 rows without a bf16 baseline use the f16 one);
`_sustained` records (QuantLinear alone under sustained load) against the baselines' own `_sustained` records.

    python3 scripts/linear-ratios.py bench/results/<run>.jsonl
"""
import collections
import json
import sys


def main(path):
    runs = collections.defaultdict(dict)
    for line in open(path):
        r = json.loads(line)
        runs[(r["M"], r["K"], r["N"], r["dtype"])][r["impl"]] = r["us"]

    def baseline(key, sustained=False):
        v = runs.get(key, {})
        return min(
            (us for impl, us in v.items() if impl.startswith("cublas") and impl.endswith("_sustained") == sustained),
            default=None,
        )

    for key, v in sorted(runs.items()):
        m, k, n, dtype = key
        base = baseline(key) or baseline((m, k, n, "f16"))
        hot = baseline(key, True) or baseline((m, k, n, "f16"), True)

        def ratio(impl, us):
            b = hot if impl.endswith("_sustained") else base
            return f"({b / us:.2f})" if b else ""

        cells = " ".join(
            f"{impl.replace('lowbit', 'lb')}={us:.1f}{ratio(impl, us)}"
            for impl, us in v.items()
            if impl.startswith("lowbit")
        )
        print(f"M={m} {k}x{n} {dtype}: {cells} base={base:.1f}" if base else f"M={m} {k}x{n} {dtype}: {cells}")


if __name__ == "__main__":
    main(sys.argv[1])
