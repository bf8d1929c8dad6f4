"""Context parallelism: one packed sequence sharded over the ranks of a process group.

Rank r holds tokens ``[o_r, o_r + S_r)`` of one packed sequence (chunks in rank order, any sizes,
0 included). The causal window of the rank's first tokens reaches the K-1 tokens before ``o_r``;
the gradient of the rank's last tokens needs the ``g`` of the K-1 tokens after its chunk.

* Forward: every rank contributes its last K-1 tokens (and their document ids); each rank takes
  the K-1 tokens preceding its chunk from them — they may come from several earlier ranks when
  chunks are shorter than K-1 — zeroes those of another document, and uses them as the initial
  state of its first document.
* Backward: every rank contributes its first K-1 tokens of x and dy; each rank takes the tokens
  that follow its chunk inside its last document and feeds them to the backward kernel as
  trailing rows, which recompute their ``g`` exactly as a single process would and finish dx of
  the rank's last tokens in the same order. So the concatenated y and dx are bitwise those of the
  single-process op (no second rounding of dx, whatever the dtype), and no gradient is sent back.

Collectives: ``all_gather`` of fixed-size tails / heads (O(world x K x C) elements) rather than
point-to-point sends to the neighbour: with chunks shorter than K-1 (or empty) the tokens a rank
needs sit on several ranks, and one gather resolves any split without chains of sends; it is
deterministic and works on gloo (CPU) and NCCL (GPU) alike.

Weight and bias gradients stay local partial sums (each rank's tokens, canonical reduction):
sum them across the context-parallel group the way data-parallel gradients are summed (e.g. the
DDP / FSDP reducer over the combined data x context group). They equal the single-process
gradient up to fp32 rounding of that final sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import ops
from .documents import SEQ_IDX, SINGLE, TABLE_DTYPES, DocTable
from .validation import check_inputs, fail


def _all_gather(t: torch.Tensor, group, world: int) -> torch.Tensor:
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.stack(out)


class _Layout:
    """Chunk sizes and offsets of every rank, gathered once per call."""

    def __init__(self, S: int, group, device: torch.device):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        sizes = _all_gather(torch.tensor([S], dtype=torch.int64, device=device), group, self.world)
        self.sizes = [int(v) for v in sizes.view(-1).tolist()]
        self.offsets = [sum(self.sizes[:q]) for q in range(self.world)]
        self.total = sum(self.sizes)

    def owner(self, token: int) -> int:
        """The rank holding a global token."""
        for q in range(self.world):
            if self.offsets[q] <= token < self.offsets[q] + self.sizes[q]:
                return q
        raise AssertionError(token)  # pragma: no cover


def _doc_ids(x: torch.Tensor, layout: _Layout, seq_idx, cu_seqlens) -> torch.Tensor:
    """int64 document id of every local token (global ids; all zero without a table)."""
    S = x.shape[0]
    if seq_idx is not None:
        return seq_idx.to(torch.int64)
    if cu_seqlens is not None:
        t = torch.arange(S, device=x.device) + layout.offsets[layout.rank]
        return torch.searchsorted(cu_seqlens.to(torch.int64), t, right=True) - 1
    return torch.zeros(S, dtype=torch.int64, device=x.device)


def _pack(rows: torch.Tensor, ids: torch.Tensor, n: int, at_end: bool):
    """Pad (rows, ids) to n entries (id -1 where padded): at the front for tails, the back for heads."""
    pad = n - rows.shape[0]
    zr = rows.new_zeros((pad,) + tuple(rows.shape[1:]))
    zi = ids.new_full((pad,), -1)
    return (torch.cat([zr, rows]), torch.cat([zi, ids])) if at_end else (torch.cat([rows, zr]), torch.cat([ids, zi]))


def _gather_tails(x, ids, layout: _Layout, K: int):
    """The K-1 tokens before this rank's chunk and their ids (-1 before the sequence start)."""
    n = K - 1
    S = x.shape[0]
    tail_x, tail_id = _pack(x[max(0, S - n):], ids[max(0, S - n):], n, at_end=True)
    all_x = _all_gather(tail_x, layout.group, layout.world)
    all_id = _all_gather(tail_id, layout.group, layout.world)
    start = layout.offsets[layout.rank]
    ranks, rows = [], []
    for j in range(n):
        token = start - n + j
        if token < 0:
            ranks.append(0)
            rows.append(-1)
            continue
        q = layout.owner(token)
        ranks.append(q)
        rows.append(n - (layout.offsets[q] + layout.sizes[q] - token))
    r = torch.tensor(ranks, device=x.device)
    i = torch.tensor(rows, device=x.device)
    before_start = i < 0
    halo = all_x[r, i.clamp(min=0)]
    halo_id = torch.where(before_start, torch.full_like(i, -1), all_id[r, i.clamp(min=0)])
    return halo, halo_id


def _gather_heads(x, dy, ids, layout: _Layout, K: int):
    """The K-1 tokens (x, dy, ids) after this rank's chunk (-1 ids past the sequence end)."""
    n = K - 1
    head_x, head_id = _pack(x[:n], ids[:n], n, at_end=False)
    head_dy, _ = _pack(dy[:n], ids[:n], n, at_end=False)
    all_x = _all_gather(head_x, layout.group, layout.world)
    all_dy = _all_gather(head_dy, layout.group, layout.world)
    all_id = _all_gather(head_id, layout.group, layout.world)
    end = layout.offsets[layout.rank] + layout.sizes[layout.rank]
    ranks, rows = [], []
    for j in range(n):
        token = end + j
        if token >= layout.total:
            break
        q = layout.owner(token)
        ranks.append(q)
        rows.append(token - layout.offsets[q])
    if not ranks:
        empty = x.new_zeros((0, x.shape[1]))
        return empty, empty, torch.zeros(0, dtype=torch.int64, device=x.device)
    r = torch.tensor(ranks, device=x.device)
    i = torch.tensor(rows, device=x.device)
    return all_x[r, i], all_dy[r, i], all_id[r, i]


class _ContextParallelConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, ids, has_table, layout, silu, grad_dtype, program):
        C, K = weight.shape
        S = x.shape[0]
        halo, halo_id = _gather_tails(x, ids, layout, K)
        if S > 0:
            halo = torch.where((halo_id == ids[0]).unsqueeze(1), halo, torch.zeros_like(halo))
        init = halo.unsqueeze(0)
        # Local table: ids relative to the first local document. Only document 0 has a state
        # (the halo); the kernels treat later documents (ids >= 1) as stateless.
        if not has_table:
            doc = DocTable(SINGLE, S, S, 1, None)
        else:
            # padding (negative ids) stays negative; a chunk that starts with padding has no document
            # continuing from the previous rank, so its documents all start at 1 (stateless)
            first = torch.where(ids[:1] >= 0, ids[:1], -1) if S > 0 else ids[:1]
            rel = torch.where(ids < 0, -1, ids - first).to(torch.int32)
            doc = DocTable(SEQ_IDX, S, max(S, 1), 1, rel)
        y, _ = ops.forward_impl(x, weight, bias, doc, init, False, silu, program)
        ctx.save_for_backward(x, weight, bias, ids, init)
        ctx.doc, ctx.layout, ctx.silu, ctx.grad_dtype, ctx.program = doc, layout, silu, grad_dtype, program
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, ids, init = ctx.saved_tensors
        K = weight.shape[1]
        dy = dy.contiguous()
        next_x, next_dy, next_id = _gather_heads(x, dy, ids, ctx.layout, K)
        trailing = None
        if x.shape[0] > 0 and next_id.numel() > 0:
            same = (next_id == ids[-1]).tolist()
            n = same.index(False) if False in same else len(same)  # ids are non-decreasing
            trailing = (next_x[:n], next_dy[:n])
        dx, dw, db, _ = ops.backward_impl(
            dy, x, weight, bias, ctx.doc, init, None, ctx.silu, ctx.grad_dtype, ctx.program, trailing=trailing
        )
        return dx, dw, db, None, None, None, None, None, None


def causal_conv1d_silu_cp(
    x_local: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: str | None = "silu",
    grad_dtype: torch.dtype | None = None,
    program: str | None = None,
) -> torch.Tensor:
    """Context-parallel ``causal_conv1d_silu`` over this rank's chunk of one packed sequence.

    Args:
        x_local: ``(S_r, C)``, this rank's tokens (chunks concatenate in rank order; S_r may be 0).
        weight, bias: as for :func:`conv1d_silu.causal_conv1d_silu`, identical on every rank.
        group: the context-parallel process group (default: the world).
        seq_idx: int32 or int64 ``(S_r,)``, the rank's slice of the global per-token document ids.
        cu_seqlens: int32 or int64 ``(N + 1,)``, the *global* document offsets (the same on every rank).

    Returns y_local ``(S_r, C)``. Autograd gives the exact dx of the local tokens and local partial
    dweight / dbias, which the caller sums over the group (see the module docstring).
    Every rank must call it (collective), in the same order.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("causal_conv1d_silu_cp: torch.distributed is not initialised")
    if not isinstance(x_local, torch.Tensor) or x_local.dim() != 2:
        fail("x_local", "a (S_r, C) tensor", getattr(x_local, "shape", type(x_local).__name__))
    w2, silu, _ = check_inputs(x_local, weight, bias, seq_idx, None, None, False, activation, grad_dtype, program)
    layout = _Layout(x_local.shape[0], group, x_local.device)
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in TABLE_DTYPES or cu_seqlens.dim() != 1:
            fail("cu_seqlens", "a 1-D int32 or int64 tensor of global document offsets", getattr(cu_seqlens, "dtype", None))
        if seq_idx is not None:
            fail("seq_idx", "None when cu_seqlens is given", "both")
        first, last = int(cu_seqlens[0]), int(cu_seqlens[-1])
        if first != 0 or last != layout.total:
            fail("cu_seqlens", f"global offsets from 0 to the total token count {layout.total}", (first, last))
        cu_seqlens = cu_seqlens.to(x_local.device)
    ids = _doc_ids(x_local, layout, seq_idx, cu_seqlens)
    has_table = seq_idx is not None or cu_seqlens is not None
    return _ContextParallelConv.apply(
        x_local, w2, bias, ids, has_table, layout, silu, grad_dtype or w2.dtype, program
    )
