"""Run chosen kernels once each between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --set full -o prof \
        python3 tools/profile_kernels.py bwd:250340:384:rowgroup_long_8b fwd:250340:384:fwd_rows_8b add:250340:384

Each case is ``call:S:C[:program[:nobias]]`` (call: fwd, bwd, copy or add; bf16, K = 4, bias unless
``nobias``, random inputs; an empty program routes). Every case runs once before profiling starts,
so compilation and the first-call work stay outside the profiled range. tools/ncu-profile wraps this.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import causal_conv1d_silu  # noqa: E402


def make(spec: str):
    call, S, C, *rest = spec.split(":")
    S, C = int(S), int(C)
    program = rest[0] if rest and rest[0] else None
    bias = "nobias" not in rest[1:]
    g = torch.Generator(device="cuda").manual_seed(S + C)
    x = torch.randn(S, C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (torch.randn(C, 4, device="cuda", dtype=torch.bfloat16, generator=g) * 0.5).requires_grad_()
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() if bias else None
    leaves = (x, w, b) if bias else (x, w)
    dy = torch.randn(S, C, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(dy)
    if call == "fwd":
        return lambda: causal_conv1d_silu(x, w, b, program=program)
    if call == "bwd":
        y = causal_conv1d_silu(x, w, b)
        return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True) if program is None else (
            torch.autograd.grad(causal_conv1d_silu(x, w, b, program=program), leaves, dy)
        )
    if call == "copy":
        return lambda: out.copy_(dy)
    if call == "add":
        return lambda: torch.add(x.detach(), dy, out=out)
    raise SystemExit(f"unknown call {call!r} in {spec!r}")


def main(specs: list[str]) -> None:
    runs = [make(s) for s in specs]
    for fn in runs:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in runs:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
