"""Merging partial attention results from (out, logsumexp) pairs, in fp32 (fp64 for fp64).

If a query's keys are split into two sets with partial results (o1, l1) and (o2, l2), the
attention over the union is  l = logaddexp(l1, l2),  o = o1 exp(l1 - l) + o2 exp(l2 - l).
"""

from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def merge_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold (block_out, block_lse) into the accumulators (out (B, H, L, D), lse (B, H, L)) in place.

    `out` and `lse` may be views (a row slice of larger accumulators)."""
    new_lse = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new_lse).unsqueeze(-1))
    out.addcmul_(block_out.to(out.dtype), torch.exp(block_lse - new_lse).unsqueeze(-1))
    lse.copy_(new_lse)


def merge_stack(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge N partial results at once: outs (N, B, H, L, D), lses (N, B, H, L) -> (B, H, L, D), (B, H, L).

    A part with no keys for a query has lse -inf and weighs nothing; every query needs at least
    one part with keys."""
    lses = lses.to(acc_dtype(lses.dtype))
    top = lses.amax(0)  # (B, H, L)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w = torch.exp(lses - top)  # (N, B, H, L); exp(-inf) = 0
    total = w.sum(0)
    out = (outs.to(w.dtype) * w.unsqueeze(-1)).sum(0) / total.unsqueeze(-1)
    return out, top + torch.log(total)


class Sums:
    """The running (out, lse) of a rank's queries q (B, H, L, D) over the parts of a ring's steps.

    The first part that spans every row with keys for each (step 0's own block does) starts the sums
    as they are; a part over some rows, before that, starts them empty (out 0, lse -inf: rows no part
    has reached weigh nothing). A part whose rows have no keys (lse -inf) must not be the first to reach
    them: merged into empty rows it would make NaN."""

    def __init__(self, q: torch.Tensor):
        self.q = q
        self.out = self.lse = None

    def add(self, part, out: torch.Tensor, lse: torch.Tensor, spans: bool) -> None:
        """Fold in a part over the rows of `part` (a lwm.parallel.pieces.Piece); spans: it covers every row
        with keys."""
        if self.out is None and spans:
            self.out, self.lse = out.to(acc_dtype(self.q.dtype)), lse  # the kernel's own: merged into in place
            return
        if self.out is None:
            self.out = torch.zeros(self.q.shape, dtype=acc_dtype(self.q.dtype), device=self.q.device)
            self.lse = torch.full(self.q.shape[:3], float("-inf"), dtype=lse.dtype, device=self.q.device)
        merge_(part.rows(self.out), part.rows(self.lse), out, lse)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> out in q's dtype, lse (fp32; fp64 for fp64)."""
        return self.out.to(self.q.dtype), self.lse
