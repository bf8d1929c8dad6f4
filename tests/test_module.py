"""CausalConv1dSiLU: nn.Conv1d compatibility, decoding, repr, and torch.compile (fullgraph, dynamic)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from expecttest import assert_expected_inline
from torch import nn

from conv1d_silu import CausalConv1dSiLU


def test_repr():
    assert_expected_inline(repr(CausalConv1dSiLU(264)), """CausalConv1dSiLU(264, kernel_size=4, bias=True, activation='silu')""")
    assert_expected_inline(
        repr(CausalConv1dSiLU(8, 2, bias=False, activation=None)),
        """CausalConv1dSiLU(8, kernel_size=2, bias=False, activation=None)""",
    )


def test_state_dict_round_trips_with_conv1d():
    conv = nn.Conv1d(12, 12, 4, groups=12, padding=3)
    m = CausalConv1dSiLU(12, 4)
    m.load_state_dict(conv.state_dict())
    x = torch.randn(2, 50, 12)
    want = F.silu(conv(x.transpose(1, 2))[..., :50]).transpose(1, 2)
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    back = nn.Conv1d(12, 12, 4, groups=12)
    back.load_state_dict(m.state_dict())
    assert torch.equal(back.weight, m.weight)


def test_init_matches_conv1d_distribution():
    torch.manual_seed(0)
    m = CausalConv1dSiLU(4096, 4)
    bound = 1 / 2  # kaiming_uniform(a=sqrt(5)) on fan_in K = 4 gives U(-1/sqrt(K), 1/sqrt(K))
    assert m.weight.abs().max() <= bound and m.weight.abs().max() > 0.9 * bound
    assert m.bias.abs().max() <= bound


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="kernel_size"):
        CausalConv1dSiLU(8, 9)
    with pytest.raises(ValueError, match="channels"):
        CausalConv1dSiLU(0)
    with pytest.raises(ValueError, match="activation"):
        CausalConv1dSiLU(8, activation="relu")


def test_packed_and_batched_inputs_agree():
    m = CausalConv1dSiLU(16, 4)
    x = torch.randn(3, 40, 16)
    cu = torch.tensor([0, 40, 80, 120], dtype=torch.int32)
    torch.testing.assert_close(m(x).reshape(120, 16), m(x.reshape(120, 16), cu_seqlens=cu))


class TinyBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, 2 * d)
        self.conv = CausalConv1dSiLU(d, 4)

    def forward(self, x, cu_seqlens):
        a, gate = self.proj(x).chunk(2, dim=-1)
        return self.conv(a, cu_seqlens=cu_seqlens) * torch.sigmoid(gate)


@pytest.mark.timeout(600)
def test_compile_fullgraph_dynamic_no_recompiles():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    block = TinyBlock(16)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(block, backend=counter, fullgraph=True, dynamic=True)
    for S in (37, 64, 101, 250):
        x = torch.randn(S, 16, requires_grad=True)
        cu = torch.tensor([0, S // 3, S], dtype=torch.int32)
        y_eager = block(x, cu)
        (gx_eager,) = torch.autograd.grad(y_eager.sum(), x)
        y = compiled(x, cu)
        (gx,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(y, y_eager)
        torch.testing.assert_close(gx, gx_eager)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"


@pytest.mark.timeout(600)
def test_compile_inductor_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = CausalConv1dSiLU(8, 3)
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    x = torch.randn(2, 30, 8, requires_grad=True)
    y = compiled(x)
    y.backward(torch.ones_like(y))
    g_compiled = [x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone()]
    x.grad = None
    m.zero_grad()
    m(x).backward(torch.ones_like(y))
    for a, b in zip(g_compiled, [x.grad, m.weight.grad, m.bias.grad]):
        torch.testing.assert_close(a, b)


@pytest.mark.timeout(600)
def test_compile_with_main_grad_accumulation():
    torch._dynamo.reset()
    m = CausalConv1dSiLU(8, 4, accumulate_into_main_grad=True)
    m.weight.main_grad = torch.zeros(8, 1, 4)
    m.bias.main_grad = torch.zeros(8)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True, dynamic=True)
    x = torch.randn(40, 8)
    compiled(x).sum().backward()
    assert m.weight.grad is None
    want = CausalConv1dSiLU(8, 4)
    want.load_state_dict(m.state_dict())
    want(x).sum().backward()
    torch.testing.assert_close(m.weight.main_grad, want.weight.grad)
    torch.testing.assert_close(m.bias.main_grad, want.bias.grad)


def test_from_and_to_conv1d():
    conv = nn.Conv1d(10, 10, 3, groups=10, padding=2)
    m = CausalConv1dSiLU.from_conv1d(conv)
    assert m.kernel_size == (3,) and torch.equal(m.weight, conv.weight) and torch.equal(m.bias, conv.bias)
    back = m.to_conv1d()
    x = torch.randn(2, 10, 30)
    torch.testing.assert_close(F.silu(back(x)[..., :30]).transpose(1, 2), m(x.transpose(1, 2).contiguous()))
    with pytest.raises(ValueError, match="depthwise"):
        CausalConv1dSiLU.from_conv1d(nn.Conv1d(10, 20, 3))
    with pytest.raises(ValueError, match="zero padding"):
        CausalConv1dSiLU.from_conv1d(nn.Conv1d(10, 10, 3, groups=10, padding=2, padding_mode="circular"))


@pytest.mark.parametrize("channel_last", [True, False])
def test_bcl_layout(channel_last):
    m = CausalConv1dSiLU(12, 4, layout="BCL")
    assert "layout='BCL'" in repr(m)
    base = torch.randn(2, 40, 12)
    x = base.transpose(1, 2) if channel_last else base.transpose(1, 2).contiguous()
    y = m(x)
    assert y.shape == (2, 12, 40) and y.stride() == x.stride()
    ref = CausalConv1dSiLU(12, 4)
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(y.transpose(1, 2), ref(base))


def test_bcl_layout_takes_every_argument():
    """layout="BCL" runs the same path as "BLC": documents, states, main_grad and program reach the op."""
    torch.manual_seed(0)
    C, K, L = 8, 4, 30
    m = CausalConv1dSiLU(C, K, layout="BCL", accumulate_into_main_grad=True, program="reference")
    x = torch.randn(1, C, L, requires_grad=True)
    cu = torch.tensor([0, 7, 30], dtype=torch.int32)
    init = torch.randn(2, C, K - 1)
    m.weight.main_grad = torch.zeros(C, 1, K)
    m.bias.main_grad = torch.zeros(C)
    y, final = m(x, cu_seqlens=cu, initial_states=init, return_final_states=True)
    ref = CausalConv1dSiLU(C, K)
    ref.load_state_dict(m.state_dict())
    want_y, want_final = ref(x.detach()[0].T.contiguous(), cu_seqlens=cu, initial_states=init.transpose(1, 2), return_final_states=True)
    torch.testing.assert_close(y[0].T, want_y)
    torch.testing.assert_close(final, want_final.transpose(1, 2))
    assert not torch.allclose(y, m(x.detach(), initial_states=init[:1]))  # the documents changed y
    y.square().sum().backward()
    want_y.square().sum().backward()
    assert m.weight.grad is None and m.bias.grad is None
    torch.testing.assert_close(m.weight.main_grad, ref.weight.grad)
    torch.testing.assert_close(m.bias.main_grad, ref.bias.grad)


@pytest.mark.parametrize("layout", ["BLC", "BCL"])
def test_module_names_x_when_its_channels_differ(layout):
    """x of the wrong channel count is the caller's x, not the module's weight."""
    m = CausalConv1dSiLU(8, layout=layout)
    x = torch.randn(2, 10, 9) if layout == "BLC" else torch.randn(2, 9, 10)
    with pytest.raises(ValueError, match=r"^x: expected 8 channels \(the module's\) in x.shape\[-[12]\]"):
        m(x)


def test_module_refuses_an_unknown_program_and_a_missing_main_grad():
    with pytest.raises(ValueError, match="program"):
        CausalConv1dSiLU(8, layout="BCL", program="bogus")
    m = CausalConv1dSiLU(8, accumulate_into_main_grad=True)
    with pytest.raises(ValueError, match="main_grad"):
        m(torch.randn(2, 5, 8))
    m.weight.main_grad = torch.zeros(8, 1, 4)
    with pytest.raises(ValueError, match="accumulate_into_main_grad: expected the bias"):
        m(torch.randn(2, 5, 8))
    with torch.no_grad():
        m(torch.randn(2, 5, 8))  # nothing to accumulate


@pytest.mark.parametrize("layout", ["BLC", "BCL"])
def test_carries_conv1d_attributes(layout):
    """Code that reads a conv's shape (transformers reads ``conv1d.kernel_size[0]``) sees the
    nn.Conv1d that this module equals: depthwise, stride 1, padded by K-1 on the left."""
    m = CausalConv1dSiLU(12, 3, layout=layout)
    conv = nn.Conv1d(12, 12, 3, groups=12, padding=2)
    for name in ("in_channels", "out_channels", "kernel_size", "groups", "padding", "stride", "dilation", "padding_mode"):
        assert getattr(m, name) == getattr(conv, name), name
        with pytest.raises(AttributeError):
            setattr(m, name, getattr(conv, name))
    assert m.channels == 12 and m.weight.shape == conv.weight.shape
    back = CausalConv1dSiLU.from_conv1d(m)  # a module is accepted wherever a depthwise conv is
    assert torch.equal(back.weight, m.weight) and back.kernel_size == (3,)


def _decode(m, x, prefix, cache):
    """Step through the tokens of ``x`` (B, L, C) from ``prefix`` on, updating ``cache``."""
    ys = []
    for t in range(prefix, x.shape[1]):
        token = x[:, t] if t % 2 else (x[:, t : t + 1] if m.layout == "BLC" else x[:, t, :, None])
        ys.append(m.step(token, cache).reshape(x.shape[0], -1))
    return torch.stack(ys, 1)


@pytest.mark.parametrize("layout", ["BLC", "BCL"])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_after_prefill_is_bitwise_the_forward(backend, layout, activation, dtype):
    """Prefill L tokens, take the final states as the cache, step the next tokens: each output is
    bitwise the forward's over all the tokens (the step runs the same op, the cache as initial
    states), and the cache ends as the forward's final states."""
    B, C, K, L, T = 3, 16, 4, 9, 4
    m = CausalConv1dSiLU(C, K, activation=activation, layout=layout, device=backend.device)
    x = torch.randn(B, L + T, C, device=backend.device).to(dtype)
    m = m.to(dtype)
    into = (lambda t: t.contiguous()) if layout == "BLC" else (lambda t: t.transpose(1, 2).contiguous())
    back = (lambda t: t) if layout == "BLC" else (lambda t: t.transpose(1, 2))
    with torch.no_grad():
        want, want_final = m(into(x), return_final_states=True)
        _, cache = m(into(x[:, :L]), return_final_states=True)
        got = _decode(m, x, L, cache)
    assert torch.equal(got, back(want)[:, L:])
    assert torch.equal(cache, want_final)


@pytest.mark.parametrize("layout", ["BLC", "BCL"])
def test_step_from_a_new_cache_and_a_width_k_cache(backend, layout):
    """new_cache() starts sequences from zeros like the forward does; a cache of K columns
    (causal-conv1d's and flash-linear-attention's form) reads its last K-1 and shifts by one."""
    B, C, K, L = 2, 8, 4, 7
    m = CausalConv1dSiLU(C, K, layout=layout, device=backend.device)
    x = torch.randn(B, L, C, device=backend.device)
    with torch.no_grad():
        want = m(x if layout == "BLC" else x.transpose(1, 2))
        want = want if layout == "BLC" else want.transpose(1, 2)
        cache = m.new_cache(B)
        assert cache.shape == ((B, K - 1, C) if layout == "BLC" else (B, C, K - 1)) and not cache.any()
        assert torch.equal(_decode(m, x, 0, cache), want)
        wide = torch.zeros(B, K, C, device=backend.device)  # the tokens before the sequence: zeros
        wide = wide if layout == "BLC" else wide.transpose(1, 2).contiguous()
        assert torch.equal(_decode(m, x, 0, wide), want)
    last = x[:, L - K :]
    assert torch.equal(wide, last if layout == "BLC" else last.transpose(1, 2))


@pytest.mark.parametrize("layout", ["BLC", "BCL"])
def test_step_records_gradients_through_the_window(layout):
    """With autograd on, the step's backward reaches x and the weight after the cache moved on."""
    m = CausalConv1dSiLU(8, 4, layout=layout)
    x = torch.randn(2, 8, requires_grad=True)
    cache = m.new_cache(2).normal_()
    m.step(x, cache).sum().backward()
    assert x.grad is not None and m.weight.grad is not None and m.weight.grad.abs().sum() > 0


def test_step_records_a_trainable_bias_alone():
    """A frozen weight and a trainable bias: the step still records the bias gradient."""
    m = CausalConv1dSiLU(8, 4)
    m.weight.requires_grad_(False)
    cache = m.new_cache(2).normal_()
    m.step(torch.randn(2, 8), cache).sum().backward()
    assert m.bias.grad is not None and m.bias.grad.abs().sum() > 0


def test_step_refuses_bad_inputs():
    m = CausalConv1dSiLU(8, 4)
    cache = m.new_cache(2)
    with pytest.raises(ValueError, match="x: expected one token per sequence"):
        m.step(torch.randn(2, 3, 8), cache)
    with pytest.raises(ValueError, match="x: expected one token"):
        m.step(torch.randn(2, 7), cache)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        m.step([0.0] * 8, cache)
    with pytest.raises(ValueError, match=r"cache: expected shape \(2, W >= 3, 8\)"):
        m.step(torch.randn(2, 8), torch.zeros(2, 2, 8))
    with pytest.raises(ValueError, match="cache: expected shape"):
        m.step(torch.randn(2, 8), torch.zeros(3, 3, 8))
    with pytest.raises(ValueError, match="cache: expected shape"):
        m.step(torch.randn(2, 8), torch.zeros(2, 8, 3))  # the "BCL" form given to a "BLC" module
    with pytest.raises(TypeError, match="cache: expected x's dtype"):
        m.step(torch.randn(2, 8), cache.double())
    with pytest.raises(TypeError, match="cache: expected a torch.Tensor"):
        m.step(torch.randn(2, 8), None)
    with pytest.raises(ValueError, match="batch"):
        m.new_cache(-1)
    with pytest.raises(ValueError, match=r"x: expected one token per sequence, shape \(B, 8\) or \(B, 8, 1\)"):
        CausalConv1dSiLU(8, 4, layout="BCL").step(torch.randn(2, 1, 8), cache)


def test_bcl_takes_any_strides_like_causal_conv1d():
    """A channel-last (B, C, L) view whose batch rows are not evenly spaced is copied, not refused,
    in the function's and the module's "BCL" layout, as compat.causal_conv1d_fn takes it."""
    from conv1d_silu import causal_conv1d_silu
    from conv1d_silu.compat import causal_conv1d_fn

    torch.manual_seed(0)
    x = torch.randn(30, 2, 8).permute(1, 2, 0)  # (B, C, L): channel stride 1, batch stride 8, token stride 16
    m = CausalConv1dSiLU(8, 4, layout="BCL")
    want = causal_conv1d_fn(x.contiguous(), m.weight[:, 0], m.bias, activation="silu")
    torch.testing.assert_close(m(x), want)
    torch.testing.assert_close(causal_conv1d_silu(x, m.weight, m.bias, layout="BCL"), want)


@pytest.mark.parametrize("grad", [False, True])
def test_step_takes_a_column_of_a_channel_first_tensor(backend, grad):
    """With layout="BCL" a step's token is naturally x[:, :, t] of a (B, C, L) tensor: channel stride
    L, not 1. It gives what the contiguous column gives (and the same weight gradients)."""
    B, C, K, L = 2, 8, 4, 5
    m = CausalConv1dSiLU(C, K, layout="BCL", device=backend.device)
    x = torch.randn(B, C, L, device=backend.device)
    runs = []
    for column in (lambda t: x[:, :, t], lambda t: x[:, :, t].contiguous()):
        m.zero_grad()
        cache = m.new_cache(B)
        with torch.set_grad_enabled(grad):
            ys = torch.stack([m.step(column(t), cache) for t in range(L)], -1)
        if grad:
            ys.square().sum().backward()
        runs.append((ys.detach(), cache, None if m.weight.grad is None else m.weight.grad.clone()))
    (y0, c0, g0), (y1, c1, g1) = runs
    assert torch.equal(y0, y1) and torch.equal(c0, c1)
    assert (g0 is None and g1 is None) if not grad else torch.equal(g0, g1)
    with torch.no_grad():
        assert torch.equal(y0, m(x))
