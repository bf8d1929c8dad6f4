"""Layouts: how each entry point's tensors map onto the op's token-major form.

The op works on token-major tensors, ``(S, C)`` or ``(B, L, C)`` with channels contiguous. Every
entry point (the function, the module, the causal-conv1d drop-in) goes through :func:`to_tokens`
and :func:`from_tokens`, so every argument reaches the op in every layout:

* ``"BLC"``: x is ``(S, C)`` or ``(B, L, C)``; states are ``(N, K-1, C)``.
* ``"BCL"``: x is ``(B, C, L)`` like ``nn.Conv1d``'s input and causal-conv1d's; states are
  ``(N, C, K-1)``. It reaches the op as its ``(B, L, C)`` view: channel-first memory (the sequence
  contiguous, ``x.stride(2) == 1``, any batch and channel strides, e.g. a ``chunk`` of a wider
  projection) runs the channel-first kernels in place, channel-last memory (``x.stride(1) == 1``,
  e.g. ``h.transpose(1, 2)``) with evenly spaced rows the channel-last ones; any other strides are
  copied first. The output takes x's layout (``torch.empty_like(x)``'s strides, as causal-conv1d's).

A 3-D x of one batch row with ``cu_seqlens`` holds packed documents (flash-linear-attention's
form): it runs as ``(S, C)`` tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .dtypes import FLOAT_DTYPES
from .validation import channel_first, fail, row_stride

LAYOUTS = ("BLC", "BCL")


class Tokens(NamedTuple):
    """The token-major arguments of one call and how to give the results back."""

    x: torch.Tensor
    seq_idx: torch.Tensor | None
    initial_states: torch.Tensor | None
    layout: str
    packed_row: bool  # a (1, L, C) batch row ran as (L, C) packed tokens


def to_tokens(
    x: object, seq_idx: object, cu_seqlens: object, initial_states: object, layout: object
) -> Tokens:
    """The token-major x, seq_idx and initial states of a call in ``layout``."""
    if layout not in LAYOUTS:
        fail("layout", "'BLC' or 'BCL'", repr(layout))
    if not isinstance(x, torch.Tensor):
        fail("x", "a torch.Tensor", type(x).__name__, TypeError)
    if layout == "BCL":
        if x.dim() != 3:
            fail("x", "shape (B, C, L) with layout='BCL'", tuple(x.shape))
        if x.dtype not in FLOAT_DTYPES:  # before any copy below
            fail("x", "dtype float32, float16, bfloat16 or float64", x.dtype, TypeError)
        if isinstance(initial_states, torch.Tensor):
            if initial_states.dim() != 3:
                fail("initial_states", "shape (N, C, K-1) with layout='BCL'", tuple(initial_states.shape))
            initial_states = initial_states.transpose(1, 2)
        if x.stride(2) != 1 and x.shape[2] > 1 and x.stride(1) != 1 and x.shape[1] > 1:
            # neither layout's kernels read it in place: copied channel-first, so the output is what
            # causal-conv1d's torch.empty_like(x) gives (any strides are taken in this layout)
            x = x.contiguous()
        x = x.transpose(1, 2)
        if row_stride(x) is None and not channel_first(x):  # rows not evenly spaced
            x = x.contiguous()
    packed_row = cu_seqlens is not None and x.dim() == 3 and x.shape[0] == 1 and not channel_first(x)
    if packed_row:
        x = x[0]
        if isinstance(seq_idx, torch.Tensor) and seq_idx.dim() == 2:
            seq_idx = seq_idx[0]
    return Tokens(x, seq_idx, initial_states, layout, packed_row)


def from_tokens(t: Tokens, y: torch.Tensor, final: torch.Tensor | None):
    """The op's token-major results in the call's layout: y, or (y, final_states)."""
    if t.packed_row:
        y = y.unsqueeze(0)
    if t.layout == "BCL":
        y = y.transpose(1, 2)  # in x's layout already (ops.like_x)
        if final is not None:
            final = final.transpose(1, 2)
    return y if final is None else (y, final)
