"""causal-conv1d's decoding step: a few new tokens against a rolling convolution state.

One CUDA launch per step (kernels/conv1d_silu_update.cu), plain PyTorch on the CPU
(conv1d_silu.decoding). A step reads no tensor value on the host, so it can be captured in a CUDA
graph (the check of ``conv_state_indices`` against the state's rows is skipped while capturing, and
on the GPU when ``CONV1D_SILU_CHECK_DOCS=0``).
"""

from __future__ import annotations

import torch

from .. import ops
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


def update(x, conv_state, weight, bias, silu: bool, cache_seqlens, conv_state_indices) -> torch.Tensor:
    """out ``(B, D, L)`` for x ``(B, D, L)``; conv_state is updated in place (see
    :func:`conv1d_silu.compat.causal_conv1d_update`). No autograd, like causal-conv1d's step."""
    w = _check(x, conv_state, weight, bias, cache_seqlens, conv_state_indices)
    return ops.update(x, conv_state, w, bias, silu, cache_seqlens, conv_state_indices)
