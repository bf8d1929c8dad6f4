"""Where the fixed cost of a backward call goes: graph-replay times (cold L2, medians) of

* the backward as routed-by-name, as it is (ticket memset + kernel with its tree climbs),
* the same kernel told the CTA level is the root (no climbs, no workspace, no memset: wrong
  dweight, right timing of everything else),
* the ticket memset alone, PyTorch's add / copy of the same shape, and an empty graph;

for a few programs and S, bf16, K = 4, bias. Usage: python3 scripts/fixed_cost.py [C ...]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, ops  # noqa: E402
from conv1d_silu.routes import PROGRAMS  # noqa: E402
from conv1d_silu.bench import Timer  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402

_plan = gpu.backward_plan


def no_climb_plan(*args, **kw):
    p = _plan(*args, **kw)
    level = args[-2].cta_level
    return dataclasses.replace(p, root=level, ws_elems=0, n_tickets=0)


def main(Cs: list[int]) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, reps=30, warmup=2, graph=True)
    med = lambda f: round(statistics.median(timer(f)), 2)  # noqa: E731
    tiny = torch.zeros(1, device=dev)
    rows = [{"case": "empty graph (one tiny add_)", "us": med(lambda: tiny.add_(1))}]
    for C in Cs:
        for S in (2048, 8192, 32768, 65536, 262144):
            x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
            out = torch.empty_like(x)
            r = {"C": C, "S": S, "add": med(lambda: torch.add(x, dy, out=out)), "copy": med(lambda: out.copy_(x))}
            for prog in ("rowgroup_8b", "rowgroup_long_8b"):
                call = lambda: ops.backward_impl(dy, x, w, b, doc, None, None, True, gd, prog)  # noqa: E731
                r[prog] = med(call)
                plan = _plan(x.dtype, w.dtype, gd, 4, C, S, C, C, 16, True, doc.mode, False, True, PROGRAMS[prog], 0)
                gpu.backward_plan = no_climb_plan
                try:
                    r[prog + " no-climb"] = med(call)
                finally:
                    gpu.backward_plan = _plan
                n = plan.n_tickets
                r[prog + " memset"] = med(lambda: torch.zeros(n, dtype=torch.int32, device=dev))
                r[prog + " root/units"] = (plan.root, plan.n_units)
            for prog in ("fwd_rows_8b", "fwd_rows16_8b"):
                r[prog] = med(lambda: ops.forward_impl(x, w, b, doc, None, False, True, prog))
            print(json.dumps(r), flush=True)
            rows.append(r)
    print(json.dumps(rows[0]))


if __name__ == "__main__":
    main([int(c) for c in sys.argv[1:]] or [264, 384])
