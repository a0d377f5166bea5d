"""Shared by the document-masking tests: random packings and the dense-mask SDPA reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def packing(S: int, g: torch.Generator, lengths=(1, 2, 3, 5, 9, 17, 30), pad: bool = True) -> torch.Tensor:
    """(S,) int32 ids of a random packing: documents numbered from 1 with lengths drawn from
    `lengths` (one token, shorter than the ring, spanning every rank), then a padding tail of 0s."""
    ids, doc = [], 1
    tail = int(torch.randint(1, 6, (1,), generator=g)) if pad else 0
    while len(ids) < S - tail:
        n = lengths[int(torch.randint(0, len(lengths), (1,), generator=g))]
        ids += [doc] * n
        doc += 1
    ids = ids[: S - tail] + [0] * tail
    return torch.tensor(ids, dtype=torch.int32)


def packings(B: int, S: int, seed: int = 0, same: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [packing(S, g)] * B if same else [packing(S, g) for _ in range(B)]
    return torch.stack(rows)  # (B, S)


def allowed(segment_ids: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, S) -> (B, S, S) bool: query i may attend key j."""
    mask = segment_ids[:, :, None] == segment_ids[:, None, :]
    if causal:
        S = segment_ids.shape[1]
        mask &= torch.ones(S, S, dtype=torch.bool).tril()
    return mask


def masked_sdpa(q, k, v, segment_ids, causal):
    """Full-sequence SDPA with the block-diagonal (causal) mask: the reference."""
    rep = q.shape[1] // k.shape[1]
    mask = allowed(segment_ids, causal)[:, None]  # (B, 1, S, S)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)
