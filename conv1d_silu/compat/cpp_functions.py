"""causal-conv1d's ``causal_conv1d.cpp_functions``: the calls mamba_ssm's fused paths and fla make.

No autograd of their own: mamba_ssm calls them inside its own ``torch.autograd.Function``s.
"""

from __future__ import annotations

import torch

from .. import ops
from ..documents import DocTable
from ..layout import to_tokens
from ..validation import check_inputs
from . import checks, conv, decode


def causal_conv1d_fwd_function(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    final_states_out: torch.Tensor | None,
    silu_activation: bool,
) -> torch.Tensor:
    """out ``(B, D, L)`` in x's layout, without autograd; final_states ``(B, D, W-1)`` are written
    into final_states_out when it is given. Arguments as :func:`conv1d_silu.compat.causal_conv1d_fn`."""
    silu = checks.flag("silu_activation", silu_activation)
    conv.seq_idx_alone(seq_idx, final_states_out=final_states_out)
    with torch.no_grad():
        out = conv.forward(
            x, weight, bias, seq_idx, initial_states, final_states_out is not None, final_states_out, silu
        )
    return out if final_states_out is None else out[0]


def _op_backward(dy, x, w, bias, seq_idx, init, dfinal, silu: bool, doc: DocTable, dx_out):
    """dx, dweight, dbias, dinitial in the op's token-major form: the implementation in eager mode
    (dx written into ``dx_out`` when given), the custom op (with its fake kernel) while compiling."""
    if not torch.compiler.is_compiling():
        return ops.backward_impl(dy, x, w, bias, doc, init, dfinal, silu, w.dtype, None, dx_out=dx_out)
    dx, dw, db, dinit = torch.ops.conv1d_silu.bwd(
        dy, x, w, bias, seq_idx, None, init, dfinal, silu, False, None
    )
    if dx_out is not None:
        dx = dx_out.copy_(dx)
    return dx, dw, db if bias is not None else None, dinit if init is not None else None


@torch.no_grad()
def causal_conv1d_bwd_function(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
    dx: torch.Tensor | None,
    return_dinitial_states: bool,
    silu_activation: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight, dbias, dinitial_states) of the forward above, from its output gradient dout.

    The backward is deterministic (bitwise reproducible) whatever ``CAUSAL_CONV1D_DETERMINISTIC`` or
    ``torch.are_deterministic_algorithms_enabled()`` say. dout: x's shape and dtype, any strides.
    dx: None for a new tensor in x's layout, or a tensor of x's shape and dtype (any non-overlapping
    strides, e.g. a slice of a larger gradient buffer) that is written in place and returned: by
    the channel-first kernels directly where x and dx are channel-first and dx overlaps neither x
    nor dout, else computed in storage of its own and copied.
    dfinal_states: ``(B, D, W-1)`` gradient of the final states, or None. dweight / dbias come in
    the parameters' dtype (dbias None without bias); dinitial_states ``(B, D, W-1)`` with
    ``stride(1) == 1`` when ``return_dinitial_states`` (the gradient w.r.t. the zero padding when
    initial_states is None), else None.
    """
    silu = checks.flag("silu_activation", silu_activation)
    checks.float_x(x, "(batch, dim, seqlen)", (3,))
    w = checks.weight(weight, x)
    checks.flag("return_dinitial_states", return_dinitial_states)
    batch, dim, _ = x.shape
    checks.tensor("dout", dout, x, x.shape, x.dtype)
    if dx is not None:
        checks.tensor("dx", dx, x, x.shape, x.dtype)
        checks.writable("dx", dx)
    conv.seq_idx_alone(seq_idx, dfinal_states=dfinal_states)
    state_shape = (batch, dim, w.shape[1] - 1)
    if dfinal_states is not None:
        checks.tensor("dfinal_states", dfinal_states, x, state_shape, x.dtype)
    if return_dinitial_states and initial_states is None:  # the gradient w.r.t. the zero padding
        initial_states = x.new_zeros(state_shape)
    tokens = to_tokens(x, seq_idx, None, initial_states, "BCL")
    w2, _, doc = check_inputs(
        tokens.x,
        weight,
        bias,
        tokens.seq_idx,
        None,
        tokens.initial_states,
        False,
        "silu" if silu else None,
        None,
        None,
    )
    dfinal = None if dfinal_states is None else dfinal_states.transpose(1, 2)
    grad, dw, db, dinit = _op_backward(
        dout.transpose(1, 2), tokens.x, w2, bias, tokens.seq_idx, tokens.initial_states, dfinal, silu, doc,
        None if dx is None else dx.transpose(1, 2),
    )
    if dx is None:
        grad = grad.transpose(1, 2)  # x's layout where the kernels read x in place
        dx = grad if conv.channel_last(x) or x.stride(2) == 1 else torch.empty_like(x).copy_(grad)
    dinit = dinit.transpose(1, 2) if return_dinitial_states else None
    return dx, dw.view(weight.shape), db, dinit


def causal_conv1d_update_function(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu_activation: bool,
    cache_seqlens: torch.Tensor | None,
    conv_state_indices: torch.Tensor | None,
) -> torch.Tensor:
    """The decoding step of :func:`conv1d_silu.compat.causal_conv1d_update` for a 3-D x ``(B, D, L)``."""
    silu = checks.flag("silu_activation", silu_activation)
    return decode.update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)
