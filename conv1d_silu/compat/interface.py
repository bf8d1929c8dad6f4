"""Drop-in replacements for ``causal_conv1d.causal_conv1d_fn`` and ``causal_conv1d_update``.

Switching is one line::

    from conv1d_silu.compat import causal_conv1d_fn, causal_conv1d_update

The arguments and results follow causal-conv1d's documented semantics — ``x`` is
``(batch, dim, seqlen)``, the output has x's memory layout — and gradients go through our
deterministic backward. Cost of the layouts: channel-last memory (``x.stride(1) == 1``, i.e. a
transposed ``(batch, seqlen, dim)`` tensor, what mamba_ssm passes) is read in place and the output
is written channel-last, no copies; channel-first memory (``x.stride(2) == 1``) costs one copy of
x in and one of the output out (and the same two in the backward).
"""

from __future__ import annotations

import torch

from ..api import causal_conv1d_silu
from ..validation import activation_flag, fail


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
    """causal-conv1d's ``causal_conv1d_fn`` on our kernels.

    x: ``(batch, dim, seqlen)``; weight: ``(dim, width)``; bias: ``(dim,)``; seq_idx:
    ``(batch, seqlen)`` int32; initial_states: ``(batch, dim, width - 1)``; final_states_out:
    ``(batch, dim, width - 1)``, written to; activation: None, ``"silu"`` or ``"swish"``.
    Returns ``out`` ``(batch, dim, seqlen)`` in x's layout, or ``(out, final_states)``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        fail("x", "a (batch, dim, seqlen) tensor", getattr(x, "shape", type(x).__name__))
    out = causal_conv1d_silu(
        x,
        weight,
        bias,
        seq_idx=seq_idx,
        initial_states=initial_states,
        return_final_states=return_final_states,
        activation=activation,
        layout="BCL",
    )
    y, final = out if return_final_states else (out, None)
    if not return_final_states:
        return y
    if final_states_out is not None:
        if final_states_out.shape != final.shape:
            fail("final_states_out", f"shape {tuple(final.shape)}", tuple(final_states_out.shape))
        final_states_out.copy_(final)
        final = final_states_out
    return y, final


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """causal-conv1d's decoding step: convolve a few new tokens against the rolling state.

    x: ``(batch, dim)`` or ``(batch, dim, seqlen)``; conv_state: ``(batch, dim, state_len)`` with
    ``state_len >= width - 1``, updated in place (the new tokens are appended, the oldest dropped);
    cache_seqlens: ``(batch,)`` int32, treats conv_state as a circular buffer written at
    ``cache_seqlens % state_len``; conv_state_indices: ``(batch,)`` int32 rows of a larger
    conv_state (continuous batching; a negative index is a padding slot: output 0, no update).
    Decoding moves a few tokens per sequence, so this is plain PyTorch (CPU and CUDA), computed
    in fp32 (fp64 for fp64) and cast once.
    """
    silu = activation_flag(activation)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    if x.dim() != 3:
        fail("x", "(batch, dim) or (batch, dim, seqlen)", tuple(x.shape))
    batch, dim, seqlen = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim:
        fail("weight", f"shape ({dim}, width)", tuple(weight.shape))
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or state_len < width - 1:
        fail("conv_state", f"shape (batch, {dim}, state_len >= {width - 1})", tuple(conv_state.shape))
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = torch.arange(batch, device=x.device) if conv_state_indices is None else conv_state_indices.long()
    if conv_state_indices is None and conv_state.shape[0] != batch:
        fail("conv_state", f"{batch} rows (or conv_state_indices)", conv_state.shape[0])
    valid = rows >= 0
    safe = rows.clamp(min=0)
    state = conv_state[safe]  # (batch, dim, state_len), a copy
    if cache_seqlens is None:
        window = torch.cat([state[..., state_len - (width - 1):], x.to(state.dtype)], dim=-1)
        new_state = torch.cat([state, x.to(state.dtype)], dim=-1)[..., -state_len:]
    else:
        start = cache_seqlens.long().unsqueeze(1)
        read = torch.remainder(start + torch.arange(-(width - 1), 0, device=x.device), state_len)
        window = torch.cat([state.gather(2, read.unsqueeze(1).expand(-1, dim, -1)), x.to(state.dtype)], dim=-1)
        write = torch.remainder(start + torch.arange(seqlen, device=x.device), state_len)
        new_state = state.scatter(2, write.unsqueeze(1).expand(-1, dim, -1), x.to(state.dtype))
    w = weight.to(acc)
    win = window.to(acc)
    z = torch.zeros(batch, dim, seqlen, dtype=acc, device=x.device)
    if bias is not None:
        z = z + bias.to(acc)[:, None]
    for k in range(width):
        z = z + w[:, k, None] * win[..., k : k + seqlen]
    out = z * torch.sigmoid(z) if silu else z
    out = torch.where(valid[:, None, None], out, torch.zeros_like(out)).to(x.dtype)
    if conv_state_indices is None:
        conv_state.copy_(new_state)
    else:  # padding slots are dropped (a boolean index: one host sync)
        conv_state[safe[valid]] = new_state[valid]
    return out.squeeze(-1) if squeeze else out
