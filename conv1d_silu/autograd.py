"""Autograd wiring of the forward and backward.

The forward saves x, weight, bias, the document table and the initial states (never z or y);
the backward recomputes z from x.

Two equivalent paths share ``ops.forward_impl`` / ``ops.backward_impl``:

* eager: :class:`CausalConv1dSiLUFunction` calls the implementations directly, skipping the
  dispatcher's per-op cost (a custom op + register_autograd round trip costs about twice an
  autograd.Function on a slow host CPU: 486 against 238 µs per forward + backward);
* torch.compile: the custom op ``conv1d_silu::fwd`` with the backward registered here, calling
  ``conv1d_silu::bwd`` (or ``bwd_main_grad``), which Dynamo traces through fake kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import gpu, ops
from .documents import DocTable
from .validation import row_stride


class Call(NamedTuple):
    """The plain-Python arguments of one eager call, passed to the Function as one value: every
    argument of ``Function.apply`` costs host time on the way in and a ``None`` gradient out.
    Checked and routed once per call signature (api.py); only a document table is per call."""

    doc: DocTable | None  # None where the signature's calls carry document tables of their own
    return_final_states: bool
    silu: bool
    grad_dtype: torch.dtype
    route: ops.Route  # the programs and launch plans of forward and backward


class CausalConv1dSiLUFunction(torch.autograd.Function):
    """Eager autograd of the op: one :class:`Call`, then the tensors (the optional ones only when
    one of them is given: each argument costs host time)."""

    @staticmethod
    def forward(ctx, call: Call, x, weight, bias, initial_states=None, weight_main_grad=None, bias_main_grad=None):
        y, final = ops.forward_impl(
            x, weight, bias, call.doc, initial_states, call.return_final_states, call.silu, None, call.route
        )
        ctx.save_for_backward(x, weight, bias, initial_states)
        ctx.call, ctx.main_grads = call, (weight_main_grad, bias_main_grad)
        return (y, final) if call.return_final_states else y

    @staticmethod
    def backward(ctx, dy, dfinal=None):
        x, weight, bias, initial_states = ctx.saved_tensors
        call = ctx.call
        wmg, bmg = ctx.main_grads
        dx, dw, db, dinit = ops.backward_impl(
            dy, x, weight, bias, call.doc, initial_states, dfinal if call.return_final_states else None,
            call.silu, call.grad_dtype, None, wmg, bmg, route=call.route,
        )
        if wmg is not None:  # the weight gradients went into the main_grad buffers
            dw = db = None
        # autograd drops the trailing Nones of a call without the optional tensors
        return None, *_differentiable_or_not(dx, dw, db, dinit), None, None


def not_differentiable(*grads):
    """``grads`` behind an autograd node that raises when differentiated. ``once_differentiable``
    adds one only where the incoming gradient requires grad; the gradient of ``y.sum()`` does not,
    yet the gradients depend on x and the weight, so a gradient penalty would silently get zero."""
    err = torch._C._functions.DelayedError(
        b"conv1d_silu: the backward is not differentiable (a gradient taken with create_graph=True "
        b"cannot be differentiated again)",
        len(grads),
    )
    return err(*(None if g is None else g.detach().requires_grad_() for g in grads))


class PlainFunction(torch.autograd.Function):
    """Eager autograd of the common call (:class:`gpu.Plain`: channel-last x, CUDA-routed, no
    states, tables or main_grad buffers), the Function directly above its prepared launches: it
    allocates the outputs, looks the launches up by the data pointers' alignment class (and dy's row
    stride) and calls them with the tensors in their structs' order (``gpu.FWD_TENSORS``,
    ``gpu.BWD_TENSORS``); a class not seen yet is planned by ``gpu.Plain``. Each layer between the
    Function and the launches cost ~1 µs of an eager forward + backward's 80-100 (2-3 % for these two)."""

    @staticmethod
    def forward(ctx, plain: gpu.Plain, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        ctx.plain = plain
        p = x.data_ptr() | 16  # gpu.alignment(x): no states
        prepared = plain.fwd_plans.get(p & -p)
        if prepared is None:
            return plain.first_forward(x, weight, bias)
        y = plain.like_x(x)
        prepared((x, weight, bias, None, None, y, None))  # y is fresh: no overlap to check
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        plain = ctx.plain
        if x.stride() != plain.x_strides:  # a saved-tensor hook handed x back with other strides
            dx, dw, db, _ = ops.backward_impl(
                dy, x, weight, bias, plain.doc, None, None, plain.silu, plain.grad_dtype, plain.bwd.name
            )
            return None, *_differentiable_or_not(dx, dw, db)
        if dy.is_contiguous():
            dy_rs = dy.shape[-1]
        else:  # the expanded scalar of y.sum() (channel stride 0) is copied: the kernels read rows as vectors
            dy_rs = row_stride(dy, repeated=True)
            if dy_rs is None:
                dy, dy_rs = dy.contiguous(), dy.shape[-1]
        p = x.data_ptr() | dy.data_ptr() | 16  # gpu.alignment(x, dy): no states, no trailing tokens
        prepared = plain.bwd_plans.get((dy_rs, p & -p, 0))
        if prepared is None:
            return None, *_differentiable_or_not(*plain.first_backward(dy, dy_rs, x, weight, bias))
        launch, fold, scratch = prepared
        dx, dw = plain.like_x(x), torch.empty_like(weight)
        db = None if bias is None else torch.empty_like(bias)
        workspace, tickets = gpu.backward_scratch(*scratch, x.device)
        # every output is fresh: no overlap to check
        launch((x, dy, weight, bias, None, None, dx, None, dw, db, workspace, tickets, None, None))
        if fold is not None:
            fold((workspace, dw, db))
        if torch.is_grad_enabled():  # create_graph=True
            dx, dw, db = not_differentiable(dx, dw, db)
        return None, dx, dw, db


def _differentiable_or_not(*grads):
    """``grads``, behind :func:`not_differentiable` under create_graph=True: a second derivative must
    raise, not come out as zero."""
    return not_differentiable(*grads) if torch.is_grad_enabled() else grads


_function_apply = super(torch.autograd.Function, CausalConv1dSiLUFunction).apply  # the C++ apply
_plain_apply = super(torch.autograd.Function, PlainFunction).apply
_functorch_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def apply(call: Call, x, weight, bias, *optional):
    """``CausalConv1dSiLUFunction.apply`` (``PlainFunction.apply`` where the call is plain), less its
    Python wrapper (1.5 µs of a 5.5 µs apply on a fast host): outside functorch's transforms that
    wrapper only unwraps dead functorch wrappers (tensors leaked out of a finished transform) and
    calls the C++ apply, as done here; inside one it is taken."""
    plain = call.route.plain
    if _functorch_active():
        if plain is not None:
            return PlainFunction.apply(plain, x, weight, bias)
        return CausalConv1dSiLUFunction.apply(call, x, weight, bias, *optional)
    x, weight = _unwrap_if_dead(x), _unwrap_if_dead(weight)
    if bias is not None:
        bias = _unwrap_if_dead(bias)
    if plain is not None:  # no optional tensors
        return _plain_apply(plain, x, weight, bias)
    if optional:
        optional = [t if t is None else _unwrap_if_dead(t) for t in optional]
    return _function_apply(call, x, weight, bias, *optional)


def _setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, cu_seqlens, initial_states, wmg, bmg, return_final_states, silu, fp32_grads, program = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx, cu_seqlens, initial_states, wmg, bmg)
    ctx.return_final_states, ctx.silu, ctx.fp32_grads, ctx.program = return_final_states, silu, fp32_grads, program


def _backward(ctx, dy, dfinal):
    x, weight, bias, seq_idx, cu_seqlens, initial_states, wmg, bmg = ctx.saved_tensors
    dfinal = dfinal if ctx.return_final_states else None
    if wmg is not None:
        dx, dinit = torch.ops.conv1d_silu.bwd_main_grad(
            dy, x, weight, bias, seq_idx, cu_seqlens, initial_states, dfinal, wmg, bmg, ctx.silu, ctx.program
        )
        dw = db = None
    else:
        dx, dw, db, dinit = torch.ops.conv1d_silu.bwd(
            dy, x, weight, bias, seq_idx, cu_seqlens, initial_states, dfinal, ctx.silu, ctx.fp32_grads, ctx.program
        )
        db = db if bias is not None else None
    dinit = dinit if initial_states is not None else None
    return dx, dw, db, None, None, dinit, None, None, None, None, None, None


ops.fwd.register_autograd(_backward, setup_context=_setup_context)


def traced(x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad,
           return_final_states, silu, grad_dtype, program):
    """The op with autograd while compiling: the custom op, whose backward is registered above."""
    y, final = torch.ops.conv1d_silu.fwd(
        x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad,
        return_final_states, silu, grad_dtype == torch.float32, program or None,
    )
    return (y, final) if return_final_states else y
