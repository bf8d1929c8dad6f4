"""Autograd wiring of the forward and backward.

The forward saves x, weight, bias, the document table and the initial states (never z or y);
the backward recomputes z from x.

Two equivalent paths share ``ops.forward_impl`` / ``ops.backward_impl``:

* eager: :class:`CausalConv1dSiLUFunction` calls the implementations directly, skipping the
  dispatcher's per-op cost (DESIGN.md 6b: a custom op + register_autograd round trip costs about
  twice an autograd.Function on a slow host CPU);
* torch.compile: the custom op ``conv1d_silu::fwd`` with the backward registered here, calling
  ``conv1d_silu::bwd`` (or ``bwd_main_grad``), which Dynamo traces through fake kernels.
"""

from __future__ import annotations

import torch

from . import ops


class CausalConv1dSiLUFunction(torch.autograd.Function):
    """Eager autograd of the op. Inputs after the tensors are plain Python values."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, weight_main_grad, bias_main_grad, doc, return_final_states, silu, grad_dtype, program):
        y, final = ops.forward_impl(x, weight, bias, doc, initial_states, return_final_states, silu, program)
        ctx.save_for_backward(x, weight, bias, initial_states)
        ctx.doc, ctx.silu, ctx.grad_dtype, ctx.program = doc, silu, grad_dtype, program
        ctx.main_grads = (weight_main_grad, bias_main_grad)
        ctx.return_final_states = return_final_states
        return (y, final) if return_final_states else y

    @staticmethod
    def backward(ctx, dy, dfinal=None):
        x, weight, bias, initial_states = ctx.saved_tensors
        wmg, bmg = ctx.main_grads
        dx, dw, db, dinit = ops.backward_impl(
            dy, x, weight, bias, ctx.doc, initial_states, dfinal if ctx.return_final_states else None,
            ctx.silu, ctx.grad_dtype, ctx.program, wmg, bmg,
        )
        if wmg is not None:  # the weight gradients went into the main_grad buffers
            dw = db = None
        return dx, dw, db, dinit, None, None, None, None, None, None, None


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


def apply(x, weight, bias, doc, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad,
          return_final_states, silu, grad_dtype, program):
    """Run the op with autograd: the custom op while compiling, the Function in eager mode."""
    if torch.compiler.is_compiling():
        fp32_grads = grad_dtype == torch.float32
        y, final = torch.ops.conv1d_silu.fwd(
            x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad,
            return_final_states, silu, fp32_grads, program,
        )
        return (y, final) if return_final_states else y
    return CausalConv1dSiLUFunction.apply(
        x, weight, bias, initial_states, weight_main_grad, bias_main_grad, doc, return_final_states, silu,
        grad_dtype, program,
    )

