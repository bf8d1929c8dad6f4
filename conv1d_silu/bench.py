"""Benchmark: ``python -m conv1d_silu.bench``.

For each (S, C) and timed call (fwd, bwd, fwdbwd) it times ours and the baselines with CUDA events
on cold L2 (a 256 MB buffer is rewritten before every timed call), takes medians, and reports the
speedup with a 95 % bootstrap CI and the share of the copy bandwidth measured in the same run.
``--graph`` times CUDA-graph replays instead (no host overhead). Same-run ratios: the forward
against ``y.copy_(x)`` and the backward against ``torch.add(x, dy, out=dx)`` of the same shape,
each timed in alternation with ours within every replay.
Baselines: PyTorch eager (``F.conv1d`` with ``groups=C``), ``torch.compile(dynamic=True)`` of the
same op as K shifted multiply-adds (one graph for every shape: Inductor specialises ``groups``),
causal-conv1d and flash-linear-attention where importable. Without a GPU it runs the CPU path at
CPU_SHAPES (a smoke test of the harness, and ours against eager PyTorch on the CPU). ``--from-json``
reports saved results again, without a GPU; ``--peers`` adds the peer rows of other runs on the
same GPU (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from . import causal_conv1d_silu
from .bench_report import CALLS, PEERS, SAME_BYTES, add_peers, markdown, merge_results, plot, write_json

# The default list: four token counts (250340, the reference shape's, beside 262144, a power of
# two) at C = 264..408 in steps of 8 (all but 320 and 384 are not multiples of 64, so bf16 rows
# start mid 128-byte line), a million tokens at C from 64 to 4096, and the shapes a Mamba block
# runs per GPU in training (8k-64k tokens, C = d_inner + 2 * d_state * n_groups of 1024-5376),
# where the backward stood furthest from add.
TOKENS = (32768, 65536, 250340, 262144)
RAGGED_C = tuple(range(264, 409, 8))
LONG_S = 1048576
WIDE_C = (64, 128, 256, 512, 1024, 2048, 4096)
MAMBA_SHAPES = ((8192, 5376), (16384, 2560), (16384, 5376), (32768, 1024), (65536, 1280))
# Without a GPU: two small shapes, and the shape tests/test_cpu_speed.py holds the CPU path to
CPU_SHAPES = [(4096, 64), (8192, 128), (16384, 256)]
# --layout BCL: x is (B, C, L) channel-first, as mamba_ssm's Mamba (v1) path and causal-conv1d's
# primary layout have it; the default shapes are B x L = 8 x 2048, 4 x 8192, 1 x 65536 at C = 256 ..
# 5120 (S = B * L; a token count without an entry here is one sequence, B = 1)
BCL_SEQLEN = {16384: 2048, 32768: 8192, 65536: 65536}
BCL_C = (256, 1024, 2560, 5120)


def bcl_shapes() -> list[tuple[int, int]]:
    return [(s, c) for s in BCL_SEQLEN for c in BCL_C]


def default_shapes() -> list[tuple[int, int]]:
    return [(s, c) for s in TOKENS for c in RAGGED_C] + [(LONG_S, c) for c in WIDE_C] + list(MAMBA_SHAPES)


@dataclass
class Row:
    S: int
    C: int
    call: str
    impl: str
    median_us: float
    times_us: list[float] = field(repr=False)
    bytes: int = 0
    baseline_us: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    pct_copy_bw: float | None = None
    same_run_ratio: float | None = None  # ours / (copy or add) of the same shape
    deterministic: bool | None = None


class Timer:
    """CUDA-event timing on cold L2 (or wall clock on the CPU)."""

    def __init__(self, device: torch.device, reps: int, warmup: int, graph: bool, flush_mb: int = 256):
        self.device, self.reps, self.warmup, self.graph = device, reps, warmup, graph
        self.cuda = device.type == "cuda"
        self.flush_buf = torch.empty(flush_mb * 2**20 // 4, dtype=torch.float32, device=device) if self.cuda else None

    def _flush(self) -> None:
        if self.flush_buf is not None:
            self.flush_buf.fill_(1.0)

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        """What one timed rep runs: ``fn`` after its warm-up calls, or in graph mode the replay of a
        CUDA graph of it (warmed up and captured on a side stream, which autograd follows)."""
        if not (self.cuda and self.graph):
            for _ in range(self.warmup):
                fn()
            return fn
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(max(1, self.warmup)):
                    fn()
                torch.cuda.synchronize()
                with torch.cuda.graph(g, stream=s):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            return g.replay
        except Exception as err:  # report and time eagerly rather than lose the row
            sys.stderr.write(f"\ngraph capture failed ({err}); timing eagerly\n")
            torch.cuda.synchronize()
            return fn

    def times(self, runs: list[Callable[[], object]]) -> list[list[float]]:
        """µs of each prepared callable per rep. The callables take turns within every rep (each
        after its own L2 flush), so a drift of the machine during the row reaches all of them
        alike and their ratio is a same-run ratio in the strict sense."""
        out: list[list[float]] = [[] for _ in runs]
        if not self.cuda:
            for _ in range(self.reps):
                for run, t in zip(runs, out):
                    t0 = time.perf_counter()
                    run()
                    t.append((time.perf_counter() - t0) * 1e6)
            return out
        events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in runs]
                  for _ in range(self.reps)]
        for rep in events:
            for run, (start, end) in zip(runs, rep):
                self._flush()
                start.record()
                run()
                end.record()
        torch.cuda.synchronize()
        for rep in events:
            for t, (start, end) in zip(out, rep):
                t.append(start.elapsed_time(end) * 1e3)
        return out

    def __call__(self, fn: Callable[[], object]) -> list[float]:
        return self.times([self.prepare(fn)])[0]


def bootstrap_ratio_ci(base: list[float], ours: list[float], n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % CI of median(base) / median(ours) by resampling both sides."""
    g = torch.Generator().manual_seed(seed)
    b = torch.tensor(base, dtype=torch.float64)
    o = torch.tensor(ours, dtype=torch.float64)
    bi = torch.randint(0, len(base), (n, len(base)), generator=g)
    oi = torch.randint(0, len(ours), (n, len(ours)), generator=g)
    ratios = b[bi].median(dim=1).values / o[oi].median(dim=1).values
    lo, hi = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return lo, hi


# ---- implementations ------------------------------------------------------------------------


def torch_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """PyTorch eager: depthwise F.conv1d with causal padding, then SiLU, on (S, C) tokens."""
    S, C = x.shape
    K = w.shape[1]
    xt = x.t().unsqueeze(0)
    y = F.conv1d(xt, w.unsqueeze(1), b, padding=K - 1, groups=C)[..., :S]
    return F.silu(y)[0].t()


def torch_reference_bcl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """PyTorch eager on channel-first (B, C, L) x, F.conv1d's own layout."""
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=w.shape[1] - 1, groups=x.shape[1])[..., : x.shape[2]])


def torch_reference_shifts(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The same op as K shifted multiply-adds: no shape-valued argument (``groups=C``) for Dynamo
    to specialise on, so ``torch.compile(..., dynamic=True)`` builds one graph for every (S, C)."""
    S = x.shape[0]
    K = w.shape[1]
    xp = F.pad(x, (0, 0, K - 1, 0))
    y = xp[0:S] * w[:, 0]
    for k in range(1, K):
        y = y + xp[k : k + S] * w[:, k]
    return F.silu(y if b is None else y + b)


def cc1d_name() -> str:
    """causal-conv1d's name in the results: its deterministic backward (CAUSAL_CONV1D_DETERMINISTIC=1,
    which its C++ reads at every call, or torch's deterministic algorithms) is a peer of its own."""
    det = os.environ.get("CAUSAL_CONV1D_DETERMINISTIC") == "1" or torch.are_deterministic_algorithms_enabled()
    return "dao_cc1d_det" if det else "dao_cc1d"


CHANNEL_LAST = "conv1d_silu[BLC]"  # ours on a channel-last copy of channel-first inputs (--with-channel-last)


def _impls(args, layout: str = "BLC") -> dict[str, Callable]:
    """Ours and the baselines on x of the layout: token-major (S, C), or channel-first (B, C, L)
    with each peer called as its users call it there."""
    bcl = layout == "BCL"

    def ours(program):
        return lambda x, w, b: causal_conv1d_silu(x, w, b, program=program, layout=layout)

    impls: dict[str, Callable] = {"conv1d_silu": ours(args.program)}
    for name in args.baseline_programs:  # our own op forced to another program, as a baseline
        impls[f"conv1d_silu[{name}]"] = ours(name)
    if bcl and args.with_channel_last:  # ours on the same values in channel-last memory, in the same run
        impls[CHANNEL_LAST] = ours(args.program)
    if "eager" in args.baselines:
        impls["torch_eager"] = torch_reference_bcl if bcl else torch_reference
    if "compile" in args.baselines and bcl:
        sys.stderr.write("baseline compile skipped: not measured with --layout BCL\n")
    elif "compile" in args.baselines:
        # the timed backward replays one forward's graph (retain_graph), which donated buffers forbid
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
        impls["torch_compile"] = torch.compile(torch_reference_shifts, dynamic=True)
    if "cc1d" in args.baselines:
        try:
            from causal_conv1d import causal_conv1d_fn

            name = cc1d_name()
            if bcl:
                impls[name] = lambda x, w, b: causal_conv1d_fn(x, w, b, activation="silu")
            else:
                impls[name] = lambda x, w, b: causal_conv1d_fn(
                    x.t().unsqueeze(0), w, b, activation="silu"
                )[0].t()
        except Exception as err:  # a missing peer is a gap in the table, so say why
            sys.stderr.write(f"baseline cc1d skipped: causal_conv1d not importable ({err!r})\n")
    if "fla" in args.baselines:
        try:
            from fla.modules.convolution import causal_conv1d as fla_conv

            if bcl:
                impls["fla_triton"] = lambda x, w, b: fla_conv(x.transpose(1, 2), w, b, activation="silu")[0].transpose(1, 2)
            else:
                impls["fla_triton"] = lambda x, w, b: fla_conv(x.unsqueeze(0), w, b, activation="silu")[0][0]
        except Exception as err:
            sys.stderr.write(f"baseline fla skipped: flash-linear-attention not importable ({err!r})\n")
    return impls


def channel_last(t: torch.Tensor) -> torch.Tensor:
    """The values of channel-first ``t`` (B, C, L) in channel-last memory, the same shape; a leaf
    that requires grad where ``t`` does."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(t.requires_grad)


def _timed_calls(fn, x, w, b, dy):
    inputs = [x, w] + ([b] if b is not None else [])
    saved = []

    def fwd():
        return fn(x, w, b)

    def bwd():
        # the forward runs once, on the stream of the first call (the capture stream in graph
        # mode), so the backward it records runs there too
        if not saved:
            saved.append(fwd())
        return torch.autograd.grad(saved[0], inputs, dy, retain_graph=True)

    def fwdbwd():
        return torch.autograd.grad(fn(x, w, b), inputs, dy)

    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwdbwd}


def _bitwise_repeatable(fn, x, w, b, dy, runs: int = 5) -> bool:
    """Whether ``runs`` forward + backward calls give the same bits. Fresh leaves on the current
    stream: the timed calls' autograd graph lives on the capture stream, and a backward through it
    from here would cross streams (PyTorch warns about the AccumulateGrad nodes)."""
    def grads():
        xl, wl = x.detach().requires_grad_(), w.detach().requires_grad_()
        bl = None if b is None else b.detach().requires_grad_()
        return torch.autograd.grad(fn(xl, wl, bl), [t for t in (xl, wl, bl) if t is not None], dy)

    first = grads()
    return all(all(torch.equal(a, c) for a, c in zip(first, grads())) for _ in range(runs - 1))


def copy_bandwidth(device: torch.device, timer: Timer) -> float:
    """Bytes read + written per second of a large device copy (same run)."""
    n = 2**29 if device.type == "cuda" else 2**22
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    us = statistics.median(timer(lambda: b.copy_(a)))
    return 2 * n / (us * 1e-6)


def tiny_steps(device: torch.device, peers: dict[str, Callable] | None = None) -> dict[str, Callable[[], None]]:
    """One eager fwd+bwd at 64 x 64 per implementation: PyTorch's ``(x * 2).sum().backward()``
    (``torch_x2_sum_backward``), ours (``conv1d_silu_fwd_bwd``) and each peer (``fn(x, w, b) -> y``;
    ``NAME_fwd_bwd``)."""
    x = torch.randn(64, 64, device=device, requires_grad=True)
    w = torch.randn(64, 4, device=device, requires_grad=True)
    b = torch.randn(64, device=device, requires_grad=True)
    steps = {
        "torch_x2_sum_backward": lambda: (x * 2).sum().backward(),
        "conv1d_silu_fwd_bwd": lambda: causal_conv1d_silu(x, w, b).sum().backward(),
    }
    for name, fn in (peers or {}).items():
        steps[f"{name}_fwd_bwd"] = lambda fn=fn: fn(x, w, b).sum().backward()
    return steps


def host_overhead_us(
    device: torch.device, iters: int = 300, rounds: int = 6, peers: dict[str, Callable] | None = None
) -> dict[str, float]:
    """CPU time per call of the tiny steps (the GPU is idle at that size): the median over rounds
    that alternate them, so a slow or shared CPU's drift hits every side alike. ``ratio`` is ours
    against PyTorch's line; a peer that fails at this size is left out, with a note on stderr."""
    steps = tiny_steps(device, peers)
    for name, fn in list(steps.items()):
        try:
            for _ in range(20):
                fn()
        except Exception as err:
            if name in ("torch_x2_sum_backward", "conv1d_silu_fwd_bwd"):
                raise
            sys.stderr.write(f"host overhead: {name} skipped ({err!r})\n")
            del steps[name]
    per_round = max(1, iters // rounds)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.process_time()
            for _ in range(per_round):
                fn()
            times[name].append((time.process_time() - t0) / per_round * 1e6)
    out = {name: statistics.median(t) for name, t in times.items()}
    out["ratio"] = out["conv1d_silu_fwd_bwd"] / out["torch_x2_sum_backward"]
    return out


def _progress(i: int, n: int, label: str) -> None:
    sys.stderr.write(f"\r[{i}/{n}] {label:<40}")
    sys.stderr.flush()


def seqlen(S: int, layout: str) -> int | None:
    """L of a channel-first shape (``--layout BCL``), None for token-major (S, C)."""
    if layout != "BCL":
        return None
    L = BCL_SEQLEN.get(S, S)
    if S % L:
        raise ValueError(f"--layout BCL: {S} tokens are not a whole number of sequences of {L}")
    return L


def shape_inputs(S: int, C: int, K: int, dtype: torch.dtype, device: torch.device, layout: str = "BLC"):
    """x, weight, bias (grad-requiring leaves) and dy of one bench shape: random, seeded by the shape;
    x is (S, C), or (B, C, L) channel-first with ``layout="BCL"``."""
    g = torch.Generator(device=device).manual_seed(S * 7919 + C)
    L = seqlen(S, layout)
    shape = (S, C) if L is None else (S // L, C, L)
    x = torch.randn(*shape, device=device, dtype=dtype, generator=g).requires_grad_()
    w = (torch.randn(C, K, device=device, dtype=dtype, generator=g) * 0.5).requires_grad_()
    b = torch.randn(C, device=device, dtype=dtype, generator=g).requires_grad_()
    dy = torch.randn(*shape, device=device, dtype=dtype, generator=g)
    return x, w, b, dy


def _shape_rows(args, impls, S: int, C: int, timer: Timer, eager: Timer, bw: float, dtype, device) -> list[Row]:
    """Every timed call of one (S, C): ours, the baselines, and PyTorch's copy / add."""
    rows: list[Row] = []
    itemsize = torch.tensor([], dtype=dtype).element_size()
    x, w, b, dy = shape_inputs(S, C, args.K, dtype, device, args.layout)
    xd = x.detach()
    out = torch.empty_like(xd)
    plain_fns = {"copy": lambda: out.copy_(xd), "add": lambda: torch.add(xd, dy, out=out)}
    plain: dict[str, list[float]] = {}
    nbytes = {"fwd": 2 * S * C * itemsize, "bwd": 3 * S * C * itemsize, "fwdbwd": 5 * S * C * itemsize}
    floor = None
    if args.floor:
        from . import bench_floor

        try:  # built and run once here: a floor that fails leaves the row without bare columns, not the run
            floor = bench_floor.calls(xd, w.detach(), None if b is None else b.detach(), dy, args.program, args.program)
            floor.fwd()
            floor.bwd()
        except Exception as err:
            sys.stderr.write(f"\nfloor S={S} C={C} skipped: {err!r}\n")
            floor = None
        floor_calls = [call for call in args.calls if call in SAME_BYTES]
    for impl, fn in impls.items():
        if impl in ("torch_eager", "torch_compile") and S * C > args.max_eager_elems:
            continue
        xi, dyi = (channel_last(x), channel_last(dy)) if impl == CHANNEL_LAST else (x, dy)
        try:
            calls = _timed_calls(fn, xi, w, b, dyi)
        except Exception as err:  # a peer that rejects the shape
            sys.stderr.write(f"\n{impl} S={S} C={C}: {err}\n")
            continue
        for call in args.calls:
            ref = SAME_BYTES.get(call) if impl == "conv1d_silu" else None
            bare = []
            if ref is not None:
                # ours and PyTorch's copy / add of the same bytes take turns within every rep, so a
                # drift of the machine during the row reaches both sides of the ratio alike; so
                # does the floor of our program's access pattern (--floor)
                runs = [eager.prepare(plain_fns[ref]), timer.prepare(calls[call])]
                if floor is not None:
                    runs.append(timer.prepare(getattr(floor, call)))
                plain[ref], times, *bare = timer.times(runs)
                if floor is not None and call == floor_calls[-1]:
                    # its y and dx (held by the floor and, timed without graphs, by its runs) go
                    # before the determinism check's copies: at 1048576 x 4096 they are 16 of the
                    # H100's 80 GiB, and the check does not fit beside them
                    floor = runs = None
            else:
                times = timer(calls[call])
            for name, t in [(impl, times)] + [("bare", t) for t in bare]:
                row = Row(S, C, call, name, statistics.median(t), t, nbytes[call])
                row.pct_copy_bw = 100 * nbytes[call] / (row.median_us * 1e-6) / bw
                if ref is not None:
                    row.same_run_ratio = row.median_us / statistics.median(plain[ref])
                if name == "conv1d_silu" and call == "bwd" and args.check_determinism:
                    row.deterministic = _bitwise_repeatable(fn, x, w, b, dy)
                rows.append(row)
    for name in ("copy", "add"):
        times = plain[name] if name in plain else eager(plain_fns[name])
        rows.append(Row(S, C, name, "torch_" + name, statistics.median(times), times, nbytes["fwd" if name == "copy" else "bwd"]))
    return rows


def run(args, on_shape: Callable[[dict], None] | None = None) -> dict:
    """Measure every shape of ``args``; ``on_shape`` gets the result so far after each shape."""
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if args.floor and device.type != "cuda":
        raise ValueError("--floor: the bare launches are our CUDA kernels: a CUDA GPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    timer = Timer(device, args.reps, args.warmup, args.graph)
    # PyTorch's own passes are single GPU-bound kernels: timed eagerly, since a captured copy_
    # becomes a graph memcpy node (the copy engine, ~1.5x slower than the copy kernel)
    eager = Timer(device, args.reps, args.warmup, graph=False)
    bw = copy_bandwidth(device, eager)
    token_major = _impls(args)
    impls = _impls(args, "BCL") if args.layout == "BCL" else token_major
    default = bcl_shapes() if args.layout == "BCL" else default_shapes()
    shapes = args.shapes or (default if device.type == "cuda" else CPU_SHAPES)
    shapes = select_part(shapes, args.part)
    # measured first, so that every partial result written below carries it (token-major calls)
    host = None if args.no_host else host_overhead_us(
        device, peers={k: v for k, v in token_major.items() if k in PEERS}
    )
    run_meta = meta(device, args, bw)
    rows: list[Row] = []
    speedups: list[dict] = []
    total = len(shapes)
    for i, (S, C) in enumerate(shapes):
        _progress(i, total, f"S={S} C={C}")
        if device.type == "cuda":
            # Every shape starts from an empty cache, not from the blocks the bandwidth probe or the
            # previous shape freed: right after a large free, the forward times ~10 % slower.
            torch.cuda.empty_cache()
        shape_rows = _shape_rows(args, impls, S, C, timer, eager, bw, dtype, device)
        rows += shape_rows
        speedups += _speedups(shape_rows)
        if on_shape is not None:
            on_shape(_result(run_meta, host, rows, speedups))
    _progress(total, total, "done")
    sys.stderr.write("\n")
    return _result(run_meta, host, rows, speedups)


def _speedups(rows: list[Row]) -> list[dict]:
    """Ours against each baseline of the same (S, C, call), with the ratio's 95 % bootstrap CI."""
    by_key = {(r.S, r.C, r.call, r.impl): r for r in rows}
    out = []
    for r in rows:
        if r.impl in ("conv1d_silu", "bare") or r.call not in CALLS:
            continue
        ours = by_key.get((r.S, r.C, r.call, "conv1d_silu"))
        if ours is None:
            continue
        lo, hi = bootstrap_ratio_ci(r.times_us, ours.times_us)
        out.append(
            dict(S=r.S, C=r.C, call=r.call, baseline=r.impl, baseline_us=r.median_us, ours_us=ours.median_us,
                 speedup=r.median_us / ours.median_us, ci95=(lo, hi), pct_copy_bw=ours.pct_copy_bw)
        )
    return out


def _result(run_meta: dict, host: dict | None, rows: list[Row], speedups: list[dict]) -> dict:
    """The saved form of a run; rows keep the reps' spread instead of the reps."""
    return {
        "meta": run_meta,
        "host_overhead_us": host,
        "rows": [{**{k: v for k, v in asdict(r).items() if k != "times_us"},
                  "min_us": min(r.times_us), "max_us": max(r.times_us)} for r in rows],
        "speedups": speedups,
    }


def select_part(shapes: list[tuple[int, int]], part: tuple[int, int] | None) -> list[tuple[int, int]]:
    """Part ``(i, n)`` of the shapes: every n-th from the i-th (1-based), so that the parts of a
    list ordered by size take similar times (a bench split over several device calls)."""
    if part is None:
        return shapes
    i, n = part
    return shapes[i - 1 :: n]


def meta(device: torch.device, args, bw: float) -> dict:
    # CONV1D_SILU_COMMIT names the commit where the tree's own git history cannot (a copied tree)
    commit = os.environ.get("CONV1D_SILU_COMMIT", "")
    try:
        # the package's own checkout, wherever the bench is started from
        here = os.path.dirname(os.path.abspath(__file__))
        commit = commit or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here
        ).stdout.strip()
    except Exception:
        commit = ""
    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:
        cupy_version = None
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cupy": cupy_version,
        "cuda": torch.version.cuda,
        "commit": commit,
        "dtype": args.dtype,
        "K": args.K,
        "layout": args.layout,
        "graph": args.graph,
        "reps": args.reps,
        "copy_bandwidth_TBps": bw / 1e12,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _shape(text: str) -> tuple[int, int]:
    s, c = text.split(",")
    return int(s), int(c)


def _part(text: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"expected 1 <= I <= N, got {text!r}")
    return i, n


def parser() -> argparse.ArgumentParser:
    """The bench's command line (scripts build their arguments with it too)."""
    p = argparse.ArgumentParser(
        prog="python -m conv1d_silu.bench", description=__doc__.split("\n\n")[0],
        epilog="A report from saved results, without a GPU: --from-json benchmarks/results/h200.json --peers "
               "benchmarks/results/h200-fla.json --markdown h200.md --plot h200.png (benchmarks/README.md).")
    p.add_argument("--shapes", type=_shape, nargs="*",
                   help="S,C pairs (default: TOKENS x RAGGED_C, LONG_S x WIDE_C and MAMBA_SHAPES, 88 shapes; on the CPU CPU_SHAPES)")
    p.add_argument("--part", type=_part, help="I/N: only every N-th shape from the I-th (a bench split over several runs; "
                   "join the parts' --json with --from-json)")
    p.add_argument("--program", help="force our op's program (default: routed)")
    p.add_argument("--baseline-programs", nargs="*", default=[], help="our op forced to these programs, as baselines")
    p.add_argument("--calls", nargs="*", default=list(CALLS), choices=CALLS)
    p.add_argument("--baselines", nargs="*", default=["eager", "compile", "cc1d", "fla"],
                   help="of eager, compile, cc1d (causal-conv1d: dao_cc1d, or dao_cc1d_det under "
                        "CAUSAL_CONV1D_DETERMINISTIC=1), fla (flash-linear-attention); default: all")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--layout", default="BLC", choices=["BLC", "BCL"],
                   help="BCL: x channel-first (B, C, L), ours with layout='BCL' and each peer as its users call it "
                        "there; default shapes B x L = 8 x 2048, 4 x 8192, 1 x 65536 at C = 256, 1024, 2560, 5120")
    p.add_argument("--with-channel-last", action="store_true",
                   help="with --layout BCL: ours on the same values in channel-last memory too (rows "
                        "'conv1d_silu[BLC]'), so both layouts and the peers' channel-first calls share one run")
    p.add_argument("-K", type=int, default=4)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    p.add_argument("--cpu", action="store_true", help="force the CPU fallback")
    p.add_argument("--check-determinism", action="store_true", default=True)
    p.add_argument("--no-host", action="store_true", help="skip the host-overhead measurement")
    p.add_argument("--floor", action="store_true",
                   help="time the floor of our programs' access pattern beside them: their launches with the "
                        "math, slab partials and fold compiled out (bare rows; a GPU; see "
                        "conv1d_silu/bench_floor.py)")
    p.add_argument("--max-eager-elems", type=int, default=2**31, help="skip eager baselines above S*C")
    p.add_argument("--decode", action="store_true",
                   help="the decoding step instead (causal_conv1d_update at B = 1, 64, 256; --dtype and -K apply, "
                        "C = 5120; see conv1d_silu/bench_decode.py)")
    p.add_argument("--step", action="store_true",
                   help="a training step's host cost instead: a Linear + CausalConv1dSiLU block eager, compiled and "
                        "compiled with mode='reduce-overhead' (eager only without a GPU; --dtype and -K apply; see "
                        "conv1d_silu/bench_step.py)")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--csv")
    p.add_argument("--plot", help="draw µs against C into this PNG (matplotlib): a row of panels per token count, "
                   "forward and backward; ours, causal-conv1d and flash-linear-attention where measured, and "
                   "PyTorch's copy_ / add of the same shape")
    p.add_argument("--from-json", nargs="+", metavar="JSON",
                   help="skip measuring: report saved --json results (several: the parts of one bench, merged; "
                        "they must agree on GPU, versions, commit, dtype, K, timing mode and reps)")
    p.add_argument("--peers", nargs="+", default=[], metavar="JSON",
                   help="saved results of other runs on the same GPU, dtype, K and timing mode (e.g. a "
                        "flash-linear-attention run): their rows of implementations other than ours and "
                        "PyTorch's copy / add join the tables and the plot, with speedups against ours of "
                        "this result (no CI across runs; the peer run's own speedup and CI beside it)")
    return p


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _apart(args) -> dict:
    """``--decode`` / ``--step``: a benchmark of its own (bench_decode, bench_step), reported alone."""
    from . import bench_decode, bench_step

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    if args.decode:
        key, mod = "decode", bench_decode
        rows = bench_decode.run(device, K=args.K, dtype=dtype, **({} if device.type == "cuda" else {"calls": 50}))
    else:
        key, mod = "step", bench_step
        rows = bench_step.run(device, K=args.K, dtype=dtype)
    text = mod.markdown(rows, name)
    print(text)
    result = {key: rows, "device": name, "commit": os.environ.get("CONV1D_SILU_COMMIT", "")}
    if args.json:
        write_json(result, args.json)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.decode or args.step:
        return _apart(args)
    peers = [_load(path) for path in args.peers]  # before a run: a missing file fails fast
    if args.from_json:
        result = merge_results([_load(path) for path in args.from_json])
    else:
        # with --json the result so far is saved after every shape: a run cut off keeps its rows
        result = run(args, on_shape=(lambda r: write_json(r, args.json)) if args.json else None)
    result = add_peers(result, peers)
    text = markdown(result)
    print(text)
    if args.json:
        write_json(result, args.json)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(result, args.plot)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("S,C,call,impl,median_us,pct_copy_bw,same_run_ratio\n")
            for r in result["rows"]:
                f.write(f"{r['S']},{r['C']},{r['call']},{r['impl']},{r['median_us']:.3f},{r['pct_copy_bw'] or ''},{r['same_run_ratio'] or ''}\n")
    return result


if __name__ == "__main__":
    main()
