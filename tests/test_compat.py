"""compat.causal_conv1d_fn / causal_conv1d_update against causal-conv1d's documented semantics,
re-derived here with F.conv1d (float64, autograd), on every backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conv1d_silu.compat import causal_conv1d_fn, causal_conv1d_update
from helpers import TOL, assert_close


def ref_fn(x, weight, bias, initial_states, activation, seq_idx=None):
    """causal-conv1d's reference semantics, per batch row (and per seq_idx segment)."""
    batch, dim, L = x.shape
    width = weight.shape[1]
    outs, finals = [], []
    for b in range(batch):
        row = x[b]
        pieces = []
        bounds = [0, L]
        if seq_idx is not None:
            ids = seq_idx[b].tolist()
            bounds = [0] + [t for t in range(1, L) if ids[t] != ids[t - 1]] + [L]
        for s, e in zip(bounds[:-1], bounds[1:]):
            pre = initial_states[b] if (initial_states is not None and s == 0) else row.new_zeros(dim, width - 1)
            full = torch.cat([pre, row[:, s:e]], dim=1)
            z = F.conv1d(full[None], weight[:, None], bias, groups=dim)[0]
            pieces.append(F.silu(z) if activation else z)
        outs.append(torch.cat(pieces, dim=1))
        pre = initial_states[b] if initial_states is not None else row.new_zeros(dim, width - 1)
        finals.append(torch.cat([pre, row], dim=1)[:, -(width - 1):])
    return torch.stack(outs), torch.stack(finals)


@pytest.mark.parametrize("width", [2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["channel_last", "channel_first"])
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("mode", ["plain", "states", "seq_idx"])
def test_causal_conv1d_fn(backend, width, layout, activation, mode):
    dtype = torch.float32
    batch, dim, L = 2, 24, 37
    g = torch.Generator().manual_seed(width)
    if layout == "channel_last":
        x = torch.randn(batch, L, dim, generator=g).to(backend.device, dtype).transpose(1, 2)
    else:
        x = torch.randn(batch, dim, L, generator=g).to(backend.device, dtype)
    weight = torch.randn(dim, width, generator=g).to(backend.device, dtype)
    bias = torch.randn(dim, generator=g).to(backend.device, dtype)
    init = torch.randn(batch, dim, width - 1, generator=g).to(backend.device, dtype) if mode == "states" else None
    seq = None
    if mode == "seq_idx":
        seq = torch.tensor([[0] * 10 + [1] * 2 + [2] * 25, [0] * 37], dtype=torch.int32, device=backend.device)
    xs = [t.detach().requires_grad_() if t is not None else None for t in (x, weight, bias, init)]
    final_out = torch.empty(batch, dim, width - 1, device=backend.device, dtype=dtype) if mode == "states" else None
    res = causal_conv1d_fn(xs[0], xs[1], xs[2], seq_idx=seq, initial_states=xs[3],
                           return_final_states=mode == "states", final_states_out=final_out, activation=activation)
    out, final = res if mode == "states" else (res, None)
    assert out.shape == x.shape and out.stride() == x.stride(), "output keeps x's layout"
    dout = torch.randn_like(out)
    loss = (out * dout).sum() + ((final * 2.0).sum() if final is not None else 0)
    loss.backward()

    r = [t.detach().cpu().double().requires_grad_() if t is not None else None for t in (x, weight, bias, init)]
    ro, rf = ref_fn(r[0], r[1], r[2], r[3], activation, None if seq is None else seq.cpu())
    rloss = (ro * dout.cpu().double()).sum() + ((rf * 2.0).sum() if mode == "states" else 0)
    grads = torch.autograd.grad(rloss, [t for t in r if t is not None])
    assert_close(out, ro, dtype, "out")
    if final is not None:
        assert final is final_out
        assert_close(final, rf, dtype, "final_states")
    for name, got, want in zip(("dx", "dweight", "dbias", "dinitial"), [t.grad for t in xs if t is not None], grads):
        assert_close(got, want, dtype, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_fn_dtypes(backend, dtype):
    x = torch.randn(2, 16, 50, device=backend.device).to(dtype)
    w = torch.randn(16, 4, device=backend.device).to(dtype)
    out = causal_conv1d_fn(x, w, activation="silu")
    ro, _ = ref_fn(x.double().cpu(), w.double().cpu(), None, None, "silu")
    assert out.dtype == dtype
    assert_close(out, ro, dtype, "out")


def naive_update(x, state, weight, bias, silu):
    """Append the new tokens to the state and convolve them, one token at a time."""
    width = weight.shape[1]
    outs = []
    for t in range(x.shape[-1]):
        state = torch.cat([state, x[..., t : t + 1]], dim=-1)
        win = state[..., -width:]
        z = (win * weight).sum(-1) + (bias if bias is not None else 0)
        outs.append(F.silu(z) if silu else z)
    return torch.stack(outs, -1), state


@pytest.mark.parametrize("seqlen", [None, 1, 3])
@pytest.mark.parametrize("state_len", [3, 6])
def test_causal_conv1d_update(backend, seqlen, state_len):
    dev = backend.device
    batch, dim, width = 3, 8, 4
    x = torch.randn(batch, dim, seqlen or 1, device=dev, dtype=torch.float64)
    state = torch.randn(batch, dim, state_len, device=dev, dtype=torch.float64)
    w = torch.randn(dim, width, device=dev, dtype=torch.float64)
    b = torch.randn(dim, device=dev, dtype=torch.float64)
    want, full = naive_update(x, state.clone(), w, b, True)
    got_state = state.clone()
    got = causal_conv1d_update(x if seqlen else x[..., 0], got_state, w, b, activation="silu")
    assert_close(got, want if seqlen else want[..., 0], torch.float64, "out")
    assert_close(got_state, full[..., -state_len:], torch.float64, "state")


def test_causal_conv1d_update_circular_and_indices(backend):
    dev = backend.device
    dim, width, state_len = 4, 4, 5
    big = torch.randn(6, dim, state_len, device=dev, dtype=torch.float64)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=dev)
    cache = torch.tensor([7, 0, 2], dtype=torch.int32, device=dev)
    x = torch.randn(3, dim, 2, device=dev, dtype=torch.float64)
    w = torch.randn(dim, width, device=dev, dtype=torch.float64)
    before = big.clone()
    out = causal_conv1d_update(x, big, w, None, activation=None, cache_seqlens=cache, conv_state_indices=idx)
    for b, row in enumerate(idx.tolist()):
        if row < 0:
            assert torch.equal(out[b], torch.zeros_like(out[b]))
            continue
        start = int(cache[b])
        ring = before[row]
        ordered = torch.stack([ring[:, (start - (width - 1) + j) % state_len] for j in range(width - 1)], -1)
        want, _ = naive_update(x[b : b + 1], ordered[None], w, None, False)
        assert_close(out[b], want[0], torch.float64, "out")
        for t in range(2):
            assert torch.equal(big[row][:, (start + t) % state_len], x[b][:, t])
    assert torch.equal(big[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    assert TOL[torch.float64] < 1e-6
