"""Plain-PyTorch references of causal-conv1d's functions, under causal-conv1d's names.

Written from causal-conv1d's documented semantics (not its code), for tests: causal-conv1d's own test
file imports ``causal_conv1d_ref``, ``causal_conv1d_update_ref`` and ``causal_conv1d_varlen_states_ref``,
and ``conv1d_silu.compat.install()`` serves them. Arithmetic in fp32 (fp64 for fp64), outputs in x's
dtype; ``causal_conv1d_ref`` is differentiable.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ..dtypes import accumulator_dtype
from .checks import silu_flag


def _conv(full, weight, bias, silu, dtype):
    """act(depthwise F.conv1d) of ``(B, D, W-1+L)`` columns: L outputs in ``dtype``."""
    dim, width = weight.shape[0], weight.shape[-1]
    acc = accumulator_dtype(dtype)
    z = F.conv1d(
        full.to(acc),
        weight.reshape(dim, 1, width).to(acc),
        None if bias is None else bias.to(acc),
        groups=dim,
    )
    return (F.silu(z) if silu else z).to(dtype)


def causal_conv1d_ref(
    x,
    weight,
    bias=None,
    initial_states=None,
    return_final_states=False,
    final_states_out=None,
    activation=None,
):
    """``act(F.conv1d(cat(initial_states or zeros, x), weight, bias, groups=D))``; x ``(B, D, L)``.

    final_states = the last W-1 columns of ``cat(initial_states or zeros, x)``, copied into
    final_states_out when given."""
    silu = silu_flag(activation)
    width = weight.shape[-1]
    pre = x.new_zeros(x.shape[0], x.shape[1], width - 1) if initial_states is None else initial_states
    full = torch.cat([pre, x], -1)
    out = _conv(full, weight, bias, silu, x.dtype)
    if not return_final_states:
        return out
    final = full[..., full.shape[-1] - (width - 1) :]
    return out, final if final_states_out is None else final_states_out.copy_(final)


def causal_conv1d_update_ref(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None):
    """One decoding step, token by token: each new token is written into conv_state (in place) at
    the next column (the state shifts left without ``cache_seqlens``; circular from column
    ``cache_seqlens % state_len`` with it), and the output convolves the W-1 state columns that
    preceded the step, then the new tokens."""
    silu = silu_flag(activation)
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    batch, _, seqlen = x3.shape
    width, state_len = weight.shape[-1], conv_state.shape[-1]
    if cache_seqlens is None:
        window = conv_state[..., state_len - (width - 1) :].clone()
        for t in range(seqlen):
            conv_state.copy_(torch.cat([conv_state[..., 1:], x3[..., t : t + 1]], -1))
    else:
        start = cache_seqlens.long()
        window = torch.stack(
            [
                conv_state[torch.arange(batch), :, (start + j - (width - 1)) % state_len]
                for j in range(width - 1)
            ],
            -1,
        )
        for t in range(seqlen):
            conv_state[torch.arange(batch), :, (start + t) % state_len] = x3[..., t]
    out = _conv(torch.cat([window, x3], -1), weight, bias, silu, x.dtype)
    return out.squeeze(-1) if squeeze else out


def causal_conv1d_varlen_states_ref(x, cu_seqlens, state_len):
    """Sequence by sequence: its last min(len, state_len) tokens right-aligned in zeros,
    ``(N, dim, state_len)`` with ``stride(1) == 1``."""
    cu = cu_seqlens.tolist()
    states = x.new_zeros(len(cu) - 1, state_len, x.shape[1])
    for i, (start, end) in enumerate(itertools.pairwise(cu)):
        n = min(end - start, state_len)
        if n > 0:
            states[i, state_len - n :] = x[end - n : end]
    return states.transpose(1, 2)
