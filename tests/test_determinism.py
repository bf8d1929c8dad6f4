"""Bitwise determinism: the same inputs give the same bits run after run, and every backward
program gives the same bits (the canonical reduction of DESIGN.md section 4)."""

from __future__ import annotations

import pytest
import torch

from conv1d_silu import causal_conv1d_silu, routes
from helpers import api_kwargs, make_case

BWD_PROGRAMS = [name for name, p in routes.PROGRAMS.items() if p.direction == "bwd"]
FWD_PROGRAMS = [name for name, p in routes.PROGRAMS.items() if p.direction == "fwd"]


def _grads(case, program=None, runs=1):
    """All outputs and gradients of `runs` identical calls."""
    results = []
    for _ in range(runs):
        x = case["x"].detach().requires_grad_()
        w = case["weight"].detach().requires_grad_()
        b = case["bias"].detach().requires_grad_() if case["bias"] is not None else None
        kw = api_kwargs(case)
        init = kw.get("initial_states")
        if init is not None:
            kw["initial_states"] = init.detach().requires_grad_()
        y = causal_conv1d_silu(x, w, b, program=program, **kw)
        y.backward(case["dy"])
        got = [y, x.grad, w.grad] + ([b.grad] if b is not None else []) + ([kw["initial_states"].grad] if init is not None else [])
        results.append([t.detach().clone() for t in got])
    return results


SHAPES = [
    dict(S=1000, C=24, K=4, mode="single"),
    dict(S=3000, C=40, K=3, mode="cu_seqlens", init=True),
    dict(S=2100, C=16, K=8, mode="seq_idx", init=True),
    dict(S=700, C=264, K=4, mode="single"),  # several channel tiles, the last one partly idle
]


@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_repeated_runs_are_bitwise_identical(backend, shape):
    case = make_case(**SHAPES[shape], dtype=torch.bfloat16, device=backend.device)
    case["dy"] = torch.randn_like(case["x"])
    runs = 10 if backend.name == "cuda" else 3
    results = _grads(case, runs=runs)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_program_gives_the_same_bits(kernel_backend, shape, dtype):
    case = make_case(**SHAPES[shape], dtype=dtype, device=kernel_backend.device)
    case["dy"] = torch.randn_like(case["x"])
    base = _grads(case, program="rowgroup")[0]
    for name in BWD_PROGRAMS + FWD_PROGRAMS:
        for a, b in zip(base, _grads(case, program=name)[0]):
            assert torch.equal(a, b), name


def test_reused_tickets_are_left_at_zero(kernel_backend):
    """The backward reuses one ticket buffer per stream without a memset: every launch must leave
    it all zero (the last arriver resets each ticket), whatever the shape and program."""
    from conv1d_silu import gpu

    gpu._scratch.clear()
    first, cases = {}, {}
    for S, C in ((3000, 16), (70000, 8), (300, 40)):
        cases[S, C] = make_case(S=S, C=C, K=4, mode="single", dtype=torch.float32, device=kernel_backend.device)
        cases[S, C]["dy"] = torch.randn_like(cases[S, C]["x"])
    for rep in range(2):
        for (S, C), case in cases.items():
            for program in ("rowgroup", "rowgroup_long_8b", "rowgroup_sm"):
                got = _grads(case, program)[0]
                if rep == 0:
                    first[S, C, program] = got
                else:
                    assert all(torch.equal(a, b) for a, b in zip(got, first[S, C, program])), (S, C, program)
                bufs = [b for k, b in gpu._scratch.items() if k[0] == "tickets"]
                assert bufs and all(int(b.count_nonzero()) == 0 for b in bufs), (S, C, program)
