"""The rectangles a ring step computes: its block plan, cut to the documents of packed sequences.

A step's BlockPlan (schedule.py) says which query rows of the local block see which key rows of
the visiting block: all of them, or a plain causal square. Without segment ids that is one kernel
call, one Piece. With segment ids (query i sees key j only when seg[i] == seg[j]) every layout
keeps token order, so in each block a document is a contiguous run of local indices. For each
pair of runs (query run, key run) of one id, the entries the plan allows are cut into at most
three rectangles, each fully visible or a causal square (top-left, diagonal included), so the
plain block kernels serve them and nothing outside a document is computed:

    causal plan, key j visible from query i when j <= i + d  (d = plan.k.start - plan.q.start)

                  keys b0 ...................... b1
    rows top..mid   | full (keys every row  |      |
                    |  sees) | causal square|      |
    rows mid..a1    | full: every key of the run   |

A pair of blocks with no shared document gives no pieces: it is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lwm.model.documents import Run, batch_runs
from lwm.parallel.schedule import ALL, BlockPlan, block_plan, block_work

BatchRuns = list[tuple[slice, list[Run]]]


@dataclass(frozen=True)
class Piece:
    b: slice  # batch rows
    q: slice  # query rows of the local block
    k: slice  # key rows of the visiting block
    causal: bool  # top-left causal square (q and k of equal length) or fully visible

    def covers(self) -> bool:
        """Whether the piece spans every query row (and so may start the accumulators)."""
        return self.b == ALL and self.q == ALL


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


def _pair_groups(q_runs: BatchRuns, k_runs: BatchRuns, batch: int) -> list[tuple[slice, list[Run], list[Run]]]:
    """Query and key runs side by side, batched when both blocks share their ids over the batch."""
    if len(q_runs) == 1 and len(k_runs) == 1:
        return [(q_runs[0][0], q_runs[0][1], k_runs[0][1])]
    per_row = lambda g: [g[0][1]] * batch if len(g) == 1 else [r for _, r in g]  # noqa: E731
    return [(slice(b, b + 1), qr, kr) for b, (qr, kr) in enumerate(zip(per_row(q_runs), per_row(k_runs)))]


def document_pieces(plan: BlockPlan, local_len: int, q_runs: BatchRuns, k_runs: BatchRuns, batch: int) -> list[Piece]:
    qs, qe, _ = plan.q.indices(local_len)
    ks, ke, _ = plan.k.indices(local_len)
    pieces = []
    for rows, qr, kr in _pair_groups(q_runs, k_runs, batch):
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
    """The pieces of every ring step of one rank: `planner(step, key_segment_ids)`."""

    def __init__(
        self,
        layout: str,
        rank: int,
        world_size: int,
        local_len: int,
        causal: bool,
        segment_ids: torch.Tensor | None = None,
    ):
        self.layout, self.rank, self.world_size, self.local_len, self.causal = (
            layout,
            rank,
            world_size,
            local_len,
            causal,
        )
        self.batch = None if segment_ids is None else segment_ids.shape[0]
        self.q_runs = None if segment_ids is None else batch_runs(segment_ids)

    def __call__(self, step: int, key_segment_ids: torch.Tensor | None = None) -> list[Piece]:
        plan = block_plan(self.layout, self.rank, (self.rank - step) % self.world_size, self.local_len, self.causal)
        if plan is None:
            return []
        if self.q_runs is None:
            return [Piece(ALL, plan.q, plan.k, plan.causal)]
        return document_pieces(plan, self.local_len, self.q_runs, batch_runs(key_segment_ids), self.batch)


def piece_work(pieces: list[Piece], batch: int, local_len: int) -> int:
    """Score entries the pieces compute (schedule.block_work of each), over the batch rows."""
    return sum(len(range(*p.b.indices(batch))) * block_work(BlockPlan(p.q, p.k, p.causal), local_len) for p in pieces)
