"""Where a kernel's warps wait, from the Nsight Compute source page that scripts/ncu-profile writes
(src_bwd.csv: one row per SASS line with its stall samples by reason):

    python3 scripts/ncu_stalls.py src_bwd.csv [--lines 25]

Prints the samples by stall reason, by opcode, by how often a line ran (lines run once per warp are
a lane's set-up and fold; the walk's lines run once per turn), and the lines with the most samples.
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter, defaultdict

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def main(path: str, n_lines: int) -> None:
    with open(path) as f:
        rows = list(csv.reader(f))
    at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header, data = rows[at], [r for r in rows[at + 1:] if r and r[0].startswith("0x")]
    col = {name: i for i, name in enumerate(header)}
    reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    if rows[0] and rows[0][0] == "Kernel Name":
        print(rows[0][1][:200])
    total = sum(_int(r[col[SAMPLES]]) for r in data) or 1
    print(f"{total} samples, {sum(_int(r[col[EXECUTED]]) for r in data)} warp instructions")

    by_reason = Counter({c: sum(_int(r[col[c]]) for r in data) for c in reasons})
    by_op, op_reasons, by_runs = Counter(), defaultdict(Counter), Counter()
    for r in data:
        source = r[col["Source"]].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", source).split()[0] if source else "?"
        n = _int(r[col[SAMPLES]])
        by_op[op] += n
        by_runs[_int(r[col[EXECUTED]])] += n
        for c in reasons:
            op_reasons[op][c] += _int(r[col[c]])

    print("by reason:")
    for c, n in by_reason.most_common():
        if n:
            print(f"  {c[6:]:22s} {n:7d} {100 * n / total:5.1f} %")
    print("by opcode (top reasons):")
    for op, n in by_op.most_common(15):
        top = ", ".join(f"{c[6:]} {m}" for c, m in op_reasons[op].most_common(3) if m)
        print(f"  {op:26s} {n:7d} {100 * n / total:5.1f} %   {top}")
    print("by executions per line (warp instructions executed by that line):")
    for runs, n in by_runs.most_common(8):
        print(f"  {runs:9d} {n:7d} {100 * n / total:5.1f} %")
    print("lines:")
    for r in sorted(data, key=lambda r: -_int(r[col[SAMPLES]]))[:n_lines]:
        n = _int(r[col[SAMPLES]])
        top = ", ".join(f"{c[6:]} {r[col[c]]}" for c in reasons if _int(r[col[c]]) >= 0.2 * n)
        print(f"  {r[0][-6:]} {n:6d} {r[col[EXECUTED]]:>8s}  {r[col['Source']].strip()[:60]:60s} {top}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--lines", type=int, default=25)
    args = ap.parse_args()
    main(args.path, args.lines)
