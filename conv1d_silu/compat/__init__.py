"""A drop-in for causal-conv1d (Dao-AILab/causal-conv1d) on conv1d_silu's kernels.

Direct use::

    from conv1d_silu.compat import causal_conv1d_fn, causal_conv1d_update

For code that imports ``causal_conv1d`` itself (mamba_ssm's fused paths, flash-linear-attention's
CUDA backend, transformers' Mamba-family models, Megatron-LM), one line before those imports::

    import conv1d_silu.compat; conv1d_silu.compat.install()

makes ``causal_conv1d``, ``causal_conv1d.causal_conv1d_interface``, ``causal_conv1d.cpp_functions``
and ``causal_conv1d.causal_conv1d_varlen`` resolve to this package, with causal-conv1d's signatures,
a ``__version__`` and ``importlib.metadata`` entry of ``1.6.1+conv1d.silu``, and a ``__spec__``
(``importlib.util.find_spec`` finds it). It raises RuntimeError if a real causal_conv1d is already
imported; :func:`uninstall` undoes it.

Semantics are causal-conv1d's, with these differences: kernel widths 2..8 (causal-conv1d: 2..4);
any channel count and strides (causal-conv1d: multiples of 8 for channel-last); float64 too;
final states, initial states and seq_idx in both memory layouts; ``final_states_out`` without
``return_final_states`` is an error instead of being ignored. The backward is always deterministic
(bitwise reproducible): Megatron's deterministic mode still asks for
``CAUSAL_CONV1D_DETERMINISTIC=1`` (or torch's deterministic algorithms), which changes nothing here.
Channel-first ``(B, D, L)`` memory costs a copy in and out; decoding (``causal_conv1d_update``) is
plain PyTorch.
"""

from __future__ import annotations

from .cpp_functions import (
    causal_conv1d_bwd_function,
    causal_conv1d_fwd_function,
    causal_conv1d_update_function,
)
from .shim import VERSION, install, uninstall
from .interface import causal_conv1d_fn, causal_conv1d_update
from .references import causal_conv1d_ref, causal_conv1d_update_ref, causal_conv1d_varlen_states_ref
from .varlen import causal_conv1d_varlen_states

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "causal_conv1d_fwd_function",
    "causal_conv1d_bwd_function",
    "causal_conv1d_update_function",
    "causal_conv1d_varlen_states",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "causal_conv1d_varlen_states_ref",
    "install",
    "uninstall",
    "VERSION",
]
