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


def packings(B: int, S: int, seed: int = 0, same: bool = False, lengths=(1, 2, 3, 5, 9, 17, 30)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [packing(S, g, lengths)] * B if same else [packing(S, g, lengths) for _ in range(B)]
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


def packed_pair(cfg, S: int):
    """Two examples (15 and 12 tokens) packed into S + 1 tokens with a padding tail, as the packer
    lays them out: segment ids 1, 2, 0; weights 0 on each example's first token and the padding."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, cfg.vocab_size, (15,), generator=g), torch.randint(0, cfg.vocab_size, (12,), generator=g)
    tokens = torch.cat([a, b, torch.zeros(S + 1 - 27, dtype=torch.long)])[None]  # (1, S + 1)
    seg = torch.tensor([1] * 15 + [2] * 12 + [0] * (S + 1 - 27), dtype=torch.int32)[None]
    weight = torch.rand(1, S + 1, generator=g) * (seg > 0)
    weight[0, [0, 15]] = 0
    vision = torch.rand(1, S + 1, generator=g) > 0.5
    batch = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_weight": weight[:, 1:],
        "vision_mask": vision[:, 1:],
        "segment_ids": seg[:, :-1],
    }
    return batch, (a, b)


def one_by_one_grads(cfg, state, batch, examples):
    """Each example alone (its own sequence, positions from 0), with the coefficients its tokens
    have in the packed batch: the summed loss and its parameter gradients."""
    from lwm.model import Transformer, token_coefficients

    model = Transformer(cfg)
    model.load_state_dict(state)
    coeff = token_coefficients(batch["loss_weight"], batch["vision_mask"])[0]
    loss, start = 0.0, 0
    for ex in examples:
        n = len(ex)
        loss = loss + model(ex[None, :-1], targets=ex[None, 1:], loss_coeff=coeff[None, start : start + n - 1]).loss
        start += n
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}
