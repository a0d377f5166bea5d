"""Attention of new tokens against a key/value cache that is split over a context-parallel group.

Used by generation (lwm.infer): every rank computes the same new tokens' q, k, v; each rank
holds only its own slice of the earlier tokens' keys and values. The new queries attend to

    every rank's cache slice   (all earlier positions: no mask), merged from (out, lse) pairs
    the new tokens themselves  (causal, computed identically on every rank)

and the result is the same as full causal attention over the whole sequence. Only (out, lse)
of the new queries travel: a few kilobytes per token and layer, never the cache.
"""

from __future__ import annotations

import torch

from lwm.parallel.comm import RingComm, all_gather_stack
from lwm.parallel.kernels import block_forward
from lwm.parallel.merge import acc_dtype, merge_, merge_stack
from lwm.parallel.pieces import StepPlanner
from lwm.parallel.ring import ring_blocks, ring_forward
from lwm.parallel.ring_steps import ring_steps


def cached_attention(
    q, k_new, v_new, k_cache=None, v_cache=None, group=None, backend: str = "auto", starts: list[int] | None = None
) -> torch.Tensor:
    """q (B, H, L, D); k_new, v_new (B, Hkv, L, D); k_cache, v_cache (B, Hkv, C, D) this rank's
    slice of the earlier tokens (C may be 0 or differ between ranks) -> (B, H, L, D). starts: per row,
    where its cached keys begin (rows of different lengths, left-padded to C; None: all at 0)."""
    if starts is None or not any(starts) or k_cache is None:
        out, lse = _cache_part(q, k_cache, v_cache, backend)
    else:  # each row over its own keys: the padding before starts[b] is never read
        parts = [
            _cache_part(q[b : b + 1], k_cache[b : b + 1, :, s:], v_cache[b : b + 1, :, s:], backend)
            for b, s in enumerate(starts)
        ]
        out, lse = torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])
    # One collective per layer: lse rides along as an extra channel. (B, H, L, D+1) -> (N, B, H, L, D+1)
    both = all_gather_stack(torch.cat([out, lse.unsqueeze(-1)], dim=-1), group)
    outs, lses = both[..., :-1], both[..., -1]  # (N, B, H, L, D), (N, B, H, L)
    own_out, own_lse = block_forward(q, k_new, v_new, causal=True, backend=backend)
    outs = torch.cat([outs, own_out.to(outs.dtype).unsqueeze(0)])
    lses = torch.cat([lses, own_lse.to(lses.dtype).unsqueeze(0)])
    return merge_stack(outs, lses)[0].to(q.dtype)


def _cache_part(q, k_cache, v_cache, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, D) over all of k_cache, v_cache (B, Hkv, C, D), no mask -> (out, lse) in the accumulation
    dtype; C = 0 (or no cache) is a part that weighs nothing."""
    B, H, L, _ = q.shape
    if k_cache is not None and k_cache.shape[2] > 0:
        out, lse = block_forward(q, k_cache, v_cache, causal=False, backend=backend)
        return out.to(acc_dtype(q.dtype)), lse.to(acc_dtype(q.dtype))
    out = torch.zeros(q.shape, dtype=acc_dtype(q.dtype), device=q.device)
    return out, torch.full((B, H, L), float("-inf"), dtype=acc_dtype(q.dtype), device=q.device)


PAST_PASSES = 2  # ring passes over the cache per prefill segment: the buffers halve, the passes double


def ring_prefill_attention(q, k, v, k_cache, v_cache, group=None, layout: str = "striped", backend: str = "auto"):
    """One segment of a chunked ring prefill: q, k, v (B, H(kv), L, D) this rank's slice (layout)
    of the segment; k_cache, v_cache (B, Hkv, C, D) this rank's slices of all earlier segments (C
    equal on every rank) -> (B, H, L, D). Causal ring attention within the segment, merged with
    non-causal ring passes over the earlier segments' cache slices (all of them come before), in
    PAST_PASSES passes of half the slice each (at least L tokens): what travels and its two sets of
    receive buffers are half the cache slice's size, not all of it, for one more ring pass."""
    comm = RingComm(group)
    L = q.shape[2]
    steps = ring_steps(StepPlanner(layout, comm.rank, comm.world_size, L, True), q, backend)
    out, lse = ring_forward(q, ring_blocks(comm, k, v), steps, None)
    if k_cache is None or k_cache.shape[2] == 0:
        return out
    out = out.to(acc_dtype(q.dtype))
    past = ring_steps(StepPlanner(layout, comm.rank, comm.world_size, L, False), q, backend)
    C = k_cache.shape[2]
    size = max(L, -(-C // PAST_PASSES))
    for start in range(0, C, size):  # the same chunks on every rank: C is equal
        chunk = slice(start, start + size)
        blocks = ring_blocks(RingComm(group), k_cache[:, :, chunk], v_cache[:, :, chunk])
        past_out, past_lse = ring_forward(q, blocks, past, None)
        merge_(out, lse, past_out, past_lse)
    return out.to(q.dtype)
