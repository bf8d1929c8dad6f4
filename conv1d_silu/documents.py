"""Document tables: how the packed token axis splits into documents.

Every op sees the tokens as one packed axis of ``S`` rows. A document table says where documents
start; windows never cross a document. Four modes, shared by the reference and the kernels:

* ``SINGLE``  : 2-D ``x`` without a table: one document of ``S`` tokens.
* ``BATCH``   : 3-D ``x`` of shape ``(B, L, C)``: ``B`` documents of ``L`` tokens.
* ``SEQ_IDX`` : ``seq_idx``, one entry per token: a document starts where the value changes
  (and, for 3-D ``x``, at every batch row). The value indexes ``initial_states``; with 3-D ``x``
  the states are one per batch row instead, preceding the row's first token, so they belong to the
  row's first document (causal-conv1d's convention for packed rows with states): the kernels' table
  then numbers that document ``b`` and the row's later ones ``B`` and up, which have no state. A
  negative value marks a padding token (causal-conv1d's convention for the tail of a batch row): its
  output and gradient are 0 and it belongs to no document.
* ``CU_SEQLENS``: ``cu_seqlens[N+1]`` offsets: document ``d`` is ``[cu[d], cu[d+1])``.

Tables may be int32 or int64 (flash-linear-attention passes int64 ``cu_seqlens``); the kernels
read int32, so an int64 table is converted once per call, after its values are checked to fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SINGLE, BATCH, SEQ_IDX, CU_SEQLENS = 0, 1, 2, 3
TABLE_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class DocTable:
    """A normalised document table. ``num_docs`` is None only for ``SEQ_IDX`` without states."""

    mode: int
    S: int
    row_len: int  # tokens per batch row (BATCH, and SEQ_IDX on 3-D input); S otherwise
    num_docs: int | None
    table: torch.Tensor | None  # flat int32 seq_idx (S,) or cu_seqlens (N+1,)
    source: torch.Tensor | None = None  # the caller's table, before any conversion to int32
    row_states: bool = False  # SEQ_IDX on 3-D x with states: one state per batch row (row_state_ids)


def num_documents(
    x: torch.Tensor,
    seq_idx: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    initial_states: torch.Tensor | None,
) -> int | None:
    """How many state rows the arguments describe: documents, or batch rows for 3-D x with
    ``seq_idx`` and states; None for ``seq_idx`` without initial states, whose ids only order the
    tokens (the count would need a read of the table)."""
    if cu_seqlens is not None:
        return cu_seqlens.shape[0] - 1
    if seq_idx is not None:  # 3-D x: one state per batch row
        return None if initial_states is None else x.shape[0] if x.dim() == 3 else initial_states.shape[0]
    return x.shape[0] if x.dim() == 3 else 1


def doc_table(
    x: torch.Tensor,
    seq_idx: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    initial_states: torch.Tensor | None,
) -> DocTable:
    """Build the table for already validated arguments."""
    S = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
    row_len = x.shape[1] if x.dim() == 3 else S
    n = num_documents(x, seq_idx, cu_seqlens, initial_states)
    if cu_seqlens is not None:
        return DocTable(CU_SEQLENS, S, row_len, n, _int32(cu_seqlens), cu_seqlens)
    if seq_idx is not None:
        if x.dim() == 3 and initial_states is not None:
            return DocTable(SEQ_IDX, S, row_len, n, _int32(row_state_ids(seq_idx).reshape(-1)), seq_idx, True)
        return DocTable(SEQ_IDX, S, row_len, n, _int32(seq_idx.reshape(-1)), seq_idx)
    return DocTable(BATCH if x.dim() == 3 else SINGLE, S, row_len, n, None)


def row_state_ids(seq_idx: torch.Tensor) -> torch.Tensor:
    """Document ids for per-row states, (B, L) int64, on the device with no host sync: row b's
    first document (the run of ``seq_idx[b, 0]``, if not padding) is ``b``, its later documents
    ``B + 1``, ``B + 2``, ... in order (ids past the B states: no state), padding stays negative.
    Documents start exactly where ``seq_idx`` changes, as before."""
    seq = seq_idx.long()
    pad = seq < 0
    first = (seq == seq[:, :1]) & ~pad[:, :1]
    starts = torch.ones_like(pad)
    starts[:, 1:] = seq[:, 1:] != seq[:, :-1]
    rank = (starts & ~pad).cumsum(1)
    rows = torch.arange(seq.shape[0], device=seq.device).unsqueeze(1)
    return torch.where(pad, seq, torch.where(first, rows, seq.shape[0] + rank))


def _int32(table: torch.Tensor) -> torch.Tensor:
    return table if table.dtype == torch.int32 else table.to(torch.int32)


def _source(doc: DocTable) -> torch.Tensor:
    return doc.table if doc.source is None else doc.source


def token_positions(doc: DocTable, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: (rows since its document's start, its state index), both int64, no host sync; a
    padding token's state index is negative."""
    t = torch.arange(doc.S, device=device)
    if doc.mode == SINGLE:
        return t, torch.zeros_like(t)
    if doc.mode == BATCH:
        return t % doc.row_len, t // doc.row_len
    if doc.mode == CU_SEQLENS:
        cu = doc.table.to(device=device, dtype=torch.int64)
        d = torch.searchsorted(cu, t, right=True) - 1
        d = d.clamp(0, max(doc.num_docs - 1, 0))
        return t - cu[d], d
    seq = doc.table.to(device=device, dtype=torch.int64)
    start = t % doc.row_len == 0
    if doc.S > 1:
        start[1:] |= seq[1:] != seq[:-1]
    first = torch.where(start, t, torch.zeros_like(t)).cummax(0).values
    return t - first, seq


def doc_spans(doc: DocTable, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, end) int64 tensors of length ``num_docs``: document ``d`` holds rows [start, end)."""
    n = doc.num_docs
    if doc.mode == CU_SEQLENS:
        cu = doc.table.to(device=device, dtype=torch.int64)
        return cu[:-1], cu[1:]
    if doc.mode == SEQ_IDX:
        # first and last row of each id, whatever padding lies between documents; an id without rows
        # is an empty document at 0
        seq = doc.table.to(device=device, dtype=torch.int64)
        t = torch.arange(doc.S, device=device)
        ids = torch.where((seq >= 0) & (seq < n), seq, n)  # padding and stray ids: a bucket past the end
        end = torch.zeros(n + 1, dtype=torch.int64, device=device).scatter_reduce(0, ids, t + 1, "amax")[:n]
        start = torch.full((n + 1,), doc.S, dtype=torch.int64, device=device).scatter_reduce(0, ids, t, "amin")[:n]
        return torch.minimum(start, end), end
    starts = torch.arange(n, device=device) * doc.row_len
    return starts, starts + doc.row_len


def check_table_contents(doc: DocTable) -> str | None:
    """Return a message describing what is wrong with the table's values, or None.

    Reads the table (one device-to-host copy for GPU tables); never called while tracing or
    capturing a CUDA graph.
    """
    if doc.mode == CU_SEQLENS:
        cu = _source(doc).to(torch.int64)
        bad_order = (cu[1:] < cu[:-1]).any() if cu.numel() > 1 else torch.zeros((), dtype=torch.bool)
        first, last, unordered = torch.stack([cu[0], cu[-1], bad_order.to(cu.device, torch.int64)]).tolist()
        if first != 0:
            return f"cu_seqlens: expected cu_seqlens[0] == 0, got {first}"
        if last != doc.S:
            return f"cu_seqlens: expected cu_seqlens[-1] == S == {doc.S}, got {last}"
        if unordered:
            return "cu_seqlens: expected non-decreasing offsets"
        return None
    if doc.mode != SEQ_IDX or doc.S == 0:
        return None
    seq = _source(doc).reshape(-1, doc.row_len).to(torch.int64)
    pad = seq < 0
    # the largest document id so far in each row, -1 before the first
    last = torch.where(pad, -1, seq).cummax(dim=1).values[:, :-1]
    real = ~pad[:, 1:]
    unordered = (real & (seq[:, 1:] < last)).any()
    rejoined = (real & pad[:, :-1] & (seq[:, 1:] == last)).any()  # a document continuing across padding
    lo, hi, unordered, rejoined = torch.stack([seq.min(), seq.max(), unordered.long(), rejoined.long()]).tolist()
    if lo < -(2**31):  # the kernels read int32: a lower id would wrap to a document id
        return f"seq_idx: expected values >= -2**31 (negative: padding), got {lo}"
    if unordered:
        return "seq_idx: expected non-decreasing values within each sequence (negative values mark padding)"
    if rejoined:
        return "seq_idx: expected a new document after padding (negative values), got the one before it again"
    if doc.num_docs is not None and hi >= doc.num_docs and not doc.row_states:
        return f"seq_idx: expected values < initial_states.shape[0] == {doc.num_docs}, got {hi}"
    if hi >= 2**31:
        return f"seq_idx: expected values < 2**31, got {hi}"
    return None
