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
from typing import NamedTuple

import torch

from .documents import DocTable, doc_table, token_positions
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
            # documents whose state index is past the table have no state (zeros)
            has_state = (state < init.shape[0]).unsqueeze(1)
            from_state = torch.where(has_state, init[state.clamp(0, init.shape[0] - 1), row], torch.zeros_like(shifted))
            taps.append(torch.where(inside, shifted, from_state))
    return taps


# ---- sigmoid from IEEE-exact operations -------------------------------------------------------


class _ExpFormat(NamedTuple):
    z_min: float  # below: n = round(-z / ln 2) is the largest exponent + 1, so 2^n = +inf
    z_max: float  # above: 2^n flushes to 0; sigmoid(z) rounds to 1 in the format long before
    mant: int
    itype: torch.dtype
    # the rest are 0-dim tensors of the format (a Python number costs a conversion per operation)
    neg_log2e: torch.Tensor
    magic: torch.Tensor  # 1.5 * 2^mant + bias: adding it rounds to an integer in the low mantissa bits
    ln2_hi: torch.Tensor  # ln 2 = ln2_hi + ln2_lo (Cody-Waite): n * ln2_hi is exact, ln2_lo the rest
    ln2_lo: torch.Tensor
    coeffs: tuple[torch.Tensor, ...]  # exp(-q) on |q| <= ln2 / 2, highest degree first
    one: torch.Tensor


def _exp_format(dtype, z_min, z_max, mant, itype, coeffs) -> _ExpFormat:
    def t(v):
        return torch.tensor(v, dtype=dtype)

    bias = 2 ** (torch.finfo(dtype).bits - mant - 2) - 1
    return _ExpFormat(z_min, z_max, mant, itype, t(-1.0 / math.log(2.0)), t(1.5 * 2**mant + bias),
                      t(0.693145751953125), t(1.4286068203094173e-06), tuple(t(c) for c in coeffs), t(1.0))


def _exp_neg_terms(n: int) -> list[float]:
    """Taylor terms of exp(-q), highest degree first."""
    return [(-1) ** i / math.factorial(i) for i in range(n - 1, -1, -1)]


# on |q| <= ln2 / 2, 8 Taylor terms reach fp32 precision, 14 fp64
_FORMAT = {
    torch.float32: _exp_format(torch.float32, -88.5, 88.0, 23, torch.int32, _exp_neg_terms(8)),
    torch.float64: _exp_format(torch.float64, -710.0, 709.0, 52, torch.int64, _exp_neg_terms(14)),
}


def _sigmoid(z: torch.Tensor, out: torch.Tensor, v: torch.Tensor, k: torch.Tensor, n: torch.Tensor) -> None:
    """out = 1 / (1 + exp(-z)) from IEEE-exact operations; ``v``, ``k``, ``n``: scratch like z.

    exp(-z) = 2^n exp(-q) with n = round(-z / ln 2), q = z + n ln 2 (Cody-Waite, exact), a Horner
    polynomial for exp(-q), and 2^n built from n's bits. Clamping z keeps n inside the exponent
    range; at its low end 2^n is +inf, so sigmoid is exactly 0 there (z below about -88.4 in
    fp32, -inf included) like the kernels' rcp(1 + ex2(...)); NaN stays NaN.
    """
    f = _FORMAT[z.dtype]
    torch.clamp(z, f.z_min, f.z_max, out=v)
    torch.mul(v, f.neg_log2e, out=k)
    k.add_(f.magic)  # magic + n: rounded to nearest, ties to even
    torch.sub(k, f.magic, out=n)  # n, exactly
    torch.mul(n, f.ln2_hi, out=out)
    v.add_(out)  # z + n * ln2_hi, exact
    torch.mul(n, f.ln2_lo, out=out)
    v.add_(out)  # q
    c = f.coeffs
    torch.mul(v, c[0], out=out)
    out.add_(c[1])
    for ci in c[2:]:
        out.mul_(v).add_(ci)
    # shifted left by the mantissa width, the bits of magic + n leave 2^n's exponent field
    k.view(f.itype).bitwise_left_shift_(f.mant)
    out.mul_(k).add_(f.one).reciprocal_()


def _sigmoid_of(z: torch.Tensor) -> torch.Tensor:
    out, v, k, n = (torch.empty_like(z) for _ in range(4))
    _sigmoid(z, out, v, k, n)
    return out


def _silu(z: torch.Tensor) -> torch.Tensor:
    return z * _sigmoid_of(z)


def _silu_grad(z: torch.Tensor) -> torch.Tensor:
    sig = _sigmoid_of(z)
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

    dx = torch.zeros_like(x2)
    dinit = None if init is None else torch.zeros(init.shape, dtype=acc, device=init.device)
    for k in range(K):
        shift = K - 1 - k
        inside = (pos >= shift).unsqueeze(1)
        contrib = w[:, k] * g
        if S > shift:
            dx[: S - shift] += torch.where(inside, contrib, torch.zeros_like(contrib))[shift:]
        if dinit is not None:
            outside = ~inside.squeeze(1) & (state < dinit.shape[0])
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


class _Reference(torch.autograd.Function):
    """Autograd of the reference: :func:`forward`, and :func:`backward` for its gradients (the
    sigmoid's rounding to an integer and bit operations have no derivative of their own)."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, doc, return_final_states, silu):
        y, final = forward(x, weight, bias, doc, initial_states, return_final_states, silu)
        ctx.save_for_backward(x, weight, bias, initial_states)
        ctx.doc, ctx.silu = doc, silu
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, weight, bias, initial_states = ctx.saved_tensors
        grads = backward(dy, x, weight, bias, ctx.doc, initial_states, dfinal, ctx.silu, weight.dtype)
        return *grads, None, None, None


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
    """Reference forward with the public API's arguments, differentiable (by :func:`backward`).

    Equivalent to, per document, ``F.silu(F.conv1d(F.pad(x.T, (K-1, 0)), w.unsqueeze(1), b,
    groups=C)).T`` with the padding replaced by the initial states when given.
    """
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    doc = doc_table(x, seq_idx, cu_seqlens, initial_states)
    y, final = _Reference.apply(x, w, bias, initial_states, doc, return_final_states, activation is not None)
    return (y, final) if return_final_states else y
