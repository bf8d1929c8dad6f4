"""Bisects the bench-only gap (docs/performance.md v10: the bench times 262144x384 forward ~10 %
slower than scripts/path_gap.py does, same GPU, same minute). In one process it times the same
graph-replayed forward / backward after each piece of the bench's own set-up in turn, then the bench
itself, then the first measurement again. One JSON line per step.

    python3 scripts/bench_gap.py S:C ...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import bench, causal_conv1d_silu  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402


def tool_tensors(S: int, C: int, dev: torch.device):
    """What path_gap.py times: the tuner's inputs, grad-requiring clones."""
    x, dy, w, b, _, _ = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
    return tuple(t.detach().clone().requires_grad_() for t in (x, w, b)) + (dy,)


def bench_tensors(S: int, C: int, dev: torch.device):
    """What bench.run times: its own generator, seed and weight scale."""
    g = torch.Generator(device=dev).manual_seed(S * 7919 + C)
    x = torch.randn(S, C, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (torch.randn(C, 4, device=dev, dtype=torch.bfloat16, generator=g) * 0.5).requires_grad_()
    b = torch.randn(C, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    dy = torch.randn(S, C, device=dev, dtype=torch.bfloat16, generator=g)
    return x, w, b, dy


def timed(step: str, tensors, timer: bench.Timer, S: int, C: int) -> None:
    x, w, b, dy = tensors
    calls = bench._timed_calls(lambda x_, w_, b_: causal_conv1d_silu(x_, w_, b_), x, w, b, dy)
    row = {"step": step, "S": S, "C": C}
    for call in ("fwd", "bwd"):
        t = timer(calls[call])
        row[call] = round(statistics.median(t), 2)
        row[call + "_min"] = round(min(t), 2)
    print(json.dumps(row), flush=True)


def placement(step: str, mine, timer: bench.Timer, S: int, C: int) -> None:
    """Graph replays of ops that allocate their output inside the graph (ours, x.clone()) and an
    eager copy into an output allocated now, with the outputs' addresses."""
    x, w, b, _ = mine
    xd = x.detach()
    got: list = []
    row = {"step": step}
    for name, fn in (("fwd", lambda: got.append(causal_conv1d_silu(x, w, b))), ("clone", lambda: got.append(xd.clone()))):
        got.clear()
        t = timer(fn)
        row[name], row[name + "_min"], row[name + "_out"] = round(statistics.median(t), 2), round(min(t), 2), hex(got[-1].data_ptr())
    out = torch.empty_like(xd)
    t = bench.Timer(x.device, 25, 3, graph=False)(lambda: out.copy_(xd))
    row["copy_eager"], row["copy_out"] = round(statistics.median(t), 2), hex(out.data_ptr())
    row["x"] = hex(xd.data_ptr())
    print(json.dumps(row), flush=True)


def main(shapes: list[str]) -> None:
    dev = torch.device("cuda")
    bench_timer = bench.Timer(dev, reps=15, warmup=3, graph=True)
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        mine = bench_tensors(S, C, dev)
        # v11: the forward's slow mode (+10 %) follows a large free (copy_bandwidth's 1 GB, a shape's
        # tensors) and is gone after torch.cuda.empty_cache(). Does it hit PyTorch's own kernels too?
        for rep in range(2):
            placement(f"clean_{rep}", mine, bench_timer, S, C)
            big = torch.empty(2**30, dtype=torch.uint8, device=dev)
            del big
            placement(f"after_free_1GB_{rep}", mine, bench_timer, S, C)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["262144:384"])
