"""Pure-PyTorch reference of the op: forward and an explicit backward.

It is the CPU implementation of the custom ops and the oracle of the GPU tests. It runs on any
device, in fp32 arithmetic (fp64 for fp64 inputs), and casts each output once at the end.

For token ``t`` of document ``d`` (first token ``s_d``) and tap ``k``::

    z[t] = bias + sum_k weight[:, k] * xx[t - (K-1) + k]
    y[t] = silu(z[t])

where ``xx[u] = x[u]`` inside the document and, before its start, initial state row
``(K-1) - (s_d - u)`` of the document (or 0).
"""

from __future__ import annotations

import math

import torch

from .documents import SEQ_IDX, DocTable, doc_table, token_positions
from .dtypes import accumulator_dtype
from .states import add_final_state_grads, final_state_sources

__all__ = ["causal_conv1d_silu_ref", "forward", "backward"]


def _taps(x2, K, pos, state, init):
    """The K shifted inputs ``xx[t - (K-1) + k]`` as (S, C) tensors in the arithmetic dtype."""
    S, C = x2.shape
    taps = []
    for k in range(K):
        shift = K - 1 - k
        shifted = torch.zeros_like(x2)
        if S > shift:
            shifted[shift:] = x2[: S - shift]
        inside = (pos >= shift).unsqueeze(1)
        if init is None:
            taps.append(torch.where(inside, shifted, torch.zeros_like(shifted)))
        else:
            row = (pos + k).clamp(max=K - 2)
            # padding (a negative index) and documents past the table have no state (zeros)
            has_state = ((state >= 0) & (state < init.shape[0])).unsqueeze(1)
            from_state = torch.where(has_state, init[state.clamp(0, init.shape[0] - 1), row], torch.zeros_like(shifted))
            taps.append(torch.where(inside, shifted, from_state))
    return taps


# exp(r) on |r| <= ln2 / 2 by Horner on Taylor terms: 8 terms reach fp32, 14 fp64 precision.
_TAYLOR = {torch.float32: [1.0 / math.factorial(i) for i in range(8)], torch.float64: [1.0 / math.factorial(i) for i in range(14)]}
# (clamp range, exponent bias, mantissa bits, integer view) per dtype; ln 2 split for Cody-Waite.
_EXP_FORMAT = {torch.float32: (87.0, 127, 23, torch.int32), torch.float64: (708.0, 1023, 52, torch.int64)}
_LN2_HI, _LN2_LO = 0.693145751953125, 1.428606765330187045e-06


def _exp(z: torch.Tensor) -> torch.Tensor:
    """exp from IEEE-exact operations only (mul, add, round, bit shifts).

    PyTorch's CPU exp takes a SIMD path or a scalar path depending on where an element sits in
    its tensor, and the two differ in the last bit; this one gives every element the same bits
    wherever it sits, so a sequence split into chunks (context parallelism) or a different
    thread count reproduces the whole-sequence result exactly. Finite inputs only (callers clamp).
    """
    limit, bias, mant, itype = _EXP_FORMAT[z.dtype]
    z = z.clamp(-limit, limit)
    n = torch.round(z * (1.0 / math.log(2.0)))
    r = (z - n * _LN2_HI) - n * _LN2_LO
    coeffs = _TAYLOR[z.dtype]
    p = torch.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = p * r + c
    scale = ((n.to(itype) + bias) << mant).view(z.dtype)  # 2^n, exactly
    return p * scale


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-z)), position-independent (see _exp); exact 0 / 1 at -inf / +inf, NaN kept."""
    sig = 1.0 / (1.0 + _exp(-z))
    sig = torch.where(z == -math.inf, torch.zeros_like(sig), sig)
    return torch.where(z.isnan(), z, sig)


def _silu(z: torch.Tensor) -> torch.Tensor:
    return z * _sigmoid(z)


def _silu_grad(z: torch.Tensor) -> torch.Tensor:
    sig = _sigmoid(z)
    return sig * (1 + z * (1 - sig))


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    doc: DocTable,
    initial_states: torch.Tensor | None,
    return_final_states: bool,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference forward. ``weight`` is (C, K). Returns (y, final_states or None)."""
    C, K = weight.shape
    acc = accumulator_dtype(x.dtype)
    x2 = x.reshape(doc.S, C).to(acc)
    pos, state = token_positions(doc, x.device)
    init = None if initial_states is None else initial_states.to(acc)
    taps = _taps(x2, K, pos, state, init)
    w = weight.to(acc)
    z = torch.zeros_like(x2) if bias is None else bias.to(acc).expand_as(x2).clone()
    for k in range(K):
        z = z + w[:, k] * taps[k]
    y = _silu(z) if silu else z
    if doc.mode == SEQ_IDX:  # padding tokens output 0
        y = torch.where((state < 0).unsqueeze(1), torch.zeros_like(y), y)
    final = None
    if return_final_states:
        src, from_x, init_row = final_state_sources(doc, K, x.device)
        gathered = x2[src.clamp(0, max(doc.S - 1, 0))] if doc.S > 0 else x2.new_zeros(*src.shape, C)
        if init is None:
            fallback = torch.zeros_like(gathered)
        else:
            n = torch.arange(src.shape[0], device=x.device).unsqueeze(1).expand_as(src)
            fallback = init[n, init_row.clamp(max=K - 2)]
        final = torch.where(from_x.unsqueeze(2), gathered, fallback).to(x.dtype)
    return y.to(x.dtype).reshape(x.shape), final


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    doc: DocTable,
    initial_states: torch.Tensor | None,
    dfinal: torch.Tensor | None,
    silu: bool,
    grad_dtype: torch.dtype,
    trailing: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Reference backward (recomputes z from x). Returns (dx, dweight (C, K), dbias, dinitial).

    ``trailing`` = (x_next, dy_next), up to K-1 tokens that follow the sequence in its last
    document (context parallelism): their g completes dx of the last tokens, nothing else.
    """
    C, K = weight.shape
    acc = accumulator_dtype(x.dtype)
    S = doc.S
    x2 = x.reshape(S, C).to(acc)
    g = dy.reshape(S, C).to(acc)
    pos, state = token_positions(doc, x.device)
    n_own = S
    if trailing is not None and S > 0 and trailing[0].shape[0] > 0:
        nx, ndy = trailing
        n = nx.shape[0]
        x2 = torch.cat([x2, nx.to(acc)])
        g = torch.cat([g, ndy.to(acc)])
        pos = torch.cat([pos, pos[-1] + 1 + torch.arange(n, device=pos.device)])
        state = torch.cat([state, state[-1].expand(n)])
        S = S + n
    init = None if initial_states is None else initial_states.to(acc)
    taps = _taps(x2, K, pos, state, init)
    w = weight.to(acc)
    if silu:
        z = torch.zeros_like(x2) if bias is None else bias.to(acc).expand_as(x2).clone()
        for k in range(K):
            z = z + w[:, k] * taps[k]
        g = g * _silu_grad(z)
    if doc.mode == SEQ_IDX:  # padding passes no gradient
        g = torch.where((state < 0).unsqueeze(1), torch.zeros_like(g), g)

    dx = torch.zeros_like(x2)
    dinit = None if init is None else torch.zeros(init.shape, dtype=acc, device=init.device)
    for k in range(K):
        shift = K - 1 - k
        inside = (pos >= shift).unsqueeze(1)
        contrib = w[:, k] * g
        if S > shift:
            dx[: S - shift] += torch.where(inside, contrib, torch.zeros_like(contrib))[shift:]
        if dinit is not None:
            outside = ~inside.squeeze(1) & (state >= 0) & (state < dinit.shape[0])
            rows = state[outside] * (K - 1) + (pos[outside] + k)
            dinit.view(-1, C).index_add_(0, rows, contrib[outside])
    dx = dx[:n_own]
    g, taps = g[:n_own], [t[:n_own] for t in taps]
    dweight = torch.stack([(g * taps[k]).sum(0) for k in range(K)], dim=1)
    dbias = None if bias is None else g.sum(0)

    if dfinal is not None:
        add_final_state_grads(dx, dinit, dfinal, doc, K)

    dx = dx.to(x.dtype).reshape(x.shape)
    dweight = dweight.to(grad_dtype)
    dbias = None if dbias is None else dbias.to(grad_dtype)
    dinit = None if dinit is None else dinit.to(initial_states.dtype)
    return dx, dweight, dbias, dinit


def causal_conv1d_silu_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    activation: str | None = "silu",
):
    """Reference forward with the public API's arguments (no autograd of its own).

    Equivalent to, per document, ``F.silu(F.conv1d(F.pad(x.T, (K-1, 0)), w.unsqueeze(1), b,
    groups=C)).T`` with the padding replaced by the initial states when given.
    """
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    doc = doc_table(x, seq_idx, cu_seqlens, initial_states)
    y, final = forward(x, w, bias, doc, initial_states, return_final_states, activation is not None)
    return (y, final) if return_final_states else y
