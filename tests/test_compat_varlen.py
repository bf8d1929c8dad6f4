"""compat.causal_conv1d_varlen_states and the shipped references (causal_conv1d_ref,
causal_conv1d_varlen_states_ref) against causal-conv1d's semantics."""

from __future__ import annotations

import pytest
import torch

from conv1d_silu.compat import causal_conv1d_ref, causal_conv1d_varlen_states, causal_conv1d_varlen_states_ref
from helpers import assert_close
from test_compat import bcl, leaves, oracle


def test_varlen_states_by_hand():
    """Sequences of 3, 0, 1 and 5 tokens, state_len 4: right-aligned tails, zeros before a start."""
    x = torch.arange(1.0, 10.0).unsqueeze(1) * torch.tensor([1.0, -1.0])  # token t holds (t+1, -(t+1))
    cu = torch.tensor([0, 3, 3, 4, 9])
    states = causal_conv1d_varlen_states(x, cu, 4)
    want = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 0, 4], [6, 7, 8, 9]], dtype=torch.float32)
    assert states.shape == (4, 2, 4) and states.stride(1) == 1
    assert torch.equal(states[:, 0], want) and torch.equal(states[:, 1], -want)
    assert torch.equal(causal_conv1d_varlen_states_ref(x, cu, 4), states)


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("state_len", [1, 4, 20])
def test_varlen_states(backend, cu_dtype, dtype, state_len):
    """x a strided split of a wider projection (mamba2's xBC.squeeze(0)); exact copies."""
    dev = backend.device
    g = torch.Generator().manual_seed(state_len)
    lengths = torch.randint(0, 30, (9,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(dev, cu_dtype)
    total = int(lengths.sum())
    x = torch.randn(total, 40, generator=g).to(dev, dtype)[:, 8:32]
    x_before = x.clone()
    states = causal_conv1d_varlen_states(x, cu, state_len)
    assert states.shape == (9, 24, state_len) and states.dtype == dtype and states.stride(1) == 1
    assert torch.equal(states, causal_conv1d_varlen_states_ref(x, cu, state_len))
    assert torch.equal(x, x_before) and not states.requires_grad


def test_varlen_states_without_tokens_or_grad(backend):
    dev = backend.device
    x = torch.randn(0, 8, device=dev)
    assert torch.equal(
        causal_conv1d_varlen_states(x, torch.zeros(3, dtype=torch.int32, device=dev), 3),
        torch.zeros(2, 8, 3, device=dev),
    )
    y = torch.randn(5, 8, device=dev, requires_grad=True)
    assert not causal_conv1d_varlen_states(y, torch.tensor([0, 5], device=dev), 3).requires_grad


@pytest.mark.parametrize(
    "exc, arg, call",
    [
        (TypeError, "x", lambda x, cu: (x.long(), cu, 4)),
        (ValueError, "x", lambda x, cu: (x[None], cu, 4)),
        (TypeError, "cu_seqlens", lambda x, cu: (x, cu.float(), 4)),
        (ValueError, "cu_seqlens", lambda x, cu: (x, cu[None], 4)),
        (ValueError, "cu_seqlens", lambda x, cu: (x, torch.tensor([0, 5, 3, 10]), 4)),
        (ValueError, "cu_seqlens", lambda x, cu: (x, torch.tensor([0, 5, 11]), 4)),
        (ValueError, "cu_seqlens", lambda x, cu: (x, torch.tensor([-1, 5, 10]), 4)),
        (ValueError, "state_len", lambda x, cu: (x, cu, 0)),
        (TypeError, "state_len", lambda x, cu: (x, cu, 2.0)),
    ],
)
def test_varlen_bad_input_is_named(exc, arg, call):
    with pytest.raises(exc, match=arg):
        causal_conv1d_varlen_states(*call(torch.randn(10, 8), torch.tensor([0, 4, 10])))


@pytest.mark.parametrize("layout", ["channel_last", "channel_first"])
@pytest.mark.parametrize("states", [False, True])
def test_shipped_causal_conv1d_ref(layout, states):
    """causal_conv1d_ref (served to causal-conv1d's own tests) agrees with the oracle, gradients too."""
    g = torch.Generator().manual_seed(4)
    x = bcl(2, 8, 3, layout, gen=g)
    w, b = torch.randn(8, 5, generator=g), torch.randn(8, generator=g)
    init = torch.randn(2, 8, 4, generator=g) if states else None
    final_out = torch.empty(2, 8, 4) if states else None
    xs = leaves(x, w, b, init)
    res = causal_conv1d_ref(*xs, return_final_states=states, final_states_out=final_out, activation="silu")
    out, final = res if states else (res, None)
    refs = leaves(*(None if t is None else t.double() for t in (x, w, b, init)))
    ro, rf = oracle(refs[0], refs[1], refs[2], None, refs[3], True)
    assert_close(out, ro, torch.float32, "out")
    if states:
        assert final is final_out
        assert_close(final, rf, torch.float32, "final_states")
    dout = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((ro * dout.double()).sum(), [t for t in refs if t is not None])
    (out * dout).sum().backward()
    for name, got, want in zip(
        ("dx", "dweight", "dbias", "dinit"), [t.grad for t in xs if t is not None], grads
    ):
        assert_close(got, want, torch.float32, name)
