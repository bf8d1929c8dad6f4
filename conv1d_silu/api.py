"""The public function."""

from __future__ import annotations

import torch

from . import autograd, config, ops, runtime
from .documents import DocTable
from .layout import from_tokens, to_tokens
from .validation import check_inputs, checked_doc, fail, weight_2d


def _main_grad(arg: str, buf: object, shape: tuple[int, ...], x: torch.Tensor) -> None:
    if buf is None:
        return
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


def _check(
    x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad, return_final_states,
    grad_dtype, activation, program,
) -> tuple[torch.Tensor, bool, torch.dtype, DocTable]:
    """Check every argument, raising for bad input; return the (C, K) weight, the SiLU flag, the
    dtype of the weight gradients and the document table."""
    w2, silu, doc = check_inputs(
        x, weight, bias, seq_idx, cu_seqlens, initial_states, return_final_states, activation, grad_dtype, program,
        main_grad=weight_main_grad is not None,
    )
    C, K = w2.shape
    _main_grad("weight_main_grad", weight_main_grad, (C, K), x)
    _main_grad("bias_main_grad", bias_main_grad, (C,), x)
    if bias_main_grad is not None and (bias is None or weight_main_grad is None):
        fail("bias_main_grad", "None unless bias and weight_main_grad are given", "a tensor")
    if weight_main_grad is not None and bias is not None and bias_main_grad is None:
        fail("bias_main_grad", "a buffer when weight_main_grad and bias are given", None)
    return w2, silu, grad_dtype or w2.dtype, doc


def _meta(t: torch.Tensor | None) -> tuple | None:
    """What the checks and plans read of a tensor argument (AttributeError for a non-tensor)."""
    return None if t is None else (type(t), t.dtype, t.shape, t.stride(), t.device)


def _views(weight, weight_main_grad, bias_main_grad):
    """The (C, K) weight, and the main_grad buffers in the shapes of the weight's gradients."""
    w2 = weight if weight.dim() == 2 else weight.select(1, 0)
    if weight_main_grad is not None:
        weight_main_grad = weight_main_grad.view(w2.shape)
        bias_main_grad = None if bias_main_grad is None else bias_main_grad.view(-1)
    return w2, weight_main_grad, bias_main_grad


def _eager(
    x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad, return_final_states,
    grad_dtype, activation, program,
):
    """The op in eager mode: the Function, with the call checked and routed once per signature
    (each tensor's type, dtype, shape, strides and device; the other arguments; the forced program)
    and looked up after. A document table's values are read by every call: its table is built and
    checked per call."""
    # CONV1D_SILU_PROGRAM is read once per call (config.forced_program, less a call of its own)
    forced = program or config.getenv("CONV1D_SILU_PROGRAM") or None
    plain = (  # the common call, told by `is` (== would compare tensors)
        seq_idx is None and cu_seqlens is None and initial_states is None and weight_main_grad is None
        and bias_main_grad is None
    )
    optional = None if plain else (seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad)
    try:
        key = (
            type(x), x.dtype, x.shape, x.stride(), x.device,
            type(weight), weight.dtype, weight.shape, weight.stride(), weight.device,
            None if bias is None else (type(bias), bias.dtype, bias.shape, bias.stride(), bias.device),  # _meta
            optional and tuple(map(_meta, optional)),
            return_final_states, type(return_final_states), grad_dtype, activation, program, forced,
        )
        call = ops.EAGER_CALLS.get(key)
    except (AttributeError, TypeError):  # a non-tensor or an unhashable argument: the checks name it
        key = call = None
    if call is None:
        w2, silu, grad_dtype, doc = _check(
            x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad,
            return_final_states, grad_dtype, activation, program,
        )
        main_grad = weight_main_grad is not None
        route = ops.route(
            x, w2, bias, doc, grad_dtype, main_grad, forced or ops.ROUTED, silu, plain and not return_final_states
        )
        call = autograd.Call(doc, return_final_states, silu, grad_dtype, route)
        if key is not None:
            ops.remember(key, call._replace(doc=None) if doc.table is not None else call)
    elif call.doc is None:
        call = call._replace(doc=checked_doc(x, seq_idx, cu_seqlens, initial_states))
    if plain:
        return autograd.apply(call, x, weight if weight.dim() == 2 else weight.select(1, 0), bias)
    w2, weight_main_grad, bias_main_grad = _views(weight, weight_main_grad, bias_main_grad)
    return autograd.apply(call, x, w2, bias, initial_states, weight_main_grad, bias_main_grad)


def _traced(
    x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad, return_final_states,
    grad_dtype, activation, program,
):
    """The op while compiling: the custom op (autograd.py), its arguments checked for every trace."""
    _, silu, grad_dtype, _ = _check(
        x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad, return_final_states,
        grad_dtype, activation, program,
    )
    w2, weight_main_grad, bias_main_grad = _views(weight, weight_main_grad, bias_main_grad)
    return autograd.traced(
        x, w2, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad, return_final_states,
        silu, grad_dtype, program,
    )


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
    tokens = None
    if layout != "BLC" or cu_seqlens is not None:  # else x is token-major as it is (layout.py)
        tokens = to_tokens(x, seq_idx, cu_seqlens, initial_states, layout)
        x, seq_idx, initial_states = tokens.x, tokens.seq_idx, tokens.initial_states
    run = _traced if torch.compiler.is_compiling() else _eager
    out = run(
        x, weight, bias, seq_idx, cu_seqlens, initial_states, weight_main_grad, bias_main_grad, return_final_states,
        grad_dtype, activation, program,
    )
    if tokens is None:
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
