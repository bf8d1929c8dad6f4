"""torch.library checks of every op (schema, fake kernel, autograd registration, AOT dispatch
with dynamic shapes) and float64 gradcheck through the public API for every variant."""

from __future__ import annotations

import contextlib

import pytest
import torch

from conv1d_silu import causal_conv1d_silu
from helpers import api_kwargs, make_case

OPCHECK_CASES = {
    "plain": dict(S=40, C=8, K=4, mode="single", bias=False),
    "bias": dict(S=40, C=8, K=4, mode="single"),
    "cu_seqlens_states": dict(S=40, C=8, K=3, mode="cu_seqlens", init=True),
    "seq_idx_states": dict(S=40, C=8, K=4, mode="seq_idx", init=True),
    "batch": dict(S=40, C=8, K=2, mode="batch", init=True),
}


def _fwd_args(case, final=True, fp32_grads=False):
    kw = api_kwargs(case)
    return (
        case["x"], case["weight"], case["bias"], kw.get("seq_idx"), kw.get("cu_seqlens"),
        kw.get("initial_states"), None, None, final and case["n_docs"] is not None, True, fp32_grads, None,
    )


@pytest.mark.parametrize("name", OPCHECK_CASES)
def test_opcheck_fwd(backend, name):
    case = make_case(**OPCHECK_CASES[name], dtype=torch.float64, device=backend.device)
    for t in (case["x"], case["weight"], case["bias"], case.get("initial_states")):
        if t is not None:
            t.requires_grad_()
    torch.library.opcheck(torch.ops.conv1d_silu.fwd.default, _fwd_args(case))


@pytest.mark.parametrize("name", OPCHECK_CASES)
@pytest.mark.parametrize("fp32_grads", [False, True])
def test_opcheck_bwd(backend, name, fp32_grads):
    case = make_case(**OPCHECK_CASES[name], dtype=torch.bfloat16, device=backend.device)
    kw = api_kwargs(case)
    C, K = case["weight"].shape
    final = case["n_docs"] is not None
    dfinal = torch.randn(case["n_docs"], K - 1, C, dtype=torch.bfloat16, device=backend.device) if final else None
    args = (
        torch.randn_like(case["x"]), case["x"], case["weight"], case["bias"], kw.get("seq_idx"),
        kw.get("cu_seqlens"), kw.get("initial_states"), dfinal, True, fp32_grads, None,
    )
    torch.library.opcheck(torch.ops.conv1d_silu.bwd.default, args)


def test_opcheck_bwd_main_grad(backend):
    case = make_case(40, 8, 4, "cu_seqlens", init=True, dtype=torch.bfloat16, device=backend.device)
    kw = api_kwargs(case)
    args = (
        torch.randn_like(case["x"]), case["x"], case["weight"], case["bias"], None, kw["cu_seqlens"],
        kw["initial_states"], None, torch.zeros(8, 4, device=backend.device),
        torch.zeros(8, device=backend.device), True, None,
    )
    torch.library.opcheck(torch.ops.conv1d_silu.bwd_main_grad.default, args)


GRADCHECK_CASES = {
    "fwd/bwd": dict(mode="single", bias=False),
    "bias": dict(mode="single"),
    "dt_cu_seqlens_states_final": dict(mode="cu_seqlens", init=True),
    "dt_seq_idx_states_final": dict(mode="seq_idx", init=True),
    "batch_states_final": dict(mode="batch", init=True),
    "seq_idx_3d": dict(mode="seq_idx_3d"),
}


@pytest.mark.parametrize("name", GRADCHECK_CASES)
@pytest.mark.parametrize("K", [2, 4])
def test_gradcheck(backend, name, K):
    case = make_case(S=24, C=3, K=K, **GRADCHECK_CASES[name], dtype=torch.float64, device=backend.device)
    kw = api_kwargs(case)
    init = kw.pop("initial_states", None)
    final = case["n_docs"] is not None and "states" in name
    inputs = [case["x"].detach().requires_grad_(), case["weight"].detach().requires_grad_()]
    has_bias = case["bias"] is not None
    if has_bias:
        inputs.append(case["bias"].detach().requires_grad_())
    if init is not None:
        inputs.append(init.detach().requires_grad_())

    def fn(*args):
        x, w = args[0], args[1]
        b = args[2] if has_bias else None
        st = args[-1] if init is not None else None
        out = causal_conv1d_silu(x, w, b, initial_states=st, return_final_states=final, **kw)
        return out

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


def test_gradcheck_fp32_weight_grads_are_fp32(backend):
    case = make_case(S=30, C=4, K=4, mode="single", dtype=torch.float32, device=backend.device)
    w = case["weight"].detach().requires_grad_()
    y = causal_conv1d_silu(case["x"], w, case["bias"], grad_dtype=torch.float32)
    y.sum().backward()
    assert w.grad.dtype == torch.float32


@pytest.mark.parametrize("states", [False, True])
def test_saved_tensor_hooks_that_change_x_strides(kernel_backend, states):
    """A saved-tensor hook (save_on_cpu, activation offloading) may hand x back with other strides
    than the call's: a slice of a wider projection comes back contiguous. The backward reads the x it
    is given, not the row stride its signature was planned for: the gradients are bitwise those of
    the call without the hook."""
    dev = kernel_backend.device
    gen = torch.Generator().manual_seed(3)
    S, C, K = 300, 24, 4
    wide = torch.randn(S, 2 * C, generator=gen).to(dev)
    w = torch.randn(C, K, generator=gen).to(dev)
    b = torch.randn(C, generator=gen).to(dev)
    init = torch.randn(1, K - 1, C, generator=gen).to(dev) if states else None
    dy = torch.randn(S, C, generator=gen).to(dev)

    def grads(hooked: bool):
        xs = wide.clone()[:, :C].requires_grad_()  # row stride 2C
        ww, bb = w.clone().requires_grad_(), b.clone().requires_grad_()
        hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t.contiguous())
        with hooks if hooked else contextlib.nullcontext():
            y = causal_conv1d_silu(xs, ww, bb, initial_states=init)
        y.backward(dy)
        return xs.grad, ww.grad, bb.grad

    for got, want in zip(grads(True), grads(False)):
        assert torch.equal(got, want)


def test_a_second_derivative_raises(backend):
    """The backward is not itself differentiable: a gradient taken with create_graph=True (a
    gradient penalty) raises when differentiated again, rather than adding nothing."""
    x = torch.randn(50, 8, device=backend.device, requires_grad=True)
    w = torch.randn(8, 4, device=backend.device, requires_grad=True)
    (g,) = torch.autograd.grad(causal_conv1d_silu(x, w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        (g.square().sum() + w.sum()).backward()
