"""The decoding step in plain PyTorch: the CPU implementation of ``conv1d_silu::update`` and the
oracle of the CUDA kernel's tests (kernels/conv1d_silu_update.cu).

A step convolves L new tokens per sequence against a rolling state ``(rows, C, state_len)`` and
appends them to it in place. It reads no tensor value on the host, so it can be captured in a CUDA
graph. Arguments are those checked by conv1d_silu.compat.decode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dtypes import accumulator_dtype


def _window_and_state(state, x, width, cache_seqlens):
    """The W-1 state columns preceding x (oldest first) and the state after x is appended."""
    batch, dim, state_len = state.shape
    seqlen = x.shape[-1]
    if cache_seqlens is None:  # the newest column is the last one
        return state[..., state_len - (width - 1) :], torch.cat([state, x], -1)[..., -state_len:]
    # circular buffer: the next token goes to column cache_seqlens % state_len
    start = cache_seqlens.long().unsqueeze(1)
    read = torch.remainder(start + torch.arange(1 - width, 0, device=x.device), state_len)
    window = state.gather(2, read.unsqueeze(1).expand(batch, dim, width - 1))
    keep = min(seqlen, state_len)  # earlier tokens would be overwritten within this step
    write = torch.remainder(start + torch.arange(seqlen - keep, seqlen, device=x.device), state_len)
    return window, state.scatter(2, write.unsqueeze(1).expand(batch, dim, keep), x[..., seqlen - keep :])


@torch.no_grad()
def update(x, conv_state, weight, bias, silu: bool, cache_seqlens, conv_state_indices) -> torch.Tensor:
    """out ``(B, C, L)`` for x ``(B, C, L)`` and the (C, W) weight; conv_state is updated in place."""
    batch, _, seqlen = x.shape
    width = weight.shape[1]
    out = torch.empty_like(x)
    if batch == 0:
        return out
    if conv_state_indices is None:
        rows = valid = None
        state = conv_state
    else:
        valid = conv_state_indices >= 0
        rows = conv_state_indices.long().clamp(min=0)
        state = conv_state.index_select(0, rows)
    window, new_state = _window_and_state(state, x, width, cache_seqlens)
    acc = accumulator_dtype(x.dtype)
    taps = torch.cat([window, x], -1).to(acc)
    wa = weight.to(acc).unsqueeze(-1)
    # explicit multiply-adds, not F.conv1d: cuDNN may take TF32 for fp32 convolutions
    z = sum(wa[:, k] * taps[..., k : k + seqlen] for k in range(width))
    if bias is not None:
        z = z + bias.to(acc).unsqueeze(-1)
    y = F.silu(z) if silu else z
    if rows is None:
        conv_state.copy_(new_state)
        return out.copy_(y)
    # A padding row (negative index) writes the first valid row's new state to that row once more
    # (without a valid row: row 0's own old state back to row 0), so a row written twice gets the
    # same value twice, and no boolean mask is read on the host.
    first = valid.to(torch.int32).argmax().reshape(1)

    def pick(t):  # index_select, not t[first], which may read first on the host
        return t.index_select(0, first)

    fill = torch.where(pick(valid)[:, None, None], pick(new_state), pick(state))
    conv_state.index_copy_(
        0, torch.where(valid, rows, pick(rows)), torch.where(valid[:, None, None], new_state, fill)
    )
    return out.copy_(torch.where(valid[:, None, None], y, 0))
