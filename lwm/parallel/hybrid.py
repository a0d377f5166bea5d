"""Hybrid context parallelism (USP): Ulysses inside a group, ring attention across groups.

The sequence is split over the ring by the layout and each ring piece contiguously over its
Ulysses group (see layout.py). The first all-to-all gives every rank of a Ulysses group the whole
ring piece for a share of the heads; ring attention then runs across the groups.
"""

from __future__ import annotations

import torch

from lwm.model.documents import Documents, check_segment_ids
from lwm.parallel.comm import group_size_and_rank
from lwm.parallel.layout import check_layout
from lwm.parallel.ring import check_qkv, ring_attention
from lwm.parallel.ulysses import check_heads, gather_segments, heads_to_seq, replicate_kv, seq_to_heads


def hybrid_attention(
    q,
    k,
    v,
    ring_group,
    ulysses_group,
    causal: bool = True,
    layout: str = "striped",
    scale: float | None = None,
    segment_ids: torch.Tensor | Documents | None = None,
    backend: str = "auto",
):
    """segment_ids: the batch's Documents (the whole sequence: nothing to gather), or this rank's
    (B, L) ids, gathered over the Ulysses group into the ring piece's (read at each call)."""
    check_qkv(q, k, v)
    check_layout(layout)
    U = group_size_and_rank(ulysses_group)[0]
    check_heads(q.shape[1], k.shape[1], U)
    if U == 1:
        return ring_attention(q, k, v, ring_group, causal, layout, scale, segment_ids, backend)
    qh = seq_to_heads(q, ulysses_group)  # (B, Hq/U, U*L, D): the whole ring piece, in order
    kh = seq_to_heads(replicate_kv(k, U), ulysses_group)
    vh = seq_to_heads(replicate_kv(v, U), ulysses_group)
    seg = segment_ids
    if isinstance(seg, torch.Tensor):
        check_segment_ids(seg, q.shape[0], q.shape[2])
        seg = gather_segments(seg.to(q.device).contiguous(), ulysses_group)  # (B, L) -> (B, U*L): the ring piece's
    out = ring_attention(qh, kh, vh, ring_group, causal, layout, scale, seg, backend)
    return heads_to_seq(out, ulysses_group)


def hybrid_groups(ring_size: int, ulysses_size: int):
    """(ring_group, ulysses_group) of this rank for world = ring_size x ulysses_size, with
    global rank = ring_rank * ulysses_size + ulysses_rank. Every rank must call this."""
    import torch.distributed as dist

    world, rank = group_size_and_rank()
    if ring_size * ulysses_size != world:
        raise ValueError(f"ring_size {ring_size} x ulysses_size {ulysses_size} != world size {world}")
    ring_group = ulysses_group = None
    for r in range(ring_size):  # new_group must be called by all ranks for every group
        g = dist.new_group([r * ulysses_size + u for u in range(ulysses_size)])
        if rank // ulysses_size == r:
            ulysses_group = g
    for u in range(ulysses_size):
        g = dist.new_group([r * ulysses_size + u for r in range(ring_size)])
        if rank % ulysses_size == u:
            ring_group = g
    return ring_group, ulysses_group
