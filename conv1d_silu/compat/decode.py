"""causal-conv1d's decoding step: a few new tokens against a rolling convolution state.

Plain PyTorch (CPU and CUDA): a step moves a few tokens per sequence. It reads no tensor value on the
host, so a step can be captured in a CUDA graph (the check of ``conv_state_indices`` against the
state's rows is skipped while capturing, and on the GPU when ``CONV1D_SILU_CHECK_DOCS=0``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dtypes import accumulator_dtype
from ..validation import fail, values_checked
from . import checks


def _check(x, conv_state, weight, bias, cache_seqlens, conv_state_indices) -> torch.Tensor:
    """Validate the step's arguments; return the (D, W) weight."""
    checks.float_x(x, "(batch, dim, seqlen)", (3,))
    batch, dim, seqlen = x.shape
    if seqlen < 1:
        fail("x", "at least one new token (x.shape[-1] >= 1)", seqlen)
    w = checks.weight(weight, x)
    checks.bias(bias, w, x)
    width = w.shape[1]
    checks.tensor("conv_state", conv_state, x, dtype=x.dtype)
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        fail("conv_state", f"shape (entries, {dim}, state_len >= {width - 1})", tuple(conv_state.shape))
    checks.writable("conv_state", conv_state)
    if cache_seqlens is not None:
        checks.index_tensor("cache_seqlens", cache_seqlens, x, (batch,))
    if conv_state_indices is None:
        if conv_state.shape[0] != batch:
            fail("conv_state", f"{batch} rows (x's batch) without conv_state_indices", conv_state.shape[0])
        return w
    checks.index_tensor("conv_state_indices", conv_state_indices, x, (batch,))
    if batch and values_checked(conv_state_indices):
        top = int(conv_state_indices.max())
        if top >= conv_state.shape[0]:
            fail(
                "conv_state_indices",
                f"values < conv_state.shape[0] == {conv_state.shape[0]} (negative: padding)",
                top,
            )
    return w


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
    """out ``(B, D, L)`` for x ``(B, D, L)``; conv_state is updated in place (see
    :func:`conv1d_silu.compat.causal_conv1d_update`). No autograd, like causal-conv1d's step."""
    w = _check(x, conv_state, weight, bias, cache_seqlens, conv_state_indices)
    batch, _, seqlen = x.shape
    width = w.shape[1]
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
    wa = w.to(acc).unsqueeze(-1)
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
