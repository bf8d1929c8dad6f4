"""Final states and their gradient, shared by the reference and the GPU path.

``final_states[d]`` holds the last K-1 rows of ``concat(initial_states[d] or zeros, x[tokens of d])``:
document d's last K-1 tokens, or, for a document shorter than K-1, some of its initial state rows too.
"""

from __future__ import annotations

import torch

from .documents import DocTable, doc_spans


def final_state_sources(doc: DocTable, K: int, device: torch.device):
    """For each (document, state row j): the token it copies, or -1 with the initial-state row."""
    start, end = doc_spans(doc, device)
    j = torch.arange(K - 1, device=device)
    src = end.unsqueeze(1) - (K - 1) + j  # (N, K-1)
    from_x = src >= start.unsqueeze(1)
    init_row = j + (end - start).unsqueeze(1)  # valid where not from_x
    return src, from_x, init_row


def add_final_state_grads(
    dx: torch.Tensor, dinit: torch.Tensor | None, dfinal: torch.Tensor, doc: DocTable, K: int
) -> None:
    """Add the gradient of final_states into dx ((S, C) or (B, L, C), any strides) and dinit, in
    place.

    final_states[d, j] copies one token of document d (or one of its initial state rows when the
    document is shorter than K-1), so every gradient element lands on one distinct place: the
    accumulating index_put_ adds exactly one value per element (no host sync, deterministic).
    """
    src, from_x, init_row = final_state_sources(doc, K, dfinal.device)
    zero = torch.zeros((), dtype=dfinal.dtype, device=dfinal.device)
    if doc.S > 0:
        on_x = torch.where(from_x.unsqueeze(2), dfinal, zero)
        token = src.clamp(0, doc.S - 1).flatten()
        at = (token,) if dx.dim() == 2 else (token // dx.shape[1], token % dx.shape[1])
        dx.index_put_(at, on_x.flatten(0, 1).to(dx.dtype), accumulate=True)
    if dinit is not None:
        n = torch.arange(src.shape[0], device=src.device).unsqueeze(1).expand_as(src)
        on_init = torch.where(from_x.unsqueeze(2), zero, dfinal)
        rows = (n * (K - 1) + init_row.clamp(max=K - 2)).flatten()
        dinit.view(-1, dinit.shape[-1]).index_put_((rows,), on_init.flatten(0, 1).to(dinit.dtype), accumulate=True)
