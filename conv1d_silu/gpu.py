"""Allocating wrappers of the CUDA kernels: choose the instantiation and geometry, allocate the
outputs and workspaces from torch's allocator, and call the launcher's prepared form of each planned
:class:`runtime.Launch` with the call's tensors (:meth:`Launcher.prepare`).

The launcher is the CuPy runtime on GPUs; the kernel tests pass the CPU emulator instead, so the
same planning code is exercised without a GPU.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, replace

import torch

from . import kernels, runtime
from .documents import DocTable
from .dtypes import accumulator_dtype
from .routes import LANES, Program, tile_vectors
from .runtime import Args, Launch, current_stream_ptr, device_index

SLAB = 32  # tokens per slab of the canonical reduction (kernels/common.cuh)
FAN = 8  # children per node of the canonical tree


class Launcher:
    """Where launches go. A planned launch is prepared once (:meth:`prepare`, per call signature and
    alignment class) into a callable that each call gives its tensors, and the outputs it did not
    allocate with the inputs they must not overlap. This base class hands every call to
    :meth:`__call__` as a bound :class:`runtime.Launch` (the recorders of tune.py and the tests);
    :class:`CudaLauncher` and the tests' emulator prepare the launch itself (:class:`runtime.Prepared`)."""

    def sm_count(self, device: torch.device) -> int:
        return runtime.device_limits(device_index(device)).sm_count

    def max_active_blocks(self, launch: Launch, device: torch.device) -> int:
        return runtime.max_active_blocks(launch.source, launch.kernel, launch.block, launch.smem, device_index(device))

    def prepare(self, launch: Launch, device: torch.device):
        """``launch`` (a planned launch) ready to be called as ``f(tensors, outputs=(), inputs=())``."""
        return functools.partial(self._bound, launch, device)

    def _bound(self, launch: Launch, device: torch.device, tensors: tuple, outputs: tuple = (), inputs: tuple = ()):
        self(launch.bind(tensors, outputs, inputs), device)

    def __call__(self, launch: Launch, device: torch.device) -> None:
        runtime.launch(launch, device)


class CudaLauncher(Launcher):
    """The GPU: each planned launch prepared once per device by the runtime."""

    def prepare(self, launch: Launch, device: torch.device) -> runtime.Prepared:
        return runtime.prepare(launch, device)


CUDA = CudaLauncher()


def alignment(*tensors: torch.Tensor | None) -> int:
    """Largest power of two, at most 16, dividing every tensor's address (in bytes): the lowest
    bit set in any of them."""
    bits = 16
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits & -bits


def vector_width(
    itemsize: int, K: int, C: int, align: int, strides: tuple[int, ...], bwd: bool, max_bytes: int = 16
) -> int:
    """Channels per thread: ``max_bytes`` when C, the row strides and the addresses allow, fewer
    else. The backward keeps 4K windows of VEC floats in registers, so it caps VEC * K at 32.
    """
    vec = max(1, max_bytes // itemsize)
    if bwd:
        vec = min(vec, 1 << (32 // K).bit_length() - 1)  # a power of two
    while vec > 1 and (C % vec or any(s % vec for s in strides) or align % (vec * itemsize)):
        vec //= 2
    return vec


PREFETCH_ROWS = 8  # rows each thread keeps in flight ahead of its math (the cp.async pipeline)


def pipe_depth(K: int) -> int:
    """Stages of the per-thread row pipeline (kernels/common.cuh, RowPipe): one ring turn of K
    rows each, DEPTH-1 turns (>= PREFETCH_ROWS rows) ahead; two for K >= 6, which keeps the
    backward's shared memory within a CTA's limit."""
    return 2 if K >= 6 else 1 + math.ceil(PREFETCH_ROWS / K)


def pipe_bytes(K: int, sources: int, threads: int, vec: int, itemsize: int) -> int:
    """Shared memory of the row pipeline: per thread DEPTH * K * sources vectors, padded to an odd
    count (kernels/common.cuh, RowPipe)."""
    return (pipe_depth(K) * K * sources | 1) * threads * vec * itemsize


def _max_offset(S: int, C: int, strides: list[int], n_docs: int, K: int) -> int:
    return max([S * s for s in strides] + [S * C, (n_docs + 1) * (K - 1) * C]) + C


def ceil_log8(n: int) -> int:
    level = 0
    while FAN**level < n:
        level += 1
    return level


def tree_shape(S: int) -> tuple[int, list[int]]:
    """Root level and the node count of each level 0..root of the canonical tree for S tokens."""
    n_slabs = max(1, math.ceil(S / SLAB))
    root = max(2, ceil_log8(n_slabs))
    return root, [math.ceil(n_slabs / FAN**level) for level in range(root + 1)]


def dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in contiguous memory (None stays None). Checks first: ``is_contiguous`` is a plain
    attribute read, where ``contiguous()`` goes through the dispatcher even when it returns ``t``
    (a few µs per call on a slow host; docs/performance.md, host overhead)."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def fresh_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous tensor of ``t``'s shape and device, and its dtype or ``dtype``: ``empty_like``
    parses no shape or device, 0.6x the host time of ``torch.empty(t.shape, dtype=..., device=...)``,
    and without keywords (a contiguous ``t`` of that dtype) 0.7x that again."""
    if (dtype is None or dtype == t.dtype) and t.is_contiguous():
        return torch.empty_like(t)
    return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)


@dataclass(frozen=True)
class Plan:
    """The launch geometry of one call, a pure function of shapes, dtypes, flags and program."""

    kernel: str
    block: int
    smem: int
    tile_v: int
    n_ctiles: int
    n_units: int
    index_64: bool
    max_offset: int
    root: int = 0
    ws_elems: int = 0
    n_tickets: int = 0
    n_vec: int = 0  # backward: vectors per row when the CTAs lie flat over (node, vector) columns
    fold: FoldPlan | None = None  # backward: the tree above the CTAs, folded by a second kernel


@dataclass(frozen=True)
class FoldPlan:
    """conv1d_silu_fold's launch: the canonical tree above the backward's CTAs (``n_nodes`` nodes,
    ``levels`` folds up to the root)."""

    kernel: str
    grid: int
    smem: int
    n_nodes: int
    levels: int


FOLD_COLS, FOLD_ROWS = 32, 16  # conv1d_silu_fold's CTA: channels x parents at a time
# The tree above the CTAs is folded by conv1d_silu_fold, launched programmatically after the
# backward, when the CTAs' level has more than FAN nodes (with fewer, the tickets' climb is a single
# fold and a second launch saves nothing) and at most FOLD_MAX_NODES (with more, each fold thread
# walks many parents; at 1024 the two ways were even): 2-9 % off the backward at 32768-196608 tokens
# on the H100, with no ticket and no fence in the backward.
FOLD_MAX_NODES = 1024


def split_fold(n_nodes: int) -> bool:
    """Whether a backward whose CTAs write ``n_nodes`` tree nodes leaves the levels above them to
    conv1d_silu_fold."""
    return FAN < n_nodes <= FOLD_MAX_NODES


def fold_plan(
    dtype: torch.dtype, gdtype: torch.dtype, K: int, C: int, has_bias: bool, n_nodes: int, levels: int
) -> FoldPlan:
    """One CTA per FOLD_COLS channels and reduced row; shared memory for the first level's parents and
    the next level's."""
    parents = math.ceil(n_nodes / FAN)
    rows = parents + math.ceil(parents / FAN) if levels > 1 else 0  # levels above the first: shared memory
    smem = rows * FOLD_COLS * accumulator_dtype(dtype).itemsize
    kernel = kernels.name_expression("conv1d_silu_fold", dtype, gdtype, K, has_bias)
    return FoldPlan(kernel, math.ceil(C / FOLD_COLS) * (K + has_bias), smem, n_nodes, levels)


FLAT_FWD_BLOCK = 256  # threads of a flat forward CTA


def program_tile(program: Program, C: int, vec: int, itemsize: int) -> int:
    """Channel vectors per CTA tile for ``program`` at ``C`` channels of ``vec``-wide vectors. A flat
    forward's tile is the whole row; a flat backward's is ``max_tile_vectors`` (tree node, vector)
    columns (at most 32, the kernel's column table), which may span rows and nodes."""
    if program.flat:
        return C // vec if program.direction == "fwd" else min(program.max_tile_vectors, 32)
    return tile_vectors(C // vec, program.max_tile_vectors, max(1, program.tile_align_bytes // (vec * itemsize)))


def flat_forward_units(S: int, rows: int, vectors: int) -> int:
    """CTAs of a flat forward: every (lane, vector) pair once, FLAT_FWD_BLOCK pairs per CTA."""
    items = math.ceil(S / rows) * vectors
    return math.ceil(items / min(FLAT_FWD_BLOCK, items))


def wave_filling_rows(S: int, vectors: int, rows: int, max_rows: int, slots: int) -> int:
    """Lane height of a flat forward whose grid of ``rows``-token lanes spills a little past one wave
    of ``slots`` resident CTAs: the smallest height up to ``max_rows`` whose grid fits in one wave,
    else ``rows``. A sliver of a second wave costs most of a wave's latency at short sequences; past
    two waves the tail is a small part of the time. Every output is
    computed the same way at any height, so the bits do not change."""
    if not slots < flat_forward_units(S, rows, vectors) <= 2 * slots:
        return rows
    return next((h for h in range(rows + 1, max_rows + 1) if flat_forward_units(S, h, vectors) <= slots), rows)


@functools.lru_cache(maxsize=8192)
def forward_plan(
    dtype: torch.dtype, wdtype: torch.dtype, K: int, C: int, S: int, row_stride: int, align: int,
    has_bias: bool, mode: int, has_init: bool, final: bool, silu: bool, program: Program, n_docs: int,
    slots: int = 0,
) -> Plan:
    """The forward's geometry; ``slots`` (CTAs resident on the whole GPU, 0: unknown) lets a program
    with ``max_fill_rows`` grow its lanes so the grid fits in one wave (:func:`wave_filling_rows`)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    vec = vector_width(itemsize, K, C, align, (row_stride,), bwd=False, max_bytes=program.vec_bytes)
    tile_v = program_tile(program, C, vec, itemsize)
    n_ctiles = math.ceil(C // vec / tile_v)
    rows = program.rows_per_lane
    if program.flat and program.max_fill_rows and slots:
        rows = wave_filling_rows(S, tile_v, rows, program.max_fill_rows, slots)
    max_off = _max_offset(S, C, [row_stride], n_docs, K)
    wide = max_off >= 2**31
    kernel = kernels.name_expression(
        "conv1d_silu_fwd", dtype, wdtype, K, vec, has_bias, mode, has_init, final, silu,
        "long long" if wide else "int", rows, pipe_depth(K),
    )
    items = math.ceil(S / rows) * tile_v  # (lane, vector) pairs of one channel tile
    block = min(FLAT_FWD_BLOCK, items) if program.flat else LANES * tile_v
    n_units = math.ceil(items / block) * n_ctiles
    smem = pipe_bytes(K, 1, block, vec, itemsize)
    return Plan(kernel, block, smem, tile_v, n_ctiles, n_units, wide, max_off)


# The pointer fields of each kernel's argument struct, in the order the launches pass the tensors.
FWD_TENSORS = ("x", "w", "bias", "table", "init", "y", "final_states")
BWD_TENSORS = (
    "x", "dy", "w", "bias", "table", "init", "dx", "dinit", "dw", "db", "workspace", "tickets", "next_x", "next_dy",
)
FOLD_TENSORS = ("workspace", "dw", "db")


def null_fields(**present: bool) -> dict[str, int]:
    """The pointer fields of a planned launch that stay null (0) for all its calls: those absent."""
    return {name: 0 for name, here in present.items() if not here}


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    doc: DocTable,
    initial_states: torch.Tensor | None,
    return_final_states: bool,
    silu: bool,
    program: Program,
    row_stride: int,
    launcher: Launcher = CUDA,
    plans: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y (contiguous, x's shape) and final_states ((N, K-1, C) or None).

    ``plans``: the launches planned before for calls of this signature, by the alignment class of the
    data pointers (a new class is planned and added), or None to plan this call alone.
    """
    y = fresh_like(x)
    final = final_states_out(x, weight, doc, initial_states) if return_final_states else None
    if doc.S == 0:
        return y, final
    init = dense(initial_states)
    align = alignment(x, init, final)
    prepared = None if plans is None else plans.get(align)
    if prepared is None:
        planned = forward_launch(
            x, weight, bias is not None, doc, init is not None, final is not None, silu, program, row_stride, align,
            launcher,
        )
        prepared = launcher.prepare(planned, x.device)
        if plans is not None:
            plans[align] = prepared
    # y and final are allocated here, so they cannot overlap an input: no overlap check to pay for
    prepared((x, dense(weight), dense(bias), doc.table, init, y, final))
    return y, final


def final_states_out(
    x: torch.Tensor, weight: torch.Tensor, doc: DocTable, initial_states: torch.Tensor | None
) -> torch.Tensor:
    """The forward's final states before its launch: the initial states (a document shorter than K-1
    keeps some of its rows), or zeros."""
    if initial_states is not None:
        return initial_states.clone(memory_format=torch.contiguous_format)
    C, K = weight.shape
    return x.new_zeros((doc.num_docs, K - 1, C))


def forward_launch(
    x: torch.Tensor, weight: torch.Tensor, has_bias: bool, doc: DocTable, has_init: bool, final: bool, silu: bool,
    program: Program, x_stride: int, align: int, launcher: Launcher,
) -> Launch:
    """The forward's planned launch: all but its tensors (:meth:`Launcher.prepare`)."""
    C, K = weight.shape
    n_docs = doc.num_docs or 0
    key = (
        x.dtype, weight.dtype, K, C, doc.S, x_stride, align, has_bias, doc.mode, has_init, final, silu, program,
        n_docs,
    )
    plan = forward_plan(*key)
    if program.max_fill_rows and plan.n_units > (sms := launcher.sm_count(x.device)):
        # the base height's residency stands for the taller lanes' (they use the same registers)
        probe = Launch("conv1d_silu_fwd", plan.kernel, (plan.n_units, 1, 1), plan.block, plan.smem, None)
        plan = forward_plan(*key, launcher.max_active_blocks(probe, x.device) * sms)
    nulls = null_fields(bias=has_bias, table=doc.table is not None, init=has_init, final_states=final)
    args = Args(
        "conv1d_silu_fwd", FWD_TENSORS, **nulls, x_rs=x_stride, row_len=doc.row_len, n_docs=n_docs, S=doc.S, C=C,
        tile_v=plan.tile_v, n_ctiles=plan.n_ctiles, n_units=plan.n_units,
    )
    launch = Launch(
        "conv1d_silu_fwd", plan.kernel, (plan.n_units, 1, 1), plan.block, plan.smem, args,
        index_64=plan.index_64, max_offset=plan.max_offset,
    )
    return launch


_scratch: dict[tuple, torch.Tensor] = {}  # (what, dtype, device type or (index, stream)) -> buffer
# (workspace size and dtype, tickets, device type or (index, stream)) -> the views of the kept buffers
# handed out for it: one dictionary lookup per call (a slice costs a dispatcher round trip, and the
# two buffers' own lookups and checks cost 2-3 µs of an eager backward in context); emptied when a
# buffer is replaced
_handed: dict[tuple, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
SCRATCH_KEEP_BYTES = 16 << 20  # larger workspaces are allocated per call, not kept
MAX_HANDED = 256  # sizes whose views are kept handed out; past it the table starts over
GRAPH_TICKETS = 1 << 18  # tickets zeroed ahead for captured launches, per device (1 MB)


class _TicketReserve:
    """Tickets zeroed outside any capture, handed out to captured launches, one slice each.

    A captured backward that allocated its tickets with ``torch.zeros`` would replay a memset node
    before its kernel every time (1-2 µs on the H200). A slice of this reserve is zero when the
    graph is captured, belongs to that one launch for good (never handed out again and never
    freed, so no other work writes it), and the kernel leaves its tickets at zero, so every replay
    finds them zero; replays of one graph are serialised by CUDA. Eager calls top the reserve up.
    """

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.used = 0
        # Graphs keep only raw pointers into these buffers, so a used-up buffer is never freed:
        # the allocator would hand its memory to other tensors while the graphs still replay.
        self.retired: list[torch.Tensor] = []
        self.lock = threading.Lock()  # two threads capturing at once must not share a slice

    def holds(self, n: int) -> bool:
        """Whether ``n`` tickets are left (read without the lock: a capture that finds fewer
        zeroes its own, so a stale answer costs nothing but that)."""
        return self.buf is not None and self.buf.numel() - self.used >= n

    def top_up(self, n: int, device: torch.device) -> None:
        with self.lock:
            if self.holds(n):
                return
            if self.buf is not None:
                self.retired.append(self.buf)
            self.buf = torch.zeros(max(GRAPH_TICKETS, n), dtype=torch.int32, device=device)
            self.used = 0
            if self.buf.is_cuda:  # a capture may follow at once on another stream: zeros first
                torch.cuda.current_stream(device).synchronize()

    def take(self, n: int) -> torch.Tensor | None:
        with self.lock:
            if self.buf is None or self.buf.numel() - self.used < n:
                return None
            start, self.used = self.used, self.used + n
            return self.buf[start : start + n]


_reserves: dict[int, _TicketReserve] = {}  # device index -> tickets for captured launches


def backward_scratch(
    ws_elems: int, ws_dtype: torch.dtype, n_tickets: int, device: torch.device, keep: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The backward's workspace (``ws_elems`` of ``ws_dtype``) and tickets (``n_tickets`` int32
    zeros), from buffers kept per (device, stream) between launches; None where none is needed.

    The workspace needs no contents (every node is written before it is read); the tickets are
    zero, and each launch leaves them at zero (the kernel's last arriver at each tree node resets
    its ticket), so no memset launch is needed. Launches on one stream never overlap, so they can
    share the buffers. While a CUDA graph is captured, the workspace is allocated for this call (a
    graph may replay on any stream) and the tickets come from a reserve zeroed ahead
    (:class:`_TicketReserve`); past SCRATCH_KEEP_BYTES a buffer is allocated for the call too.
    Without ``keep`` (the custom ops, which torch.compile's CUDA graphs run) nothing is kept or
    topped up: cudagraph trees run a call's warm-up with every allocation in the graph's private
    pool, and a buffer kept from there outlives the call in that pool. The stream is looked up
    once for both (a few µs of a slow host's time per lookup).
    """
    if device.type != "cuda":
        where = device.type
    else:
        index = device_index(device)
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing or not keep:
            reserve = _reserves.get(index) if capturing else None
            tickets = reserve.take(n_tickets) if n_tickets and reserve is not None else None
            if n_tickets and tickets is None:
                tickets = torch.zeros(n_tickets, dtype=torch.int32, device=device)
            workspace = torch.empty(ws_elems, dtype=ws_dtype, device=device) if ws_elems else None
            return workspace, tickets
        reserve = _reserves.get(index) or _reserves.setdefault(index, _TicketReserve())
        if n_tickets and not reserve.holds(n_tickets):
            reserve.top_up(n_tickets, device)
        where = (index, current_stream_ptr(index))
    key = (ws_elems, ws_dtype, n_tickets, where)
    views = _handed.get(key)
    if views is None:
        workspace = _kept("workspace", ws_elems, ws_dtype, device, where) if ws_elems else None
        tickets = _kept("tickets", n_tickets, torch.int32, device, where) if n_tickets else None
        views = workspace, tickets
        kept = (
            _scratch.get(("workspace", ws_dtype, where)) if ws_elems else None,
            _scratch.get(("tickets", torch.int32, where)) if n_tickets else None,
        )
        # only views of the buffers kept now (another thread may have replaced one since), and a
        # bounded number of sizes: sequence lengths vary
        if all(t is None or t._base is k for t, k in zip(views, kept)):
            if len(_handed) >= MAX_HANDED:
                _handed.clear()
            _handed[key] = views
    return views


def _kept(what: str, n: int, dtype: torch.dtype, device: torch.device, where: tuple) -> torch.Tensor:
    """``n`` elements of the buffer kept for ``what`` on one (device, stream), grown as needed (a
    view of it), or past SCRATCH_KEEP_BYTES a tensor of this call's own (no view)."""
    key = (what, dtype, where)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < n:
        size = max(n, 2 * (0 if buf is None else buf.numel()), 1024)
        fresh = torch.zeros if what == "tickets" else torch.empty
        if size * dtype.itemsize > SCRATCH_KEEP_BYTES:
            return fresh(n, dtype=dtype, device=device)
        buf = _scratch[key] = fresh(size, dtype=dtype, device=device)
        _handed.clear()  # no view of the replaced buffer is handed out again
    return buf[:n]


@functools.lru_cache(maxsize=8192)
def backward_plan(
    dtype: torch.dtype, wdtype: torch.dtype, gdtype: torch.dtype, K: int, C: int, S: int, x_stride: int,
    dy_stride: int, align: int, has_bias: bool, mode: int, has_init: bool, silu: bool, program: Program, n_docs: int,
) -> Plan:
    itemsize = torch.empty((), dtype=dtype).element_size()
    vec = vector_width(itemsize, K, C, align, (x_stride, dy_stride), bwd=True, max_bytes=program.vec_bytes)
    spl, cta_level = program.slabs_per_lane, program.cta_level
    root, nodes = tree_shape(S)
    nb = K + (1 if has_bias else 0)
    n_vec = C // vec if program.flat else 0  # flat: tile_v (node, vector) columns per CTA
    tile_v = program_tile(program, C, vec, itemsize)
    n_ctiles = 1 if program.flat else math.ceil(C // vec / tile_v)
    n_units = math.ceil(nodes[cta_level] * n_vec / tile_v) if program.flat else nodes[cta_level] * n_ctiles
    fold = None
    if split_fold(nodes[cta_level]):
        fold = fold_plan(dtype, gdtype, K, C, has_bias, nodes[cta_level], root - cta_level)
    climb_to = cta_level + 1 if fold else root  # workspace levels: [cta_level, climb_to)
    ws_elems = sum(nodes[level] for level in range(cta_level, climb_to)) * nb * C
    tickets_per_parent = 0 if fold else n_vec or n_ctiles
    n_tickets = sum(nodes[level] for level in range(cta_level + 1, root + 1)) * tickets_per_parent
    max_off = max(_max_offset(S, C, [x_stride, dy_stride], n_docs, K), ws_elems)
    wide = max_off >= 2**31
    kernel = kernels.name_expression(
        "conv1d_silu_bwd", dtype, wdtype, gdtype, K, vec, has_bias, mode, has_init, silu,
        "long long" if wide else "int", spl, pipe_depth(K), program.flat,
    )
    block = program.cta_lanes * tile_v
    slots = LANES * tile_v * nb * vec * accumulator_dtype(dtype).itemsize  # [LANES][NB][tile_c] accumulators
    smem = slots + pipe_bytes(K, 2, block, vec, itemsize)
    return Plan(kernel, block, smem, tile_v, n_ctiles, n_units, wide, max_off, root, ws_elems, n_tickets, n_vec, fold)


def backward(
    dy: torch.Tensor,
    dy_stride: int,
    x: torch.Tensor,
    x_stride: int,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    doc: DocTable,
    initial_states: torch.Tensor | None,
    silu: bool,
    grad_dtype: torch.dtype,
    program: Program,
    weight_grad_out: torch.Tensor | None = None,
    bias_grad_out: torch.Tensor | None = None,
    launcher: Launcher = CUDA,
    trailing: tuple[torch.Tensor, torch.Tensor] | None = None,
    plans: dict | None = None,
    keep_scratch: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dx, dweight (C, K), dbias, dinitial_states.

    With ``weight_grad_out`` (an fp32 (C, K) buffer, e.g. a main_grad), dweight/dbias are added
    into the given buffers (one fp32 add of the canonical sum) and returned. ``trailing`` =
    (x_next, dy_next): up to K-1 tokens after the sequence, in its last document, whose g
    completes dx (context parallelism). ``plans``: as for :func:`forward`, by dy's row stride, the
    alignment class and the number of trailing tokens. ``keep_scratch``: see :func:`backward_scratch`.
    """
    has_bias = bias is not None
    accumulate = weight_grad_out is not None
    dx = fresh_like(x)
    dw, db, dinit = gradient_outputs(weight, bias, initial_states, grad_dtype, weight_grad_out, bias_grad_out, doc.S)
    if doc.S == 0:
        return dx, dw, db, dinit
    init = dense(initial_states)
    next_x = next_dy = None
    if trailing is not None and trailing[0].shape[0] > 0:
        next_x, next_dy = (dense(t) for t in trailing)
    key = (dy_stride, alignment(x, dy, init, next_x, next_dy), 0 if next_x is None else next_x.shape[0])
    prepared = None if plans is None else plans.get(key)
    if prepared is None:
        launch, fold, scratch = backward_launches(
            x, weight, has_bias, doc, init is not None, silu, dw.dtype, program, x_stride, *key, accumulate, launcher
        )
        prepared = (
            launcher.prepare(launch, x.device), None if fold is None else launcher.prepare(fold, x.device), scratch
        )
        if plans is not None:
            plans[key] = prepared
    launch, fold, scratch = prepared
    device = x.device
    workspace, tickets = backward_scratch(*scratch, device, keep_scratch)
    tensors = (
        x, dy, dense(weight), dense(bias), doc.table, init, dx, dinit, dw, db, workspace, tickets, next_x, next_dy
    )
    # dx, dinit and unless accumulating dw / db are allocated here: only main_grad buffers, the
    # caller's, could overlap an input, so only they pay for the overlap check
    if accumulate:
        outputs = (dw,) if db is None else (dw, db)
        inputs = tuple(t for t in (x, dy, init, next_x, next_dy) if t is not None)
    else:
        outputs = inputs = ()
    launch(tensors, outputs, inputs)
    if fold is not None:
        fold((workspace, dw, db))
    return dx, dw, db, dinit


def gradient_outputs(
    weight: torch.Tensor, bias: torch.Tensor | None, initial_states: torch.Tensor | None, grad_dtype: torch.dtype,
    weight_grad_out: torch.Tensor | None, bias_grad_out: torch.Tensor | None, S: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dweight and dbias (the main_grad buffers when accumulating into them) and a zeroed dinitial;
    with no tokens (S = 0) fresh weight gradients are zeros, as no launch writes them."""
    if weight_grad_out is not None:
        dw, db = weight_grad_out, bias_grad_out
    else:
        dw = fresh_like(weight, grad_dtype)
        db = fresh_like(bias, grad_dtype) if bias is not None else None
        if S == 0:
            dw.zero_()
            if db is not None:
                db.zero_()
    dinit = None
    if initial_states is not None:
        dinit = torch.zeros_like(initial_states, memory_format=torch.contiguous_format)
    return dw, db, dinit


def fold_launch(
    dtype: torch.dtype, gdtype: torch.dtype, K: int, C: int, has_bias: bool, n_nodes: int, levels: int,
    accumulate: bool,
) -> Launch:
    """conv1d_silu_fold's planned launch (tensors: workspace, dw, db), programmatic after the backward."""
    f = fold_plan(dtype, gdtype, K, C, has_bias, n_nodes, levels)
    args = Args(
        "conv1d_silu_fold", FOLD_TENSORS, **null_fields(db=has_bias), accumulate=int(accumulate), C=C, n_nodes=n_nodes,
        levels=levels,
    )
    return Launch("conv1d_silu_bwd", f.kernel, (f.grid, 1, 1), FOLD_COLS * FOLD_ROWS, f.smem, args, programmatic=True)


def backward_launches(
    x: torch.Tensor, weight: torch.Tensor, has_bias: bool, doc: DocTable, has_init: bool, silu: bool,
    grad_dtype: torch.dtype, program: Program, x_stride: int, dy_stride: int, align: int, n_next: int,
    accumulate: bool, launcher: Launcher,
) -> tuple[Launch, Launch | None, tuple[int, torch.dtype, int]]:
    """The backward's planned launch and the fold's (or None), all but their tensors, and
    the size and dtype of the workspace and the number of tickets they take (backward_scratch)."""
    C, K = weight.shape
    n_docs = doc.num_docs or 0
    plan = backward_plan(
        x.dtype, weight.dtype, grad_dtype, K, C, doc.S, x_stride, dy_stride, align, has_bias, doc.mode, has_init,
        silu, program, n_docs,
    )
    nulls = null_fields(
        bias=has_bias, db=has_bias, table=doc.table is not None, init=has_init, dinit=has_init,
        workspace=plan.ws_elems > 0, tickets=plan.n_tickets > 0, next_x=n_next > 0, next_dy=n_next > 0,
    )
    args = Args(
        "conv1d_silu_bwd", BWD_TENSORS, **nulls, x_rs=x_stride, dy_rs=dy_stride, row_len=doc.row_len, n_docs=n_docs,
        accumulate=int(accumulate), S=doc.S, C=C, tile_v=plan.tile_v, n_ctiles=plan.n_ctiles, n_units=plan.n_units,
        root_level=plan.root, n_next=n_next, n_vec=plan.n_vec, split=int(plan.fold is not None),
    )
    launch = Launch(
        "conv1d_silu_bwd", plan.kernel, (plan.n_units, 1, 1), plan.block, plan.smem, args,
        index_64=plan.index_64, max_offset=plan.max_offset,
    )
    if program.persistent:
        per_sm = launcher.max_active_blocks(launch, x.device)
        launch = replace(launch, grid=(min(plan.n_units, per_sm * launcher.sm_count(x.device)), 1, 1))
    fold = None
    if plan.fold is not None:
        fold = fold_launch(x.dtype, grad_dtype, K, C, has_bias, plan.fold.n_nodes, plan.fold.levels, accumulate)
    return launch, fold, (plan.ws_elems, accumulator_dtype(x.dtype), plan.n_tickets)


class Plain:
    """The common eager call of one signature: channel-last x read in place by CUDA-routed programs
    (or their emulator), no document table, initial or final states or main_grad buffers, contiguous
    weight and bias with gradients in their dtype, at least one token. Everything but the data
    pointers is fixed by the signature, so ``autograd.PlainFunction`` allocates the outputs, looks the
    prepared launches up by the pointers' alignment class and calls them, one layer above them; an
    alignment class not seen yet goes through :func:`forward` / :func:`backward`, which plan it into
    the same tables. The layers this skips (ops.forward_impl / backward_impl, the general wrappers'
    argument handling) cost 4-8 % of an eager forward + backward's host time."""

    __slots__ = (
        "fwd", "bwd", "x_stride", "x_strides", "doc", "silu", "grad_dtype", "launcher", "fwd_plans", "bwd_plans",
        "like_x",
    )

    def __init__(self, fwd: Program, bwd: Program, x: torch.Tensor, x_stride: int, doc: DocTable, silu: bool,
                 grad_dtype: torch.dtype, launcher: Launcher, fwd_plans: dict, bwd_plans: dict):
        self.fwd, self.bwd, self.x_stride, self.doc, self.silu = fwd, bwd, x_stride, doc, silu
        self.x_strides = x.stride()  # the signature's: a saved-tensor hook may hand x back with others
        self.grad_dtype, self.launcher, self.fwd_plans, self.bwd_plans = grad_dtype, launcher, fwd_plans, bwd_plans
        # fresh_like of the signature's x: empty_like itself where x is contiguous (a call less)
        self.like_x = torch.empty_like if x.is_contiguous() else fresh_like

    @staticmethod
    def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, doc: DocTable,
                grad_dtype: torch.dtype, fwd: Program, bwd: Program, x_stride: int | None) -> bool:
        """Whether a call of this signature (no states, no main_grad: the caller's part) is plain."""
        return (
            x_stride is not None and doc.table is None and doc.S > 0 and fwd.cuda and bwd.cuda
            and fwd.layout == bwd.layout == "BLC" and weight.is_contiguous() and grad_dtype == weight.dtype
            and (bias is None or bias.is_contiguous() and bias.dtype == grad_dtype)
        )

    def first_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """y of a call whose alignment class is not planned yet (planned and kept here)."""
        y, _ = forward(
            x, weight, bias, self.doc, None, False, self.silu, self.fwd, self.x_stride, self.launcher, self.fwd_plans
        )
        return y

    def first_backward(self, dy: torch.Tensor, dy_stride: int, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """dx, dweight and dbias of a call whose (dy row stride, alignment class) is not planned yet."""
        dx, dw, db, _ = backward(
            dy, dy_stride, x, self.x_stride, weight, bias, self.doc, None, self.silu, self.grad_dtype, self.bwd,
            launcher=self.launcher, plans=self.bwd_plans,
        )
        return dx, dw, db


UPDATE_BLOCK = 128  # threads per CTA of the decoding step: one (batch row, channel) each
UPDATE_TENSORS = ("x", "state", "w", "bias", "cache_seqlens", "state_indices", "out")


def update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    cache_seqlens: torch.Tensor | None,
    conv_state_indices: torch.Tensor | None,
    launcher: Launcher = CUDA,
) -> torch.Tensor:
    """One decoding step (kernels/conv1d_silu_update.cu): out ``(B, C, L)`` with x's strides;
    conv_state ``(rows, C, state_len)`` is updated in place. Arguments as checked by
    conv1d_silu.compat.decode; x and the state may have any strides."""
    B, C, L = x.shape
    K = weight.shape[1]
    n = conv_state.shape[2]
    out = torch.empty_like(x)
    if B == 0 or C == 0:
        return out
    # the kernel reads int32 index tensors densely (index b at offset b): any other strides or an
    # int64 tensor is converted first (int64 cache_seqlens of any size reduced mod state_len)
    if cache_seqlens is not None and cache_seqlens.dtype != torch.int32:
        cache_seqlens = torch.remainder(cache_seqlens, n).to(torch.int32)
    cache_seqlens = dense(cache_seqlens)
    indices = dense(None if conv_state_indices is None else conv_state_indices.to(torch.int32))
    kernel = kernels.name_expression(
        "conv1d_silu_update", x.dtype, weight.dtype, K, bias is not None, silu, cache_seqlens is not None,
        indices is not None,
    )
    args = Args(
        "conv1d_silu_update", UPDATE_TENSORS,
        **null_fields(bias=bias is not None, cache_seqlens=cache_seqlens is not None, state_indices=indices is not None),
        x_bs=x.stride(0), x_cs=x.stride(1), x_ls=x.stride(2), state_bs=conv_state.stride(0),
        state_cs=conv_state.stride(1), state_ls=conv_state.stride(2), state_len=n, out_bs=out.stride(0),
        out_cs=out.stride(1), out_ls=out.stride(2), C=C, L=L,
    )
    planned = Launch(
        "conv1d_silu_update", kernel, (B * -(-C // UPDATE_BLOCK), 1, 1), UPDATE_BLOCK, 0, args, index_64=True
    )
    tensors = (x, conv_state, dense(weight), dense(bias), cache_seqlens, indices, out)
    # prepared for this step alone (its plan is not kept): nothing ties the plan to what is prepared
    launcher.prepare(planned, x.device)(tensors, (out, conv_state), (x,))
    return out
