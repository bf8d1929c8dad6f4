"""Run chosen kernels once each between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --set full -o prof \
        python3 tools/profile_kernels.py bwd:250340:384:rowgroup_long_8b fwd:250340:384:fwd_rows_8b add:250340:384

Each case is ``call:S:C[:program[:nobias]]`` (call: fwd, bwd, copy, add, or cc1d: causal-conv1d's
``causal_conv1d_fn`` forward and backward on the same inputs, for its kernels beside ours; bf16, K = 4,
bias unless ``nobias``, random inputs; an empty program routes). S as ``BxL`` (``bwd:8x2048:1024:bwd_bcl``) makes x
channel-first, (B, C, L) with ``layout="BCL"``. Every case runs once before profiling starts, so
compilation and the first-call work stay outside the profiled range. tools/ncu-profile wraps this.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import causal_conv1d_silu  # noqa: E402


def parse(spec: str) -> tuple[str, tuple[int, ...], int, str, str | None, bool]:
    """(call, x's shape, C, layout, program or None, bias) of a case."""
    call, tokens, C, *rest = spec.split(":")
    C = int(C)
    if "x" in tokens:
        B, L = (int(v) for v in tokens.split("x"))
        shape, layout = (B, C, L), "BCL"
    else:
        shape, layout = (int(tokens), C), "BLC"
    return call, shape, C, layout, rest[0] if rest and rest[0] else None, "nobias" not in rest[1:]


def make(spec: str):
    call, shape, C, layout, program, bias = parse(spec)
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (torch.randn(C, 4, device="cuda", dtype=torch.bfloat16, generator=g) * 0.5).requires_grad_()
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() if bias else None
    leaves = (x, w, b) if bias else (x, w)
    dy = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(dy)
    if call == "fwd":
        return lambda: causal_conv1d_silu(x, w, b, program=program, layout=layout)
    if call == "bwd":
        y = causal_conv1d_silu(x, w, b, layout=layout)
        return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True) if program is None else (
            torch.autograd.grad(causal_conv1d_silu(x, w, b, program=program, layout=layout), leaves, dy)
        )
    if call == "cc1d":
        from causal_conv1d import causal_conv1d_fn  # imported only here: the other cases run without it

        def view(t):  # its (B, C, L) view of the same memory
            return t if layout == "BCL" else t.unsqueeze(0).transpose(1, 2)

        return lambda: torch.autograd.grad(causal_conv1d_fn(view(x), w, b, activation="silu"), leaves, view(dy))
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
