"""Argument checks of the public entry points.

Every check runs before any allocation or launch and raises ``TypeError`` (wrong type / dtype) or
``ValueError`` (wrong shape, layout, value), naming the argument with expected vs got.
"""

from __future__ import annotations

import torch

from . import config
from .documents import TABLE_DTYPES, DocTable, check_table_contents, doc_table, num_documents
from .dtypes import FLOAT_DTYPES

K_MIN, K_MAX = 2, 8
ACTIVATIONS = {"silu": True, "swish": True, None: False, "identity": False}


def fail(arg: str, expected: str, got: object, exc: type[Exception] = ValueError) -> None:
    raise exc(f"{arg}: expected {expected}, got {got}")


def _tensor(arg: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(arg, "a torch.Tensor", type(t).__name__, TypeError)
    return t


def _same_device(arg: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.device != x.device:
        fail(arg, f"a tensor on {x.device} (the device of x)", t.device)


def activation_flag(activation: object) -> bool:
    """True for SiLU, False for identity; raises for anything else."""
    if activation not in ACTIVATIONS:
        fail("activation", "'silu', 'swish' or None", repr(activation))
    return ACTIVATIONS[activation]


def weight_2d(weight: object, C: int | None = None) -> torch.Tensor:
    """Accept (C, K) or nn.Conv1d's (C, 1, K) weight; return the (C, K) view."""
    w = _tensor("weight", weight)
    if w.dim() == 3 and w.shape[1] == 1:
        w = w[:, 0, :]
    elif w.dim() != 2:
        fail("weight", "shape (C, K) or (C, 1, K)", tuple(w.shape))
    if C is not None and w.shape[0] != C:
        fail("weight", f"{C} channels (x.shape[-1]) in weight.shape[0]", w.shape[0])
    if not K_MIN <= w.shape[1] <= K_MAX:
        fail("weight", f"kernel size K in [{K_MIN}, {K_MAX}] (weight.shape[-1])", w.shape[1])
    return w


def check_weight_for(w: torch.Tensor, x: torch.Tensor) -> None:
    """The (C, K) weight goes with x: same device, a floating dtype, float64 with float64 x (the
    kernels convert 16-bit and fp32 weights for fp32 arithmetic only)."""
    _same_device("weight", w, x)
    if w.dtype not in FLOAT_DTYPES:
        fail("weight", "a floating dtype", w.dtype, TypeError)
    if x.dtype == torch.float64 and w.dtype != torch.float64:
        fail("weight", "float64 with float64 x", w.dtype, TypeError)


def row_stride(t: torch.Tensor, repeated: bool = False) -> int | None:
    """Elements between consecutive packed tokens of a (S, C) or (B, L, C) tensor.

    None when the kernels cannot read it in place: channel stride != 1, tokens not evenly spaced,
    or rows overlapping (token stride < C); with ``repeated``, a token stride of 0 (one row for
    every token: ``expand`` of a (C,) tensor, as the gradient of ``y.sum(0)``) is read in place too.
    """
    C = t.shape[-1]
    if t.is_contiguous():
        return C
    if C > 1 and t.stride(-1) != 1:
        return None
    if t.dim() == 2:
        rs = t.stride(0) if t.shape[0] > 1 else C
    else:
        B, L = t.shape[0], t.shape[1]
        if L > 1:
            rs = t.stride(1)
            if B > 1 and t.stride(0) != L * rs:
                return None
        else:
            rs = t.stride(0) if B > 1 else C
    return rs if rs >= C or repeated and rs == 0 else None


def channel_first(t: torch.Tensor) -> bool:
    """A (B, L, C) view of channel-first memory: the sequence contiguous (``t.stride(1) == 1``, e.g.
    ``h.transpose(1, 2)`` of a ``(B, C, L)`` tensor) and not readable as channel-last rows. The
    channel-first kernels read it in place, with any batch and channel strides."""
    return t.dim() == 3 and t.shape[1] > 1 and t.stride(1) == 1 and row_stride(t) is None


def check_x_layout(x: torch.Tensor) -> None:
    """x is read in place: channel-last (channel stride 1, evenly spaced tokens at a stride >= C) or
    channel-first (:func:`channel_first`)."""
    if row_stride(x) is None and not channel_first(x):
        fail(
            "x",
            "channel stride 1 and evenly spaced tokens with token stride >= C "
            "(for 3-D x, batch stride = L * token stride), or for 3-D x token stride 1 "
            "(channel-first); call .contiguous()",
            f"strides {tuple(x.stride())} for shape {tuple(x.shape)}",
        )


def check_inputs(
    x: object,
    weight: object,
    bias: object,
    seq_idx: object,
    cu_seqlens: object,
    initial_states: object,
    return_final_states: bool,
    activation: object,
    grad_dtype: object,
    program: object,
    main_grad: bool = False,
) -> tuple[torch.Tensor, bool, DocTable]:
    """Validate the public arguments; return the (C, K) weight, the SiLU flag and the doc table.
    ``main_grad``: fp32 buffers take the weight gradients (they make ``grad_dtype=torch.float32``
    meaningful with 16-bit weights)."""
    x = _tensor("x", x)
    if x.dtype not in FLOAT_DTYPES:
        fail("x", "dtype float32, float16, bfloat16 or float64", x.dtype, TypeError)
    if x.dim() not in (2, 3):
        fail("x", "shape (S, C) or (B, L, C)", tuple(x.shape))
    C = x.shape[-1]
    if C < 1:
        fail("x", "at least one channel (x.shape[-1] >= 1)", C)
    check_x_layout(x)
    w = weight_2d(weight, C)
    check_weight_for(w, x)
    if bias is not None:
        bias = _tensor("bias", bias)
        _same_device("bias", bias, x)
        if bias.dtype != w.dtype:
            fail("bias", f"the weight's dtype {w.dtype}", bias.dtype, TypeError)
        if tuple(bias.shape) != (C,):
            fail("bias", f"shape ({C},)", tuple(bias.shape))
    silu = activation_flag(activation)
    if grad_dtype not in (None, torch.float32, w.dtype):
        fail("grad_dtype", f"None, torch.float32 or the weight's dtype {w.dtype}", grad_dtype, TypeError)
    if grad_dtype == torch.float32 and w.dtype != torch.float32 and not main_grad:
        # autograd casts a parameter's gradient to the parameter's dtype, so the fp32 sums would be
        # rounded to the weight's dtype and give exactly the bits of grad_dtype=None
        fail("grad_dtype", "None, or torch.float32 with fp32 weights or weight_main_grad (an fp32 buffer "
             "the fp32 gradient is added into)", f"torch.float32 with a {w.dtype} weight and no main_grad")
    if program is not None and not isinstance(program, str):
        fail("program", "a program name (str) or None", type(program).__name__, TypeError)
    if not isinstance(return_final_states, bool):
        fail("return_final_states", "a bool", type(return_final_states).__name__, TypeError)

    K = w.shape[1]
    if seq_idx is not None and cu_seqlens is not None:
        fail("seq_idx", "None when cu_seqlens is given (pass one document table)", "both")
    if seq_idx is not None:
        seq_idx = _tensor("seq_idx", seq_idx)
        _same_device("seq_idx", seq_idx, x)
        if seq_idx.dtype not in TABLE_DTYPES:
            fail("seq_idx", "dtype torch.int32 or torch.int64", seq_idx.dtype, TypeError)
        want = tuple(x.shape[:-1])
        if tuple(seq_idx.shape) != want:
            fail("seq_idx", f"shape {want} (one entry per token)", tuple(seq_idx.shape))
        if not seq_idx.is_contiguous():
            fail("seq_idx", "a contiguous tensor", tuple(seq_idx.stride()))
    if cu_seqlens is not None:
        cu_seqlens = _tensor("cu_seqlens", cu_seqlens)
        _same_device("cu_seqlens", cu_seqlens, x)
        if x.dim() == 3 and x.shape[0] != 1:
            fail("cu_seqlens", "None for 3-D x of several batch rows (each row is a document)", "a tensor")
        if cu_seqlens.dtype not in TABLE_DTYPES:
            fail("cu_seqlens", "dtype torch.int32 or torch.int64", cu_seqlens.dtype, TypeError)
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            fail("cu_seqlens", "shape (N + 1,) with N >= 1", tuple(cu_seqlens.shape))
        if not cu_seqlens.is_contiguous():
            fail("cu_seqlens", "a contiguous tensor", tuple(cu_seqlens.stride()))
    if initial_states is not None:
        initial_states = _tensor("initial_states", initial_states)
        _same_device("initial_states", initial_states, x)
        if initial_states.dtype != x.dtype:
            fail("initial_states", f"x's dtype {x.dtype}", initial_states.dtype, TypeError)
        n = num_documents(x, seq_idx, cu_seqlens, initial_states) if initial_states.dim() == 3 else None
        if seq_idx is not None and x.dim() == 3 and return_final_states:  # one state per batch row
            fail("return_final_states", "False with 3-D x, seq_idx and initial_states (use 2-D x, whose "
                 "states are one per document)", True)
        want = (n if n is not None else "N", K - 1, C)
        if tuple(initial_states.shape) != want:
            rows = "batch rows" if seq_idx is not None and x.dim() == 3 else "documents"
            fail("initial_states", f"shape {want} ({rows}, K-1, C)", tuple(initial_states.shape))
    if return_final_states and seq_idx is not None and initial_states is None:
        fail(
            "return_final_states",
            "initial_states (which sets the document count) when seq_idx is given; "
            "or use cu_seqlens",
            "no initial_states",
        )

    return w, silu, checked_doc(x, seq_idx, cu_seqlens, initial_states)


def values_checked(t: torch.Tensor) -> bool:
    """Whether checks that read tensor values (one host sync) run for ``t``: never while tracing or
    capturing a CUDA graph, and on the GPU only while ``CONV1D_SILU_CHECK_DOCS`` is on."""
    if torch.compiler.is_compiling():
        return False
    return not t.is_cuda or (config.check_documents() and not torch.cuda.is_current_stream_capturing())


def checked_doc(
    x: torch.Tensor,
    seq_idx: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    initial_states: torch.Tensor | None,
) -> DocTable:
    """The document table of checked arguments, its values checked where :func:`values_checked`
    allows (every call: the values may change between calls of one signature)."""
    doc = doc_table(x, seq_idx, cu_seqlens, initial_states)
    if doc.table is not None and values_checked(doc.table):
        message = check_table_contents(doc)
        if message is not None:
            raise ValueError(message)
    return doc
