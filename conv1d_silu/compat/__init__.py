"""Drop-ins for causal-conv1d (Dao-AILab/causal-conv1d) on conv1d_silu's kernels.

    from conv1d_silu.compat import causal_conv1d_fn, causal_conv1d_update
"""

from __future__ import annotations

from .interface import causal_conv1d_fn, causal_conv1d_update

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]
