"""What one rank computes at each ring step, forward and backward: the step's work.

ring.py runs the steps (one loop per direction: it merges what each step returns and passes K/V and
dK/dV around the ring); this module says what each step is, for one rank, batch and kernel:

    pieces   the step's block part (blocks.py) cut to the batch's documents (pieces.py): one block
             kernel call per rectangle (kernels.py); no rectangle, a skipped step
    varlen   packed documents on CUDA flash: the whole step in one variable-length call (varlen.py),
             where the step fits one

Either yields partial results over row ranges of the local block (a Piece: batch rows and query rows;
the key rows its dK/dV cover): forward (piece, out, lse, spans: every row of the block has keys in it),
merged by merge.Sums; backward (piece, dq, dk, dv), recomputed from the final output and logsumexp
(`Finals`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterator

import torch

from lwm.parallel.blocks import ALL
from lwm.parallel.kernels import block_backward, block_forward, select_backend, softmax_scale
from lwm.parallel.pieces import Piece, StepPlanner
from lwm.parallel.varlen import VarlenPlan, VarlenStep, packed_lse, varlen_backward, varlen_forward, varlen_plan

WHOLE = Piece(ALL, ALL, ALL, False)  # a varlen step's results cover the whole block


class Finals:
    """What the backward reads of the forward: the incoming gradient, the queries, the final output and
    logsumexp (the varlen kernel's packed form of it made once, on first use)."""

    def __init__(self, dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor):
        self.dout, self.q, self.out, self.lse = dout, q, out, lse

    @cached_property
    def packed_lse(self) -> torch.Tensor:
        return packed_lse(self.lse)


class PieceWork:
    """A step as block kernel calls, one per piece (none: the step is skipped)."""

    def __init__(self, pieces: list[Piece], kernel: str):
        self.pieces, self.kernel = pieces, kernel

    def forward(self, q, k, v, scale) -> Iterator[tuple]:
        for p in self.pieces:
            o, l = block_forward(p.rows(q), k[p.b, :, p.k], v[p.b, :, p.k], p.causal, scale, self.kernel)
            yield p, o, l, p.covers()  # every row of a piece sees a key

    def backward(self, f: Finals, k, v, scale) -> Iterator[tuple]:
        for p in self.pieces:
            grads = block_backward(
                p.rows(f.dout), p.rows(f.q), k[p.b, :, p.k], v[p.b, :, p.k], p.rows(f.out), p.rows(f.lse),
                p.causal, scale, self.kernel,
            )  # fmt: skip
            yield p, *grads


class VarlenWork:
    """A step as one variable-length flash call over the whole block."""

    def __init__(self, step: VarlenStep, plan: VarlenPlan):
        self.step, self.plan = step, plan

    def forward(self, q, k, v, scale) -> Iterator[tuple]:
        lengths = self.plan.lengths(self.step, q.device)
        yield WHOLE, *varlen_forward(q, k, v, self.step, lengths, softmax_scale(q, scale)), self.step.covers

    def backward(self, f: Finals, k, v, scale) -> Iterator[tuple]:
        lengths = self.plan.lengths(self.step, f.q.device)
        yield (
            WHOLE,
            *varlen_backward(f.dout, f.q, k, v, f.out, f.packed_lse, self.step, lengths, softmax_scale(f.q, scale)),
        )


class RingSteps:
    """One rank's steps for one batch and kernel: `steps(s)` is the work of step s."""

    def __init__(self, planner: StepPlanner, kernel: str, pinned: bool = False):
        self.planner, self.kernel = planner, kernel
        one_call = planner.documents is not None and kernel == "cuda_flash"
        self.varlen = varlen_plan(planner, pinned) if one_call else None

    def __call__(self, step: int) -> PieceWork | VarlenWork:
        one = self.varlen.steps[step] if self.varlen is not None else None
        if one is not None and (step > 0 or one.covers):  # step 0 starts the sums: every row needs a key
            return VarlenWork(one, self.varlen)
        return PieceWork(self.planner(step), self.kernel)


def ring_steps(planner: StepPlanner, q: torch.Tensor, backend: str = "auto") -> RingSteps:
    """The planner's steps with the kernel `backend` selects for q (device, dtype, head dim); the host tables
    they copy to a CUDA q's device are pinned (VarlenPlan)."""
    return RingSteps(planner, select_backend(q, backend), pinned=copies_pinned(q.device))


def copies_pinned(device: torch.device) -> bool:
    """Whether host tables bound for `device` are pinned first: a CUDA device's copies from pageable host
    memory block the host until the GPU's queue drains (a planner's fake CPU tensors and meta ones copy none)."""
    return device.type == "cuda"
