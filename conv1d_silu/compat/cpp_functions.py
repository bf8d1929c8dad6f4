"""causal-conv1d's ``causal_conv1d.cpp_functions``: the calls mamba_ssm's fused paths and fla make.

No autograd of their own: mamba_ssm calls them inside its own ``torch.autograd.Function``s.
"""

from __future__ import annotations

import torch

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
    with torch.no_grad():
        out = conv.forward(
            x, weight, bias, seq_idx, initial_states, final_states_out is not None, final_states_out, silu
        )
    return out if final_states_out is None else out[0]


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
    strides, e.g. a slice of a larger gradient buffer) that is written in place and returned; it
    may overlap x or dout (the gradient is computed in storage of its own, then copied).
    dfinal_states: ``(B, D, W-1)`` gradient of the final states, or None. dweight / dbias come in
    the parameters' dtype (dbias None without bias); dinitial_states ``(B, D, W-1)`` with
    ``stride(1) == 1`` when ``return_dinitial_states`` (the gradient w.r.t. the zero padding when
    initial_states is None), else None.
    """
    silu = checks.flag("silu_activation", silu_activation)
    with torch.no_grad():
        return conv.backward(
            x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states, silu
        )


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
