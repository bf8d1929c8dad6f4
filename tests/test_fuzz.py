"""Hypothesis fuzzing of every variant against the float64 naive oracle: random S, C, K, dtypes,
documents, initial / final states, strided x, non-contiguous upstream gradients. CI runs a small
fixed profile; scripts/gpu-check runs a long one (HYPOTHESIS_PROFILE=gpu)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conv1d_silu import causal_conv1d_silu
from helpers import MODES, api_kwargs, assert_close, make_case, naive_grads

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
# On the GPU most examples compile a kernel instance of their own (0.3-10 s each), so the long
# profile runs as shards that pytest-xdist spreads over its workers, each drawing its own examples;
# the derandomized CI profile stays one shard (shards would repeat each other's examples).
SHARDS = 1 if settings.default.derandomize else 6


@pytest.mark.slow(150)  # seconds on the GPU (the long profile compiles a kernel per example)
@pytest.mark.parametrize("shard", range(SHARDS))
@settings(max_examples=max(1, settings.default.max_examples // SHARDS))
@given(
    S=st.integers(0, 300),
    C=st.integers(1, 40),
    K=st.integers(2, 8),
    mode=st.sampled_from(MODES),
    bias=st.booleans(),
    init=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    fp32_weight=st.booleans(),
    row_pad=st.sampled_from([0, 0, 3, 8]),
    grad_layout=st.sampled_from(["contiguous", "strided", "channel_strided"]),
    silu=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fuzz_against_naive(backend, shard, S, C, K, mode, bias, init, dtype, fp32_weight, row_pad, grad_layout, silu, seed):
    if mode in ("seq_idx", "seq_idx_3d") and S == 0:
        S = 1
    if mode == "seq_idx_3d":
        init = False
    wdtype = torch.float32 if fp32_weight and dtype != torch.float64 else dtype
    case = make_case(S, C, K, mode, bias=bias, init=init, dtype=dtype, wdtype=wdtype, device=backend.device,
                     seed=seed, row_pad=row_pad)
    final = case["n_docs"] is not None
    x = case["x"].detach().requires_grad_()
    w = case["weight"].detach().requires_grad_()
    b = case["bias"].detach().requires_grad_() if bias else None
    kw = api_kwargs(case)
    if init:
        kw["initial_states"] = kw["initial_states"].detach().requires_grad_()
    out = causal_conv1d_silu(x, w, b, return_final_states=final, activation="silu" if silu else None, **kw)
    y, fin = out if final else (out, None)
    g = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(y.shape, generator=g).to(backend.device, dtype)
    if grad_layout == "strided":  # token stride > C: read in place
        dy = torch.cat([dy, torch.zeros_like(dy)], -1)[..., : y.shape[-1]]
    elif grad_layout == "channel_strided":  # channel stride 2: copied once
        dy = torch.stack([dy, dy], -1)[..., 0]
    grads = [y] + ([fin] if fin is not None else [])
    ups = [dy] + ([torch.randn(fin.shape, generator=g).to(backend.device, dtype)] if fin is not None else [])
    torch.autograd.backward(grads, ups)
    ref = naive_grads(case, dy.contiguous(), ups[1] if fin is not None else None, silu)
    assert_close(y, ref[0], dtype, "y")
    if fin is not None:
        assert_close(fin, ref[1], dtype, "final")
    assert_close(x.grad, ref[2], dtype, "dx")
    gw = torch.float32 if wdtype == torch.float32 and dtype != torch.float64 else wdtype
    assert_close(w.grad, ref[3], gw, "dweight")
    if bias:
        assert_close(b.grad, ref[4], gw, "dbias")
    if init:
        assert_close(kw["initial_states"].grad, ref[5], dtype, "dinitial")
