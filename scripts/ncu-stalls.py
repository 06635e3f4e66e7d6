#!/usr/bin/env python3
"""Summarises an Nsight Compute source export (`ncu -i X.ncu-rep --page source --csv --print-source sass`, gzipped or
not): warp stall samples by reason and by opcode, instructions executed by opcode, the top instructions by samples,
and the instructions of the loop body that ran exactly `--per` times (one decode stage per warp), by opcode.

    python3 scripts/ncu-stalls.py decode-m16-sass.csv.gz [--top 12] [--per 57344]
"""
import argparse
import collections
import csv
import gzip


def opcode(sass):
    words = sass.split()
    op = words[1] if words and words[0].startswith("@") else (words[0] if words else "?")
    return op


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--per", type=int, default=0, help="executions of the loop body's instructions")
    a = p.parse_args()
    opener = gzip.open if a.csv.endswith(".gz") else open
    rows = list(csv.reader(opener(a.csv, "rt")))
    hdr, data = rows[1], rows[2:]
    samples, executed = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    by_reason, by_op, exec_op, body = (collections.Counter() for _ in range(4))
    top = []
    for r in data:
        if not r[1].strip() or not r[samples].isdigit():
            continue
        n, op = int(r[samples]), opcode(r[1].strip())
        by_op[op.split(".")[0]] += n
        exec_op[op.split(".")[0]] += int(r[executed] or 0)
        if a.per and int(r[executed] or 0) == a.per:
            body[op] += 1
        stalls = {hdr[i][6:]: int(r[i] or 0) for i in reasons if int(r[i] or 0)}
        by_reason.update(stalls)
        top.append((n, r[0][-5:], r[1].strip(), stalls))
    print("samples", sum(by_reason.values()), dict(by_reason.most_common()))
    print("samples by opcode", by_op.most_common(16))
    print("executed by opcode", exec_op.most_common(16))
    if a.per:
        print(f"loop body ({a.per} executions each): {sum(body.values())} instructions", body.most_common())
    for t in sorted(top, reverse=True)[: a.top]:
        print(t)


if __name__ == "__main__":
    main()
