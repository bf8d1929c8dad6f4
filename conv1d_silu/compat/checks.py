"""Argument checks of the causal-conv1d drop-ins: causal-conv1d's rules in this package's error style.

Every check raises before any work: ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong
shape or value, naming the argument with expected vs got. The one exception is the activation, which
raises ``NotImplementedError`` like causal-conv1d (its callers catch neither).
"""

from __future__ import annotations

import torch

from ..dtypes import FLOAT_DTYPES
from ..validation import check_weight_for, fail, weight_2d

SILU = {None: False, "silu": True, "swish": True}
INDEX_DTYPES = (torch.int32, torch.int64)


def silu_flag(activation: object) -> bool:
    """True for "silu" / "swish", False for None (causal-conv1d's set)."""
    if not (activation is None or isinstance(activation, str)) or activation not in SILU:
        fail("activation", "None, 'silu' or 'swish'", repr(activation), NotImplementedError)
    return SILU[activation]


def flag(arg: str, value: object) -> bool:
    if not isinstance(value, bool):
        fail(arg, "a bool", type(value).__name__, TypeError)
    return value


def tensor(
    arg: str,
    t: object,
    x: torch.Tensor | None = None,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``t`` is a tensor on x's device, of ``shape`` and ``dtype`` when given."""
    if not isinstance(t, torch.Tensor):
        fail(arg, "a torch.Tensor", type(t).__name__, TypeError)
    if x is not None and t.device != x.device:
        fail(arg, f"a tensor on {x.device} (the device of x)", t.device)
    if dtype is not None and t.dtype != dtype:
        fail(arg, f"dtype {dtype}", t.dtype, TypeError)
    if shape is not None and tuple(t.shape) != tuple(shape):
        fail(arg, f"shape {tuple(shape)}", tuple(t.shape))
    return t


def index_tensor(arg: str, t: object, x: torch.Tensor, shape: tuple[int, ...] | None) -> torch.Tensor:
    """An int32 / int64 tensor on x's device (of ``shape`` when given)."""
    tensor(arg, t, x)
    if t.dtype not in INDEX_DTYPES:
        fail(arg, "dtype torch.int32 or torch.int64", t.dtype, TypeError)
    if shape is not None and tuple(t.shape) != shape:
        fail(arg, f"shape {shape}", tuple(t.shape))
    return t


def float_x(x: object, shape: str, dims: tuple[int, ...]) -> torch.Tensor:
    """x is a floating tensor of one of ``dims`` dimensions (``shape`` names them)."""
    tensor("x", x)
    if x.dtype not in FLOAT_DTYPES:
        fail("x", "dtype float32, float16, bfloat16 or float64", x.dtype, TypeError)
    if x.dim() not in dims:
        fail("x", f"shape {shape}", tuple(x.shape))
    return x


def weight(w: object, x: torch.Tensor) -> torch.Tensor:
    """The (D, W) view of a ``(D, W)`` or ``(D, 1, W)`` weight for x ``(B, D, L)``; 2 <= W <= 8."""
    w2 = weight_2d(w)
    if w2.shape[0] != x.shape[1]:
        fail("weight", f"{x.shape[1]} channels (x.shape[1]) in weight.shape[0]", w2.shape[0])
    check_weight_for(w2, x)
    return w2


def bias(b: object, w: torch.Tensor, x: torch.Tensor) -> None:
    if b is not None:
        tensor("bias", b, x, (w.shape[0],), w.dtype)


def writable(arg: str, t: torch.Tensor) -> None:
    """An output written in place: no two of its elements share memory."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    reach = 1
    for stride, size in dims:
        if stride < reach:
            fail(
                arg,
                "a tensor whose elements do not overlap",
                f"strides {tuple(t.stride())} for shape {tuple(t.shape)}",
            )
        reach = stride * size
