"""compat.causal_conv1d_fn against causal-conv1d's semantics, re-derived here with F.conv1d (float64,
autograd), on every backend. ``oracle`` and ``bcl`` serve the other test_compat_* files too."""

from __future__ import annotations

import inspect

import pytest
import torch

from conv1d_silu import compat
from conv1d_silu.compat import causal_conv1d_fn
from helpers import assert_close, doc_spans, naive

LEAD_PADDING = pytest.mark.xfail(
    strict=True, reason="seq_idx < 0 as padding tokens waits for its GPU proof (kernels)"
)


def oracle(x, weight, bias=None, seq_idx=None, initial_states=None, silu=False):
    """causal-conv1d's forward in float64 from its semantics: per batch row (and per run of equal
    seq_idx), F.conv1d over the initial states (or zeros) followed by the tokens; tokens with
    seq_idx < 0 output 0. Returns (out (B, D, L), final_states (B, D, W-1)), differentiable."""
    batch, dim, length = x.shape
    w = weight.reshape(dim, -1).double()
    x2 = x.double().transpose(1, 2).reshape(batch * length, dim)
    init = None if initial_states is None else initial_states.double().transpose(1, 2)
    spans = doc_spans(batch * length, seq_idx=seq_idx, batch_len=length)
    y, finals = naive(x2, w, None if bias is None else bias.double(), spans, init, silu)
    if seq_idx is not None:
        y = torch.where(seq_idx.reshape(-1, 1).cpu() < 0, 0.0, y)
    out = y.reshape(batch, length, dim).transpose(1, 2)
    final = torch.stack([finals[b] for b in range(batch)]).transpose(1, 2) if seq_idx is None else None
    return out, final


def bcl(batch, dim, length, layout, dtype=torch.float32, device="cpu", gen=None):
    """x (B, D, L) in one of the memory layouts callers pass: "channel_first" (contiguous),
    "channel_last" (``h.transpose(1, 2)``), "split" (a column slice of a wider (B, L, proj)
    projection, as mamba2's xBC), "chunk" (mamba_simple's CF chunk of xz, strides (L, B*L, 1))."""

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    if layout == "channel_first":
        return rnd(batch, dim, length)
    if layout == "channel_last":
        return rnd(batch, length, dim).transpose(1, 2)
    if layout == "split":
        return rnd(batch, length, dim + 40)[..., 24 : 24 + dim].transpose(1, 2)
    if layout == "chunk":
        return rnd(2 * dim, batch, length).permute(1, 0, 2).chunk(2, dim=1)[0]
    raise AssertionError(layout)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("width", [2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["channel_last", "channel_first", "split", "chunk"])
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("mode", ["plain", "states", "seq_idx"])
def test_causal_conv1d_fn(backend, width, layout, activation, mode):
    dtype, dev = torch.float32, backend.device
    batch, dim, length = 2, 24, 37
    g = torch.Generator().manual_seed(width)
    x = bcl(batch, dim, length, layout, dtype, dev, g)
    weight = torch.randn(dim, width, generator=g).to(dev, dtype)
    bias = torch.randn(dim, generator=g).to(dev, dtype)
    init = (
        torch.randn(batch, width - 1, dim, generator=g).to(dev, dtype).transpose(1, 2)
        if mode == "states"
        else None
    )
    seq = None
    if mode == "seq_idx":
        seq = torch.tensor([[0] * 10 + [1] * 2 + [2] * 25, [0] * 37], dtype=torch.int32, device=dev)
    final_out = torch.empty(batch, dim, width - 1, device=dev, dtype=dtype) if mode == "states" else None
    xs = leaves(x, weight, bias, init)
    res = causal_conv1d_fn(
        xs[0],
        xs[1],
        xs[2],
        seq_idx=seq,
        initial_states=xs[3],
        return_final_states=mode == "states",
        final_states_out=final_out,
        activation=activation,
    )
    out, final = res if mode == "states" else (res, None)
    assert out.shape == x.shape and out.dtype == dtype
    assert out.stride() == torch.empty_like(x).stride(), (
        "out is allocated like empty_like(x)"
    )
    assert out.stride(1 if layout in ("channel_last", "split") else 2) == 1, "out keeps x's layout"
    dout = torch.randn(out.shape, generator=g).to(dev, dtype)
    dfinal = torch.randn(batch, dim, width - 1, generator=g).to(dev, dtype)
    loss = (out * dout).sum() + ((final * dfinal).sum() if final is not None else 0)
    loss.backward()

    refs = leaves(*(t.double().cpu() if t is not None else None for t in (x, weight, bias, init)))
    ro, rf = oracle(
        refs[0], refs[1], refs[2], None if seq is None else seq.cpu(), refs[3], activation is not None
    )
    rloss = (ro * dout.cpu().double()).sum() + (
        (rf * dfinal.cpu().double()).sum() if final is not None else 0
    )
    grads = torch.autograd.grad(rloss, [t for t in refs if t is not None])
    assert_close(out, ro, dtype, "out")
    if final is not None:
        assert final is final_out, "final_states_out is written in place and returned"
        assert_close(final, rf, dtype, "final_states")
    for name, got, want in zip(
        ("dx", "dweight", "dbias", "dinitial"), [t.grad for t in xs if t is not None], grads
    ):
        assert_close(got, want, dtype, name)


@pytest.mark.parametrize("layout", ["channel_last", "channel_first"])
def test_final_states_layout(backend, layout):
    """final_states come as (B, D, W-1) with stride(1) == 1, also from channel-first x and from
    sequences shorter than W-1 (part of the initial state is carried forward)."""
    x = bcl(2, 16, 2, layout, device=backend.device)
    w = torch.randn(16, 5, device=backend.device)
    init = torch.randn(2, 16, 4, device=backend.device)
    _, final = causal_conv1d_fn(x, w, initial_states=init, return_final_states=True)
    assert final.shape == (2, 16, 4) and final.stride(1) == 1
    assert torch.equal(final, torch.cat([init, x], -1)[..., -4:])


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
def test_fp32_weight_with_16_bit_x(backend, x_dtype):
    g = torch.Generator().manual_seed(1)
    x = bcl(2, 16, 50, "split", x_dtype, backend.device, g)
    w, b = (torch.randn(*s, generator=g).to(backend.device) for s in ((16, 4), (16,)))
    xs = leaves(x, w, b)
    out = causal_conv1d_fn(*xs, activation="silu")
    dout = torch.randn(out.shape, generator=g).to(backend.device, x_dtype)
    (out.float() * dout.float()).sum().backward()
    refs = leaves(*(t.double().cpu() for t in (x, w, b)))
    ro, _ = oracle(*refs, silu=True)
    grads = torch.autograd.grad((ro * dout.double().cpu()).sum(), refs)
    assert out.dtype == x_dtype
    assert_close(out, ro, x_dtype, "out")
    assert (xs[0].grad.dtype, xs[1].grad.dtype, xs[2].grad.dtype) == (x_dtype, torch.float32, torch.float32)
    for name, got, want in zip(("dx", "dweight", "dbias"), (t.grad for t in xs), grads):
        assert_close(got, want, x_dtype, name)


def test_channel_last_view_with_uneven_batch_rows(backend):
    """A channel-last view whose batch rows are not L tokens apart (a length slice of a longer
    buffer) is read like causal-conv1d reads it: any strides."""
    full = torch.randn(2, 50, 16, device=backend.device)
    x = full[:, :30].transpose(1, 2)
    w = torch.randn(16, 4, device=backend.device)
    out = causal_conv1d_fn(x, w, activation="silu")
    assert_close(out, oracle(x.cpu(), w.cpu(), silu=True)[0], torch.float32, "out")


@pytest.mark.parametrize("states", [False, True])
def test_output_can_be_modified_in_place(backend, states):
    """Callers add into the output in place (fla's ``y.add_(residual)``, causal-conv1d's tests'
    ``out += ...`` before the backward); the gradient flows through it."""
    x = bcl(2, 8, 10, "channel_last", device=backend.device).requires_grad_()
    w = torch.randn(8, 4, device=backend.device)
    init = torch.randn(2, 8, 3, device=backend.device) if states else None
    res = causal_conv1d_fn(x, w, initial_states=init, return_final_states=states, activation="silu")
    out, final = res if states else (res, None)
    out += 1.0 if final is None else final.sum(-1, keepdim=True)
    out.sum().backward()
    xr = x.detach().cpu().double().requires_grad_()
    ro, rf = oracle(xr, w.cpu(), None, None, None if init is None else init.cpu(), True)
    (dx,) = torch.autograd.grad(
        ro.sum() + (rf.sum() * x.shape[-1] if states else 0), [xr]
    )  # L outputs each add sum(final)
    assert_close(x.grad, dx, torch.float32, "dx")


def _padded_seq_idx(dtype, device):
    return torch.tensor([[0] * 5 + [1] * 20 + [-1] * 5, [2] * 30], dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_seq_idx_dtypes(backend, dtype):
    seq = torch.tensor([[0] * 7 + [1] * 23, [0] * 30], dtype=dtype, device=backend.device)
    x = bcl(2, 16, 30, "channel_last", device=backend.device)
    w = torch.randn(16, 3, device=backend.device)
    out = causal_conv1d_fn(x, w, seq_idx=seq, activation="silu")
    assert_close(out, oracle(x.cpu(), w.cpu(), seq_idx=seq.cpu(), silu=True)[0], torch.float32, "out")


@LEAD_PADDING
def test_negative_seq_idx_is_padding(backend):
    """Padding tokens (seq_idx < 0) output exactly 0, not act(bias); the others see only their run."""
    seq = _padded_seq_idx(torch.int32, backend.device)
    x = bcl(2, 16, 30, "split", device=backend.device)
    w, b = torch.randn(16, 4, device=backend.device), torch.randn(16, device=backend.device)
    out = causal_conv1d_fn(x, w, b, seq_idx=seq, activation="silu")
    assert torch.equal(out[0, :, 25:], torch.zeros_like(out[0, :, 25:]))
    assert_close(out, oracle(x.cpu(), w.cpu(), b.cpu(), seq.cpu(), silu=True)[0], torch.float32, "out")


def fragment_oracle(x, weight, bias, initial_states, seq_idx, silu):
    """causal-conv1d 1.7's packed rows with states, float64, differentiable: each run of equal
    seq_idx in a row is convolved alone; only a run that starts the row reads the row's initial
    state (later runs, and a first run after padding, start from zeros); padding runs output 0."""
    batch, dim, length = x.shape
    w = weight.reshape(dim, -1).double()
    width = w.shape[1]
    rows = []
    for b in range(batch):
        ids = seq_idx[b].tolist()
        pieces, start = [], 0
        while start < length:
            end = start + 1
            while end < length and ids[end] == ids[start]:
                end += 1
            if ids[start] < 0:
                pieces.append(x.new_zeros(dim, end - start, dtype=torch.float64))
            else:
                pre = initial_states[b].double() if start == 0 else x.new_zeros(dim, width - 1, dtype=torch.float64)
                full = torch.cat([pre, x[b, :, start:end].double()], -1)
                z = torch.nn.functional.conv1d(full[None], w[:, None], None if bias is None else bias.double(), groups=dim)[0]
                pieces.append(torch.nn.functional.silu(z) if silu else z)
            start = end
        rows.append(torch.cat(pieces, -1))
    return torch.stack(rows)


@pytest.mark.parametrize("layout", ["channel_last", "channel_first"])
def test_seq_idx_with_initial_states_feeds_each_rows_first_document(backend, layout):
    """causal-conv1d 1.7's packed rows with states (Megatron's context parallelism over packed
    sequences): through causal_conv1d_fn (autograd) and the cpp functions, y, dx, dweight, dbias and
    dinitial_states against the per-run oracle."""
    from conv1d_silu.compat import causal_conv1d_bwd_function, causal_conv1d_fwd_function

    dev = backend.device
    g = torch.Generator().manual_seed(21)
    dim, length, width = 16, 19, 4
    seq = torch.tensor(
        [[3] * 2 + [5] * 6 + [6] + [9] * 10, [1] * 3 + [4] * 9 + [6] * 7, [7] * 19], dtype=torch.int32, device=dev
    )
    x = bcl(3, dim, length, layout, device=dev, gen=g)
    w = torch.randn(dim, width, generator=g).to(dev)
    b = torch.randn(dim, generator=g).to(dev)
    init = torch.randn(3, width - 1, dim, generator=g).to(dev).transpose(1, 2)  # stride(1) == 1
    dout = torch.randn(3, dim, length, generator=g).to(dev)
    leaves = [t.detach().cpu().double().requires_grad_() for t in (x, w, b, init)]
    want = fragment_oracle(*leaves[:3], leaves[3], seq.cpu(), True)
    want_grads = torch.autograd.grad((want * dout.double().cpu()).sum(), leaves)

    xs, ws, bs, inits = (t.detach().clone().requires_grad_() for t in (x, w, b, init))
    out = causal_conv1d_fn(xs, ws, bs, seq_idx=seq, initial_states=inits, activation="silu")
    out.backward(dout)
    assert_close(out, want, torch.float32, "out")
    for name, got, ref in zip(("dx", "dweight", "dbias", "dinitial_states"), (xs.grad, ws.grad, bs.grad, inits.grad),
                              want_grads):
        assert_close(got, ref, torch.float32, name)

    out2 = causal_conv1d_fwd_function(x, w, b, seq, init, None, True)
    assert torch.equal(out2, out.detach())
    dx, dw, db, dinit = causal_conv1d_bwd_function(x, w, b, dout, seq, init, None, None, True, True)
    for got, ref in zip((dx, dw, db, dinit), (xs.grad, ws.grad, bs.grad, inits.grad)):
        assert torch.equal(got, ref)


CAUSAL_CONV1D_SIGNATURES = {
    "causal_conv1d_fn": "(x, weight, bias=None, seq_idx=None, initial_states=None, "
    "return_final_states=False, final_states_out=None, activation=None)",
    "causal_conv1d_update": "(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, "
    "conv_state_indices=None)",
    "causal_conv1d_fwd_function": "(x, weight, bias, seq_idx, initial_states, final_states_out, "
    "silu_activation)",
    "causal_conv1d_bwd_function": "(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, "
    "return_dinitial_states, silu_activation)",
    "causal_conv1d_update_function": "(x, conv_state, weight, bias, silu_activation, cache_seqlens, "
    "conv_state_indices)",
    "causal_conv1d_varlen_states": "(x, cu_seqlens, state_len)",
    "causal_conv1d_ref": "(x, weight, bias=None, initial_states=None, return_final_states=False, "
    "final_states_out=None, activation=None)",
    "causal_conv1d_update_ref": "(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None)",
    "causal_conv1d_varlen_states_ref": "(x, cu_seqlens, state_len)",
}


@pytest.mark.parametrize("name", sorted(CAUSAL_CONV1D_SIGNATURES))
def test_signature_is_causal_conv1d_s(name):
    """Names, order and defaults: transformers keeps only the keywords a function names."""
    sig = inspect.signature(getattr(compat, name))
    bare = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    assert str(sig.replace(parameters=bare, return_annotation=sig.empty)) == CAUSAL_CONV1D_SIGNATURES[name]


def _bad_calls(dev):
    x = torch.randn(2, 16, 10, device=dev)
    w = torch.randn(16, 4, device=dev)
    seq = torch.zeros(2, 10, dtype=torch.int32, device=dev)
    init = torch.randn(2, 16, 3, device=dev)
    return [
        (NotImplementedError, "activation", dict(x=x, weight=w, activation="gelu")),
        (NotImplementedError, "activation", dict(x=x, weight=w, activation="identity")),
        (TypeError, "x", dict(x=x.to(torch.int32), weight=w)),
        (ValueError, "x", dict(x=x[0], weight=w)),
        (ValueError, "weight", dict(x=x, weight=torch.randn(16, 9, device=dev))),
        (ValueError, "weight", dict(x=x, weight=torch.randn(16, 1, device=dev))),
        (ValueError, "weight", dict(x=x, weight=torch.randn(8, 4, device=dev))),
        (TypeError, "bias", dict(x=x, weight=w, bias=torch.randn(16, device=dev, dtype=torch.float64))),
        (ValueError, "bias", dict(x=x, weight=w, bias=torch.randn(8, device=dev))),
        (
            ValueError,
            "final_states_out",
            dict(x=x, weight=w, final_states_out=torch.empty(2, 16, 3, device=dev)),
        ),
        (
            ValueError,
            "final_states_out",
            dict(x=x, weight=w, return_final_states=True, final_states_out=torch.empty(2, 16, 4, device=dev)),
        ),
        (
            TypeError,
            "final_states_out",
            dict(
                x=x,
                weight=w,
                return_final_states=True,
                final_states_out=torch.empty(2, 16, 3, device=dev, dtype=torch.float16),
            ),
        ),
        (
            ValueError,
            "final_states_out",
            dict(
                x=x,
                weight=w,
                return_final_states=True,
                final_states_out=torch.empty(1, 16, 1, device=dev).expand(2, 16, 3),
            ),
        ),
        (TypeError, "return_final_states", dict(x=x, weight=w, return_final_states=1)),
        (ValueError, "return_final_states", dict(x=x, weight=w, seq_idx=seq, return_final_states=True)),
        (ValueError, "seq_idx", dict(x=x, weight=w, seq_idx=seq[:, :5])),
        (ValueError, "initial_states", dict(x=x, weight=w, initial_states=init[..., :2])),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls("cpu"))))
def test_bad_input_is_named(case):
    exc, arg, kwargs = _bad_calls("cpu")[case]
    with pytest.raises(exc, match=arg):
        causal_conv1d_fn(**kwargs)
