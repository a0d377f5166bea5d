"""Ulysses attention: an all-to-all trades the sequence split for a head split, each rank runs
local attention over the whole sequence for its share of the heads (the block kernels of ring
attention, as one rank of a ring: the same backends and document pieces), and a second all-to-all
trades back. The batch's Documents describe the whole sequence already; given segment ids
instead, every rank gathers the whole sequence's ids. Q heads must be
divisible by the group size P. K/V heads stay as they are when their count Hkv is a multiple of
P; otherwise each is repeated lcm(Hkv, P) / Hkv times (the GQA grouping of q head h to kv head
h // (H / Hkv) is kept), the fewest that give every rank the K/V heads its q heads use.
Gradients of the copies sum back onto the original heads.
"""

from __future__ import annotations

import math

import torch

from lwm.model.documents import Documents
from lwm.parallel.comm import all_gather_stack, all_to_all, group_size_and_rank
from lwm.parallel.layout import check_layout, gathered_positions
from lwm.parallel.ring import as_documents, check_qkv, simulate_ring


def check_heads(n_heads: int, n_kv_heads: int, size: int) -> None:
    """Any k/v head count that divides the q heads works (see replicate_kv); q heads must split evenly."""
    if n_heads % size:
        raise ValueError(f"q heads {n_heads} are not divisible by the Ulysses group size {size}")


def replicate_kv(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, Hkv, L, D) -> (B, lcm(Hkv, size), L, D), unchanged when size divides Hkv: each kv head is
    repeated in place (repeat_interleave), so rank r's q heads find theirs among its share."""
    n = x.shape[1]
    rep = math.lcm(n, size) // n
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def seq_to_heads(x: torch.Tensor, group, order: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, L, D) sequence-sharded -> (B, H/P, P*L, D) head-sharded; with `order`, the gathered
    rank pieces are re-indexed into that order along the sequence."""
    P = group_size_and_rank(group)[0]
    B, H, L, D = x.shape
    x = x.view(B, P, H // P, L, D).transpose(0, 1)  # (B, H, L, D) -> (P, B, H/P, L, D): chunk j for rank j
    x = all_to_all(x.contiguous(), group)  # (P, B, H/P, L, D): chunk j is rank j's sequence piece
    x = x.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * L, D)  # -> (B, H/P, P*L, D) in rank order
    return x if order is None else x.index_select(2, order)


def heads_to_seq(x: torch.Tensor, group, order: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of seq_to_heads: (B, H/P, S, D) -> (B, H, S/P, D)."""
    P = group_size_and_rank(group)[0]
    B, Hp, S, D = x.shape
    if order is not None:
        x = x.index_select(2, order)
    x = x.view(B, Hp, P, S // P, D).permute(2, 0, 1, 3, 4)  # (B, H/P, S, D) -> (P, B, H/P, L, D)
    x = all_to_all(x.contiguous(), group)  # chunk j: my sequence piece of rank j's heads
    return x.transpose(0, 1).reshape(B, P * Hp, S // P, D)  # (P, B, H/P, L, D) -> (B, H, L, D)


def gather_segments(segment_ids: torch.Tensor, group, order: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) this rank's ids -> (B, P*L) the group's, in rank order (or re-indexed by `order`)."""
    parts = all_gather_stack(segment_ids, group)  # (P, B, L)
    full = parts.transpose(0, 1).reshape(segment_ids.shape[0], -1)  # (P, B, L) -> (B, P*L)
    return full if order is None else full.index_select(1, order)


def ulysses_attention(
    q,
    k,
    v,
    group=None,
    causal: bool = True,
    layout: str = "striped",
    scale: float | None = None,
    segment_ids: torch.Tensor | Documents | None = None,
    backend: str = "auto",
):
    """Exact attention for this rank's slice (same contract as ring_attention). The local attention
    over the whole sequence runs on the block kernels named by `backend` (lwm.parallel.kernels)."""
    check_qkv(q, k, v)
    check_layout(layout)
    P = group_size_and_rank(group)[0]
    check_heads(q.shape[1], k.shape[1], P)
    S = P * q.shape[2]
    perm = gathered_positions(S, P, layout, 1, q.device)  # global position of each gathered token
    to_natural, to_layout = torch.argsort(perm), perm
    gather = lambda ids: gather_segments(ids, group, to_natural)  # noqa: E731  (B, L) -> (B, S) natural order
    documents = as_documents(segment_ids, q, gather)
    if P == 1:
        return simulate_ring(q, k, v, 1, causal, "contiguous", scale, documents, backend)
    qh = seq_to_heads(q, group, to_natural)
    kh = seq_to_heads(replicate_kv(k, P), group, to_natural)
    vh = seq_to_heads(replicate_kv(v, P), group, to_natural)
    out = simulate_ring(
        qh, kh, vh, 1, causal, "contiguous", scale, documents, backend
    )  # (B, H/P, S, D), whole sequence
    return heads_to_seq(out, group, to_layout)  # natural order -> rank pieces -> back to the owners
