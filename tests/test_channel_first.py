"""The channel-first kernels: x ``(B, C, L)`` with the sequence contiguous, read and written in place.

Their math is the channel-last kernels', operation for operation, so the property is bits: every
output and gradient of a channel-first call equals that of the same values in channel-last memory
(which test_layouts and test_conv1d_silu check against float64 references), for every variant.
"""

from __future__ import annotations

import pytest
import torch

from conv1d_silu import causal_conv1d_silu, gpu_bcl, ops, routes
from conv1d_silu.compat import causal_conv1d_fn
from conv1d_silu.compat.cpp_functions import causal_conv1d_bwd_function

GRADS = ("x", "weight", "bias", "initial_states")

# (B, C, L, K, dtype, wdtype, docs, states, bias, silu, grads)
CASES = [
    (2, 6, 64, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),
    (3, 5, 48, 3, torch.bfloat16, torch.float32, "none", "both", False, True, "weight"),
    (2, 4, 96, 4, torch.bfloat16, torch.float32, "seq_idx", "none", True, False, "fp32"),
    (2, 4, 96, 4, torch.float16, torch.float32, "padding", "initial", True, True, "main_grad"),
    (1, 3, 80, 2, torch.float32, torch.float32, "cu_seqlens", "both", True, True, "weight"),
    (2, 3, 36, 8, torch.float32, torch.float32, "none", "both", True, True, "weight"),  # L % 8 != 0
    (2, 3, 13, 4, torch.bfloat16, torch.bfloat16, "none", "initial", True, True, "weight"),  # 1 token per access
    (2, 2, 24, 5, torch.float64, torch.float64, "seq_idx", "initial", True, True, "weight"),
    (4, 2, 640, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # 80 slabs in a round of 128
    (40, 2, 48, 4, torch.bfloat16, torch.float32, "none", "both", True, True, "weight"),  # a round spans 40 rows
    (3, 2, 40, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # slabs straddle rows
    (3, 2, 96, 4, torch.bfloat16, torch.float32, "none", "final", True, True, "weight"),  # simple, final states
    # two parts per channel: part 0's tail vector is row 3's, reached by thread 0's last wrap
    (4, 2, 2712, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),
    (4, 2, 2720, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # the same, simple
]


def _case(B, C, L, K, dtype, wdtype, docs, states, bias, device, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dt).to(device)

    wide = rnd(B, 2 * C + 1, L)  # x is a chunk of a wider projection, as mamba_ssm's xz
    kw = {}
    n_states = B
    if docs == "seq_idx":
        ids = torch.zeros(B, L, dtype=torch.int32)
        for r in range(B):
            for cut in sorted(torch.randint(1, L, (3,), generator=gen).tolist()):
                ids[r, cut:] += 1
        kw["seq_idx"] = ids.to(device)
    elif docs == "padding":  # causal-conv1d's padding tokens: between documents and at each row's end
        row = [0] * 20 + [-1] * 5 + [1] * 45 + [2] * (L - 77) + [-1] * 7
        kw["seq_idx"] = torch.tensor([row] * B, dtype=torch.int32, device=device)
    elif docs == "cu_seqlens":
        kw["cu_seqlens"] = torch.tensor([0, 5, 6, 40, 41, L], dtype=torch.int32, device=device)
        n_states = 5
    if states in ("initial", "both"):
        kw["initial_states"] = rnd(n_states, C, K - 1)
    if states in ("final", "both"):
        kw["return_final_states"] = True
    return wide[:, 1 : C + 1], rnd(C, K, dt=wdtype), rnd(C, dt=wdtype) if bias else None, kw


def _run(x, w, b, kw, silu, grads, dy_seed=1):
    """Outputs and gradients of one call with layout='BCL'."""
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_(grads != "main_grad")
    b = None if b is None else b.detach().requires_grad_(grads != "main_grad")
    kw = dict(kw)
    if "initial_states" in kw:
        kw["initial_states"] = kw["initial_states"].detach().requires_grad_()
    extra = {}
    if grads == "fp32":
        extra["grad_dtype"] = torch.float32
    if grads == "main_grad":
        extra["weight_main_grad"] = torch.full(w.shape, 0.5, device=w.device)
        if b is not None:
            extra["bias_main_grad"] = torch.full(b.shape, -0.25, device=b.device)
    out = causal_conv1d_silu(x, w, b, activation="silu" if silu else None, layout="BCL", **kw, **extra)
    y, final = out if isinstance(out, tuple) else (out, None)
    gen = torch.Generator().manual_seed(dy_seed)
    loss = (y * torch.randn(y.shape, generator=gen).to(y)).sum()
    if final is not None:
        loss = loss + (final * torch.randn(final.shape, generator=gen).to(final)).sum()
    loss.backward()
    got = {"y": y, "final": final, "dx": x.grad}
    got["dinit"] = kw["initial_states"].grad if "initial_states" in kw else None
    if grads == "main_grad":
        got.update(dw=extra["weight_main_grad"], db=extra.get("bias_main_grad"))
    else:
        got.update(dw=w.grad, db=None if b is None else b.grad)
    return got


def _launched(backend) -> list[str]:
    return [launch.kernel.split("<")[0] for launch in ops._launcher.launches] if backend.name == "emu" else []


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v).removeprefix("torch.") for v in c))
def test_channel_first_gives_the_channel_last_bits(kernel_backend, case):
    B, C, L, K, dtype, wdtype, docs, states, bias, silu, grads = case
    x, w, b, kw = _case(B, C, L, K, dtype, wdtype, docs, states, bias, kernel_backend.device)
    assert x.stride(2) == 1 and x.stride(1) == L
    first = _run(x, w, b, kw, silu, grads)
    if kernel_backend.name == "emu":
        assert set(_launched(kernel_backend)) <= {"conv1d_silu_fwd_bcl", "conv1d_silu_bwd_bcl", "conv1d_silu_fold"}
        # the simple walk exactly where no document starts inside a slab and there are no initial states
        simple = docs == "none" and states in ("none", "final") and (B == 1 or L % 32 == 0)
        backward = [lau.kernel for lau in ops._launcher.launches if lau.kernel.startswith("conv1d_silu_bwd_bcl<")]
        assert backward and all(k.endswith(f", {str(simple).lower()}, 0>") for k in backward)  # SIMPLE, staged
    x_last = x.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, channel-last memory
    last = _run(x_last, w, b, kw, silu, grads)
    for name, got in first.items():
        want = last[name]
        if want is None:
            assert got is None, name
            continue
        assert torch.equal(got, want), f"{name}: max diff {(got.double() - want.double()).abs().max().item()}"
    # the outputs take x's layout: empty_like of a chunk is contiguous channel-first memory
    assert first["y"].is_contiguous() and first["dx"].is_contiguous()
    assert last["y"].stride(1) == 1 and last["dx"].stride(1) == 1


CHAIN_CASES = [c for c in CASES if c[6] == "none"] + [
    (1, 3, 100, 4, torch.bfloat16, torch.float32, "none", "none", True, True, "weight"),  # the last slab 4 tokens
    (1, 2, 2051, 4, torch.float32, torch.float32, "none", "none", True, True, "fp32"),  # 1-token vectors, S past a round
    (3, 2, 96, 8, torch.float32, torch.float32, "none", "none", True, True, "weight"),  # tails of two vectors
    (24, 2, 64, 4, torch.bfloat16, torch.bfloat16, "none", "none", False, False, "main_grad"),  # 8 rows per sweep
    (2, 2, 64, 6, torch.float16, torch.float32, "none", "final", True, True, "weight"),
    (2, 2, 64, 4, torch.float64, torch.float64, "none", "none", True, True, "weight"),  # 2-token vectors, K = 4
    (2, 2, 64, 2, torch.float64, torch.float64, "none", "none", True, True, "weight"),  # 2-token vectors, K = 2
    (1, 2, 1001, 8, torch.float64, torch.float64, "none", "none", True, True, "weight"),  # 1-token vectors, K = 8
    (2, 2, 1030, 8, torch.bfloat16, torch.float32, "none", "none", True, True, "weight"),  # 2-token vectors
    (9, 2, 32, 8, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # rows of one slab
    (1, 2, 8, 8, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # fewer tokens than taps
    (1, 2, 8200, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # two rounds
    (70, 2, 96, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, True, "weight"),  # rounds across rows
    (1, 2, 101, 2, torch.bfloat16, torch.float32, "none", "none", True, True, "weight"),  # 2-byte vectors: staged
    (2, 3, 128, 4, torch.float32, torch.float32, "none", "none", True, True, "weight"),  # fp32, 8 lanes a slab
    (3, 2, 64, 5, torch.float32, torch.float32, "none", "none", False, True, "main_grad"),  # fp32, K = 5
    (1, 2, 4100, 4, torch.float16, torch.float16, "none", "none", True, False, "weight"),  # fp16, 8-byte vectors
]


CHAINED = "bwd_bcl_chain2"  # the chained round, with routes.PROGRAMS[CHAINED].chain vectors a lane
CHAIN = 2


def _chained(kernel: str, simple: bool, chain: int) -> int:
    """The CHAIN flag a launch of the chained program should carry: its vectors per lane where the
    simple walk applies, the slab's vectors split evenly over lanes and a vector of whole 32-bit
    words holds K-1 taps."""
    args = kernel.split("<", 1)[1].rstrip(">").split(", ")
    K, vec, itemsize = int(args[3]), int(args[4]), {"float": 4, "double": 8}.get(args[0], 2)
    return chain if simple and (32 // vec) % chain == 0 and vec >= K - 1 and vec * itemsize >= 4 else 0


@pytest.mark.parametrize("wide", [False, True], ids=["int", "long"])
@pytest.mark.parametrize("case", CHAIN_CASES, ids=lambda c: "-".join(str(v).removeprefix("torch.") for v in c))
def test_the_chained_round_gives_the_same_bits(kernel_backend, monkeypatch, case, wide):
    """bwd_bcl_chain2 (g and dx of each lane's own vectors, a slab's partial chained through its
    lanes) computes the same expressions in the same order as the routed walk: every output and
    gradient has its bits, with 32- and 64-bit offsets, and it runs the chained round exactly where
    the simple walk applies and a vector holds a token's taps. A NaN g at a row's first token
    (x = inf there) stays out of the row before it."""
    B, C, L, K, dtype, wdtype, docs, states, bias, silu, grads = case
    if wide and kernel_backend.name != "emu":
        pytest.skip("64-bit offsets are forced on the emulator; the GPU takes them at 2^31 elements")
    x, w, b, kw = _case(B, C, L, K, dtype, wdtype, docs, states, bias, kernel_backend.device)
    if B > 1:
        x[1, 0, 0] = float("inf")
    if wide:
        monkeypatch.setattr(gpu_bcl, "_wide", lambda *args: True)
    gpu_bcl.backward_launches.cache_clear()
    try:
        want = _run(x, w, b, kw, silu, grads)
        got = _run(x, w, b, {**kw, "program": CHAINED}, silu, grads)
        if kernel_backend.name == "emu":
            simple = states in ("none", "final") and (B == 1 or L % 32 == 0)
            launch = next(lau for lau in reversed(ops._launcher.launches) if "bwd_bcl" in lau.kernel)
            chain = _chained(launch.kernel, simple, CHAIN)
            flags = f", {'long long' if wide else 'int'}, {str(simple).lower()}, {chain}>"
            assert launch.kernel.endswith(flags), launch.kernel
    finally:
        gpu_bcl.backward_launches.cache_clear()
    for name, value in want.items():
        if value is None:
            assert got[name] is None, name
        else:
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, equal_nan=True, msg=name)
    if B > 1 and silu:
        assert got["dx"][0].isfinite().all() and not got["dx"][1, 0, 0].isfinite()


def test_the_chained_round_runs_for_the_mamba_shapes():
    """At bf16 and K = 4 (16-byte vectors of 8 tokens) the chained program takes its round."""
    assert routes.PROGRAMS[CHAINED].chain == CHAIN
    launch, _, _ = gpu_bcl.backward_launches(
        torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 8, 64, 2048, (64 * 2048, 2048) * 3, 16, True, 0, False,
        True, 0, False, False, CHAIN)
    assert launch.kernel.endswith(f", int, true, {CHAIN}>"), launch.kernel


def test_the_chained_round_forced_on_channel_last_x_gives_its_bits(kernel_backend):
    """A chained program named for channel-last x (S, C) runs on a channel-first copy and returns dx in
    x's layout, with the routed channel-last call's bits."""
    dev = kernel_backend.device
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(300, 24, generator=gen).to(torch.bfloat16).to(dev)
    w, b = torch.randn(24, 4, generator=gen).to(dev), torch.randn(24, generator=gen).to(dev)
    dy = torch.randn(300, 24, generator=gen).to(torch.bfloat16).to(dev)

    def grads(program):
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        causal_conv1d_silu(*leaves, program=program).backward(dy)
        return [t.grad for t in leaves]

    want, got = grads(None), grads(CHAINED)
    if kernel_backend.name == "emu":
        assert ops._launcher.launches[-1].kernel.startswith("conv1d_silu_bwd_bcl<")  # its CTAs write the root
        assert ops._launcher.launches[-1].kernel.endswith(f", true, {CHAIN}>")
    assert got[0].stride() == x.stride()
    for name, g, r in zip(("dx", "dw", "db"), got, want):
        assert torch.equal(g, r), name


def test_the_chained_round_climbs_to_the_same_bits(kernel_backend, monkeypatch):
    """The chained round's partials climb through running sums as the routed walk's (forced at 2^16
    tokens, with its last slab short)."""
    x, w, b, _ = _case(1, 2, (1 << 16) - 8, 4, torch.bfloat16, torch.bfloat16, "none", "none", True,
                       kernel_backend.device)
    want = _run(x, w, b, {}, True, "weight")
    monkeypatch.setattr(gpu_bcl, "top_level", lambda root: root - 1)
    gpu_bcl.backward_launches.cache_clear()
    try:
        got = _run(x, w, b, {"program": CHAINED}, True, "weight")
    finally:
        gpu_bcl.backward_launches.cache_clear()
    for name in ("dx", "dw", "db"):
        assert torch.equal(got[name], want[name]), name


def test_channel_first_reads_x_in_place(kernel_backend):
    if kernel_backend.name != "emu":
        pytest.skip("the emulator records the launches")
    x, w, b, _ = _case(2, 4, 64, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, "cpu")
    x = x.detach().requires_grad_()
    y = causal_conv1d_silu(x, w, b, layout="BCL")
    y.sum().backward()
    fwd, bwd = ops._launcher.launches[-2:]
    for seen in (fwd.tensors[0], bwd.tensors[0]):  # x's own memory, as its (B, L, C) view
        assert seen.data_ptr() == x.data_ptr() and seen.transpose(1, 2).stride() == x.stride()
    dense = torch.randn(2, 4, 64, dtype=torch.bfloat16).permute(1, 0, 2).contiguous().permute(1, 0, 2)
    assert causal_conv1d_silu(dense, w, b, layout="BCL").stride() == dense.stride(), "empty_like(x)'s strides"


def test_the_climb_through_running_sums_gives_the_same_bits(kernel_backend, monkeypatch):
    """Where a CTA's part is a node above level 2 (a million tokens and up on their own), its level-2
    nodes climb through running sums; forced here at 2^16 tokens."""
    x, w, b, _ = _case(1, 2, 1 << 16, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, kernel_backend.device)
    want = _run(x.transpose(1, 2).contiguous().transpose(1, 2), w, b, {}, True, "weight")
    monkeypatch.setattr(gpu_bcl, "top_level", lambda root: root - 1)
    gpu_bcl.backward_launches.cache_clear()
    try:
        got = _run(x, w, b, {}, True, "weight")
    finally:
        gpu_bcl.backward_launches.cache_clear()
    for name in ("dx", "dw", "db"):
        assert torch.equal(got[name], want[name]), name


def test_mamba_inner_dx_is_written_in_place(kernel_backend):
    """mamba_inner_fn hands the backward x = xz.chunk(2, dim=1)[0] and dx = a chunk of dxz: dx is
    written where it lies, the rest of dxz untouched."""
    dev = kernel_backend.device
    B, D, L, K = 2, 6, 64, 4
    gen = torch.Generator().manual_seed(3)
    xz = torch.randn(B, 2 * D, L, generator=gen).to(torch.bfloat16).to(dev)
    x = xz.chunk(2, dim=1)[0]
    w = torch.randn(D, K, generator=gen).to(dev)
    b = torch.randn(D, generator=gen).to(dev)
    dout = torch.randn(B, D, L, generator=gen).to(torch.bfloat16).to(dev)
    dxz = torch.full_like(xz, 7.0)
    dx = dxz.chunk(2, dim=1)[0]
    got = causal_conv1d_bwd_function(x, w, b, dout, None, None, None, dx, False, True)
    assert got[0] is dx
    assert torch.equal(dxz[:, D:], torch.full_like(dxz[:, D:], 7.0))
    if kernel_backend.name == "emu":
        bwd = next(launch for launch in ops._launcher.launches if "bwd_bcl" in launch.kernel)
        assert bwd.tensors[6].data_ptr() == dx.data_ptr(), "no copy of dx"
    x_last = x.transpose(1, 2).contiguous().transpose(1, 2)
    want = causal_conv1d_bwd_function(x_last, w, b, dout, None, None, None, None, False, True)
    for g, r in zip(got[:3], want[:3]):
        assert torch.equal(g, r)


def test_compat_forward_keeps_x_layout(kernel_backend):
    x, w, b, _ = _case(2, 4, 32, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, kernel_backend.device)
    y = causal_conv1d_fn(x, w, b, activation="silu")
    assert y.shape == x.shape and y.stride(2) == 1
    x_last = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(y, causal_conv1d_fn(x_last, w, b, activation="silu"))


def test_compiled_channel_first_call_matches_eager(kernel_backend):
    """The fake kernels give the channel-first strides the real ones do."""
    x, w, b, _ = _case(2, 4, 32, 4, torch.float32, torch.float32, "none", "none", True, kernel_backend.device)

    def f(x, w, b):
        return causal_conv1d_silu(x, w, b, layout="BCL") * 2

    eager = f(x, w, b)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, b)
    assert compiled.stride() == eager.stride() and torch.equal(compiled, eager)


def test_parts_above_level_two_at_their_own_size(kernel_backend):
    """From a million tokens a CTA's part is a node above level 2 without any forcing (slow on the
    emulator: GPU only)."""
    if kernel_backend.name != "cuda":
        pytest.skip("1.2M tokens: GPU only (the forced climb above covers the emulator)")
    x, w, b, _ = _case(2, 8, 600_000, 4, torch.bfloat16, torch.bfloat16, "none", "none", True, "cuda")
    got = _run(x, w, b, {}, True, "weight")
    want = _run(x.transpose(1, 2).contiguous().transpose(1, 2), w, b, {}, True, "weight")
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(got[name], want[name]), name


def test_any_strides_and_programs_of_either_layout(kernel_backend):
    """x of neither layout, and a program of the other layout than x's, give the routed call's values
    in x's layout (the custom op too, which no entry point's checks guard)."""
    dev = kernel_backend.device
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(4, 4, generator=gen).to(dev), torch.randn(4, generator=gen).to(dev)
    x = torch.randn(2, 4, 64, generator=gen).to(dev)
    want = causal_conv1d_silu(x, w, b, layout="BCL", program="reference")
    strided = torch.zeros(2, 4, 128, device=dev)
    strided[..., ::2] = x
    y = causal_conv1d_silu(strided[..., ::2], w, b, layout="BCL")  # neither layout: copied channel-first
    assert y.stride() == torch.empty_like(strided[..., ::2]).stride()
    torch.testing.assert_close(y, want)
    odd = torch.zeros(2, 65, 4, device=dev)  # (B, L, C) rows not evenly spaced, neither layout
    odd[:, :64] = x.transpose(1, 2)
    for program in ("fwd_bcl", "fwd_rows", "reference"):
        y, _ = torch.ops.conv1d_silu.fwd(odd[:, :64], w, b, None, None, None, None, None, False, True, False, program)
        torch.testing.assert_close(y.transpose(1, 2), want)
    for program in ("fwd_rows", "fwd_bcl"):  # either layout's program on channel-first x
        torch.testing.assert_close(causal_conv1d_silu(x, w, b, layout="BCL", program=program), want)
        torch.testing.assert_close(
            causal_conv1d_silu(x.transpose(1, 2).contiguous(), w, b, program=program), want.transpose(1, 2)
        )


def test_a_channel_first_backward_refuses_trailing_tokens(kernel_backend):
    dev = kernel_backend.device
    x, dy = torch.randn(32, 4, device=dev), torch.randn(32, 4, device=dev)
    w = torch.randn(4, 4, device=dev)
    doc = ops.doc_table(x, None, None, None)
    trailing = (torch.randn(3, 4, device=dev), torch.randn(3, 4, device=dev))
    with pytest.raises(ValueError, match="program: 'bwd_bcl' takes no trailing tokens"):
        ops.backward_impl(dy, x, w, None, doc, None, None, True, torch.float32, "bwd_bcl", trailing=trailing)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_staged_rounds_fit_three_ctas_per_sm(dtype):
    """The staged backward's shared memory stays within three CTAs per SM at every dtype (fp64 with
    K = 8 at 256-slab rounds would exceed a CTA's limit)."""
    for L in (4096, 1 << 20):
        launch, _, _ = gpu_bcl.backward_launches(
            dtype, dtype, dtype, 8, 1, 64, L, (64 * L, L) * 3, 16, True, 0, True, True, 1, False, False
        )
        assert launch.smem * 3 <= 227 * 1024 and launch.block % 64 == 0, (L, launch.smem, launch.block)


@pytest.mark.parametrize(
    "B,C,L,K,dtype",
    [
        (1, 3, 100, 4, torch.bfloat16),  # one row, its last slab 4 tokens long
        (3, 2, 96, 4, torch.float16),  # rows of whole slabs: tails cross into the next row
        (2, 2, 640, 4, torch.bfloat16),  # rows of whole slabs, 40 slabs
        (1, 2, 2051, 4, torch.float32),  # 1-token accesses, a round's tail vector past S
        (24, 2, 64, 4, torch.bfloat16),  # a staging thread's vectors 8 rows apart
        (3, 2, 96, 8, torch.float32),  # two tail vectors
        (1, 3, 100, 2, torch.bfloat16),
        (2, 2, 64, 6, torch.bfloat16),
    ],
)
def test_the_simple_walk_gives_the_channel_last_bits(kernel_backend, B, C, L, K, dtype):
    """The routed backward walks one sequence, or rows of whole slabs without states, with one liveness bound
    per slab; an infinite x at a row's last token must not reach the partials through the dead
    tokens after it (their g, 0, times its inf: NaN), as it does not in channel-last (without the
    activation a live token's g stays finite, so dweight is inf there, not NaN)."""
    x, w, b, kw = _case(B, C, L, K, dtype, torch.float32, "none", "none", True, kernel_backend.device)
    x[-1, 0, -1] = float("inf")
    want = _run(x.transpose(1, 2).contiguous().transpose(1, 2), w, b, kw, False, "weight")
    xx, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
    y = causal_conv1d_silu(xx, wg, bg, activation=None, layout="BCL")
    gen = torch.Generator().manual_seed(1)
    (y * torch.randn(y.shape, generator=gen).to(y)).sum().backward()
    if kernel_backend.name == "emu":
        backward = [lau.kernel for lau in ops._launcher.launches if lau.kernel.startswith("conv1d_silu_bwd_bcl<")]
        assert backward and all(k.endswith(", true, 0>") for k in backward)  # SIMPLE, staged
    for name, got in (("dx", xx.grad), ("dw", wg.grad), ("db", bg.grad)):
        torch.testing.assert_close(got, want[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert not wg.grad.isnan().any() and wg.grad[0].isinf().any()
