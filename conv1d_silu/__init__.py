"""conv1d_silu: deterministic causal depthwise conv1d + SiLU training ops for PyTorch.

Import never touches CUDA: kernels compile on first use (``conv1d_silu.warmup()`` compiles the
common ones ahead of time).
"""

from __future__ import annotations

from . import ops as _ops  # registers the custom ops  # noqa: F401
from . import autograd as _autograd  # registers their autograd  # noqa: F401
from .api import causal_conv1d_silu, warmup
from .module import CausalConv1dSiLU
from .reference import causal_conv1d_silu_ref

__version__ = "0.1.0"


__all__ = ["causal_conv1d_silu", "CausalConv1dSiLU", "causal_conv1d_silu_ref", "warmup", "__version__"]
