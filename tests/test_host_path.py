"""The eager host path: a repeated call looks its checks, routes and launch plans up by its
signature, yet still refuses bad input; the Python work of one forward + backward stays bounded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from helpers import load_module

from conv1d_silu import api, causal_conv1d_silu, gpu, ops

PACKAGE = str(Path(api.__file__).resolve().parent)


def _step(x, w, b, **kw):
    y = causal_conv1d_silu(x, w, b, **kw)
    y.sum().backward()
    return y.detach().clone(), x.grad.clone(), w.grad.clone(), b.grad.clone()


def _leaves(S=40, C=16, K=4, dtype=torch.float32):
    x = torch.randn(S, C, dtype=dtype, requires_grad=True)
    w = torch.randn(C, K, dtype=dtype, requires_grad=True)
    b = torch.randn(C, dtype=dtype, requires_grad=True)
    return x, w, b


def _refuse(*names):
    def refused(*args, **kwargs):
        raise AssertionError(f"called on a repeated call: {names}")

    return refused


def test_a_repeated_call_checks_routes_and_plans_nothing(kernel_backend, monkeypatch):
    """The second call of a signature (new tensors, same shapes, strides, dtypes and device) runs
    no argument check, no program choice and no launch planning, and gives the first call's bits."""
    first = _step(*_leaves())
    planning = ((api, "check_inputs"), (ops, "choose"), (gpu, "forward_launch"), (gpu, "backward_launches"))
    for module, name in planning:
        monkeypatch.setattr(module, name, _refuse(name))
    torch.manual_seed(0)
    again = _step(*_leaves())
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_bad_input_after_a_good_call_raises_the_same_errors():
    """A remembered signature never lets bad input through: arguments that compare equal to a good
    call's, and document tables whose values (read every call) are wrong."""
    x, w, _ = _leaves()
    causal_conv1d_silu(x, w, return_final_states=True)
    with pytest.raises(TypeError, match="return_final_states: expected a bool, got int"):
        causal_conv1d_silu(x, w, return_final_states=1)
    causal_conv1d_silu(x, w, activation=None)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_silu(x, w, activation="relu")
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
        causal_conv1d_silu(x.tolist(), w)
    good = torch.tensor([0] * 20 + [1] * 20, dtype=torch.int32)
    init = torch.zeros(2, 3, 16)
    causal_conv1d_silu(x, w, seq_idx=good, initial_states=init)
    with pytest.raises(ValueError, match="seq_idx: expected non-decreasing values"):
        causal_conv1d_silu(x, w, seq_idx=good.flip(0), initial_states=init)
    cu = torch.tensor([0, 25, 40], dtype=torch.int32)
    causal_conv1d_silu(x, w, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens"):
        causal_conv1d_silu(x, w, cu_seqlens=torch.tensor([0, 25, 39], dtype=torch.int32))


def test_the_cache_of_eager_calls_is_bounded_and_follows_the_launcher(monkeypatch):
    monkeypatch.setattr(ops, "MAX_EAGER_CALLS", 3)
    monkeypatch.setattr(ops, "EAGER_CALLS", {})
    w = torch.randn(8, 4)
    for S in range(10, 20):
        causal_conv1d_silu(torch.randn(S, 8), w)
        assert 1 <= len(ops.EAGER_CALLS) <= 3
    with ops.use_launcher(gpu.CUDA):  # another launcher plans otherwise: nothing carries over
        assert not ops.EAGER_CALLS
    assert not ops.EAGER_CALLS


def test_the_program_environment_is_read_by_every_call(monkeypatch):
    """CONV1D_SILU_PROGRAM, read cheaply from os.environ's own dict, still follows every change
    between calls: set, reset, emptied, deleted, through monkeypatch or os.environ directly."""
    import os

    from conv1d_silu import config

    seen = []
    real = ops.choose
    monkeypatch.setattr(ops, "choose", lambda d, *a: seen.append(a[-1]) or real(d, *a))
    monkeypatch.setattr(ops, "EAGER_CALLS", {})
    monkeypatch.delenv("CONV1D_SILU_PROGRAM", raising=False)
    x, w, b = _leaves()

    def program(set_env):
        set_env()
        seen.clear()
        causal_conv1d_silu(x, w, b).sum().backward()
        assert config.forced_program() == (os.environ.get("CONV1D_SILU_PROGRAM") or None)
        return seen[:1]  # the program the signature was routed with ([] when looked up)

    assert program(lambda: None) == [ops.ROUTED]
    assert program(lambda: monkeypatch.setenv("CONV1D_SILU_PROGRAM", "reference")) == ["reference"]
    assert program(lambda: None) == []  # the same signature and program: looked up
    assert program(lambda: os.environ.__setitem__("CONV1D_SILU_PROGRAM", "")) == []  # empty: routed, seen before
    os.environ["CONV1D_SILU_PROGRAM"] = "bogus"
    with pytest.raises(ValueError, match="bogus"):
        causal_conv1d_silu(x, w, b)
    os.environ.pop("CONV1D_SILU_PROGRAM")
    assert config.forced_program() is None
    assert config.getenv("CONV1D_SILU_PROGRAM", "x") == "x"
    monkeypatch.setattr(os, "environ", {"CONV1D_SILU_PROGRAM": "reference"})  # a stand-in mapping
    assert config.forced_program() == "reference"


def test_a_gradient_repeated_over_the_tokens_is_read_in_place(kernel_backend, monkeypatch):
    """dy = v.expand(S, C) (the gradient of y.sum(0)) reaches the kernels as one row with a token
    stride of 0, the bits of its dense copy; the expanded scalar of y.sum() has channel stride 0,
    which the kernels' vector reads cannot take: it is copied."""
    from conv1d_silu.documents import doc_table

    x, w, b = (t.detach() for t in _leaves())
    doc = doc_table(x, None, None, None)
    v = torch.randn(x.shape[-1])

    def grads(dy):
        return ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, None)

    dense = grads(v.expand_as(x).contiguous())
    scalar = grads(torch.ones(()).expand_as(x))
    copies, contiguous = [], torch.Tensor.contiguous

    def copy(t, *args, **kwargs):
        copies.append(t)
        return contiguous(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", copy)
    repeated = grads(v.expand_as(x))
    assert not any(t.stride(-1) == 1 and t.stride(0) == 0 for t in copies)
    for a, c in zip(dense[:3], repeated[:3]):  # dx, dweight, dbias
        assert torch.equal(a, c)
    for a, c in zip(scalar[:3], grads(torch.ones_like(x))[:3]):
        assert torch.equal(a, c)


# Python calls in the package per eager forward + backward at a repeated signature, on the no-op
# launcher (its prepared launches called as on a GPU, the driver stood in): 14 at this writing (the
# plain path, gpu.Plain), under 15 % of a call that checks, routes and plans afresh. A regression of
# the cache, or new layers on the hot path, pass this bound.
MAX_PACKAGE_CALLS = 18


def _package_calls(step) -> list[str]:
    """The functions of the package that ``step()`` calls, in order."""
    calls = []

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls


def test_the_eager_host_path_makes_few_python_calls():
    x, w, b = _leaves(64, 64)

    def step():
        causal_conv1d_silu(x, w, b).sum().backward()

    with ops.use_launcher(load_module("tools/host_profile.py").NoLaunch(), emulate_arch="sm_90"):
        step()
        repeated = _package_calls(step)
        ops.EAGER_CALLS.clear()
        first = _package_calls(step)
    assert len(repeated) <= MAX_PACKAGE_CALLS, repeated
    assert len(first) > 2 * len(repeated)  # the first call of a signature checks, routes and plans


def test_the_function_is_applied_as_function_apply_does(backend):
    """The eager path calls the Function's C++ apply itself: inside a functorch transform it still
    goes through ``Function.apply`` (and its refusal), and a dead functorch wrapper (a tensor leaked
    out of a finished transform) is unwrapped first, as ``Function.apply`` does; the plain call's
    Function (the kernels) and the general one (the reference on the CPU) alike."""
    x, w = torch.randn(40, 8, device=backend.device), torch.randn(8, 4, device=backend.device)
    causal_conv1d_silu(x, w)
    assert (_route_of_last_call().plain is not None) == backend.kernels
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: causal_conv1d_silu(t, w).sum())(x)
    leaked = []
    torch.func.grad(lambda t: leaked.append(t) or (t * 2).sum())(x)
    assert torch._C._functorch.is_functorch_wrapped_tensor(leaked[0])
    y = causal_conv1d_silu(leaked[0], w)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(y)
    assert torch.equal(y, causal_conv1d_silu(x, w))


def test_kept_scratch_views_are_handed_out_again_until_a_buffer_is_replaced(monkeypatch):
    """backward_scratch hands a repeated request the same views of the kept buffers; growing a buffer
    for a larger request replaces it, and views of the replaced buffer are not handed out again; a
    request past SCRATCH_KEEP_BYTES gets tensors of its own every call, never kept."""
    monkeypatch.setattr(gpu, "_scratch", {})
    monkeypatch.setattr(gpu, "_handed", {})
    cpu = torch.device("cpu")
    ws, tickets = gpu.backward_scratch(100, torch.float32, 10, cpu)
    assert gpu.backward_scratch(100, torch.float32, 10, cpu) == (ws, tickets)
    assert ws.numel() == 100 and tickets.numel() == 10 and not tickets.any()
    big_ws, _ = gpu.backward_scratch(5000, torch.float32, 10, cpu)  # grows the workspace buffer
    again, tickets_again = gpu.backward_scratch(100, torch.float32, 10, cpu)
    assert again._base is big_ws._base is gpu._scratch["workspace", torch.float32, "cpu"]
    assert again._base is not ws._base and tickets_again._base is tickets._base
    huge = gpu.SCRATCH_KEEP_BYTES // 4 + 1
    first, _ = gpu.backward_scratch(huge, torch.float32, 0, cpu)
    second, _ = gpu.backward_scratch(huge, torch.float32, 0, cpu)
    assert first._base is None and second._base is None and first.data_ptr() != second.data_ptr()


def test_handed_views_stay_bounded_and_current(monkeypatch):
    """Varying sequence lengths do not grow the table of handed-out views past MAX_HANDED, and a
    buffer replaced after a request's views were cut (by another thread) is not cached."""
    monkeypatch.setattr(gpu, "_scratch", {})
    monkeypatch.setattr(gpu, "_handed", {})
    monkeypatch.setattr(gpu, "MAX_HANDED", 8)
    cpu = torch.device("cpu")
    gpu.backward_scratch(4000, torch.float32, 100, cpu)  # the buffers at their steady size
    for n in range(1, 40):
        gpu.backward_scratch(n, torch.float32, n % 7, cpu)
        assert len(gpu._handed) <= 8
    gpu._handed.clear()
    kept = gpu._kept

    def replaced_meanwhile(what, n, dtype, device, where):  # another thread grows the buffer
        view = kept(what, n, dtype, device, where)
        gpu._scratch[what, dtype, where] = torch.empty(2 * gpu._scratch[what, dtype, where].numel(), dtype=dtype)
        return view

    monkeypatch.setattr(gpu, "_kept", replaced_meanwhile)
    gpu.backward_scratch(10, torch.float32, 0, cpu)
    assert not gpu._handed


def test_the_functions_define_no_setup_context():
    """autograd.apply calls the Functions' C++ apply, skipping Function.apply's binding of default
    arguments, which only a Function with its own setup_context needs."""
    from conv1d_silu.autograd import CausalConv1dSiLUFunction, PlainFunction

    assert CausalConv1dSiLUFunction.setup_context is torch.autograd.Function.setup_context
    assert PlainFunction.setup_context is torch.autograd.Function.setup_context


def _route_of_last_call():
    return next(reversed(ops.EAGER_CALLS.values())).route


PLAIN_CASES = ["dense", "row_stride", "conv_weight", "no_bias", "bf16", "offset", "repeated_dy"]


@pytest.mark.parametrize("case", PLAIN_CASES)
def test_the_plain_path_gives_the_general_paths_bits(kernel_backend, case, monkeypatch):
    """gpu.Plain (the common call one layer above its launches) against ops.forward_impl /
    backward_impl for the same calls: the same outputs and gradients, bit for bit, first call of an
    alignment class and repeated calls alike."""
    dtype = torch.bfloat16 if case == "bf16" else torch.float32
    g = torch.Generator().manual_seed(5)
    S, C, K = 70, 24, 4
    base = torch.randn(S, C + 8, generator=g).to(dtype)
    if case == "row_stride":
        x0 = base[:, :C]  # a slice of a wider projection: row stride C + 8
    elif case == "offset":
        x0 = base.flatten()[1 : 1 + S * C].view(S, C)  # 4-byte aligned: a narrower vector class
    else:
        x0 = base[:, :C].contiguous()
    w0 = torch.randn(C, 1, K, generator=g).to(dtype) if case == "conv_weight" else torch.randn(C, K, generator=g).to(dtype)
    b0 = None if case == "no_bias" else torch.randn(C, generator=g).to(dtype)
    dy = torch.randn(C, generator=g).to(dtype).expand(S, C) if case == "repeated_dy" else None
    x0, w0 = x0.to(kernel_backend.device), w0.to(kernel_backend.device)
    b0 = None if b0 is None else b0.to(kernel_backend.device)

    def run():
        outs = []
        for _ in range(2):  # the first call plans, the second looks up
            x, w = x0.detach().requires_grad_(), w0.detach().requires_grad_()
            b = None if b0 is None else b0.detach().requires_grad_()
            y = causal_conv1d_silu(x, w, b)
            y.backward(dy.to(y.device) if dy is not None else torch.ones_like(y))
            outs.append([y.detach(), x.grad, w.grad, None if b is None else b.grad])
        return outs, _route_of_last_call()

    ops.EAGER_CALLS.clear()
    plain, route = run()
    assert route.plain is not None
    monkeypatch.setattr(gpu.Plain, "applies", staticmethod(lambda *args: False))
    ops.EAGER_CALLS.clear()
    general, route = run()
    assert route.plain is None
    for got, want in zip(plain, general):
        for a, c in zip(got, want):
            assert (a is None and c is None) or torch.equal(a, c)


def test_the_plain_path_is_taken_only_for_plain_calls(kernel_backend):
    """States, document tables, main_grad buffers, a strided weight and channel-first x keep the
    general path; so does a call routed to the reference."""
    dev = kernel_backend.device
    x = torch.randn(40, 16, device=dev)
    w, b = torch.randn(16, 4, device=dev), torch.randn(16, device=dev)

    def plain(**kw):
        ops.EAGER_CALLS.clear()
        causal_conv1d_silu(kw.pop("x", x), kw.pop("w", w), kw.pop("b", b), **kw)
        return _route_of_last_call().plain is not None

    assert plain() and plain(b=None) and plain(x=x.view(2, 20, 16))
    assert not plain(return_final_states=True)
    assert not plain(initial_states=torch.zeros(1, 3, 16, device=dev))
    assert not plain(seq_idx=torch.zeros(40, dtype=torch.int32, device=dev))
    assert not plain(weight_main_grad=torch.zeros(16, 4, device=dev), bias_main_grad=torch.zeros(16, device=dev))
    assert not plain(w=w.t().contiguous().t())
    assert not plain(x=x.view(2, 20, 16).transpose(1, 2).contiguous().transpose(1, 2))
    assert not plain(program="reference")
