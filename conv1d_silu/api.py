"""The public function."""

from __future__ import annotations

import torch

from . import autograd, runtime
from .layout import from_tokens, to_tokens
from .validation import check_inputs, fail


def _main_grad(arg: str, buf: object, shape: tuple[int, ...], x: torch.Tensor) -> torch.Tensor | None:
    if buf is None:
        return None
    if not isinstance(buf, torch.Tensor):
        fail(arg, "a torch.Tensor or None", type(buf).__name__, TypeError)
    if buf.dtype != torch.float32:
        fail(arg, "dtype torch.float32", buf.dtype, TypeError)
    if buf.device != x.device:
        fail(arg, f"a tensor on {x.device}", buf.device)
    # the weight's own shape, (C, K) or nn.Conv1d's (C, 1, K)
    shapes = (shape, (shape[0], 1, shape[1])) if len(shape) == 2 else (shape,)
    if tuple(buf.shape) not in shapes or not buf.is_contiguous():
        fail(arg, f"a contiguous buffer of shape {' or '.join(map(str, shapes))}", tuple(buf.shape))
    return buf.view(shape)


def causal_conv1d_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    grad_dtype: torch.dtype | None = None,
    activation: str | None = "silu",
    program: str | None = None,
    weight_main_grad: torch.Tensor | None = None,
    bias_main_grad: torch.Tensor | None = None,
    layout: str = "BLC",
):
    """Causal depthwise conv1d followed by SiLU, with a deterministic backward.

    ``y[t, c] = silu(bias[c] + sum_k weight[c, k] * x[t - (K-1) + k, c])`` within each document
    (earlier tokens come from ``initial_states``, or are zero).

    Args:
        x: ``(S, C)`` packed tokens or ``(B, L, C)`` (B documents of L tokens); float32, float16,
            bfloat16 or float64. Channel stride 1; the token stride may exceed C (a slice of a
            wider projection is read in place). With ``layout="BCL"``: ``(B, C, L)``.
        weight: ``(C, K)`` or ``nn.Conv1d``'s ``(C, 1, K)``, 2 <= K <= 8; may be fp32 with 16-bit x.
        bias: ``(C,)`` in the weight's dtype, or None.
        seq_idx: int32 or int64 document index per token (``(S,)``, or ``(B, L)`` for 3-D x); documents
            start where it changes.
        cu_seqlens: int32 or int64 ``(N + 1,)`` document offsets into the S tokens (2-D x, or 3-D x of one
            batch row).
        initial_states: ``(N, K-1, C)`` in x's dtype: the K-1 tokens preceding each document
            (``(N, C, K-1)`` with ``layout="BCL"``). With 3-D x and seq_idx: ``(B, K-1, C)``, the
            tokens preceding each batch row, read by the row's first document only (later ones
            start from zeros; causal-conv1d's packed rows with states); no final states then.
        return_final_states: also return ``(N, K-1, C)``: each document's last K-1 tokens
            (initial state rows included when a document is shorter than K-1); ``(N, C, K-1)``
            with ``layout="BCL"``.
        grad_dtype: dtype dweight/dbias are computed in: the weight's (default), or torch.float32
            with ``weight_main_grad`` (autograd would cast an fp32 gradient back to a 16-bit
            weight's dtype, so that combination is refused).
        activation: ``"silu"`` (or ``"swish"``) or None for the identity.
        program: force a kernel program by name (see ``conv1d_silu.routes.PROGRAMS``).
        weight_main_grad / bias_main_grad: fp32 buffers (Megatron-style ``main_grad``) that the
            backward adds dweight / dbias into, in place; the weight then gets no ``.grad``.
        layout: ``"BLC"`` (token-major, the default) or ``"BCL"`` (``(B, C, L)``, see
            :mod:`conv1d_silu.layout`).

    Returns:
        y with x's shape and dtype (and, for ``"BCL"``, x's memory layout), or ``(y, final_states)``.
    """
    tokens = to_tokens(x, seq_idx, cu_seqlens, initial_states, layout)
    x, seq_idx, initial_states = tokens.x, tokens.seq_idx, tokens.initial_states
    w2, silu, doc = check_inputs(
        x, weight, bias, seq_idx, cu_seqlens, initial_states, return_final_states, activation, grad_dtype, program,
        main_grad=weight_main_grad is not None,
    )
    C, K = w2.shape
    wmg = _main_grad("weight_main_grad", weight_main_grad, (C, K), x)
    bmg = _main_grad("bias_main_grad", bias_main_grad, (C,), x)
    if bmg is not None and (bias is None or wmg is None):
        fail("bias_main_grad", "None unless bias and weight_main_grad are given", "a tensor")
    if wmg is not None and bias is not None and bmg is None:
        fail("bias_main_grad", "a buffer when weight_main_grad and bias are given", None)
    out = autograd.apply(
        x, w2, bias, doc, seq_idx, cu_seqlens, initial_states, wmg, bmg, return_final_states, silu,
        grad_dtype or w2.dtype, program,
    )
    if layout == "BLC" and not tokens.packed_row:
        return out
    return from_tokens(tokens, *(out if return_final_states else (out, None)))


def warmup(device: torch.device | str | int | None = None, dtypes=(torch.bfloat16,), ks=(4,)) -> int:
    """Compile and run the common CUDA kernels now (forward and backward, with and without bias)
    on small random inputs, so the first training step does not pay for NVRTC. A no-op without
    CuPy or a GPU. Returns the number of calls made."""
    if not runtime.available():
        return 0
    dev = torch.device("cuda", runtime.device_index(torch.device("cuda" if device is None else device)))
    calls = 0
    for dtype in dtypes or (torch.bfloat16,):
        for K in ks:
            for bias in (False, True):
                x = torch.randn(64, 64, device=dev, dtype=dtype, requires_grad=True)
                w = torch.randn(64, K, device=dev, dtype=dtype, requires_grad=True)
                b = torch.randn(64, device=dev, dtype=dtype, requires_grad=True) if bias else None
                causal_conv1d_silu(x, w, b).float().sum().backward()
                calls += 1
    return calls
