"""The forward's time against where its output lies relative to its input (docs/performance.md v11:
right after a large free the forward at 262144 x 384 ran ~10 % slower, with its output
0x46000000 bytes below x, where PyTorch's clone into the same address was not slower). x and y are
views of one buffer, y starting `delta` bytes after x (and, for each delta, as far below it);
each placement times our forward (graph replay) and PyTorch's copy into the same y (eager), cold
L2. One JSON line per delta.

    python3 scripts/placement_sweep.py S:C FROM_MB TO_MB STEP_MB [PROGRAM ...]

(default program: the routed one)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, ops, routes  # noqa: E402
from conv1d_silu.bench import Timer  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402


class _Into:
    """Stands in for the torch module inside conv1d_silu.gpu so the forward's output is `y`."""

    def __init__(self, y: torch.Tensor):
        self.y = y

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def empty(self, *args, **kwargs) -> torch.Tensor:
        return self.y


def main(shape: str, lo_mb: int, hi_mb: int, step_mb: int, progs: list[str]) -> None:
    dev = torch.device("cuda")
    S, C = (int(v) for v in shape.split(":"))
    x0, _, w, b, doc, _ = _setup("fwd_bias", S, C, 4, torch.bfloat16, dev)
    progs = progs or [routes.select("sm_90", "fwd_bias", C, S).name]
    n = S * C * 2
    buf = torch.empty(2 * (hi_mb << 20) + n, dtype=torch.uint8, device=dev)
    at = lambda mb: buf[mb << 20 : (mb << 20) + n].view(torch.bfloat16).view(S, C)  # noqa: E731
    x = at(hi_mb)
    x.copy_(x0)
    for prog in progs:  # plans and compiles outside the patch
        ops.forward_impl(x, w, b, doc, None, False, True, prog)
    graph, eager = Timer(dev, 15, 2, graph=True), Timer(dev, 15, 2, graph=False)
    for mb in range(lo_mb, hi_mb + 1, step_mb):
        row = {"delta_mb": mb}
        for side, y in (("after", at(hi_mb + mb)), ("below", at(hi_mb - mb))):
            for prog in progs:
                gpu.torch = _Into(y)
                try:
                    fwd = graph(lambda: ops.forward_impl(x, w, b, doc, None, False, True, prog))
                finally:
                    gpu.torch = torch
                row[f"{prog}_{side}"] = round(statistics.median(fwd), 2)
            row[f"copy_{side}"] = round(statistics.median(eager(lambda: y.copy_(x))), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
