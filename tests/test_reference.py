"""The PyTorch reference (the CPU kernels and the GPU tests' oracle) against an independent naive
per-document F.conv1d implementation differentiated by autograd, in float64."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conv1d_silu import causal_conv1d_silu, reference
from conv1d_silu.documents import SEQ_IDX, DocTable, doc_table
from helpers import MODES, assert_close, make_case, naive_grads


def _reference(case, dy, dfinal, silu=True, return_final=True):
    x, w, b = case["x"], case["weight"], case["bias"]
    init = case.get("initial_states")
    doc = doc_table(x, case.get("seq_idx"), case.get("cu_seqlens"), init)
    want_final = return_final and doc.num_docs is not None
    y, final = reference.forward(x, w, b, doc, init, want_final, silu)
    grads = reference.backward(dy, x, w, b, doc, init, dfinal if want_final else None, silu, w.dtype)
    return (y, final) + grads


def _check(case, silu=True):
    x = case["x"]
    dy = torch.randn(x.shape, dtype=x.dtype)
    n = case["n_docs"]
    C, K = case["weight"].shape
    dfinal = torch.randn(n, K - 1, C, dtype=x.dtype) if n is not None else None
    got = _reference(case, dy, dfinal, silu)
    want = naive_grads(case, dy, dfinal, silu)
    for name, g, w in zip(("y", "final", "dx", "dweight", "dbias", "dinit"), got, want):
        if w is None:
            assert g is None, name
            continue
        torch.testing.assert_close(g.double(), w, rtol=1e-10, atol=1e-10, msg=name)


# initial states with 3-D x and seq_idx are rejected by design (no document count): not generated
MODE_INIT = [(m, i) for m in MODES for i in (False, True) if not (i and m == "seq_idx_3d")]


@pytest.mark.parametrize("mode,init", MODE_INIT)
@pytest.mark.parametrize("K", [2, 3, 4, 8])
def test_reference_matches_naive(mode, K, init):
    case = make_case(40, 5, K, mode, init=init, dtype=torch.float64, seed=K)
    _check(case)


@pytest.mark.parametrize("silu", [True, False])
def test_reference_identity_and_no_bias(silu):
    case = make_case(33, 3, 4, "cu_seqlens", bias=False, init=True, dtype=torch.float64)
    _check(case, silu)


def test_reference_documents_shorter_than_k():
    # documents of length 1 and 2 with K = 8: every window is mostly initial state
    x = torch.randn(6, 4, dtype=torch.float64)
    case = {
        "x": x,
        "weight": torch.randn(4, 8, dtype=torch.float64),
        "bias": torch.randn(4, dtype=torch.float64),
        "cu_seqlens": torch.tensor([0, 1, 1, 3, 6], dtype=torch.int32),
        "initial_states": torch.randn(4, 7, 4, dtype=torch.float64),
        "spans": [(0, 1, 0), (1, 1, 1), (1, 3, 2), (3, 6, 3)],
        "n_docs": 4,
    }
    _check(case)


@given(
    S=st.integers(0, 70),
    C=st.integers(1, 6),
    K=st.integers(2, 8),
    mode=st.sampled_from(MODES),
    init=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_reference_random_shapes(S, C, K, mode, init, bias, seed):
    if mode == "seq_idx_3d":
        init = False
    if mode in ("seq_idx", "seq_idx_3d") and S == 0:
        S = 1
    case = make_case(S, C, K, mode, bias=bias, init=init, dtype=torch.float64, seed=seed)
    _check(case)


def test_reference_accumulates_in_fp32_and_casts_once():
    x = torch.randn(64, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 4, dtype=torch.float32)
    doc = doc_table(x, None, None, None)
    y, _ = reference.forward(x, w, None, doc, None, False, True)
    y64, _ = reference.forward(x.double(), w.double(), None, doc, None, False, True)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, y64.to(torch.float32).to(torch.bfloat16)) or (y.float() - y64.float()).abs().max() < 1e-2


# ---- the sigmoid at the format's extremes, and non-finite values --------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sigmoid_within_a_few_ulp_and_exact_at_the_extremes(dtype):
    from conv1d_silu.reference import _sigmoid

    lo = -100.0 if dtype == torch.float32 else -750.0
    z = torch.cat([torch.linspace(lo, 40, 2_000_001, dtype=dtype), torch.randn(200_000, dtype=dtype) * 4])
    out, v, k, n = (torch.empty_like(z) for _ in range(4))
    _sigmoid(z, out, v, k, n)
    exact = torch.sigmoid(z.to(torch.float64))
    # within 3 units in the last place of the exact value; where that value is denormal (z below
    # about -87.3 in fp32, -708.4 in fp64), 0 or a denormal within the smallest normal (the
    # kernels flush it to 0)
    tiny = torch.finfo(dtype).tiny
    normal = exact >= tiny
    ulp = torch.finfo(dtype).eps * exact[normal]
    assert float(((out[normal].double() - exact[normal]).abs() / ulp).max()) < 3
    assert float((out[~normal].double() - exact[~normal]).abs().max()) < tiny
    big = torch.finfo(dtype).max
    special = torch.tensor([-math.inf, -big, -1e30, math.inf, big, math.nan], dtype=dtype)
    s = torch.empty_like(special)
    _sigmoid(special, s, *(torch.empty_like(special) for _ in range(3)))
    assert s[:3].tolist() == [0.0, 0.0, 0.0] and s[3:5].tolist() == [1.0, 1.0] and s[5].isnan()


# bias values that put z far out: silu(z) = z * sigmoid(z), sigmoid exactly 0 where exp(-z)
# overflows (the kernels' rcp(1 + ex2(-z log2 e))), so silu is -0 for huge negative z, NaN at -inf
# (-inf * 0), z for huge positive z and +inf; silu' is 0, NaN, 1 and NaN (+inf * 0)
EXTREME_BIAS = [-1e38, -3e38, -math.inf, math.inf, math.nan, 1e38, -100.0, -88.5, -87.0, 30.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_at_the_extremes_forward_and_backward(backend, dtype):
    """On every backend (the CPU path, the kernels' emulator, the GPU) against the float64 naive
    oracle; huge negative z gives exactly -0 and a zero gradient."""
    S, K = 40, 4
    C = len(EXTREME_BIAS) + 2  # two ordinary channels beside
    g = torch.Generator().manual_seed(7)
    case = {
        "x": torch.randn(S, C, generator=g).to(backend.device, dtype),
        "weight": (torch.randn(C, K, generator=g) * 0.5).to(backend.device, dtype),
        "bias": torch.tensor(EXTREME_BIAS + [0.5, -0.5]).to(backend.device, dtype),
        "spans": [(0, S, 0)],
        "n_docs": None,
    }
    x, w, b = (case[k].clone().requires_grad_() for k in ("x", "weight", "bias"))
    y = causal_conv1d_silu(x, w, b)
    dy = torch.randn(S, C, generator=g).to(backend.device, dtype)
    y.backward(dy)
    want = naive_grads(case, dy, None)
    got = (y, x.grad, w.grad, b.grad)
    for name, g_, ref in zip(("y", "dx", "dweight", "dbias"), got, want[:1] + want[2:5]):
        assert_close(g_, ref, dtype, name)
    huge_negative = [i for i, v in enumerate(EXTREME_BIAS) if v < -1e30 and v != -math.inf]
    assert y[:, huge_negative].eq(0).all() and y[:, huge_negative].float().signbit().all()
    assert y[:, EXTREME_BIAS.index(-math.inf)].isnan().all()
    assert (y[:, EXTREME_BIAS.index(math.inf)] == math.inf).all()
    assert w.grad[huge_negative].eq(0).all() and b.grad[huge_negative].eq(0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_finite_values_stay_in_their_document(backend, dtype):
    """NaN and Inf at a document's last and first tokens reach no other document's y or dx, though
    the CPU path computes whole windows before it fixes up the rows at document edges."""
    case = make_case(300, 6, 4, "cu_seqlens", init=True, dtype=dtype, device=backend.device, seed=3)
    case["cu_seqlens"] = torch.tensor([0, 100, 101, 103, 300], dtype=torch.int32, device=backend.device)
    case["spans"] = [(0, 100, 0), (100, 101, 1), (101, 103, 2), (103, 300, 3)]
    case["initial_states"] = case["initial_states"][:1].expand(4, -1, -1).contiguous()
    case["n_docs"] = 4
    x = case["x"].clone()
    x[99, 0], x[100, 1], x[103, 2], x[102, 3] = math.nan, math.inf, -math.inf, math.nan
    case["x"] = x
    xg = x.clone().requires_grad_()
    y = causal_conv1d_silu(xg, case["weight"], case["bias"], cu_seqlens=case["cu_seqlens"],
                           initial_states=case["initial_states"])
    dy = torch.randn_like(y)
    dy[104, 4] = math.nan  # and one in the upstream gradient, which dx of rows 101..103 must not see
    y.backward(dy)
    want = naive_grads(case, dy, None)
    assert_close(y, want[0], dtype, "y")
    assert_close(xg.grad, want[2], dtype, "dx")
    assert y[:99].isfinite().all() and xg.grad[:96].isfinite().all()


# ---- bitwise guarantees of the CPU path ----------------------------------------------------------


def _chunk_call(x, w, b, dy, cu, o, n):
    """Tokens [o, o + n) of the sequence as context parallelism runs them (conv1d_silu/distributed.py):
    the K-1 tokens before them (zero where outside their first document) as the initial state, a
    local table, the following tokens of their last document as trailing rows."""
    S, K = x.shape[0], w.shape[1]
    ids = torch.searchsorted(cu.long(), torch.arange(S), right=True) - 1
    before = torch.arange(o - (K - 1), o)
    same = (before >= 0) & (ids[before.clamp(min=0)] == ids[min(o, S - 1)])
    init = torch.where(same.unsqueeze(1), x[before.clamp(min=0)], 0.0).unsqueeze(0)
    local = (ids[o : o + n] - ids[o]).to(torch.int32) if n else ids[:0].to(torch.int32)
    doc = DocTable(SEQ_IDX, n, max(n, 1), 1, local)
    after = torch.arange(o + n, min(o + n + K - 1, S))
    after = after[ids[after] == ids[o + n - 1]] if n else after[:0]
    y, _ = reference.forward(x[o : o + n], w, b, doc, init, False, True)
    trailing = (x[after], dy[after])
    dx = reference.backward(dy[o : o + n], x[o : o + n], w, b, doc, init, None, True, w.dtype, trailing)[0]
    return y, dx


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_give_the_whole_sequence_bits(dtype):
    """Context parallelism's guarantee on the CPU path, with chunks spanning several blocks of rows
    and ending inside them, chunks shorter than K-1, and documents across chunk borders."""
    S, C, K = 2000, 37, 4  # blocks of 885 rows; rows of 37 channels end vectors anywhere
    g = torch.Generator().manual_seed(5)
    x, dy = (torch.randn(S, C, generator=g).to(dtype) for _ in range(2))
    w, b = torch.randn(C, K, generator=g).to(dtype), torch.randn(C, generator=g).to(dtype)
    cu = torch.tensor([0, 300, 301, 699, 700, 703, 1600, 2000], dtype=torch.int32)
    doc = doc_table(x, None, cu, None)
    y, _ = reference.forward(x, w, b, doc, None, False, True)
    dx = reference.backward(dy, x, w, b, doc, None, None, True, w.dtype)[0]
    cuts = [0, 2, 700, 701, 1022, 1500, 2000]
    parts = [_chunk_call(x, w, b, dy, cu, o, e - o) for o, e in itertools.pairwise(cuts)]
    assert torch.equal(torch.cat([p[0] for p in parts]), y)
    assert torch.equal(torch.cat([p[1] for p in parts]), dx)


def test_thread_count_changes_no_bits():
    """Every output, dweight and dbias included, has the same bits on one thread as on several."""
    case = make_case(3000, 64, 4, "cu_seqlens", init=True, seed=11)
    x, w, b, init = case["x"], case["weight"], case["bias"], case["initial_states"]
    doc = doc_table(x, None, case["cu_seqlens"], init)
    dy, dfinal = torch.randn_like(x), torch.randn_like(init)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            results.append(reference.forward(x, w, b, doc, init, True, True)
                           + reference.backward(dy, x, w, b, doc, init, dfinal, True, w.dtype))
    finally:
        torch.set_num_threads(threads)
    for one, several in zip(*results):
        assert torch.equal(one, several)


def test_padding_rows_are_zero_and_change_no_document():
    """seq_idx < 0 marks padding (causal-conv1d's convention): y and dx are 0 there, every real
    token has the bits it has with the padding cut out, and the padding reads no state and passes
    no gradient (dweight, dbias, dinitial as without it)."""
    C, K = 6, 4
    g = torch.Generator().manual_seed(2)
    ids = torch.tensor([0] * 9 + [-1] * 5 + [1] * 14 + [-1] * 3 + [2] * 2 + [-1] * 4, dtype=torch.int32)
    x, dy = (torch.randn(len(ids), C, generator=g) for _ in range(2))
    x[ids < 0] *= 1e3  # padding values reach no output
    w, b, init = torch.randn(C, K, generator=g), torch.randn(C, generator=g), torch.randn(3, K - 1, C, generator=g)
    real = ids >= 0
    doc = doc_table(x, ids, None, init)
    padded = reference.forward(x, w, b, doc, init, False, True)[:1]
    padded += reference.backward(dy, x, w, b, doc, init, None, True, w.dtype)
    kept = doc_table(x[real], ids[real], None, init)
    cut = reference.forward(x[real], w, b, kept, init, False, True)[:1]
    cut += reference.backward(dy[real], x[real], w, b, kept, init, None, True, w.dtype)
    y, dx, dw, db, dinit = padded
    assert y[~real].eq(0).all() and dx[~real].eq(0).all()
    assert torch.equal(y[real], cut[0]) and torch.equal(dx[real], cut[1])
    for got, want in zip((dw, db, dinit), cut[2:]):
        torch.testing.assert_close(got, want)


def test_public_reference_is_differentiable():
    """causal_conv1d_silu_ref takes autograd (its gradients are the backward's), and its output
    may be modified in place before the backward."""
    case = make_case(50, 5, 4, "cu_seqlens", init=True, dtype=torch.float64, seed=4)
    leaves = [case[k].clone().requires_grad_() for k in ("x", "weight", "bias", "initial_states")]
    y, final = reference.causal_conv1d_silu_ref(*leaves[:3], cu_seqlens=case["cu_seqlens"],
                                                initial_states=leaves[3], return_final_states=True)
    dy, dfinal = torch.randn_like(y), torch.randn_like(final)
    y.mul_(1.0)
    got = torch.autograd.grad((y * dy).sum() + (final * dfinal).sum(), leaves)
    want = naive_grads(case, dy, dfinal)[2:]
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g, w_, rtol=1e-10, atol=1e-10)
