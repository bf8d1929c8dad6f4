"""The public op end to end (forward, autograd backward) against the float64 naive oracle, on
every backend: the CPU reference, the CUDA templates under the CPU emulator, and the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conv1d_silu import causal_conv1d_silu, routes
from helpers import api_kwargs, assert_close, make_case, naive_grads

CONFIGS = {
    "plain": dict(S=100, C=8, K=4, mode="single"),
    "odd_C": dict(S=77, C=7, K=4, mode="single"),
    "cu_seqlens_states": dict(S=300, C=24, K=3, mode="cu_seqlens", init=True),
    "seq_idx_states_K8": dict(S=257, C=16, K=8, mode="seq_idx", init=True),
    "batch_states_K2": dict(S=128, C=8, K=2, mode="batch", init=True),
    "seq_idx_3d": dict(S=96, C=12, K=4, mode="seq_idx_3d"),
    "identity_no_bias": dict(S=70, C=16, K=5, mode="single", bias=False, activation=None),
    "strided_x": dict(S=200, C=16, K=4, mode="single", row_pad=8),
    "one_token": dict(S=1, C=8, K=4, mode="single", init=True),
    "shorter_than_K": dict(S=3, C=8, K=4, mode="cu_seqlens", init=True),
    "long_tree": dict(S=2600, C=8, K=4, mode="cu_seqlens"),
}
DTYPES = {
    "f32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "f16": (torch.float16, None),
    "bf16_w32": (torch.bfloat16, torch.float32),
    "f64": (torch.float64, None),
}


def run(case, *, dtype_w=None, activation="silu", return_final=None, program=None, grad_dtype=None):
    """Forward + backward through the public API. Returns outputs, grads and the upstream grads."""
    C, K = case["weight"].shape
    x = case["x"].detach().requires_grad_()
    w = case["weight"].detach().requires_grad_()
    b = case["bias"].detach().requires_grad_() if case["bias"] is not None else None
    kw = api_kwargs(case)
    if "initial_states" in kw:
        kw["initial_states"] = kw["initial_states"].detach().requires_grad_()
    if return_final is None:
        return_final = case["n_docs"] is not None
    out = causal_conv1d_silu(
        x, w, b, **kw, return_final_states=return_final, activation=activation, program=program, grad_dtype=grad_dtype
    )
    y, final = out if return_final else (out, None)
    dy = torch.randn_like(y)
    loss = (y.double() * dy.double()).sum()
    dfinal = None
    if final is not None:
        dfinal = torch.randn_like(final)
        loss = loss + (final.double() * dfinal.double()).sum()
    loss.backward()
    init = kw.get("initial_states")
    grads = (x.grad, w.grad, None if b is None else b.grad, None if init is None else init.grad)
    return y, final, grads, dy, dfinal


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtypes", DTYPES)
def test_matches_naive(backend, config, dtypes):
    cfg = dict(CONFIGS[config])
    activation = cfg.pop("activation", "silu")
    dtype, wdtype = DTYPES[dtypes]
    case = make_case(**cfg, dtype=dtype, wdtype=wdtype, device=backend.device, seed=len(config))
    y, final, grads, dy, dfinal = run(case, activation=activation)
    ref = naive_grads(case, dy, dfinal, silu=activation is not None)
    assert y.dtype == dtype and y.is_contiguous()
    assert_close(y, ref[0], dtype, "y")
    if final is not None:
        assert final.dtype == dtype
        assert_close(final, ref[1], dtype, "final_states")
    names = ("dx", "dweight", "dbias", "dinitial")
    for name, g, r in zip(names, grads, ref[2:]):
        if r is None:
            assert g is None, name
            continue
        assert g.dtype == (dtype if name in ("dx", "dinitial") else (wdtype or dtype)), name
        if name == "dweight":
            r = r.reshape(g.shape)
        assert_close(g, r, dtype if name == "dx" else g.dtype, name)  # weight grads at their own dtype's tolerance


NAMED_VARIANTS = {
    "fwd": dict(direction="fwd", bias=False, docs=False),
    "fwd_bias": dict(direction="fwd", bias=True, docs=False),
    "fwd_dt": dict(direction="fwd", bias=True, docs=True),
    "bwd": dict(direction="bwd", bias=False, docs=False),
    "bwd_bias": dict(direction="bwd", bias=True, docs=False),
    "bwd_dt": dict(direction="bwd", bias=True, docs=True),
    "bwd_fp32g": dict(direction="bwd", bias=False, docs=False, fp32=True),
    "bwd_bias_fp32g": dict(direction="bwd", bias=True, docs=False, fp32=True),
}


@pytest.mark.parametrize("variant", NAMED_VARIANTS)
def test_named_variants(backend, variant):
    """Each of the 8 variant names of the route table: routed by that name and correct."""
    v = NAMED_VARIANTS[variant]
    fp32 = v.get("fp32", False)
    assert routes.variant_name(v["direction"], v["bias"], v["docs"], fp32) == variant
    case = make_case(
        150, 16, 4, "cu_seqlens" if v["docs"] else "single", bias=v["bias"], dtype=torch.bfloat16,
        device=backend.device,
    )
    if not fp32:
        y, final, grads, dy, dfinal = run(case, return_final=False)
    else:  # fp32 weight gradients of 16-bit weights go into fp32 main_grad buffers
        x = case["x"].detach().requires_grad_()
        C, K = case["weight"].shape
        main = (torch.zeros(C, K, device=backend.device), torch.zeros(C, device=backend.device) if v["bias"] else None)
        y = causal_conv1d_silu(x, case["weight"], case["bias"], **api_kwargs(case), grad_dtype=torch.float32,
                               weight_main_grad=main[0], bias_main_grad=main[1])
        dy = torch.randn_like(y)
        y.backward(dy)
        grads = (x.grad, *main)
    ref = naive_grads(case, dy, None)
    assert_close(y, ref[0], torch.bfloat16, "y")
    assert_close(grads[0], ref[2], torch.bfloat16, "dx")
    grad_dtype = torch.float32 if fp32 else torch.bfloat16
    assert_close(grads[1], ref[3].reshape(grads[1].shape), grad_dtype, "dweight")
    if v["bias"]:
        assert_close(grads[2], ref[4], grad_dtype, "dbias")


def test_empty_sequence(backend):
    x = torch.randn(0, 8, device=backend.device, requires_grad=True)
    w = torch.randn(8, 4, device=backend.device, requires_grad=True)
    b = torch.randn(8, device=backend.device, requires_grad=True)
    init = torch.randn(1, 3, 8, device=backend.device, requires_grad=True)
    y, final = causal_conv1d_silu(x, w, b, initial_states=init, return_final_states=True)
    assert y.shape == (0, 8) and torch.equal(final, init.detach())
    (y.sum() + final.sum()).backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))
    assert torch.equal(init.grad, torch.ones_like(init))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_and_inf_propagate_like_reference(backend, dtype):
    case = make_case(64, 8, 4, "single", dtype=dtype, device=backend.device)
    x = case["x"].clone()
    x[5, 1] = float("nan")
    x[20, 3] = float("inf")
    x[30, 4] = float("-inf")
    case["x"] = x
    y, _, grads, dy, _ = run(case, return_final=False)
    ref = naive_grads(case, dy, None)
    assert_close(y, ref[0], dtype, "y")
    assert_close(grads[0], ref[2], dtype, "dx")


def test_noncontiguous_upstream_gradient(backend):
    case = make_case(90, 16, 4, "single", device=backend.device)
    x = case["x"].detach().requires_grad_()
    y = causal_conv1d_silu(x, case["weight"], case["bias"])
    big = torch.randn(90, 32, device=backend.device)
    y.backward(big[:, ::2])  # channel stride 2: copied once; token stride 64 would be read in place
    ref = naive_grads(case, big[:, ::2].contiguous(), None)
    assert_close(x.grad, ref[2], torch.float32, "dx")


def test_main_grad_accumulates_in_place(backend):
    case = make_case(120, 16, 4, "single", dtype=torch.bfloat16, device=backend.device)
    w = case["weight"].detach().requires_grad_()
    b = case["bias"].detach().requires_grad_()
    wmg = torch.full((16, 4), 0.5, device=backend.device)
    bmg = torch.full((16,), -0.25, device=backend.device)
    x = case["x"]
    y = causal_conv1d_silu(x, w, b, weight_main_grad=wmg, bias_main_grad=bmg)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert w.grad is None and b.grad is None
    ref = naive_grads(case, dy, None)
    assert_close(wmg, 0.5 + ref[3], torch.float32, "main_grad")
    assert_close(bmg, -0.25 + ref[4], torch.float32, "bias main_grad")


def test_fp32_master_weights_give_fp32_grads(backend):
    case = make_case(200, 16, 4, "cu_seqlens", dtype=torch.bfloat16, wdtype=torch.float32, device=backend.device)
    _, _, grads, dy, _ = run(case, return_final=False)
    assert grads[1].dtype == torch.float32 and grads[2].dtype == torch.float32
    ref = naive_grads(case, dy, None)
    assert_close(grads[1], ref[3], torch.float32, "dweight")


@pytest.mark.parametrize("mode", ["cu_seqlens", "seq_idx"])
def test_int64_tables_give_the_int32_bits(backend, mode):
    """flash-linear-attention passes int64 cu_seqlens: converted once per call, same bits."""
    case = make_case(300, 24, 4, mode, init=True, dtype=torch.bfloat16, device=backend.device)
    first = run(case)
    kw = api_kwargs(case)
    table = "cu_seqlens" if mode == "cu_seqlens" else "seq_idx"
    case[table] = kw[table].long()
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0) if torch.cuda.is_available() else None
    second = run(case)
    for a, b in zip((first[0], first[1], *first[2]), (second[0], second[1], *second[2])):
        assert (a is None and b is None) or torch.equal(a, b)


def _padded_case(device, two_d: bool, K: int = 4, C: int = 12):
    """seq_idx with padding (-1) the way causal-conv1d's callers pad: between documents and at the
    end of each row; with 2-D x, initial states for every document id."""
    g = torch.Generator().manual_seed(11)
    if two_d:
        ids = [0] * 9 + [1] * 2 + [-1] * 5 + [2] * 14 + [-1] * 3 + [4] * 1 + [-1] * 4
        seq = torch.tensor(ids, dtype=torch.int32)
        x = torch.randn(len(ids), C, generator=g)
        init = torch.randn(5, K - 1, C, generator=g)
    else:
        rows = [[0] * 20 + [-1] * 6, [1] * 3 + [2] * 15 + [-1] * 8]
        seq = torch.tensor(rows, dtype=torch.int32)
        x = torch.randn(2, 26, C, generator=g)
        init = None
    w, b = torch.randn(C, K, generator=g), torch.randn(C, generator=g)
    return [t.to(device) if t is not None else None for t in (x, w, b, seq, init)]


@pytest.mark.parametrize("two_d", [True, False], ids=["packed_with_states", "rows"])
def test_negative_seq_idx_is_padding(backend, two_d):
    """Padding tokens (seq_idx < 0) output exactly 0, take and pass no gradient, and read and write
    no state; every document equals the same document run alone."""
    x, w, b, seq, init = _padded_case(backend.device, two_d)
    C, K = w.shape
    leaves = [t.detach().requires_grad_() for t in (x, w, b)] + ([init.detach().requires_grad_()] if two_d else [])
    kw = dict(seq_idx=seq, initial_states=leaves[3], return_final_states=True) if two_d else dict(seq_idx=seq)
    out = causal_conv1d_silu(*leaves[:3], **kw)
    y, final = out if two_d else (out, None)
    dy = torch.randn_like(y)
    loss = (y.double() * dy.double()).sum()
    if two_d:
        dfinal = torch.randn_like(final)
        loss = loss + (final.double() * dfinal.double()).sum()
    grads = torch.autograd.grad(loss, leaves)

    pad = (seq < 0).reshape(y.shape[:-1])
    assert torch.equal(y[pad], torch.zeros_like(y[pad])), "padding outputs exactly 0"
    assert torch.equal(grads[0][pad], torch.zeros_like(grads[0][pad])), "padding gets no gradient"

    # the oracle: each document alone (float64), padding left out
    x64, w64, b64 = (t.detach().cpu().double().requires_grad_() for t in (x, w, b))
    init64 = init.detach().cpu().double().requires_grad_() if two_d else None
    flat_x, flat_seq, flat_dy = x64.reshape(-1, C), seq.cpu().reshape(-1), dy.detach().cpu().double().reshape(-1, C)
    want_y = torch.zeros_like(flat_x)
    ref_loss = 0
    row_len = flat_seq.numel() if two_d else seq.shape[1]
    t = 0
    while t < flat_seq.numel():
        e = t + 1
        while e < flat_seq.numel() and flat_seq[e] == flat_seq[t] and e % row_len:
            e += 1
        d = int(flat_seq[t])
        if d >= 0:
            pre = init64[d] if two_d else flat_x.new_zeros(K - 1, C)
            full = torch.cat([pre, flat_x[t:e]])
            z = F.conv1d(full.T[None], w64[:, None], b64, groups=C)[0].T
            want_y[t:e] = F.silu(z)
            ref_loss = ref_loss + (F.silu(z) * flat_dy[t:e]).sum()
            if two_d:
                ref_loss = ref_loss + (full[-(K - 1):] * dfinal[d].detach().cpu().double()).sum()
        t = e
    if two_d:  # ids without tokens: their final state is their initial state
        for d in set(range(init.shape[0])) - set(flat_seq.tolist()):
            ref_loss = ref_loss + (init64[d] * dfinal[d].detach().cpu().double()).sum()
    assert_close(y.reshape(-1, C), want_y.to(y.dtype), y.dtype, "y")
    want = torch.autograd.grad(ref_loss, [x64, w64, b64] + ([init64] if two_d else []))
    names = ("dx", "dweight", "dbias", "dinitial")
    for got, ref, name in zip(grads, want, names):
        assert_close(got, ref.to(got.dtype), torch.float32, name)
    if two_d:  # id 3 has no tokens: its final state is its initial state, untouched by padding
        assert torch.equal(final[3], init[3])


def test_padding_must_not_join_or_reorder_documents():
    x, w = torch.randn(6, 4), torch.randn(4, 4)
    for ids, message in (([0, 0, -1, 0, 1, 1], "new document after padding"), ([1, 1, -1, 0, 0, 0], "non-decreasing")):
        with pytest.raises(ValueError, match=message):
            causal_conv1d_silu(x, w, seq_idx=torch.tensor(ids, dtype=torch.int32))
    y = causal_conv1d_silu(x, w, seq_idx=torch.full((6,), -1, dtype=torch.int32))
    assert torch.equal(y, torch.zeros_like(y))
