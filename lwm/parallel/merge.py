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
