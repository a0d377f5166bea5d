"""Ulysses (and hybrid) attention with k/v head counts that do not divide the group (gloo, CPU)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from lwm.parallel import hybrid_attention, hybrid_groups, shard, ulysses_attention
from lwm.parallel.launch import run_distributed
from lwm.parallel.ulysses import check_heads, replicate_kv

LAYOUTS = ("striped", "zigzag")
D = 8
# world -> (q heads, k/v heads) run by ulysses_attention over all ranks
ULYSSES_HEADS = {2: [(4, 4), (6, 3)], 3: [(6, 2), (12, 4)], 4: [(8, 2), (12, 6)]}  # (12, 4) at 3: lcm = all 12
HYBRID_HEADS = [(6, 3), (4, 1)]  # world 4 = ring 2 x ulysses 2


def _errors(rank, world, attn, hq, hkv, causal, layout, ulysses_size=1):
    """Max |error| of this rank's output and dq/dk/dv against full-sequence SDPA (enable_gqa)."""
    seq = 4 * world  # zigzag needs 2 * world pieces
    g = torch.Generator().manual_seed(hq * 100 + hkv)
    q, k, v = (torch.randn(1, h, seq, D, generator=g) for h in (hq, hkv, hkv))
    dout = torch.randn(1, hq, seq, D, generator=g)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = F.scaled_dot_product_attention(*full, is_causal=causal, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref_out, full, dout)
    sh = lambda t: shard(t, 2, rank, world, layout, ulysses_size)  # noqa: E731
    local = [sh(t).requires_grad_() for t in (q, k, v)]
    out = attn(*local, causal=causal, layout=layout)
    grads = torch.autograd.grad(out, local, sh(dout))
    for a, b in zip(grads, local):  # dk, dv on the original (un-replicated) heads
        assert a.shape == b.shape, (a.shape, b.shape)
    errs = [(out - sh(ref_out)).abs().max().item()]
    errs += [(a - sh(b)).abs().max().item() for a, b in zip(grads, ref_grads)]
    return max(errs)


def _error_message(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def _worker(rank, world):
    results, messages = {}, {}
    for (hq, hkv), layout, causal in itertools.product(ULYSSES_HEADS[world], LAYOUTS, (True, False)):
        results[("ulysses", hq, hkv, layout, causal)] = _errors(rank, world, ulysses_attention, hq, hkv, causal, layout)
    x = torch.randn(1, world + 1, 4, D)  # world + 1 q heads, 1 k/v head
    messages["ulysses"] = _error_message(lambda: ulysses_attention(x, x[:, :1], x[:, :1]))
    if world == 4:
        ring_group, ulysses_group = hybrid_groups(2, 2)
        attn = lambda q, k, v, causal, layout: hybrid_attention(q, k, v, ring_group, ulysses_group, causal, layout)  # noqa: E731
        for (hq, hkv), layout, causal in itertools.product(HYBRID_HEADS, LAYOUTS, (True, False)):
            results[("hybrid", hq, hkv, layout, causal)] = _errors(rank, world, attn, hq, hkv, causal, layout, 2)
        y = torch.randn(1, 3, 4, D)
        messages["hybrid"] = _error_message(lambda: hybrid_attention(y, y[:, :1], y[:, :1], ring_group, ulysses_group))
    return results, messages


@pytest.fixture(scope="module", params=sorted(ULYSSES_HEADS), ids=lambda n: f"N{n}")
def head_errors(request):
    return request.param, run_distributed(_worker, request.param, timeout=120.0)


def test_kv_heads_any_divisor_match_full_sdpa(head_errors):
    world, per_rank = head_errors
    cases = per_rank[0][0]
    assert len(cases) == 4 * len(ULYSSES_HEADS[world]) + (4 * len(HYBRID_HEADS) if world == 4 else 0)
    for case in cases:
        worst = max(r[0][case] for r in per_rank)
        assert worst < 1e-5, f"N={world} {case}: max error {worst:.2e} (fp32, atol 1e-5)"


def test_q_heads_not_divisible_by_group_raise(head_errors):
    world, per_rank = head_errors
    for _, messages in per_rank:
        assert f"q heads {world + 1}" in messages["ulysses"] and f"group size {world}" in messages["ulysses"]
        if world == 4:
            assert "q heads 3" in messages["hybrid"] and "group size 2" in messages["hybrid"]


@pytest.mark.parametrize("hq,hkv,size", [(6, 2, 3), (28, 4, 7), (6, 3, 2), (8, 2, 4), (4, 4, 2), (8, 8, 4)])
def test_replicate_kv_is_minimal_and_keeps_the_grouping(hq, hkv, size):
    check_heads(hq, hkv, size)
    k = torch.randn(1, hkv, 3, 2)
    r = replicate_kv(k, size)
    if hkv % size == 0:
        assert r is k  # un-expanded
    n = r.shape[1]
    assert n % size == 0 and hq % n == 0 and n == math.lcm(hkv, size)
    for j in range(n):  # replicated head j is original head j // (n / hkv)
        assert torch.equal(r[:, j], k[:, j // (n // hkv)])
    per_q, per_kv = hq // size, n // size
    for h in range(hq):  # q head h on rank h // per_q finds its kv head h // (hq / hkv) among that rank's share
        rank, local = divmod(h, per_q)
        kv_local = local // (per_q // per_kv)
        assert torch.equal(r[:, rank * per_kv + kv_local], k[:, h // (hq // hkv)])


def test_check_heads_names_the_values():
    with pytest.raises(ValueError, match="q heads 6 are not divisible by the Ulysses group size 4"):
        check_heads(6, 2, 4)
    check_heads(6, 3, 2)  # formerly refused
    check_heads(28, 4, 7)
