"""Document masking on one process: packed documents attend only within themselves.

`segment_ids` (B, S) integers give every token its document; query i attends key j exactly when
seg[i] == seg[j] (and j <= i if causal). Segment 0 (padding) is a document like any other, so
every query has at least itself and nothing is NaN. No (S, S) mask is ever built: each document
is one SDPA call on its own tokens, so the work is the sum of the documents' squares.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Run = tuple[int, int, int]  # (start, end, segment id): a maximal stretch of equal ids


def check_segment_ids(segment_ids: torch.Tensor, batch: int, length: int, what: str = "segment_ids") -> None:
    """An integer (batch, length) tensor, or a ValueError naming the shapes and dtype."""
    if segment_ids.dtype.is_floating_point or segment_ids.dtype.is_complex or segment_ids.dtype == torch.bool:
        raise ValueError(f"{what} must be an integer tensor, got dtype {segment_ids.dtype}")
    if tuple(segment_ids.shape) != (batch, length):
        raise ValueError(
            f"{what} {tuple(segment_ids.shape)} must be (batch, length) = ({batch}, {length}) for the queries"
        )


def runs(row: torch.Tensor) -> list[Run]:
    """(L,) ids -> maximal runs of equal ids, in order. One host transfer of the boundaries."""
    n = row.numel()
    if n == 0:
        return []
    cuts = (torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()  # first index of each later run
    starts, ends = [0, *cuts], [*cuts, n]
    ids = row[torch.tensor(starts, device=row.device)].tolist()
    return list(zip(starts, ends, ids))


def batch_runs(segment_ids: torch.Tensor) -> list[tuple[slice, list[Run]]]:
    """(B, L) -> [(batch rows, runs)]: one entry for all rows when they share their ids (the usual
    case, so the kernels run batched), else one per row."""
    if segment_ids.shape[0] == 1 or bool((segment_ids == segment_ids[:1]).all()):
        return [(slice(None), runs(segment_ids[0]))]
    return [(slice(b, b + 1), runs(segment_ids[b])) for b in range(segment_ids.shape[0])]


def _sdpa(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _rows_attention(q, k, v, row_runs: list[Run], causal: bool, scale: float | None) -> torch.Tensor:
    """One batch group: one SDPA call per document. A document split over several runs (its id
    appears again later) is gathered, attended in order, and put back."""
    by_id: dict[int, list[Run]] = {}
    for run in row_runs:
        by_id.setdefault(run[2], []).append(run)
    if len(by_id) == len(row_runs):  # every document is one contiguous run: slices, no copies
        return torch.cat(
            [_sdpa(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal, scale) for a, b, _ in row_runs], dim=2
        )
    index = [torch.cat([torch.arange(a, b) for a, b, _ in doc]).to(q.device) for doc in by_id.values()]
    parts = [_sdpa(q.index_select(2, i), k.index_select(2, i), v.index_select(2, i), causal, scale) for i in index]
    order = torch.cat(index)  # the position of each gathered row
    return torch.cat(parts, dim=2).index_select(2, torch.argsort(order))  # (B, H, L, D) in sequence order


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segment_ids: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """q (B, Hq, S, D), k/v (B, Hkv, S, D), segment_ids (B, S) -> (B, Hq, S, D)."""
    check_segment_ids(segment_ids, q.shape[0], q.shape[2])
    groups = batch_runs(segment_ids)
    outs = [_rows_attention(q[rows], k[rows], v[rows], row_runs, causal, scale) for rows, row_runs in groups]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
