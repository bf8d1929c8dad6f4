"""causal-conv1d's calling convention on the op: ``(B, D, L)`` tensors in either memory layout.

Both memory layouts are read in place (``x.stride(2) == 1``: channel-first, ``x.stride(1) == 1``:
channel-last; see :mod:`conv1d_silu.layout`), and the output takes x's layout. States are
``(B, D, W-1)``.
"""

from __future__ import annotations

import torch

from ..api import causal_conv1d_silu
from ..validation import fail
from . import checks


def channel_last(x: torch.Tensor) -> bool:
    return x.shape[1] <= 1 or x.stride(1) == 1


def seq_idx_alone(seq_idx: object, **others: object) -> None:
    """causal-conv1d takes no final states together with seq_idx (initial states, one per batch row,
    belong to each row's first document)."""
    if seq_idx is not None:
        for arg, value in others.items():
            if value is not None and value is not False:
                fail(
                    arg,
                    "None (or False) when seq_idx is given",
                    "a tensor" if isinstance(value, torch.Tensor) else value,
                )


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    return_final_states: bool,
    final_states_out: torch.Tensor | None,
    silu: bool,
):
    """out, or (out, final_states) with ``return_final_states``; final_states_out, when given, is
    written in place and returned."""
    checks.float_x(x, "(batch, dim, seqlen)", (3,))
    w = checks.weight(weight, x)
    checks.flag("return_final_states", return_final_states)
    seq_idx_alone(seq_idx, return_final_states=return_final_states)
    if final_states_out is not None:
        if not return_final_states:
            fail("final_states_out", "None unless return_final_states=True", "a tensor")
        batch, dim, _ = x.shape
        checks.tensor("final_states_out", final_states_out, x, (batch, dim, w.shape[1] - 1), x.dtype)
        checks.writable("final_states_out", final_states_out)
    out = causal_conv1d_silu(
        x,
        weight,
        bias,
        seq_idx=seq_idx,
        initial_states=initial_states,
        return_final_states=return_final_states,
        activation="silu" if silu else None,
        layout="BCL",
    )
    if final_states_out is None:
        return out
    return out[0], final_states_out.copy_(out[1])
