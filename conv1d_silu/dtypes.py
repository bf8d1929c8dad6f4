"""The dtypes the ops take, and the dtype they compute in."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the op computes in for ``dtype`` data (the kernels' ``Acc<T>``): fp64 for fp64, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
