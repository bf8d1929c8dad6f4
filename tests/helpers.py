"""Test helpers: an independent naive implementation (float64 autograd) and tolerance checks."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import torch
import torch.nn.functional as F

# Per output dtype: tolerance relative to |expected| + mean |expected| (METHOD.md: fp32 math
# lands far under 1e-3; a bf16 / fp16 output carries one rounding of 2^-9 / 2^-12).
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 1.6e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, name: str = "") -> None:
    """Elementwise check scaled by the tensor's magnitude; NaN must match NaN (and Inf, Inf)."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = TOL[dtype or actual.dtype]
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan_a, nan_e = a.isnan(), e.isnan()
    assert torch.equal(nan_a, nan_e), f"{name}: NaN positions differ ({int(nan_a.sum())} vs {int(nan_e.sum())})"
    inf_e = e.isinf()
    assert torch.equal(a[inf_e], e[inf_e]), f"{name}: Inf values differ"
    finite = ~(nan_e | inf_e)
    a, e = a[finite], e[finite]
    if e.numel() == 0:
        return
    scale = e.abs().mean() + 1e-30
    err = (a - e).abs()
    bound = tol * (e.abs() + scale)
    worst = int(torch.argmax(err - bound))
    assert bool((err <= bound).all()), (
        f"{name}: max error {float(err.max()):.3e} (bound {tol:.1e} x (|ref| + {float(scale):.3e})); "
        f"worst at flat index {worst}: got {float(a[worst])}, expected {float(e[worst])}"
    )


def doc_spans(S: int, seq_idx=None, cu_seqlens=None, batch_len=None, n_docs=None):
    """List of (start, end, state) per document, written independently of conv1d_silu.documents."""
    if cu_seqlens is not None:
        cu = [int(v) for v in cu_seqlens]
        return [(cu[d], cu[d + 1], d) for d in range(len(cu) - 1)]
    if seq_idx is not None:
        seq = [int(v) for v in seq_idx.reshape(-1)]
        row = batch_len or S
        spans = []
        for t in range(S):
            if t == 0 or t % row == 0 or seq[t] != seq[t - 1]:
                spans.append([t, t + 1, seq[t]])
            else:
                spans[-1][1] = t + 1
        if n_docs is not None:  # documents whose id never appears are empty
            present = {s[2] for s in spans}
            spans += [[S, S, d] for d in range(n_docs) if d not in present]
        return [tuple(s) for s in spans]
    if batch_len is not None:
        return [(b * batch_len, (b + 1) * batch_len, b) for b in range(S // batch_len)]
    return [(0, S, 0)]


def naive(x2, weight, bias, spans, initial_states, silu=True):
    """Per document: F.conv1d over concat(initial state or zeros, tokens), in x2's dtype; a span
    whose state is negative (padding, or a document without a state) starts from zeros.

    Returns (y (S, C), final_states (N, K-1, C) as a list indexed by state)."""
    S, C = x2.shape
    K = weight.shape[1]
    y = [None] * len(spans)
    finals = {}
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1]))
    for i in order:
        s, e, d = spans[i]
        pre = initial_states[d] if initial_states is not None and d >= 0 else x2.new_zeros(K - 1, C)
        full = torch.cat([pre, x2[s:e]], 0)
        finals[d] = full[full.shape[0] - (K - 1):]
        if e == s:
            y[i] = x2.new_zeros(0, C)
            continue
        z = F.conv1d(full.t().unsqueeze(0), weight.unsqueeze(1), bias, groups=C)[0].t()
        y[i] = F.silu(z) if silu else z
    ys = [y[i] for i in order if spans[i][1] > spans[i][0]]
    out = torch.cat(ys, 0) if ys else x2.new_zeros(0, C)
    return out, finals


MODES = ("single", "batch", "seq_idx", "cu_seqlens", "seq_idx_3d")


def random_lengths(S: int, gen: torch.Generator, short: int, allow_empty: bool) -> list[int]:
    """Document lengths summing to S, with many short ones (length 1 .. short) mixed in."""
    lengths, left = [], S
    while left > 0:
        r = torch.rand((), generator=gen).item()
        if allow_empty and r < 0.1:
            n = 0
        elif r < 0.5:
            n = int(torch.randint(1, short + 1, (), generator=gen))
        else:
            n = int(torch.randint(1, max(2, S // 2), (), generator=gen))
        n = min(n, left)
        lengths.append(n)
        left -= n
    return lengths or [0]


def make_case(
    S: int,
    C: int,
    K: int,
    mode: str = "single",
    *,
    bias: bool = True,
    init: bool = False,
    dtype: torch.dtype = torch.float32,
    wdtype: torch.dtype | None = None,
    device: str = "cpu",
    seed: int = 0,
    batch: int = 2,
    row_pad: int = 0,
):
    """Random inputs of one call: a dict of public-API kwargs plus 'spans' for the naive check.

    ``row_pad`` > 0 makes x a strided view (token stride C + row_pad), like a slice of a wider
    projection output."""
    gen = torch.Generator().manual_seed(seed)
    wdtype = wdtype or dtype

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dt)

    kw: dict = {}
    batch_len = None
    if mode in ("batch", "seq_idx_3d"):
        L = max(1, S // batch)
        S = batch * L
        batch_len = L
        shape = (batch, L, C)
    else:
        shape = (S, C)
    full = rnd(*shape[:-1], C + row_pad)
    x = full[..., :C] if row_pad else full
    kw["x"] = x
    kw["weight"] = rnd(C, K, dt=wdtype)
    kw["bias"] = rnd(C, dt=wdtype) if bias else None
    n_docs = None
    if mode == "cu_seqlens":
        lengths = random_lengths(S, gen, K, allow_empty=True)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        kw["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32, device=device)
        n_docs = len(lengths)
    elif mode == "seq_idx":
        lengths = random_lengths(S, gen, K, allow_empty=False)
        ids, d = [], 0
        for n in lengths:
            d += 1 + int(torch.rand((), generator=gen).item() < 0.15)  # occasional unused id
            ids += [d - 1] * n
        kw["seq_idx"] = torch.tensor(ids, dtype=torch.int32, device=device)
        n_docs = ((ids[-1] + 1) if ids else 1) if init else None  # without states: no count
    elif mode == "seq_idx_3d":
        rows = []
        for _ in range(batch):
            lengths = random_lengths(batch_len, gen, K, allow_empty=False)
            rows.append([i for i, n in enumerate(lengths) for _ in range(n)])
        kw["seq_idx"] = torch.tensor(rows, dtype=torch.int32, device=device)
    elif mode == "batch":
        n_docs = batch
    else:
        n_docs = 1
    if init:
        assert mode != "seq_idx_3d"
        kw["initial_states"] = rnd(n_docs, K - 1, C)
    kw["spans"] = doc_spans(
        S,
        seq_idx=kw.get("seq_idx"),
        cu_seqlens=kw.get("cu_seqlens"),
        batch_len=batch_len,
        n_docs=n_docs if mode == "seq_idx" else None,
    )
    kw["n_docs"] = n_docs
    return kw


def api_kwargs(case: dict) -> dict:
    return {k: v for k, v in case.items() if k not in ("spans", "n_docs", "x", "weight", "bias", "dy")}


def naive_grads(case: dict, dy: torch.Tensor, dfinal: torch.Tensor | None, silu: bool = True):
    """float64 naive forward, then autograd: y, final_states, dx, dweight, dbias, dinitial."""
    x = case["x"].detach().cpu().double().requires_grad_()
    w = case["weight"].detach().cpu().double().requires_grad_()
    b = case["bias"].detach().cpu().double().requires_grad_() if case["bias"] is not None else None
    init = case.get("initial_states")
    init = init.detach().cpu().double().requires_grad_() if init is not None else None
    C, K = w.shape
    y, finals = naive(x.reshape(-1, C), w, b, case["spans"], init, silu)
    loss = (y * dy.detach().cpu().double().reshape(-1, C)).sum()
    final = None
    if case["n_docs"] is not None:
        n = case["n_docs"]
        zeros = x.new_zeros(K - 1, C)
        final = torch.stack([finals.get(d, init[d] if init is not None else zeros) for d in range(n)])
        if dfinal is not None:
            loss = loss + (final * dfinal.detach().cpu().double()).sum()
    inputs = [t for t in (x, w, b, init) if t is not None]
    grads = list(torch.autograd.grad(loss, inputs, allow_unused=True)) if loss.requires_grad else [None] * len(inputs)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs)]
    dx, dw = grads[0], grads[1]
    db = grads[2] if b is not None else None
    dinit = grads[-1] if init is not None else None
    return y.reshape(case["x"].shape).detach(), None if final is None else final.detach(), dx, dw, db, dinit


ROOT = Path(__file__).resolve().parents[1]


def load_module(relative: str) -> types.ModuleType:
    """A file of the repository that is not in a package (``tools/x.py``, ``examples/y.py``) as a
    module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
