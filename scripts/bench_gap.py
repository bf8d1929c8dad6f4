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


def main(shapes: list[str]) -> None:
    dev = torch.device("cuda")
    tool_timer = bench.Timer(dev, reps=25, warmup=2, graph=True)
    bench_timer = bench.Timer(dev, reps=15, warmup=3, graph=True)
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        tool = tool_tensors(S, C, dev)
        timed("tool_tensors_tool_timer", tool, tool_timer, S, C)
        timed("tool_tensors_bench_timer", tool, bench_timer, S, C)
        mine = bench_tensors(S, C, dev)
        timed("bench_tensors_bench_timer", mine, bench_timer, S, C)
        # v11: the forward's slow mode followed copy_bandwidth; which part of it?
        big = torch.empty(2**30, dtype=torch.uint8, device=dev)
        del big
        timed("after_alloc_free_1GB", mine, bench_timer, S, C)
        a = torch.empty(2**29, dtype=torch.uint8, device=dev)
        b = torch.empty_like(a)
        for _ in range(18):
            b.copy_(a)
        timed("after_18_copies_of_512MB", mine, bench_timer, S, C)
        a = b = None
        timed("after_freeing_them", mine, bench_timer, S, C)
        extra = bench.Timer(dev, 15, 3, graph=False)
        del extra
        timed("after_a_timer_came_and_went", mine, bench_timer, S, C)
        torch.cuda.empty_cache()
        timed("after_empty_cache", mine, bench_timer, S, C)
        bench.copy_bandwidth(dev, bench.Timer(dev, 15, 3, graph=False))
        timed("after_copy_bandwidth", mine, bench_timer, S, C)
        timed("after_copy_bandwidth_again", mine, bench_timer, S, C)
        torch.cuda.empty_cache()
        timed("after_copy_bandwidth_empty_cache", mine, bench_timer, S, C)
        out = torch.empty_like(mine[0].detach())
        eager = bench.Timer(dev, 15, 3, graph=False)
        eager(lambda: out.copy_(mine[0].detach()))
        eager(lambda: torch.add(mine[0].detach(), mine[3], out=out))
        timed("after_copy_add", mine, bench_timer, S, C)
        # the copy baseline itself, eager, at several placements of its output
        for step in range(4):
            pad = torch.empty(step * 2**20 * 7, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(mine[0].detach())
            t = bench.Timer(dev, 25, 3, graph=False)(lambda: dst.copy_(mine[0].detach()))
            print(json.dumps({"step": f"copy_out_after_{step * 7}MB_pad", "copy": round(statistics.median(t), 2),
                              "copy_min": round(min(t), 2), "dst_mod_2MB": dst.data_ptr() % 2**21}), flush=True)
            del pad
            dst = None
        mine = out = None  # freed before the bench allocates its own
        args = bench.parser().parse_args(["--graph", "--reps", "15", "--shapes", f"{S},{C}", "--calls", "fwd", "bwd",
                                          "--baselines", "--no-host"])
        result = bench.run(args)
        for r in result["rows"]:
            if r["impl"] == "conv1d_silu":
                print(json.dumps({"step": "bench_run", "S": S, "C": C, r["call"]: round(r["median_us"], 2),
                                  r["call"] + "_min": round(r["min_us"], 2)}), flush=True)
        timed("tool_tensors_after_bench", tool, tool_timer, S, C)


if __name__ == "__main__":
    main(sys.argv[1:] or ["262144:384"])
