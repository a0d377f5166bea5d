"""Document masking on one process: packed documents attend only within themselves.

`segment_ids` (B, S) integers give every token its document; query i attends key j exactly when
seg[i] == seg[j] (and j <= i if causal). Segment 0 (padding) is a document like any other, so
every query has at least itself and nothing is NaN. No (S, S) mask is ever built: each document
is one SDPA call on its own tokens, so the work is the sum of the documents' squares.

Where the documents are is read on the host once per batch (`Documents`, from the ids before
they move to the device) and handed to every attention call, forward, backward and recompute:
reading it from a device tensor at every call would make the host wait for the device each time.
A plain ids tensor is still accepted (read at each call: one host transfer).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

Run = tuple[int, int, int]  # (start, end, key): a maximal stretch of one document
BatchRuns = list[tuple[slice, list[Run]]]  # (batch rows, their runs): one entry when all rows share them


def _row_runs(row: np.ndarray) -> np.ndarray:
    """(S,) ids -> (R, 3) int64 runs (start, end, id) of equal ids, in order."""
    cuts = np.flatnonzero(row[1:] != row[:-1]) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    ends = np.concatenate([cuts, [row.size]]).astype(np.int64)
    return np.stack([starts, ends, row[starts].astype(np.int64)], axis=1)


class Documents:
    """The documents of one batch of packed sequences, on the host (numpy: fake and meta tensors
    pass through untouched). `seq_len` is the whole sequence; `local_len` the slice this process's
    q, k, v hold (seq_len / context-parallel size). What the ring derives from it (step plans, their
    device copies) the parallel package keeps beside it for the rest of the batch (lwm.parallel.pieces.kept)."""

    def __init__(self, segment_ids, local_len: int | None = None):
        ids = np.asarray(segment_ids.cpu() if isinstance(segment_ids, torch.Tensor) else segment_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ValueError(f"segment_ids must be (batch, length) integers, got shape {ids.shape} dtype {ids.dtype}")
        self.batch, self.seq_len = ids.shape
        self.local_len = self.seq_len if local_len is None else local_len
        shared = self.batch == 1 or bool((ids == ids[:1]).all())
        rows = [ids[0]] if shared else list(ids)
        self.rows = [(slice(None) if shared else slice(b, b + 1), _row_runs(r)) for b, r in enumerate(rows)]
        # one run per id: runs are then told apart by their order, which every layout keeps
        self.unique = all(len(np.unique(r[:, 2])) == len(r) for _, r in self.rows)

    def __getstate__(self) -> dict:  # sent without what other packages derived from it and keep on it
        return {k: self.__dict__[k] for k in ("batch", "seq_len", "local_len", "rows", "unique")}

    def to(self, *args, **kwargs) -> "Documents":
        """Host data: moving a batch to a device leaves it where it is (Lightning calls this)."""
        return self

    def runs(self, held_before: Callable[[np.ndarray], np.ndarray]) -> BatchRuns:
        """The runs in the local indices of a slice of the sequence, given `held_before(g)`: how
        many of the slice's tokens lie before global position g (the slice keeps token order).
        A run's key is its order in the sequence when ids are unique, else its id."""
        out = []
        for rows, runs in self.rows:
            a, b = held_before(runs[:, 0]), held_before(runs[:, 1])
            keys = np.arange(len(runs)) if self.unique else runs[:, 2]
            keep = b > a
            out.append((rows, list(zip(a[keep].tolist(), b[keep].tolist(), keys[keep].tolist()))))
        return out

    def whole(self) -> BatchRuns:
        """The runs of the whole sequence."""
        return self.runs(lambda g: g)


SegmentIds = torch.Tensor | Documents


def check_segment_ids(segment_ids: SegmentIds, batch: int, length: int, what: str = "segment_ids") -> None:
    """An integer (batch, length) tensor or Documents whose slice is that long, or a ValueError."""
    if isinstance(segment_ids, Documents):
        if (segment_ids.batch, segment_ids.local_len) != (batch, length):
            raise ValueError(
                f"{what}: documents of {segment_ids.batch} x {segment_ids.local_len} local tokens, "
                f"expected (batch, length) = ({batch}, {length}) for the queries"
            )
        return
    if segment_ids.dtype.is_floating_point or segment_ids.dtype.is_complex or segment_ids.dtype == torch.bool:
        raise ValueError(f"{what} must be an integer tensor, got dtype {segment_ids.dtype}")
    if tuple(segment_ids.shape) != (batch, length):
        raise ValueError(
            f"{what} {tuple(segment_ids.shape)} must be (batch, length) = ({batch}, {length}) for the queries"
        )


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
    segment_ids: SegmentIds,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """q (B, Hq, S, D), k/v (B, Hkv, S, D), segment_ids (B, S) or Documents -> (B, Hq, S, D)."""
    check_segment_ids(segment_ids, q.shape[0], q.shape[2])
    docs = segment_ids if isinstance(segment_ids, Documents) else Documents(segment_ids)
    if docs.seq_len != q.shape[2]:
        raise ValueError(
            f"documents of a {docs.seq_len}-token sequence cut into {q.shape[2]}-token slices need "
            "context-parallel attention (lwm.parallel), not the one-process kind"
        )
    groups = docs.whole()
    outs = [_rows_attention(q[rows], k[rows], v[rows], row_runs, causal, scale) for rows, row_runs in groups]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
