"""Graph-replay time of the same forward / backward through each layer: ops.*_impl (what the tuner
times), the public function without and with autograd, and the bench's own call, bf16, K = 4, bias.
Finds what the bench's rows pay on top of the tuner's.

    python3 scripts/path_gap.py S:C ...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import causal_conv1d_silu, ops, routes  # noqa: E402
from conv1d_silu.bench import Timer, _timed_calls  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402


def main(shapes: list[str]) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, reps=25, warmup=2, graph=True)
    med = lambda f: round(statistics.median(timer(f)), 2)  # noqa: E731
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
        fprog = routes.select("sm_90", "fwd_bias", C, S).name
        bprog = routes.select("sm_90", "bwd_bias", C, S).name
        xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
        calls = _timed_calls(lambda x_, w_, b_: causal_conv1d_silu(x_, w_, b_), xg, wg, bg, dy)
        out = torch.empty_like(x)
        row = {
            "S": S, "C": C, "fwd_prog": fprog, "bwd_prog": bprog,
            "copy_eager": round(statistics.median(Timer(dev, 25, 2, graph=False)(lambda: out.copy_(x))), 2),
            "fwd_impl": med(lambda: ops.forward_impl(x, w, b, doc, None, False, True, fprog)),
            "fwd_api_nograd": med(lambda: causal_conv1d_silu(x, w, b)),
            "fwd_api_grad": med(lambda: causal_conv1d_silu(xg, wg, bg)),
            "fwd_bench": med(calls["fwd"]),
            "bwd_impl": med(lambda: ops.backward_impl(dy, x, w, b, doc, None, None, True, gd, bprog)),
            "bwd_bench": med(calls["bwd"]),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
