"""Forward / backward graph-replay time against the row pipeline's depth (gpu.PREFETCH_ROWS), bf16, K = 4,
bias: python3 scripts/depth_sweep.py prog:S:C ... (the depth list comes from $DEPTHS)."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, ops  # noqa: E402
from conv1d_silu.bench import Timer  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402


def main(cases: list[str]) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, reps=20, warmup=2, graph=True)
    for case in cases:
        prog, S, C = case.split(":")
        S, C = int(S), int(C)
        x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
        row = {"case": case}
        for rows in [int(d) for d in os.environ.get("DEPTHS", "4 8 12 16 24").split()]:
            gpu.PREFETCH_ROWS = rows
            gpu.backward_plan.cache_clear()
            gpu.forward_plan.cache_clear()
            if prog.startswith("fwd"):
                t = timer(lambda: ops.forward_impl(x, w, b, doc, None, False, True, prog))
            else:
                t = timer(lambda: ops.backward_impl(dy, x, w, b, doc, None, None, True, gd, prog))
            row[rows] = round(statistics.median(t), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
