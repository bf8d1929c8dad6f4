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


def test_reused_tickets_are_left_at_zero(kernel_backend, ticket_climb):
    """The backward reuses one ticket buffer per stream without a memset: every launch must leave
    it all zero (the last arriver resets each ticket), whatever the shape and program."""
    from conv1d_silu import gpu

    gpu._scratch.clear()
    gpu._handed.clear()
    first, cases = {}, {}
    for S, C in ((3000, 16), (70000, 8), (300, 40)):
        cases[S, C] = make_case(S=S, C=C, K=4, mode="single", dtype=torch.float32, device=kernel_backend.device)
        cases[S, C]["dy"] = torch.randn_like(cases[S, C]["x"])
    for rep in range(2):
        for (S, C), case in cases.items():
            for program in ("rowgroup", "rowgroup_long_8b", "rowgroup_sm", "rowgroup_flat_8b", "rowgroup_long_flat_8b",
                            "rowgroup_long_flat32_8b", "rowgroup_long_flat32"):
                got = _grads(case, program)[0]
                if rep == 0:
                    first[S, C, program] = got
                else:
                    assert all(torch.equal(a, b) for a, b in zip(got, first[S, C, program])), (S, C, program)
                bufs = [b for k, b in gpu._scratch.items() if k[0] == "tickets"]
                assert bufs and all(int(b.count_nonzero()) == 0 for b in bufs), (S, C, program)


@pytest.mark.parametrize("program", ["rowgroup_8b", "rowgroup_flat_8b", "rowgroup_long_8b", "rowgroup_sm"])
def test_fold_launch_gives_the_ticket_climbs_bits(kernel_backend, program, request):
    """With more than FAN and at most gpu.FOLD_MAX_NODES nodes at the CTAs' level, a second kernel
    folds the tree above them instead of the tickets' climb: the same bits, fp32 main-grad
    accumulation included."""
    from conv1d_silu import gpu, ops
    from conv1d_silu.documents import doc_table

    dev = kernel_backend.device
    torch.manual_seed(7)
    cta_level = routes.PROGRAMS[program].cta_level
    calls = []
    for S, C in ((3000, 40), (20000, 24)):
        assert gpu.split_fold(gpu.tree_shape(S)[1][cta_level]) == (cta_level == 1 or S == 20000)
        x, w, b = torch.randn(S, C, device=dev), torch.randn(C, 4, device=dev), torch.randn(C, device=dev)
        dy = torch.randn_like(x)
        doc = doc_table(x, None, None, None)
        main_w, main_b = torch.randn(C, 4, device=dev), torch.randn(C, device=dev)

        def call(x=x, w=w, b=b, dy=dy, doc=doc, main_w=main_w, main_b=main_b):
            plain = ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, program)
            summed = ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, program,
                                       main_w.clone(), main_b.clone())
            return [*plain[:3], *summed[1:3]]

        calls.append(call)
    split = [call() for call in calls]
    request.getfixturevalue("ticket_climb")
    for call, want in zip(calls, split):
        for a, c in zip(call(), want):
            assert torch.equal(a, c), program


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fused multiply-add, exactly: a * b + c in float64 is exact for these operands (at most
    12-bit mantissas, magnitudes within 2^25 of each other), so one rounding to float32 is the FMA's."""
    return (a.double() * b.double() + c.double()).float()


def canonical_dweight_dbias(x: torch.Tensor, dy: torch.Tensor, K: int, starts: list[int]):
    """dweight (C, K) and dbias (C,) of the identity activation (g = dy) by DESIGN.md section 4,
    written independently of the kernels: fp32 slab partials of SLAB tokens, each accumulated in
    token order with FMAs, then a tree of fan-in FAN over the slabs in index order (children added
    one after another, missing children as +0) up to the root level of gpu.tree_shape."""
    from conv1d_silu.gpu import FAN, SLAB, tree_shape

    S, C = x.shape
    doc = torch.zeros(S, dtype=torch.long)
    for s in starts[1:-1]:
        doc[s:] += 1
    xf, g = x.float(), dy.float()
    n_slabs = -(-S // SLAB)
    acc = torch.zeros(n_slabs, K + 1, C)  # [slab][tap k | bias][channel]
    for i in range(SLAB):
        t = torch.arange(n_slabs) * SLAB + i
        own = t < S
        tc = t.clamp(max=S - 1)
        for k in range(K):
            src = tc - (K - 1) + k  # window row k of token t: same document only, zeros before
            ok = (src >= 0) & (doc[src.clamp(min=0)] == doc[tc])
            xv = torch.where(ok[:, None], xf[src.clamp(min=0)], torch.zeros(()))
            acc[:, k] = torch.where(own[:, None], _fma32(g[tc], xv, acc[:, k]), acc[:, k])
        acc[:, K] = torch.where(own[:, None], (acc[:, K].double() + g[tc].double()).float(), acc[:, K])
    root, sizes = tree_shape(S)
    level = acc
    for n in sizes[1:]:
        kids = torch.zeros(n * FAN, K + 1, C)
        kids[: level.shape[0]] = level
        kids = kids.view(n, FAN, K + 1, C)
        level = kids[:, 0].clone()
        for j in range(1, FAN):
            level = level + kids[:, j]
    return level[0, :K].T.contiguous(), level[0, K].contiguous()


CANONICAL = [
    dict(S=2600, C=24, K=4, starts=None),  # 82 slabs: three tree levels, partial nodes at each
    dict(S=700, C=264, K=4, starts=None),  # several channel tiles, the last one partly idle
    dict(S=3000, C=40, K=3, starts=[0, 5, 700, 701, 2222, 3000]),  # documents
    dict(S=70000, C=8, K=4, starts=None),  # 2188 slabs: four tree levels
    dict(S=600000, C=4, K=2, starts=None),  # 18750 slabs: five levels
    dict(S=140000, C=4, K=2, starts=None),  # 4375 slabs: the fold kernel climbs four levels (547 nodes)
]


@pytest.mark.slow(30)  # seconds on the GPU
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", range(len(CANONICAL)))
def test_dweight_and_dbias_are_the_canonical_reduction(kernel_backend, shape, dtype):
    """Every backward program's fp32 dweight / dbias has exactly the bits of the canonical
    reduction computed by an independent model (identity activation, so g = dy exactly). In fp32
    the inputs carry 12-bit mantissas, so a slab's running sum rounds at most steps and the token
    order inside a slab shows in the bits as the tree's order does."""
    S, C, K, starts = (CANONICAL[shape][k] for k in ("S", "C", "K", "starts"))
    gen = torch.Generator().manual_seed(shape)

    def away_from_zero(*size):  # magnitudes >= 0.25, mantissas of <= 12 bits: the FMAs are exact in fp64
        v = torch.randn(*size, generator=gen)
        m, e = torch.frexp(v.sign() * (v.abs() + 0.25))
        return torch.ldexp(torch.round(m * 4096) / 4096, e.float()).to(dtype)

    x, dy = away_from_zero(S, C), away_from_zero(S, C)
    w, b = away_from_zero(C, K).float(), away_from_zero(C).float()  # fp32 master weights: fp32 grads
    want_w, want_b = canonical_dweight_dbias(x, dy, K, starts or [0, S])
    dev = kernel_backend.device
    kw = {"cu_seqlens": torch.tensor(starts, dtype=torch.int32, device=dev)} if starts else {}
    for name in BWD_PROGRAMS:
        xs, ws, bs = (t.to(dev, copy=True).requires_grad_() for t in (x, w, b))
        causal_conv1d_silu(xs, ws, bs, activation=None, program=name, **kw).backward(dy.to(dev))
        assert torch.equal(ws.grad.cpu(), want_w), name
        assert torch.equal(bs.grad.cpu(), want_b), name


@pytest.mark.parametrize("mode", ["single", "cu_seqlens"])
def test_flat_forward_rows_wider_than_a_cta(kernel_backend, mode):
    """fwd_flat16_8b with a row of more vectors than a CTA has threads (C = 1040 bf16: 260 8-byte
    vectors, 256 threads): a lane's row spans two CTAs, and the bits equal the tiled program's."""
    case = make_case(S=90, C=1040, K=4, mode=mode, init=mode != "single", dtype=torch.bfloat16,
                     device=kernel_backend.device)
    kw = api_kwargs(case)
    ys = [causal_conv1d_silu(case["x"], case["weight"], case["bias"], program=p, **kw)
          for p in ("fwd_flat16_8b", "fwd_rows16_8b")]
    assert torch.equal(ys[0], ys[1])
    ref = causal_conv1d_silu(case["x"].cpu(), case["weight"].cpu(), case["bias"].cpu(), program="reference",
                             **{k: v.cpu() if torch.is_tensor(v) else v for k, v in kw.items()})
    torch.testing.assert_close(ys[0].cpu().float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("rows", [17, 25])
@pytest.mark.parametrize("mode", ["single", "cu_seqlens"])
def test_flat_forward_lanes_grown_to_one_wave_give_the_same_bits(kernel_backend, mode, rows, monkeypatch):
    """fwd_flat16_8b whose 16-token lanes need more CTAs than a wave (2 resident CTAs per SM here):
    one more (the lanes grow to 17 tokens) or 56 % more (to 25), the grid fits one wave, and y and
    the final states keep the bits of 16-token lanes."""
    import dataclasses

    from conv1d_silu import gpu, ops

    class TwoPerSM(gpu.Launcher):
        def __init__(self, inner: gpu.Launcher):
            self.inner, self.grids = inner, []

        def sm_count(self, device):
            return self.inner.sm_count(device)

        def max_active_blocks(self, launch, device):
            return 2

        def __call__(self, launch, device):
            self.grids.append(launch.grid[0])
            self.inner(launch, device)

    fixed = dataclasses.replace(routes.PROGRAMS["fwd_flat16_8b"], name="fwd_flat16_8b_fixed", max_fill_rows=0)
    monkeypatch.setitem(routes.PROGRAMS, fixed.name, fixed)
    launcher = TwoPerSM(ops._launcher)
    slots = 2 * launcher.sm_count(torch.device(kernel_backend.device))
    # C = 64 bf16: 16 vectors a lane, 16 lanes a CTA; 16-token lanes take slots + 1 CTAs (for 17) or
    # 1.5625 x slots (for 25)
    S = 16 * (16 * slots + 1) if rows == 17 else 400 * slots
    case = make_case(S=S, C=64, K=4, mode=mode, init=mode != "single", dtype=torch.bfloat16,
                     device=kernel_backend.device)
    kw = api_kwargs(case)
    if mode != "single":
        kw["return_final_states"] = True
    with ops.use_launcher(launcher, emulate_arch=ops._emulated_arch):
        out = {p: causal_conv1d_silu(case["x"], case["weight"], case["bias"], program=p, **kw)
               for p in (fixed.name, "fwd_flat16_8b")}
    assert launcher.grids == [gpu.flat_forward_units(S, 16, 16), gpu.flat_forward_units(S, rows, 16)]
    assert launcher.grids[0] > slots >= launcher.grids[1] and gpu.flat_forward_units(S, rows - 1, 16) > slots
    for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in out.values())):
        assert torch.equal(a, b)


@pytest.mark.parametrize("program", ["rowgroup", "rowgroup_flat_8b", "rowgroup_long_flat32_8b", "rowgroup_long_flat32"])
def test_trailing_rows_finish_dx_like_one_call(kernel_backend, program):
    """Context parallelism's trailing rows (the next rank's first K-1 tokens): the first S1 rows' dx
    with them equals that of one call over all rows, bit for bit."""
    from conv1d_silu import ops
    from conv1d_silu.documents import doc_table

    S, S1, C, K = 700, 389, 264, 4
    case = make_case(S=S, C=C, K=K, dtype=torch.bfloat16, device=kernel_backend.device)
    x, w, b = case["x"], case["weight"], case["bias"]
    dy = torch.randn_like(x)
    whole = ops.backward_impl(dy, x, w, b, doc_table(x, None, None, None), None, None, True, w.dtype, program)
    head = ops.backward_impl(dy[:S1], x[:S1], w, b, doc_table(x[:S1], None, None, None), None, None, True,
                             w.dtype, program, trailing=(x[S1:S1 + K - 1], dy[S1:S1 + K - 1]))
    assert torch.equal(head[0], whole[0][:S1])
