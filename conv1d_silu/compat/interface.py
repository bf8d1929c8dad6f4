"""causal-conv1d's ``causal_conv1d_fn`` and ``causal_conv1d_update``, with its signatures."""

from __future__ import annotations

import torch

from . import checks, conv, decode


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
):
    """``act(bias + causal depthwise conv1d(x, weight))`` with autograd (our deterministic backward).

    Equals ``F.conv1d(x, weight.unsqueeze(1), bias, padding=W-1, groups=D)[..., :L]``, then SiLU
    for ``activation`` "silu" / "swish" (None: identity; anything else raises NotImplementedError).

    x: ``(B, D, L)``, float32 / float16 / bfloat16 (or float64), any strides: channel-last memory
    (``x.stride(1) == 1``, e.g. ``h.transpose(1, 2)`` or a slice of a fused projection) is read in
    place; channel-first memory is copied (in, and the output back out).
    weight: ``(D, W)`` (or nn.Conv1d's ``(D, 1, W)``), any strides, any float dtype (fp32 with 16-bit
    x); 2 <= W <= 8, where causal-conv1d takes 2 <= W <= 4. bias: ``(D,)`` in the weight's dtype.
    seq_idx: ``(B, L)`` int32 or int64: a tap reads only tokens of the same value (non-decreasing
    along each row). Not with return_final_states.
    initial_states: ``(B, D, W-1)`` in x's dtype, the tokens before x (zeros when None); with
    seq_idx, row b's state precedes its first token, so only the row's first document reads it.
    return_final_states: also return final_states ``(B, D, W-1)`` (``stride(1) == 1``): the last
    W-1 columns of ``cat(initial_states or zeros, x)``. final_states_out: ``(B, D, W-1)`` written
    in place and returned as final_states; only with return_final_states (causal-conv1d ignores it
    otherwise; here that is an error).
    Returns out ``(B, D, L)`` in x's dtype and layout, or ``(out, final_states)``.
    """
    silu = checks.silu_flag(activation)
    return conv.forward(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, silu)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decoding: convolve new tokens against the rolling state, and append them to it in place.

    x: ``(B, D)`` or ``(B, D, L)`` with L >= 1 new tokens, any strides. conv_state:
    ``(B, D, state_len)`` (or ``(entries, D, state_len)`` with conv_state_indices), state_len >= W-1,
    x's dtype, any non-overlapping strides; mutated in place, never replaced. weight / bias /
    activation as :func:`causal_conv1d_fn`.
    Without cache_seqlens the output convolves the state's last W-1 columns then x, and the state
    becomes ``cat(conv_state, x)[..., -state_len:]``. cache_seqlens ``(B,)`` int32 / int64: the
    state is a circular buffer whose next column is ``cache_seqlens % state_len`` (the W-1 columns
    before it are read, x is written from it; cache_seqlens itself is not incremented).
    conv_state_indices ``(B,)`` int32 / int64: batch row b uses entry ``conv_state_indices[b]``
    (distinct for the non-negative ones); a negative index is a padding row: output 0, no state
    touched. Returns out with x's shape, dtype and layout. Plain PyTorch without autograd, without
    a host sync: CUDA-graph capturable.
    """
    silu = checks.silu_flag(activation)
    squeeze = isinstance(x, torch.Tensor) and x.dim() == 2
    out = decode.update(
        x.unsqueeze(-1) if squeeze else x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices
    )
    return out.squeeze(-1) if squeeze else out
