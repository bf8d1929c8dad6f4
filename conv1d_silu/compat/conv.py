"""causal-conv1d's calling convention on the op: ``(B, D, L)`` tensors in either memory layout.

Channel-last memory (``x.stride(1) == 1``) is read in place; channel-first memory is copied to
channel-last first (see :mod:`conv1d_silu.layout`). States are ``(B, D, W-1)``. The backward is this
package's deterministic one, whatever ``CAUSAL_CONV1D_DETERMINISTIC`` says.
"""

from __future__ import annotations

import torch

from .. import ops
from ..api import causal_conv1d_silu
from ..documents import DocTable
from ..layout import to_tokens
from ..validation import check_inputs, fail, row_stride
from . import checks


def channel_last(x: torch.Tensor) -> bool:
    return x.shape[1] <= 1 or x.stride(1) == 1


def readable(x: object) -> object:
    """x, with a channel-last view the kernels cannot read in place (batch rows not evenly spaced,
    overlapping tokens) copied to dense channel-last, as causal-conv1d reads any such strides."""
    if isinstance(x, torch.Tensor) and x.dim() == 3 and channel_last(x) and row_stride(x.transpose(1, 2)) is None:
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    return x


def _seq_idx_alone(seq_idx: object, **others: object) -> None:
    """causal-conv1d takes no states together with seq_idx."""
    if seq_idx is not None:
        for arg, value in others.items():
            if value is not None and value is not False:
                fail(arg, "None (or False) when seq_idx is given", "a tensor" if isinstance(value, torch.Tensor) else value)


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    return_final_states: bool,
    final_states_out: torch.Tensor | None,
    silu: bool,
):
    """out, or (out, final_states) with ``return_final_states``; final_states_out, when given, is
    written in place and returned."""
    checks.float_x(x, "(batch, dim, seqlen)", (3,))
    w = checks.weight(weight, x)
    checks.flag("return_final_states", return_final_states)
    _seq_idx_alone(seq_idx, initial_states=initial_states, return_final_states=return_final_states)
    if final_states_out is not None:
        if not return_final_states:
            fail("final_states_out", "None unless return_final_states=True", "a tensor")
        batch, dim, _ = x.shape
        checks.tensor("final_states_out", final_states_out, x, (batch, dim, w.shape[1] - 1), x.dtype)
        checks.writable("final_states_out", final_states_out)
    out = causal_conv1d_silu(
        readable(x), weight, bias, seq_idx=seq_idx, initial_states=initial_states,
        return_final_states=return_final_states, activation="silu" if silu else None, layout="BCL",
    )
    if final_states_out is None:
        return out
    return out[0], final_states_out.copy_(out[1])


def _op_backward(dy, x, w, bias, seq_idx, init, dfinal, silu: bool, doc: DocTable):
    """dx, dweight, dbias, dinitial in the op's token-major form: the implementation in eager mode,
    the custom op (with its fake kernel) while compiling."""
    if not torch.compiler.is_compiling():
        return ops.backward_impl(dy, x, w, bias, doc, init, dfinal, silu, w.dtype, None)
    dx, dw, db, dinit = torch.ops.conv1d_silu.bwd(dy, x, w, bias, seq_idx, None, init, dfinal, silu, False, None)
    return dx, dw, db if bias is not None else None, dinit if init is not None else None


def backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
    dx: torch.Tensor | None,
    return_dinitial_states: bool,
    silu: bool,
):
    """(dx, dweight, dbias, dinitial_states) of causal-conv1d's ``causal_conv1d_bwd_function``."""
    checks.float_x(x, "(batch, dim, seqlen)", (3,))
    w = checks.weight(weight, x)
    checks.flag("return_dinitial_states", return_dinitial_states)
    batch, dim, _ = x.shape
    checks.tensor("dout", dout, x, x.shape, x.dtype)
    if dx is not None:
        checks.tensor("dx", dx, x, x.shape, x.dtype)
        checks.writable("dx", dx)
    _seq_idx_alone(
        seq_idx, initial_states=initial_states, dfinal_states=dfinal_states,
        return_dinitial_states=return_dinitial_states,
    )
    state_shape = (batch, dim, w.shape[1] - 1)
    if dfinal_states is not None:
        checks.tensor("dfinal_states", dfinal_states, x, state_shape, x.dtype)
    if return_dinitial_states and initial_states is None:  # the gradient w.r.t. the zero padding
        initial_states = x.new_zeros(state_shape)
    tokens = to_tokens(readable(x), seq_idx, None, initial_states, "BCL")
    w2, _, doc = check_inputs(
        tokens.x, weight, bias, tokens.seq_idx, None, tokens.initial_states, False,
        "silu" if silu else None, None, None,
    )
    dfinal = None if dfinal_states is None else dfinal_states.transpose(1, 2)
    grad, dw, db, dinit = _op_backward(
        dout.transpose(1, 2), tokens.x, w2, bias, tokens.seq_idx, tokens.initial_states, dfinal, silu, doc
    )
    grad = grad.transpose(1, 2)
    if dx is not None:
        dx.copy_(grad)  # computed in storage of its own first: dx may overlap x or dout
    elif channel_last(x):
        dx = grad
    else:
        dx = torch.empty_like(x).copy_(grad)
    dinit = dinit.transpose(1, 2) if return_dinitial_states else None
    return dx, dw.view(weight.shape), db, dinit
