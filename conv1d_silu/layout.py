"""Layouts: how each entry point's tensors map onto the op's token-major form.

The op works on token-major tensors, ``(S, C)`` or ``(B, L, C)`` with channels contiguous. Every
entry point (the function, the module, the causal-conv1d drop-in) goes through :func:`to_tokens`
and :func:`from_tokens`, so every argument reaches the op in every layout:

* ``"BLC"``: x is ``(S, C)`` or ``(B, L, C)``; states are ``(N, K-1, C)``.
* ``"BCL"``: x is ``(B, C, L)`` like ``nn.Conv1d``'s input and causal-conv1d's; states are
  ``(N, C, K-1)``. Channel-last memory (``x.stride(1) == 1``, e.g. ``h.transpose(1, 2)``) with evenly
  spaced rows is read in place; any other strides are copied to channel-last first, and the output of
  a channel-first x is copied back into x's layout (``torch.empty_like(x)``'s strides).

A 3-D x of one batch row with ``cu_seqlens`` holds packed documents (flash-linear-attention's
form): it runs as ``(S, C)`` tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .dtypes import FLOAT_DTYPES
from .validation import fail, row_stride

LAYOUTS = ("BLC", "BCL")


class Tokens(NamedTuple):
    """The token-major arguments of one call and how to give the results back."""

    x: torch.Tensor
    seq_idx: torch.Tensor | None
    initial_states: torch.Tensor | None
    layout: str
    packed_row: bool  # a (1, L, C) batch row ran as (L, C) packed tokens
    channel_first: torch.Tensor | None  # a channel-first x, copied in: the output goes back to its layout


def to_tokens(
    x: object, seq_idx: object, cu_seqlens: object, initial_states: object, layout: object
) -> Tokens:
    """The token-major x, seq_idx and initial states of a call in ``layout``."""
    if layout not in LAYOUTS:
        fail("layout", "'BLC' or 'BCL'", repr(layout))
    if not isinstance(x, torch.Tensor):
        fail("x", "a torch.Tensor", type(x).__name__, TypeError)
    channel_first = None
    if layout == "BCL":
        if x.dim() != 3:
            fail("x", "shape (B, C, L) with layout='BCL'", tuple(x.shape))
        if x.dtype not in FLOAT_DTYPES:  # before any copy below
            fail("x", "dtype float32, float16, bfloat16 or float64", x.dtype, TypeError)
        if isinstance(initial_states, torch.Tensor):
            if initial_states.dim() != 3:
                fail("initial_states", "shape (N, C, K-1) with layout='BCL'", tuple(initial_states.shape))
            initial_states = initial_states.transpose(1, 2)
        if x.shape[1] > 1 and x.stride(1) != 1:
            channel_first = x
        x = x.transpose(1, 2)
        if channel_first is not None or row_stride(x) is None:
            # channel-first memory, or channel-last rows not evenly spaced (any strides are taken in
            # this layout, as causal-conv1d takes them)
            x = x.contiguous()
    packed_row = cu_seqlens is not None and x.dim() == 3 and x.shape[0] == 1
    if packed_row:
        x = x[0]
        if isinstance(seq_idx, torch.Tensor) and seq_idx.dim() == 2:
            seq_idx = seq_idx[0]
    return Tokens(x, seq_idx, initial_states, layout, packed_row, channel_first)


def from_tokens(t: Tokens, y: torch.Tensor, final: torch.Tensor | None):
    """The op's token-major results in the call's layout: y, or (y, final_states)."""
    if t.packed_row:
        y = y.unsqueeze(0)
    if t.layout == "BCL":
        y = y.transpose(1, 2)
        if t.channel_first is not None:  # x's strides, as causal-conv1d's torch.empty_like(x)
            y = torch.empty_like(t.channel_first).copy_(y)
        if final is not None:
            final = final.transpose(1, 2)
    return y if final is None else (y, final)
