"""The PyTorch reference (the CPU kernels and the GPU tests' oracle) against an independent naive
per-document F.conv1d implementation differentiated by autograd, in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conv1d_silu import reference
from conv1d_silu.documents import doc_table
from helpers import MODES, make_case, naive_grads


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
