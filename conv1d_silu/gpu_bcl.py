"""Allocating wrappers of the channel-first kernels (kernels/conv1d_silu_bcl.cu): x, dy, y and dx
``(B, C, L)`` with the sequence contiguous, passed here as their ``(B, L, C)`` views (the op's
token-major shape: ``x.stride(1) == 1``), with any batch and channel strides.

The outputs take x's memory layout as ``torch.empty_like`` gives it (channel-first, contiguous
when x is not dense), which is what causal-conv1d returns; dweight / dbias fold through the same
canonical tree as the channel-last backward (gpu.tree_shape, conv1d_silu_fold), so both layouts give
the same bits.
"""

from __future__ import annotations

import functools
import math

import torch

from . import kernels
from .documents import BATCH, SINGLE, DocTable
from .dtypes import accumulator_dtype
from .gpu import (
    CUDA, FAN, SLAB, Launcher, alignment, backward_scratch, dense, final_states_out, fold_launch, gradient_outputs,
    null_fields, tree_shape,
)
from .runtime import Args, Launch

FWD_BLOCK = 256  # threads of a forward CTA at most (fewer for short rows)
FWD_VECTORS = 2  # vectors of VEC tokens per forward thread
BWD_ROUND_SLABS = {2: 256, 4: 128, 8: 64}  # slabs per backward round by x's itemsize: the rounds the H100 timed
FWD_TENSORS = ("x", "w", "bias", "table", "init", "y", "final_states")
BWD_TENSORS = ("x", "dy", "w", "bias", "table", "init", "dx", "dinit", "dw", "db", "workspace")


def like_x(x: torch.Tensor) -> torch.Tensor:
    """An output for channel-first ``x`` ((B, L, C) view, sequence contiguous): ``empty_like`` of the
    ``(B, C, L)`` tensor where that keeps the sequence contiguous (x dense), else a contiguous
    ``(B, C, L)`` tensor; as its (B, L, C) view. The custom ops' fakes call it too, so compiled and
    eager calls agree on the strides."""
    xt = x.transpose(1, 2)
    out = torch.empty_like(xt)
    if out.stride(2) != 1 and out.shape[2] > 1:
        out = torch.empty(xt.shape, dtype=x.dtype, device=x.device)
    return out.transpose(1, 2)


def strides(t: torch.Tensor) -> tuple[int, int]:
    """(batch, channel) strides of a (B, L, C) view of channel-first memory."""
    return t.stride(0), t.stride(2)


def vector_width(itemsize: int, L: int, spans: tuple[int, ...], align: int) -> int:
    """Tokens per thread access: 16 bytes when L, the batch and channel strides and the addresses
    allow, fewer else (a vector never spans two rows)."""
    vec = 16 // itemsize
    while vec > 1 and (L % vec or any(s % vec for s in spans) or align % (vec * itemsize)):
        vec //= 2
    return vec


def _wide(B: int, L: int, C: int, spans: tuple[int, ...], n_docs: int, K: int) -> bool:
    """Whether some offset the kernels form needs 64-bit indexing (spans: (batch, channel) stride
    pairs of each tensor)."""
    rows = [B * bs + C * cs + L for bs, cs in zip(spans[::2], spans[1::2])]
    return max(rows + [(n_docs + 1) * (K - 1) * C]) >= 2**31


@functools.lru_cache(maxsize=4096)
def forward_launch(
    dtype: torch.dtype, wdtype: torch.dtype, K: int, B: int, C: int, L: int, spans: tuple[int, ...], align: int,
    has_bias: bool, mode: int, has_init: bool, final: bool, silu: bool, n_docs: int, has_table: bool,
) -> Launch:
    """The forward's planned launch (:meth:`Launch.bind` takes a call's tensors); spans: the (batch,
    channel) strides of x and y."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    vec = vector_width(itemsize, L, spans, align)
    vectors = math.ceil(L / vec)
    block = min(FWD_BLOCK, 32 * math.ceil(vectors / FWD_VECTORS / 32))
    n_chunks = math.ceil(vectors / (block * FWD_VECTORS))
    wide = _wide(B, L, C, spans, n_docs, K)
    kernel = kernels.name_expression(
        "conv1d_silu_fwd_bcl", dtype, wdtype, K, vec, has_bias, mode, has_init, final, silu,
        "long long" if wide else "int", FWD_VECTORS,
    )
    args = Args(
        "conv1d_silu_fwd_bcl", FWD_TENSORS,
        **null_fields(bias=has_bias, table=has_table, init=has_init, final_states=final),
        x_bs=spans[0], x_cs=spans[1], n_docs=n_docs, y_bs=spans[2], y_cs=spans[3], S=B * L, C=C, L=L,
        n_chunks=n_chunks,
    )
    return Launch("conv1d_silu_bcl", kernel, (B * C * n_chunks, 1, 1), block, 0, args, index_64=wide)


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    doc: DocTable,
    initial_states: torch.Tensor | None,
    return_final_states: bool,
    silu: bool,
    launcher: Launcher = CUDA,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y (x's layout, :func:`like_x`) and final_states ((N, K-1, C) or None) of channel-first x."""
    B, L, C = x.shape
    K = weight.shape[1]
    y = like_x(x)
    final = final_states_out(x, weight, doc, initial_states) if return_final_states else None
    if doc.S == 0:
        return y, final
    init = dense(initial_states)
    launch = forward_launch(
        x.dtype, weight.dtype, K, B, C, L, (*strides(x), *strides(y)), alignment(x, y), bias is not None, doc.mode,
        init is not None, final is not None, silu, doc.num_docs or 0, doc.table is not None,
    )
    tensors = (x, dense(weight), dense(bias), doc.table, init, y, final)
    launcher(launch.bind(tensors, (), ()), x.device)
    return y, final


def top_level(root: int) -> int:
    """The tree level of the nodes a backward CTA makes: at most three levels below the root, so
    conv1d_silu_fold folds at most 512 nodes per channel in its shared memory."""
    return max(2, root - 3)


def simple_walk(mode: int, has_init: bool, B: int, L: int) -> bool:
    """Whether the backward takes the simple walk: no document starts inside a slab (one row, or
    rows of whole slabs) and there are no states."""
    return mode in (SINGLE, BATCH) and not has_init and (B == 1 or L % SLAB == 0)


@functools.lru_cache(maxsize=4096)
def backward_launches(
    dtype: torch.dtype, wdtype: torch.dtype, gdtype: torch.dtype, K: int, B: int, C: int, L: int,
    spans: tuple[int, ...], align: int, has_bias: bool, mode: int, has_init: bool, silu: bool, n_docs: int,
    has_table: bool, accumulate: bool, chain: int = 0,
) -> tuple[Launch, Launch | None, int]:
    """The backward's planned launch, the fold's (None when the CTAs write the root) and the
    workspace's element count; spans: the (batch, channel) strides of x, dy and dx; chain: the
    chained round's vectors per lane (routes.Program.chain) where the simple walk applies and a
    vector of whole 32-bit words holds a token's K-1 taps (else the staged round)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    vec = vector_width(itemsize, L, spans, align)
    S = B * L
    root, nodes = tree_shape(S)
    top = top_level(root)
    n_slabs = nodes[0]
    # rounds of whole level-2 nodes (64 slabs), no more than the slabs there are
    node = FAN * FAN
    block = min(BWD_ROUND_SLABS[itemsize], node * math.ceil(n_slabs / node))
    # a part is one round of level-2 nodes, or one node of the top level
    part_slabs = block if top == 2 else FAN**top
    n_parts = math.ceil(n_slabs / part_slabs)
    ws_nodes = 0 if top == root else nodes[top]  # the CTAs' nodes, which the fold takes to the root
    nb = K + has_bias
    smem = nb * (block + block // FAN + block // FAN**2) * accumulator_dtype(dtype).itemsize
    # x and dy of a round: each slab and a padding vector, then the tail vectors (the chained round
    # stages nothing: its lanes keep their vectors in registers)
    simple = simple_walk(mode, has_init, B, L)
    nv = SLAB // vec
    chain = chain if simple and chain and nv % chain == 0 and vec >= K - 1 and vec * itemsize >= 4 else 0
    tail = -(-(K - 1) // vec) * vec  # tokens of the tail vectors
    staged = 0 if chain else 2 * (block * (SLAB + vec) + tail) * itemsize
    smem = -(-smem // 16) * 16 + staged
    # a staging thread's token numbers run past S by less than a round and two sweeps of the CTA's
    # vectors: less than two rounds
    wide = _wide(B, L, C, spans, n_docs, K) or ws_nodes * nb * C >= 2**31 or S + 2 * block * SLAB >= 2**31
    kernel = kernels.name_expression(
        "conv1d_silu_bwd_bcl", dtype, wdtype, gdtype, K, vec, has_bias, mode, has_init, silu,
        "long long" if wide else "int", simple, chain,
    )
    args = Args(
        "conv1d_silu_bwd_bcl", BWD_TENSORS,
        **null_fields(
            bias=has_bias, db=has_bias, table=has_table, init=has_init, dinit=has_init, workspace=ws_nodes > 0
        ),
        x_bs=spans[0], x_cs=spans[1], dy_bs=spans[2], dy_cs=spans[3], n_docs=n_docs, dx_bs=spans[4],
        dx_cs=spans[5], accumulate=int(accumulate), S=S, C=C, L=L, n_parts=n_parts, part_slabs=part_slabs,
        top_level=top, root_level=root,
    )
    launch = Launch("conv1d_silu_bcl", kernel, (C * n_parts, 1, 1), block, smem, args, index_64=wide)
    fold = fold_launch(dtype, gdtype, K, C, has_bias, ws_nodes, root - top, accumulate) if ws_nodes else None
    return launch, fold, ws_nodes * nb * C


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    doc: DocTable,
    initial_states: torch.Tensor | None,
    silu: bool,
    grad_dtype: torch.dtype,
    weight_grad_out: torch.Tensor | None = None,
    bias_grad_out: torch.Tensor | None = None,
    launcher: Launcher = CUDA,
    dx: torch.Tensor | None = None,
    keep_scratch: bool = True,
    chain: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dx (x's layout, or written into ``dx``, any channel-first view), dweight (C, K), dbias,
    dinitial_states, of channel-first x and dy; ``weight_grad_out`` as for gpu.backward."""
    B, L, C = x.shape
    K = weight.shape[1]
    accumulate = weight_grad_out is not None
    given = dx
    dx = like_x(x) if dx is None else dx
    dw, db, dinit = gradient_outputs(weight, bias, initial_states, grad_dtype, weight_grad_out, bias_grad_out, doc.S)
    if doc.S == 0:
        return dx, dw, db, dinit
    init = dense(initial_states)
    launch, fold, ws_elems = backward_launches(
        x.dtype, weight.dtype, dw.dtype, K, B, C, L, (*strides(x), *strides(dy), *strides(dx)), alignment(x, dy, dx),
        bias is not None, doc.mode, init is not None, silu, doc.num_docs or 0, doc.table is not None, accumulate,
        chain,
    )
    workspace, _ = backward_scratch(ws_elems, accumulator_dtype(x.dtype), 0, x.device, keep_scratch)
    tensors = (x, dy, dense(weight), dense(bias), doc.table, init, dx, dinit, dw, db, workspace)
    # only the caller's buffers (dx, main_grad) could overlap an input: only they are checked
    outputs = tuple(t for t in (given, *((dw, db) if accumulate else ())) if t is not None)
    inputs = tuple(t for t in (x, dy, init) if t is not None) if outputs else ()
    launcher(launch.bind(tensors, outputs, inputs), x.device)
    if fold is not None:
        launcher(fold.bind((workspace, dw, db), (), ()), x.device)
    return dx, dw, db, dinit
