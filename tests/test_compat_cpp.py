"""compat's causal_conv1d_fwd_function / causal_conv1d_bwd_function (causal-conv1d's cpp_functions), called
as mamba_ssm's fused paths and fla call them, against the float64 oracle of test_compat."""

from __future__ import annotations

import pytest
import torch

from conv1d_silu.compat import causal_conv1d_bwd_function, causal_conv1d_fwd_function
from helpers import assert_close
from test_compat import bcl, leaves, oracle


def oracle_grads(x, weight, bias, dout, seq_idx=None, initial_states=None, dfinal=None, silu=True):
    """(out, final, dx, dweight, dbias, dinitial) of the oracle, float64 on the CPU."""
    refs = leaves(*(None if t is None else t.double().cpu() for t in (x, weight, bias, initial_states)))
    init = refs[3]
    if init is None and dfinal is not None:  # the gradient w.r.t. the zero padding
        init = refs[3] = torch.zeros(
            x.shape[0], x.shape[1], weight.shape[-1] - 1, dtype=torch.float64, requires_grad=True
        )
    out, final = oracle(refs[0], refs[1], refs[2], None if seq_idx is None else seq_idx.cpu(), init, silu)
    loss = (out * dout.double().cpu()).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal.double().cpu()).sum()
    wanted = [t for t in refs if t is not None]
    grads = dict(
        zip(
            [n for n, t in zip(("dx", "dweight", "dbias", "dinit"), refs) if t is not None],
            torch.autograd.grad(loss, wanted),
        )
    )
    return out.detach(), None if final is None else final.detach(), grads


@pytest.mark.parametrize("layout", ["channel_last", "channel_first", "split", "chunk"])
@pytest.mark.parametrize("silu", [False, True])
def test_fwd_function(backend, layout, silu):
    dev = backend.device
    x = bcl(2, 16, 21, layout, device=dev)
    w = torch.randn(16, 4, device=dev, requires_grad=True)
    b = torch.randn(16, device=dev, requires_grad=True)
    out = causal_conv1d_fwd_function(x, w, b, None, None, None, silu)
    assert not out.requires_grad, "no autograd: mamba_ssm calls it inside its own Function"
    assert_close(out, oracle(x.cpu(), w.detach().cpu(), b.detach().cpu(), silu=silu)[0], torch.float32, "out")


def test_fwd_function_states(backend):
    dev = backend.device
    x = bcl(2, 16, 21, "split", device=dev)
    w = torch.randn(16, 3, device=dev)
    init = torch.randn(2, 2, 16, device=dev).transpose(1, 2)
    final = torch.empty(2, 2, 16, device=dev).transpose(1, 2)
    out = causal_conv1d_fwd_function(x, w, None, None, init, final, True)
    want, want_final = oracle(x.cpu(), w.cpu(), None, None, init.cpu(), True)
    assert_close(out, want, torch.float32, "out")
    assert torch.equal(final.cpu(), want_final.float()), "final_states_out written in place"


@pytest.mark.parametrize("layout", ["channel_last", "channel_first", "split", "chunk"])
@pytest.mark.parametrize("bias", [False, True])
def test_bwd_function_allocates_dx_in_x_layout(backend, layout, bias):
    dev = backend.device
    g = torch.Generator().manual_seed(3)
    x = bcl(2, 16, 33, layout, device=dev, gen=g)
    w = torch.randn(16, 4, generator=g).to(dev)
    b = torch.randn(16, generator=g).to(dev) if bias else None
    dout = bcl(2, 16, 33, layout, device=dev, gen=g)
    dx, dw, db, dinit = causal_conv1d_bwd_function(x, w, b, dout, None, None, None, None, False, True)
    _, _, want = oracle_grads(x, w, b, dout)
    assert dx.stride() == torch.empty_like(x).stride()
    assert dx.stride(1 if layout in ("channel_last", "split") else 2) == 1
    assert_close(dx, want["dx"], torch.float32, "dx")
    assert_close(dw, want["dweight"], torch.float32, "dweight")
    assert dinit is None and (db is None) == (not bias)
    if bias:
        assert_close(db, want["dbias"], torch.float32, "dbias")


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_bwd_function_returns_parameter_dtypes(backend, wdtype):
    dev = backend.device
    x = bcl(2, 16, 20, "split", torch.bfloat16, dev)
    w, b = torch.randn(16, 4, device=dev, dtype=wdtype), torch.randn(16, device=dev, dtype=wdtype)
    dout = torch.randn_like(x)
    dx, dw, db, _ = causal_conv1d_bwd_function(x, w, b, dout, None, None, None, None, False, True)
    assert (dx.dtype, dw.dtype, db.dtype) == (torch.bfloat16, wdtype, wdtype)
    _, _, want = oracle_grads(x, w, b, dout)
    for name, got in (("dx", dx), ("dweight", dw), ("dbias", db)):
        assert_close(got, want[name], torch.bfloat16, name)


@pytest.mark.parametrize("given", [False, True])
def test_bwd_function_states(backend, given):
    """dinitial_states (B, D, W-1) with stride(1) == 1, and dfinal_states adding its gradient; without
    initial_states, dinitial_states is the gradient w.r.t. the zero padding."""
    dev = backend.device
    x = bcl(2, 16, 2, "channel_last", device=dev)  # shorter than W-1: final states hold initial ones
    w = torch.randn(16, 5, device=dev)
    init = torch.randn(2, 4, 16, device=dev).transpose(1, 2) if given else None
    dout, dfinal = torch.randn(2, 16, 2, device=dev), torch.randn(2, 16, 4, device=dev)
    dx, dw, db, dinit = causal_conv1d_bwd_function(x, w, None, dout, None, init, dfinal, None, True, True)
    _, _, want = oracle_grads(x, w, None, dout, initial_states=init, dfinal=dfinal)
    assert dinit.shape == (2, 16, 4) and dinit.stride(1) == 1 and db is None
    for name, got in (("dx", dx), ("dweight", dw), ("dinit", dinit)):
        assert_close(got, want[name], torch.float32, name)


def test_bwd_function_dx_may_overlap_its_inputs(backend):
    """dx written over dout (or x) still gets the gradient: it is computed in storage of its own."""
    dev = backend.device
    x = bcl(2, 16, 40, "channel_last", device=dev)
    w = torch.randn(16, 4, device=dev)
    dout = torch.randn(2, 40, 16, device=dev).transpose(1, 2)
    _, _, want = oracle_grads(x, w, None, dout)
    for target in ("dout", "x"):
        xx, dd = x.clone(), dout.clone()
        buf = dd if target == "dout" else xx
        dx, *_ = causal_conv1d_bwd_function(xx, w, None, dd, None, None, None, buf, False, True)
        assert dx is buf
        assert_close(buf, want["dx"], torch.float32, f"dx over {target}")


def test_mamba_inner_fn_style(backend):
    """MambaInnerFn: x is the channel-first chunk of xz (strides (L, B*L, 1)), dout is rearranged
    "d (b l) -> b d l", and dx is the chunk of a fresh dxz: written in place, the return value
    discarded; the other half of dxz (dz) is left alone."""
    dev = backend.device
    batch, dim, length, d_model = 2, 16, 25, 12
    g = torch.Generator().manual_seed(7)
    h = torch.randn(batch, length, d_model, generator=g).to(dev)
    w_in = torch.randn(2 * dim, d_model, generator=g).to(dev)
    xz = (w_in @ h.reshape(batch * length, d_model).t()).reshape(2 * dim, batch, length).permute(1, 0, 2)
    xz = xz.contiguous() if xz.stride(-1) != 1 else xz  # mamba_simple's xz stays (L, B*L, 1)
    x, _ = xz.chunk(2, dim=1)
    conv1d_weight = torch.randn(dim, 1, 4, generator=g).to(dev)[:, 0, :]
    conv1d_bias = torch.randn(dim, generator=g).to(dev).contiguous()
    conv1d_out = causal_conv1d_fwd_function(x, conv1d_weight, conv1d_bias, None, None, None, True)
    dconv1d_out = (
        torch.randn(dim, batch * length, generator=g).to(dev).reshape(dim, batch, length).permute(1, 0, 2)
    )
    dxz = torch.empty_like(xz).fill_(7.0)
    dx, dz = dxz.chunk(2, dim=1)
    causal_conv1d_bwd_function(x, conv1d_weight, conv1d_bias, dconv1d_out, None, None, None, dx, False, True)
    out, _, want = oracle_grads(x, conv1d_weight, conv1d_bias, dconv1d_out)
    assert_close(conv1d_out, out, torch.float32, "conv1d_out")
    assert_close(dxz[:, :dim], want["dx"], torch.float32, "dx (in dxz)")
    assert torch.equal(dz, torch.full_like(dz, 7.0)), "dz untouched"


@pytest.mark.parametrize("seq_idx", [False, True])
def test_mamba_split_conv1d_scan_combined_style(backend, seq_idx):
    """MambaSplitConv1dScanCombinedFn: xBC is a split of zxbcdt (B, L, proj), passed as the
    channel-last view "b s d -> b d s"; dout is a fresh dense dxBC; dx is the same split of
    dzxbcdt = empty_like(zxbcdt): written in place, the other splits left alone."""
    dev = backend.device
    batch, length, d_ssm, conv_dim, nheads = 2, 30, 16, 32, 4
    sizes = [d_ssm, conv_dim, nheads]
    g = torch.Generator().manual_seed(9)
    zxbcdt = torch.randn(batch, length, sum(sizes), generator=g).to(dev)
    _, xBC, _ = torch.split(zxbcdt, sizes, dim=-1)
    weight = torch.randn(conv_dim, 4, generator=g).to(dev)
    bias = torch.randn(conv_dim, generator=g).to(dev)
    seq = None
    if seq_idx:
        seq = torch.tensor([[0] * 9 + [1] * 21, [0] * 30], dtype=torch.int32, device=dev).contiguous()
    xBC_conv = causal_conv1d_fwd_function(xBC.transpose(1, 2), weight, bias, seq, None, None, True).transpose(
        1, 2
    )
    dxBC = torch.randn(xBC.shape, generator=g).to(dev)
    dzxbcdt = torch.full_like(zxbcdt, 3.0)
    dz, dxBC_given, ddt = torch.split(dzxbcdt, sizes, dim=-1)
    _, dweight, dbias, _ = causal_conv1d_bwd_function(
        xBC.transpose(1, 2),
        weight,
        bias,
        dxBC.transpose(1, 2),
        seq,
        None,
        None,
        dxBC_given.transpose(1, 2),
        False,
        True,
    )
    out, _, want = oracle_grads(xBC.transpose(1, 2), weight, bias, dxBC.transpose(1, 2), seq_idx=seq)
    assert_close(xBC_conv.transpose(1, 2), out, torch.float32, "xBC_conv")
    assert_close(dxBC_given.transpose(1, 2), want["dx"], torch.float32, "dx (in dzxbcdt)")
    assert_close(dweight, want["dweight"], torch.float32, "dweight")
    assert_close(dbias, want["dbias"], torch.float32, "dbias")
    assert torch.equal(dz, torch.full_like(dz, 3.0)) and torch.equal(ddt, torch.full_like(ddt, 3.0))


def test_fla_mix_backward_style(backend):
    """fla's FastCausalConv1dFn.backward: x the saved (B, T, D) rearranged to channel-last, dx a
    preallocated contiguous (B, T, D) rearranged too; the returned dx is used."""
    dev = backend.device
    x = torch.randn(1, 40, 24, device=dev)
    weight, bias = torch.randn(24, 3, device=dev), torch.randn(24, device=dev)
    dout = torch.randn(1, 40, 24, device=dev)
    seq = torch.tensor([[0] * 13 + [1] * 27], dtype=torch.int32, device=dev)
    dx_buf = torch.empty_like(x, memory_format=torch.contiguous_format).transpose(1, 2)
    dx, dw, db, dinit = causal_conv1d_bwd_function(
        x.transpose(1, 2), weight, bias, dout.transpose(1, 2), seq, None, None, dx_buf, False, False
    )
    _, _, want = oracle_grads(x.transpose(1, 2), weight, bias, dout.transpose(1, 2), seq_idx=seq, silu=False)
    assert dx is dx_buf and dinit is None
    for name, got in (("dx", dx), ("dweight", dw), ("dbias", db)):
        assert_close(got, want[name], torch.float32, name)


def test_compiled_calls_match_eager():
    """Under torch.compile the functions go through the custom ops (fake kernels), same results."""
    x = bcl(2, 16, 20, "split")
    w, b = torch.randn(16, 4), torch.randn(16)
    dout = torch.randn(2, 20, 16).transpose(1, 2)

    def step(x, w, b, dout):
        out = causal_conv1d_fwd_function(x, w, b, None, None, None, True)
        dx, dw, db, _ = causal_conv1d_bwd_function(x, w, b, dout, None, None, None, None, False, True)
        return out, dx, dw, db

    eager = step(x, w, b, dout)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x, w, b, dout)
    for name, got, want in zip(("out", "dx", "dweight", "dbias"), compiled, eager):
        assert torch.equal(got, want), name


def _bad_calls():
    x = torch.randn(2, 16, 10)
    w = torch.randn(16, 4)
    dout = torch.randn(2, 16, 10)
    seq = torch.zeros(2, 10, dtype=torch.int32)
    good = dict(
        x=x,
        weight=w,
        bias=None,
        dout=dout,
        seq_idx=None,
        initial_states=None,
        dfinal_states=None,
        dx=None,
        return_dinitial_states=False,
        silu_activation=True,
    )
    return [
        (TypeError, "silu_activation", dict(good, silu_activation="silu")),
        (TypeError, "return_dinitial_states", dict(good, return_dinitial_states=None)),
        (ValueError, "dout", dict(good, dout=dout[..., :5])),
        (TypeError, "dout", dict(good, dout=dout.double())),
        (ValueError, "dx", dict(good, dx=torch.empty(2, 16, 9))),
        (TypeError, "dx", dict(good, dx=torch.empty(2, 16, 10, dtype=torch.float16))),
        (ValueError, "dx", dict(good, dx=torch.empty(1, 16, 10).expand(2, 16, 10))),
        (ValueError, "dfinal_states", dict(good, dfinal_states=torch.randn(2, 16, 4))),
        (ValueError, "dfinal_states", dict(good, seq_idx=seq, dfinal_states=torch.randn(2, 16, 3))),
        (ValueError, "weight", dict(good, weight=torch.randn(16, 9))),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_input_is_named(case):
    exc, arg, kwargs = _bad_calls()[case]
    with pytest.raises(exc, match=arg):
        causal_conv1d_bwd_function(**kwargs)


def test_fwd_function_bad_flag():
    with pytest.raises(TypeError, match="silu_activation"):
        causal_conv1d_fwd_function(torch.randn(1, 8, 4), torch.randn(8, 4), None, None, None, None, "silu")
