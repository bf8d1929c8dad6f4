"""The bench-only forward gap (docs/performance.md v10-v11: the bench timed 262144 x 384's forward
~10 % slower than scripts/path_gap.py). One JSON line per step, in one process.

    python3 scripts/bench_gap.py bisect S:C ...     the forward / backward after each piece of the
                                                     bench's set-up in turn, then the bench itself
    python3 scripts/bench_gap.py placement S:C ...  our forwards and backwards and PyTorch's clone /
                                                     copy with outputs allocated in a clean cache and
                                                     after a 1 GB free
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import bench, causal_conv1d_silu, routes  # noqa: E402
from conv1d_silu.tune import _call, _setup  # noqa: E402


def tool_tensors(S: int, C: int, dev: torch.device):
    """What path_gap.py times: the tuner's inputs, grad-requiring clones."""
    x, dy, w, b, _, _ = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
    return tuple(t.detach().clone().requires_grad_() for t in (x, w, b)) + (dy,)


def bench_tensors(S: int, C: int, dev: torch.device):
    """What bench.run times."""
    return bench.shape_inputs(S, C, 4, torch.bfloat16, dev)


def timed(step: str, tensors, timer: bench.Timer, S: int, C: int) -> None:
    x, w, b, dy = tensors
    calls = bench._timed_calls(lambda x_, w_, b_: causal_conv1d_silu(x_, w_, b_), x, w, b, dy)
    row = {"step": step, "S": S, "C": C}
    for call in ("fwd", "bwd"):
        t = timer(calls[call])
        row[call] = round(statistics.median(t), 2)
        row[call + "_min"] = round(min(t), 2)
    print(json.dumps(row), flush=True)


# forwards whose CTAs span 256 rows and two whose CTAs span 128 (and the shape's routed one)
PROGRAMS = ["fwd_rows_8b_a64", "fwd_rows16_8b", "fwd_rows16_8b_a64"]
# backwards whose CTAs span 256 rows (rowgroup_8b) and 2048 (the long ones), and the routed one
BWD_PROGRAMS = ["rowgroup_8b", "rowgroup_long_8b", "rowgroup_long16_8b"]


def placement(step: str, mine, timer: bench.Timer, S: int, C: int) -> None:
    """Graph replays of ops that allocate their output inside the graph (our forwards, our
    backwards' dx, x.clone()) and an eager copy into an output allocated now, with the outputs'
    addresses."""
    x, w, b, _ = mine
    xd = x.detach()
    got: list = []
    routed = routes.select("sm_90", "fwd_bias", C, S).name
    row = {"step": step, "S": S, "C": C, "routed": routed}
    progs = PROGRAMS + ([routed] if routed not in PROGRAMS else [])
    ours = [(p, lambda p=p: got.append(causal_conv1d_silu(x, w, b, program=p))) for p in progs]
    _, dy, _, _, doc, gd = _setup("bwd_bias", S, C, 4, x.dtype, x.device)
    bwd_routed = routes.select("sm_90", "bwd_bias", C, S).name
    wd, bd = w.detach(), b.detach()
    ours += [
        (p, lambda p=p: got.append(_call("bwd_bias", p, xd, dy, wd, bd, doc, gd)[0]))
        for p in BWD_PROGRAMS + ([bwd_routed] if bwd_routed not in BWD_PROGRAMS else [])
    ]
    row["bwd_routed"] = bwd_routed
    for name, fn in ours + [("clone", lambda: got.append(xd.clone()))]:
        got.clear()
        t = timer(fn)
        row[name], row[name + "_min"], row[name + "_out"] = round(statistics.median(t), 2), round(min(t), 2), hex(got[-1].data_ptr())
    out = torch.empty_like(xd)
    t = bench.Timer(x.device, 25, 3, graph=False)(lambda: out.copy_(xd))
    row["copy_eager"], row["copy_out"] = round(statistics.median(t), 2), hex(out.data_ptr())
    row["x"] = hex(xd.data_ptr())
    print(json.dumps(row), flush=True)


def bisect(S: int, C: int, dev: torch.device) -> None:
    tool_timer = bench.Timer(dev, reps=25, warmup=2, graph=True)
    bench_timer = bench.Timer(dev, reps=15, warmup=3, graph=True)
    tool = tool_tensors(S, C, dev)
    timed("tool_tensors_tool_timer", tool, tool_timer, S, C)
    timed("tool_tensors_bench_timer", tool, bench_timer, S, C)
    mine = bench_tensors(S, C, dev)
    timed("bench_tensors_bench_timer", mine, bench_timer, S, C)
    big = torch.empty(2**30, dtype=torch.uint8, device=dev)
    del big
    timed("after_alloc_free_1GB", mine, bench_timer, S, C)
    a = torch.empty(2**29, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(18):
        b.copy_(a)
    timed("after_18_copies_of_512MB", mine, bench_timer, S, C)
    del a, b
    timed("after_freeing_them", mine, bench_timer, S, C)
    torch.cuda.empty_cache()
    timed("after_empty_cache", mine, bench_timer, S, C)
    bench.copy_bandwidth(dev, bench.Timer(dev, 15, 3, graph=False))
    timed("after_copy_bandwidth", mine, bench_timer, S, C)
    timed("after_copy_bandwidth_again", mine, bench_timer, S, C)
    del mine  # freed before the bench allocates its own
    args = bench.parser().parse_args(["--graph", "--reps", "15", "--shapes", f"{S},{C}", "--calls", "fwd", "bwd",
                                      "--baselines", "--no-host"])
    for r in bench.run(args)["rows"]:
        if r["impl"] == "conv1d_silu":
            print(json.dumps({"step": "bench_run", r["call"]: round(r["median_us"], 2),
                              r["call"] + "_min": round(r["min_us"], 2)}), flush=True)
    timed("tool_tensors_after_bench", tool, tool_timer, S, C)


def placements(S: int, C: int, dev: torch.device) -> None:
    timer = bench.Timer(dev, reps=15, warmup=3, graph=True)
    mine = bench_tensors(S, C, dev)
    for rep in range(2):
        placement(f"clean_{rep}", mine, timer, S, C)
        big = torch.empty(2**30, dtype=torch.uint8, device=dev)
        del big
        placement(f"after_free_1GB_{rep}", mine, timer, S, C)
        torch.cuda.empty_cache()


def main(mode: str, shapes: list[str]) -> None:
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        {"bisect": bisect, "placement": placements}[mode](S, C, torch.device("cuda"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["262144:384"])
