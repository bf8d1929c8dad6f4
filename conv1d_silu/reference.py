"""Pure-PyTorch reference of the op: forward and an explicit backward.

It is the CPU implementation of the custom ops and the oracle of the GPU tests. It runs on any
device, in fp32 arithmetic (fp64 for fp64 inputs), and casts each output once at the end.

For token ``t`` of document ``d`` (first token ``s_d``) and tap ``k``::

    z[t] = bias + sum_k weight[:, k] * xx[t - (K-1) + k]
    y[t] = silu(z[t])

where ``xx[u] = x[u]`` inside the document and, before its start, initial state row
``(K-1) - (s_d - u)`` of the document (or 0).

Every element of y and dx goes through one fixed sequence of IEEE operations (mul, add, round to
an integer, bit shifts; no library exp, whose vector and scalar paths differ in the last bit), so
its bits depend on its inputs alone, never on where it sits: a sequence split into chunks
(context parallelism) or run on another thread count gives the whole-sequence y and dx bit for
bit. On the CPU the work runs over blocks of rows that stay in cache, in a few reused buffers,
each operation split over PyTorch's threads as usual; the rows whose window leaves their document
(its first K-1 rows, and for dx its last K-1) are computed apart, by the same operations on their
true inputs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from .documents import DocTable, token_positions
from .dtypes import accumulator_dtype
from .states import add_final_state_grads, final_state_sources
from .validation import check_inputs

__all__ = ["causal_conv1d_silu_ref", "forward", "backward"]

# Elements per block of rows on the CPU: the backward's block buffers (5 MB) stay in cache, and
# each operation on a block is still worth splitting over PyTorch's threads (on 2 cores, 2^17
# is within 4 % of the best of 2^16..2^18 on one thread and on two).
BLOCK_ELEMENTS = 1 << 17


def _blocks(S: int, C: int, device: torch.device) -> list[tuple[int, int]]:
    """[a, b) row ranges covering [0, S): cache-sized on the CPU, one block elsewhere."""
    rows = max(1, BLOCK_ELEMENTS // max(C, 1)) if device.type == "cpu" else max(S, 1)
    return [(a, min(a + rows, S)) for a in range(0, S, rows)]


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


_FORMAT = {
    # minimax of degree 6: relative error 1.9e-9 on |q| <= ln2 / 2, sigmoid within 2.5 ulp (as
    # with the 8 Taylor terms, two operations fewer)
    torch.float32: _exp_format(
        torch.float32, -88.5, 88.0, 23, torch.int32,
        (0.0013836846134577057, -0.008374815798301793, 0.04166822556692284, -0.16666420169946367,
         0.4999999207982802, -1.0000000363231765, 1.0000000005541663),
    ),
    # 14 Taylor terms reach fp64 precision
    torch.float64: _exp_format(
        torch.float64, -710.0, 709.0, 52, torch.int64,
        [(-1) ** i / math.factorial(i) for i in range(13, -1, -1)],
    ),
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


def _silu_grad_times(dy: torch.Tensor, z: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    """out = dy * silu'(z) = dy * s (1 + z (1 - s)), s = sigmoid(z): 0 where s is 0 (z finite)."""
    one = _FORMAT[z.dtype].one
    torch.sub(one, s, out=out)
    out.mul_(z).add_(one).mul_(s).mul_(dy)


def _window_sum(
    term: Callable[[int], torch.Tensor],
    wT: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    tmp: torch.Tensor,
    inside: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = bias + w[0] term(0) + ... + w[K-1] term(K-1), each product rounded, added in k order;
    products where ``inside[:, k]`` is False count as 0 (after the product, so a non-finite weight
    stays out of them). Every caller computes its rows with this one sequence of operations."""
    for k in range(wT.shape[0]):
        dst = out if k == 0 else tmp
        torch.mul(term(k), wT[k], out=dst)
        if inside is not None:
            dst.masked_fill_(~inside[:, k : k + 1], 0.0)
        if k > 0:
            out.add_(tmp)
        elif bias is not None:
            out.add_(bias)
    return out


# ---- windows that leave their document --------------------------------------------------------


class _Edges:
    """The rows whose window leaves their document, computed apart from the others.

    ``starts``: rows within K-1 of their document's start; ``taps`` (rows, K, C): their true K
    inputs (x, initial state row or 0); ``z`` their pre-activation. ``pads``: padding rows (a
    negative state index), in no document: output and gradient 0. For the backward (``dx_rows``
    given) also ``ends``: rows t < dx_rows within K-1 of their document's end or of the rows' end,
    whose dx[t] = sum_k w[k] g[t + K-1-k] takes fewer than K terms; ``end_src`` (rows, K): the
    row of g each term reads, ``end_inside``: whether it is in the document.
    """

    def __init__(self, xs, pos, state, init, wT, bias, acc, dx_rows: int | None = None):
        K = wT.shape[0]
        dev = xs.device
        shift = torch.arange(K - 1, -1, -1, device=dev)  # tap k reads row t - (K-1-k)
        self.starts = (pos < K - 1).nonzero().squeeze(1)
        self.start_rows = self.starts.tolist()
        p = pos[self.starts].unsqueeze(1)
        inside = (p >= shift).unsqueeze(2)
        from_x = xs[(self.starts.unsqueeze(1) - shift).clamp(min=0)].to(acc)
        if init is None:
            from_state = torch.zeros_like(from_x)
        else:
            row = (p + torch.arange(K, device=dev)).clamp(max=K - 2)
            st = state[self.starts]
            # padding (a negative index) and documents past the table have no state (zeros)
            has = ((st >= 0) & (st < init.shape[0])).view(-1, 1, 1)
            from_state = torch.where(has, init[st.clamp(0, init.shape[0] - 1).unsqueeze(1), row], 0.0)
        self.taps = torch.where(inside, from_x, from_state)
        first = self.taps[:, 0]
        self.z = _window_sum(lambda k: self.taps[:, k], wT, bias, torch.empty_like(first),
                             torch.empty_like(first))
        self.pads = (state < 0).nonzero().squeeze(1)
        self.pad_rows = self.pads.tolist()
        if dx_rows is None:
            return
        # row t's dx reads g[t + j] for j < K; the row lies in t's document when its position is
        # at least j (the document started by t) and it exists
        n = pos.shape[0]
        short = torch.zeros(dx_rows, dtype=torch.bool, device=dev)
        for j in range(1, K):
            m = max(0, min(dx_rows, n - j))
            short[:m] |= pos[j : j + m] < j
            short[m:] = True
        self.ends = short.nonzero().squeeze(1)
        self.end_rows = self.ends.tolist()
        self.end_src = self.ends.unsqueeze(1) + shift
        self.end_inside = (self.end_src < n) & (pos[self.end_src.clamp(max=n - 1)] >= shift)


def _span(rows: list[int], a: int, b: int) -> slice:
    """The entries of sorted ``rows`` inside [a, b)."""
    return slice(bisect.bisect_left(rows, a), bisect.bisect_left(rows, b))


def _zero_padding(t: torch.Tensor, edges: _Edges, a: int) -> None:
    """Zero the padding rows of ``t``, which holds rows [a, a + len(t))."""
    i = _span(edges.pad_rows, a, a + t.shape[0])
    if i.start < i.stop:
        t.index_fill_(0, edges.pads[i] - a, 0.0)


def _z_rows(xs, edges: _Edges, wT, bias, a: int, b: int, z: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """z of rows [a, b) into ``z`` (b - a rows): full windows of x, then the document starts."""
    K = wT.shape[0]
    a0 = max(a, K - 1)  # rows below K-1 are all document starts
    if a0 < b:
        xr = xs[a0 - (K - 1) : b]
        m = b - a0
        _window_sum(lambda k: xr[k : k + m], wT, bias, z[a0 - a :], tmp[a0 - a :])
    i = _span(edges.start_rows, a, b)
    if i.start < i.stop:
        z.index_copy_(0, edges.starts[i] - a, edges.z[i])
    return z


@torch.no_grad()
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
    S = doc.S
    xs = x.reshape(S, C)
    wT = weight.to(acc).t().contiguous()
    b = None if bias is None else bias.to(acc)
    init = None if initial_states is None else initial_states.to(acc)
    pos, state = token_positions(doc, x.device)
    edges = _Edges(xs, pos, state, init, wT, b, acc)
    # returned whole, not as a view: callers may modify the output in place (autograd refuses that
    # for a view of a tensor made inside the forward)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ys = y.view(S, C)
    blocks = _blocks(S, C, x.device)
    rows = max((e - a for a, e in blocks), default=0)

    z, s, v, k, n = (torch.empty(rows, C, dtype=acc, device=x.device) for _ in range(5))
    for a, e in blocks:
        m = e - a
        _z_rows(xs, edges, wT, b, a, e, z[:m], s[:m])
        if silu:
            _sigmoid(z[:m], s[:m], v[:m], k[:m], n[:m])
            torch.mul(z[:m], s[:m], out=ys[a:e])
        else:
            ys[a:e] = z[:m]
        _zero_padding(ys[a:e], edges, a)
    final = None
    if return_final_states:
        src, from_x, init_row = final_state_sources(doc, K, x.device)
        if S > 0:
            gathered = xs[src.clamp(0, S - 1)].to(acc)
        else:
            gathered = xs.new_zeros(*src.shape, C, dtype=acc)
        if init is None:
            fallback = torch.zeros_like(gathered)
        else:
            ids = torch.arange(src.shape[0], device=x.device).unsqueeze(1).expand_as(src)
            fallback = init[ids, init_row.clamp(max=K - 2)]
        final = torch.where(from_x.unsqueeze(2), gathered, fallback).to(x.dtype)
    return y, final


@torch.no_grad()
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
    dweight and dbias sum per block of rows, then over the blocks in order.
    """
    C, K = weight.shape
    acc = accumulator_dtype(x.dtype)
    S = doc.S
    xs = x.reshape(S, C)
    gs = dy.reshape(S, C)
    pos, state = token_positions(doc, x.device)
    if trailing is not None and S > 0 and trailing[0].shape[0] > 0:
        nx, ndy = trailing
        n = nx.shape[0]
        xs = torch.cat([xs, nx.to(xs.dtype)])
        gs = torch.cat([gs, ndy.to(gs.dtype)])
        pos = torch.cat([pos, pos[-1] + 1 + torch.arange(n, device=pos.device)])
        state = torch.cat([state, state[-1].expand(n)])
    rows_all = xs.shape[0]
    wT = weight.to(acc).t().contiguous()
    b = None if bias is None else bias.to(acc)
    init = None if initial_states is None else initial_states.to(acc)
    edges = _Edges(xs, pos, state, init, wT, b, acc, dx_rows=S)

    dx = torch.empty((S, C), dtype=acc, device=x.device)
    blocks = _blocks(S, C, x.device)
    rows = max((e - a for a, e in blocks), default=0) + K - 1
    sums = torch.empty(len(blocks), K + 1, C, dtype=acc, device=x.device)  # per block: dweight.T, dbias
    g_starts = torch.empty_like(edges.z)

    z, s, v, k, n, g = (torch.empty(rows, C, dtype=acc, device=x.device) for _ in range(6))
    prod = torch.empty(rows, K, C, dtype=acc, device=x.device)
    for blk, (a, e) in enumerate(blocks):
        # g of rows [a, e + K-1): dx of rows [a, e) reads K-1 rows past them
        ge = min(e + K - 1, rows_all)
        m = ge - a
        if silu:
            _z_rows(xs, edges, wT, b, a, ge, z[:m], s[:m])
            _sigmoid(z[:m], s[:m], v[:m], k[:m], n[:m])
            _silu_grad_times(gs[a:ge], z[:m], s[:m], g[:m])
        else:
            g[:m] = gs[a:ge]
        _zero_padding(g[:m], edges, a)
        # dx: full windows, then rows near a document end
        full = min(e, rows_all - (K - 1)) - a
        if full > 0:
            _window_sum(lambda q, full=full: g[K - 1 - q : K - 1 - q + full], wT, None, dx[a : a + full],
                        s[:full])
        i = _span(edges.end_rows, a, e)
        if i.start < i.stop:
            src = edges.end_src[i] - a
            cnt = i.stop - i.start
            rows_of = lambda q, src=src, m=m: g[src[:, q].clamp(max=m - 1)]
            out = _window_sum(rows_of, wT, None, v[:cnt], s[:cnt], edges.end_inside[i])
            dx.index_copy_(0, edges.ends[i], out)
        # dweight, dbias: g times each row's K inputs; document starts take their true inputs
        own = e - a
        a0 = max(a, K - 1)
        if a0 < e:
            window = xs.unfold(0, K, 1)[a0 - (K - 1) : e - (K - 1)].transpose(1, 2)
            torch.mul(g[a0 - a : own].unsqueeze(1), window, out=prod[a0 - a : own])
        i = _span(edges.start_rows, a, e)
        if i.start < i.stop:
            starts = edges.starts[i] - a
            g_starts[i] = g[starts]
            prod.index_copy_(0, starts, g_starts[i].unsqueeze(1) * edges.taps[i])
        torch.sum(prod[:own], 0, out=sums[blk, :K])
        torch.sum(g[:own], 0, out=sums[blk, K])
    dweight = sums[:, :K].sum(0).t().contiguous()
    dbias = None if bias is None else sums[:, K].sum(0)

    dinit = None
    if init is not None:
        dinit = torch.zeros(init.shape, dtype=acc, device=init.device)
        own = edges.starts < S
        p, st, gr = pos[edges.starts][own], state[edges.starts][own], g_starts[own]
        for q in range(K):
            outside = (p < K - 1 - q) & (st >= 0) & (st < dinit.shape[0])
            dinit.view(-1, C).index_add_(0, st[outside] * (K - 1) + p[outside] + q, wT[q] * gr[outside])
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
    w, silu, doc = check_inputs(
        x, weight, bias, seq_idx, cu_seqlens, initial_states, return_final_states, activation, None, None
    )
    y, final = _Reference.apply(x, w, bias, initial_states, doc, return_final_states, silu)
    return (y, final) if return_final_states else y
