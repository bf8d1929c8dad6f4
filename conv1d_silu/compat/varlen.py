"""causal-conv1d's ``causal_conv1d_varlen_states``: the conv states of packed sequences."""

from __future__ import annotations

import torch

from ..validation import fail, values_checked
from . import checks


def _check(x, cu_seqlens, state_len) -> None:
    checks.float_x(x, "(total_tokens, dim)", (2,))
    checks.index_tensor("cu_seqlens", cu_seqlens, x, None)
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        fail("cu_seqlens", "shape (N + 1,)", tuple(cu_seqlens.shape))
    if isinstance(state_len, bool) or not isinstance(state_len, int) or state_len < 1:
        fail(
            "state_len",
            "a positive int",
            repr(state_len),
            TypeError if not isinstance(state_len, int) else ValueError,
        )
    if cu_seqlens.shape[0] > 1 and values_checked(cu_seqlens):
        cu = cu_seqlens.long()
        low, high, unordered = torch.stack([cu.min(), cu.max(), (cu[1:] < cu[:-1]).any().long()]).tolist()
        if unordered or low < 0 or high > x.shape[0]:
            fail(
                "cu_seqlens",
                f"non-decreasing offsets in [0, {x.shape[0]}] (x.shape[0])",
                f"values in [{low}, {high}]",
            )


@torch.no_grad()
def causal_conv1d_varlen_states(x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int) -> torch.Tensor:
    """The last ``state_len`` tokens of each packed sequence, as conv states.

    x: ``(total_tokens, dim)``, any strides. cu_seqlens: ``(N + 1,)`` int32 or int64 non-decreasing
    offsets; sequence ``i`` is ``x[cu_seqlens[i]:cu_seqlens[i + 1]]``.
    Returns ``states`` ``(N, dim, state_len)`` in x's dtype, allocated as ``(N, state_len, dim)``
    transposed (``stride(1) == 1``): the last ``min(len, state_len)`` tokens of each sequence
    right-aligned, zeros before the sequence's start. No autograd; no host sync.
    """
    _check(x, cu_seqlens, state_len)
    total, dim = x.shape
    cu = cu_seqlens.long()
    n = cu.shape[0] - 1
    token = cu[1:].unsqueeze(1) + torch.arange(-state_len, 0, device=x.device)  # (N, state_len)
    inside = (token >= cu[:-1].unsqueeze(1)).unsqueeze(2)
    if total == 0:
        return x.new_zeros(n, state_len, dim).transpose(1, 2)
    rows = x.index_select(0, token.clamp(0, total - 1).flatten()).view(n, state_len, dim)
    return torch.where(inside, rows, 0).transpose(1, 2)
