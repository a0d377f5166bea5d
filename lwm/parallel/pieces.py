"""The rectangles a ring step computes: its block plan, cut to the documents of packed sequences.

A step's BlockPart (blocks.py) says which query rows of the local block see which key rows of
the visiting block: all of them, or a plain causal square. Without documents that is one kernel
call, one Piece. With documents (query i sees key j only when both are in one document) every
layout keeps token order, so in each block a document is a contiguous run of local indices. For
each pair of runs (query run, key run) of one document, the entries the plan allows are cut into
at most three rectangles, each fully visible or a causal square (top-left, diagonal included), so
the plain block kernels serve them and nothing outside a document is computed:

    causal plan, key j visible from query i when j <= i + d  (d = plan.k.start - plan.q.start)

                  keys b0 ...................... b1
    rows top..mid   | full (keys every row  |      |
                    |  sees) | causal square|      |
    rows mid..a1    | full: every key of the run   |

A pair of blocks with no shared document gives no pieces: it is skipped. Every rank's runs come
from the batch's Documents (host arithmetic, no device read), and the plans of a rank are kept with
them for the batch: the layers, the backward and the recompute reuse them (`step_planner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from lwm.model.documents import BatchRuns, Documents, Run
from lwm.parallel.blocks import ALL, BlockPart, block_part, block_work


@dataclass(frozen=True)
class Piece:
    b: slice  # batch rows
    q: slice  # query rows of the local block
    k: slice  # key rows of the visiting block
    causal: bool  # top-left causal square (q and k of equal length) or fully visible

    def covers(self) -> bool:
        """Whether the piece spans every query row (and so may start the accumulators)."""
        return self.b == ALL and self.q == ALL

    def rows(self, t):
        """The piece's rows of t (B, H, L[, D]): t itself for the whole block, so that `+=` on it adds in place
        (on a view of t it would copy the rows back)."""
        return t if self.covers() else t[self.b, :, self.q]


def held_before(layout: str, rank: int, world_size: int, local_len: int):
    """g -> how many tokens of `rank`'s slice (lwm.parallel.layout) lie before global position g."""
    L, N = local_len, world_size
    if layout == "contiguous":
        return lambda g: np.clip(g - rank * L, 0, L)
    if layout == "striped":
        return lambda g: np.clip(-((rank - g) // N), 0, L)  # ceil((g - rank) / N)
    c = L // 2  # zigzag: chunks rank and 2N-1-rank
    return lambda g: np.clip(g - rank * c, 0, c) + np.clip(g - (2 * N - 1 - rank) * c, 0, c)


def _clip(row_runs: list[Run], lo: int, hi: int) -> list[Run]:
    return [(max(a, lo), min(b, hi), i) for a, b, i in row_runs if min(b, hi) > max(a, lo)]


def _causal_pieces(rows: slice, a0: int, a1: int, b0: int, b1: int, d: int) -> list[Piece]:
    """Query rows [a0, a1) x key rows [b0, b1), key j visible from query i when j <= i + d."""
    out = []
    top = max(a0, b0 - d)  # the first row that sees a key of the run
    if top >= a1:
        return out
    mid = min(a1, b1 - d)  # rows [top, mid) see part of the run, rows [mid, a1) all of it
    if top < mid:
        if b0 < top + d:
            out.append(Piece(rows, slice(top, mid), slice(b0, top + d), False))
        out.append(Piece(rows, slice(top, mid), slice(top + d, mid + d), True))
    low = max(top, b1 - d)
    if low < a1:
        out.append(Piece(rows, slice(low, a1), slice(b0, b1), False))
    return out


def pair_groups(q_runs: BatchRuns, k_runs: BatchRuns, batch: int) -> list[tuple[slice, list[Run], list[Run]]]:
    """Query and key runs side by side, batched when both blocks share their runs over the batch."""
    if len(q_runs) == 1 and len(k_runs) == 1:
        return [(q_runs[0][0], q_runs[0][1], k_runs[0][1])]
    per_row = lambda g: [g[0][1]] * batch if len(g) == 1 else [r for _, r in g]  # noqa: E731
    return [(slice(b, b + 1), qr, kr) for b, (qr, kr) in enumerate(zip(per_row(q_runs), per_row(k_runs)))]


def document_pieces(plan: BlockPart, local_len: int, q_runs: BatchRuns, k_runs: BatchRuns, batch: int) -> list[Piece]:
    qs, qe, _ = plan.q.indices(local_len)
    ks, ke, _ = plan.k.indices(local_len)
    pieces = []
    for rows, qr, kr in pair_groups(q_runs, k_runs, batch):
        keys: dict[int, list[tuple[int, int]]] = {}
        for b0, b1, i in _clip(kr, ks, ke):
            keys.setdefault(i, []).append((b0, b1))
        for a0, a1, i in _clip(qr, qs, qe):
            for b0, b1 in keys.get(i, ()):
                if plan.causal:
                    pieces += _causal_pieces(rows, a0, a1, b0, b1, ks - qs)
                else:
                    pieces.append(Piece(rows, slice(a0, a1), slice(b0, b1), False))
    return pieces


class StepPlanner:
    """The pieces every ring step of one rank computes: `planner(step)`. Host arithmetic only; what the
    step runs (these pieces, or one variable-length call where the kernel has one) is ring_steps.py's."""

    def __init__(
        self, layout: str, rank: int, world_size: int, local_len: int, causal: bool, documents: Documents | None = None
    ):
        self.layout, self.rank, self.world_size, self.local_len, self.causal = (
            layout,
            rank,
            world_size,
            local_len,
            causal,
        )
        self.documents = documents
        self._pieces: dict[int, list[Piece]] = {}

    def plan(self, step: int) -> BlockPart | None:
        src = (self.rank - step) % self.world_size
        return block_part(self.layout, self.rank, src, self.local_len, self.causal)

    def runs(self, rank: int) -> BatchRuns:
        return self.documents.runs(held_before(self.layout, rank, self.world_size, self.local_len))

    @cached_property
    def q_runs(self) -> BatchRuns:
        return self.runs(self.rank)

    def __call__(self, step: int) -> list[Piece]:
        if step not in self._pieces:
            plan = self.plan(step)
            if plan is None:
                pieces = []
            elif self.documents is None:
                pieces = [Piece(ALL, plan.q, plan.k, plan.causal)]
            else:
                k_runs = self.runs((self.rank - step) % self.world_size)
                pieces = document_pieces(plan, self.local_len, self.q_runs, k_runs, self.documents.batch)
            self._pieces[step] = pieces
        return self._pieces[step]


def step_planner(
    layout: str, rank: int, world_size: int, local_len: int, causal: bool, documents: Documents | None
) -> StepPlanner:
    """The rank's planner, made once per batch (kept with its documents) for every later call."""
    if documents is None:
        return StepPlanner(layout, rank, world_size, local_len, causal)
    if documents.seq_len != world_size * local_len:
        raise ValueError(
            f"documents of a {documents.seq_len}-token sequence do not match {world_size} slices of {local_len}"
        )
    key = ("ring", layout, rank, world_size, local_len, causal)
    return kept(documents, key, lambda: StepPlanner(layout, rank, world_size, local_len, causal, documents))


KEPT = "_ring_plans"  # the attribute of a batch's Documents that holds what the ring derived from it


def kept(documents: Documents, key: tuple, make: Callable):
    """What the ring derives from a batch's documents (step planners, varlen plans and their device
    copies), made once and kept with the batch's Documents (an attribute only this package reads; the
    planners point back at it, so it lives in the Documents and goes with it): every layer's call
    reuses it."""
    derived = documents.__dict__.setdefault(KEPT, {})
    if key not in derived:
        derived[key] = make()
    return derived[key]


def piece_work(pieces: list[Piece], batch: int, local_len: int) -> int:
    """Score entries the pieces compute (schedule.block_work of each), over the batch rows."""
    return sum(len(range(*p.b.indices(batch))) * block_work(BlockPart(p.q, p.k, p.causal), local_len) for p in pieces)
