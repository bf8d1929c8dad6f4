"""Every program and variant family once on small shapes, for compute-sanitizer.

Run as ``PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3
tools/sanitize_cases.py`` (no caching allocator, so an access past a tensor hits unallocated
memory). Also checks the results against the reference, so a run that is clean but wrong fails.
``--list`` prints the cases and programs without running them (no GPU needed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

from conv1d_silu import causal_conv1d_silu, routes  # noqa: E402
from helpers import api_kwargs, assert_close, make_case, naive_grads  # noqa: E402

# Every CUDA program once: a forward program name forces the forward, the backward then routes.
PROGRAMS = [n for n, p in routes.PROGRAMS.items() if p.direction == "bwd"] + [
    n for n, p in routes.PROGRAMS.items() if p.direction == "fwd"
]
CASES = [
    dict(S=700, C=24, K=4, mode="single", dtype=torch.bfloat16),
    dict(S=700, C=7, K=3, mode="cu_seqlens", init=True, dtype=torch.float32),
    dict(S=2300, C=40, K=8, mode="seq_idx", init=True, dtype=torch.bfloat16),
    dict(S=300, C=16, K=2, mode="batch", init=True, dtype=torch.float16, bias=False),
    dict(S=200, C=16, K=4, mode="seq_idx_3d", dtype=torch.bfloat16, row_pad=8),
    dict(S=90, C=6, K=5, mode="single", dtype=torch.float64),
    # 79 nodes at the one-slab CTAs' level, 10 at the eight-slab ones': conv1d_silu_fold climbs 3 and 2 levels
    dict(S=20000, C=8, K=4, mode="single", dtype=torch.float32),
]


def padding_case() -> int:
    """seq_idx < 0 marks padding between documents and at the end, with states: every program against
    the reference program on the same GPU tensors."""
    gen = torch.Generator(device="cuda").manual_seed(99)
    ids = [0] * 300 + [-1] * 50 + [1] * 400 + [-1] * 30 + [3] * 100 + [-1] * 21
    seq = torch.tensor(ids, dtype=torch.int32, device="cuda")
    C, K = 24, 4
    x = torch.randn(len(ids), C, device="cuda", generator=gen, dtype=torch.bfloat16)
    w, b = torch.randn(C, K, device="cuda", generator=gen), torch.randn(C, device="cuda", generator=gen)
    init = torch.randn(4, K - 1, C, device="cuda", generator=gen, dtype=torch.bfloat16)
    dy, dfin = torch.randn_like(x), torch.randn_like(init)

    def run(program):
        leaves = [t.detach().requires_grad_() for t in (x, w, b, init)]
        y, fin = causal_conv1d_silu(*leaves[:3], seq_idx=seq, initial_states=leaves[3], return_final_states=True,
                                    program=program)
        torch.autograd.backward([y, fin], [dy, dfin])
        return [y, fin] + [t.grad for t in leaves]

    want = run("reference")
    for program in PROGRAMS:
        got = run(program)
        assert torch.equal(got[0][seq < 0], torch.zeros_like(got[0][seq < 0])), f"padding {program}: y"
        for name, g, r in zip(("y", "final", "dx", "dweight", "dbias", "dinitial"), got, want):
            assert_close(g, r, name=f"padding {program} {name}")
    return len(PROGRAMS)


def decode_cases() -> int:
    """The decoding kernel: shifted and circular states, padding rows, more new tokens than state
    columns, channel-last and channel-first states; each against the PyTorch step on the same GPU
    tensors (outputs close, states equal)."""
    from conv1d_silu.compat import causal_conv1d_update
    from conv1d_silu.decoding import update as step_reference

    gen = torch.Generator(device="cuda").manual_seed(7)
    n = 0
    for dtype, K, L, state_len, circular, indexed, channel_last in [
        (torch.bfloat16, 4, 1, 3, False, False, True),
        (torch.bfloat16, 4, 1, 6, True, True, False),
        (torch.float32, 3, 9, 4, False, True, False),
        (torch.float32, 8, 9, 7, True, False, True),
        (torch.float16, 2, 2, 1, False, False, False),
    ]:
        B, C, rows = 5, 200, 8

        def rnd(*shape):
            return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

        x = rnd(B, L, C).transpose(1, 2) if channel_last else rnd(B, C, L)
        state = rnd(rows if indexed else B, state_len, C).transpose(1, 2) if channel_last else rnd(rows if indexed else B, C, state_len)
        w, b = rnd(C, K), rnd(C)
        lens = torch.tensor([0, 3, 8, 1 << 33, 5], device="cuda") if circular else None
        idx = torch.tensor([6, -1, 0, 3, -1], dtype=torch.int32, device="cuda") if indexed else None
        want_state = state.clone()
        want = step_reference(x, want_state, w, b, True, lens, idx)
        got = causal_conv1d_update(x, state, w, b, "silu", lens, idx)
        assert_close(got, want, dtype, f"decode {dtype} K={K} L={L} out")
        assert torch.equal(state, want_state), f"decode {dtype} K={K} L={L} state"
        n += 1
    return n


def channel_first_cases() -> int:
    """The channel-first kernels on x = a chunk of a wider (B, 2C+1, L) tensor (batch and channel
    strides of their own): 16-byte and 1-token accesses, states, padding, cu_seqlens, main_grad
    accumulation, a part above tree level 2 (1.2M tokens), rows of whole slabs without states (the
    simple walk, and there both the staged and the chained round), and mamba_ssm's dx written into a chunk; each
    against the same values in channel-last memory (bits)."""
    from conv1d_silu.compat.cpp_functions import causal_conv1d_bwd_function

    gen = torch.Generator(device="cuda").manual_seed(11)
    n = 0
    for B, C, L, K, dtype, docs, states in [
        (3, 40, 256, 4, torch.bfloat16, "none", True),
        (2, 24, 203, 3, torch.float32, "none", True),
        (2, 16, 300, 4, torch.bfloat16, "padding", True),
        (1, 8, 500, 2, torch.float16, "cu_seqlens", True),
        (1, 3, 1_200_000, 4, torch.bfloat16, "none", False),
        (4, 32, 512, 4, torch.bfloat16, "none", False),
        (4, 16, 2712, 4, torch.bfloat16, "none", False),  # two parts per channel, a tail through a row wrap
        (3, 8, 96, 4, torch.bfloat16, "none", False),  # a round past S: the chained round's guarded loads
    ]:
        wide = torch.randn(B, 2 * C + 1, L, device="cuda", generator=gen).to(dtype)
        x = wide[:, 1 : C + 1]
        w, b = torch.randn(C, K, device="cuda", generator=gen), torch.randn(C, device="cuda", generator=gen)
        kw = {}
        if docs == "padding":
            row = [0] * 100 + [-1] * 20 + [1] * (L - 130) + [-1] * 10
            kw["seq_idx"] = torch.tensor([row] * B, dtype=torch.int32, device="cuda")
        if docs == "cu_seqlens":
            kw["cu_seqlens"] = torch.tensor([0, 3, 100, 101, L], dtype=torch.int32, device="cuda")
        n_states = 4 if docs == "cu_seqlens" else B
        init = torch.randn(n_states, C, K - 1, device="cuda", generator=gen).to(dtype) if states else None
        dy = torch.randn(B, C, L, device="cuda", generator=gen).to(dtype)

        def run(xx, program=None):
            leaves = [t.detach().requires_grad_() for t in (xx, w, b)]
            st = None if init is None else init.detach().requires_grad_()
            mg = torch.zeros(C, K, device="cuda"), torch.zeros(C, device="cuda")
            y = causal_conv1d_silu(*leaves, initial_states=st, weight_main_grad=mg[0], bias_main_grad=mg[1],
                                   layout="BCL", program=program, **kw)
            y.backward(dy)
            return [y, leaves[0].grad, *mg] + ([] if st is None else [st.grad])

        want = run(x.transpose(1, 2).contiguous().transpose(1, 2))
        # the routed program (the staged walk at these widths), and the chained round where the simple walk applies
        for program in (None, "bwd_bcl_chain2") if docs == "none" and not states else (None,):
            got = run(x, program)
            for name, g, r in zip(("y", "dx", "dweight", "dbias", "dinitial"), got, want):
                assert torch.equal(g, r), f"channel-first {B}x{C}x{L} {dtype} {docs} {program}: {name}"
            n += 1
    xz = torch.randn(2, 64, 512, device="cuda", generator=gen).to(torch.bfloat16)
    dxz = torch.zeros_like(xz)
    w, b = torch.randn(32, 4, device="cuda", generator=gen), torch.randn(32, device="cuda", generator=gen)
    dout = torch.randn(2, 32, 512, device="cuda", generator=gen).to(torch.bfloat16)
    got = causal_conv1d_bwd_function(xz[:, :32], w, b, dout, None, None, None, dxz[:, :32], False, True)
    want = causal_conv1d_bwd_function(xz[:, :32].contiguous(), w, b, dout, None, None, None, None, False, True)
    assert all(torch.equal(g, r) for g, r in zip(got[:3], want[:3])) and not dxz[:, 32:].any(), "mamba dx in place"
    return n + 1


def main(argv: list[str] | None = None) -> int:
    if "--list" in (sys.argv[1:] if argv is None else argv):
        for i, spec in enumerate(CASES):
            print(f"case {i}: " + ", ".join(f"{k}={v}" for k, v in spec.items()))
        print(f"programs ({len(PROGRAMS)}): {' '.join(PROGRAMS)}")
        return 0
    n = 0
    for i, spec in enumerate(CASES):
        spec = dict(spec)
        dtype = spec.pop("dtype")
        case = make_case(**spec, dtype=dtype, device="cuda", seed=i)
        final = case["n_docs"] is not None and "initial_states" in case
        for program in PROGRAMS:
            x = case["x"].detach().requires_grad_()
            w = case["weight"].detach().requires_grad_()
            b = case["bias"].detach().requires_grad_() if case["bias"] is not None else None
            kw = api_kwargs(case)
            out = causal_conv1d_silu(x, w, b, return_final_states=final, program=program, **kw)
            y, fin = out if final else (out, None)
            dy = torch.randn_like(y)
            dfin = torch.randn_like(fin) if fin is not None else None
            torch.autograd.backward([y] + ([fin] if fin is not None else []), [dy] + ([dfin] if fin is not None else []))
            ref = naive_grads(case, dy, dfin)
            assert_close(y, ref[0], dtype, f"case {i} {program} y")
            assert_close(x.grad, ref[2], dtype, f"case {i} {program} dx")
            for name, g, r in (("dweight", w.grad, ref[3]), ("dbias", None if b is None else b.grad, ref[4])):
                if r is not None:  # the tree's sums, at their own dtype's tolerance (as tests/test_conv1d_silu.py)
                    assert_close(g, r.reshape(g.shape), name=f"case {i} {program} {name}")
            n += 1
    n += padding_case()
    n += channel_first_cases()
    steps = decode_cases()
    torch.cuda.synchronize()
    print(f"sanitize_cases: {n} forward+backward runs and {steps} decoding steps checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
