"""One variable-length flash call per ring step (lwm/parallel/varlen.py): the CPU stand-in of the
varlen kernel against fp64 math, the pairs of every step against the allowed entries, and the
ring through it against the reference (tests/cuda_standins.py holds the kernel's contract)."""

from __future__ import annotations

import pytest
import torch
from cuda_standins import KernelContractError, installed
from document_refs import allowed, masked_sdpa, packings

from lwm.model.documents import Documents
from lwm.parallel import block_part, shard, simulate_ring
from lwm.parallel.pieces import StepPlanner
from lwm.parallel.varlen import VarlenPlan

LAYOUTS = ("contiguous", "striped", "zigzag")


@pytest.fixture(autouse=True)
def standins():
    with installed() as calls:
        calls.clear()
        yield calls


def _math(q, k, v, causal):
    """fp64 attention of one pair, (H, n, D), causal bottom-right; lse -inf where no key is seen."""
    rep = q.shape[0] // k.shape[0]
    s = q @ k.repeat_interleave(rep, 0).transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        nq, nk = q.shape[1], k.shape[1]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1 + nk - nq), -torch.inf)
    return s.softmax(-1).nan_to_num(0.0) @ v.repeat_interleave(rep, 0), s.logsumexp(-1)


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_standin_matches_math_pair_by_pair(causal):
    """Pairs of every shape the ring asks for: square, more keys, fewer keys (top rows see
    nothing), no keys, no queries; grouped heads (4 q, 2 kv); grads against fp64 autograd."""
    lens = [(5, 5), (3, 7), (6, 2), (4, 0), (0, 3), (1, 4)]
    cq = torch.tensor([0] + [a for a, _ in lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    ck = torch.tensor([0] + [b for _, b in lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(int(cq[-1]), 4, 16, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(int(ck[-1]), 2, 16, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse = torch.ops.aten._flash_attention_forward(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), cq, ck, 6, 7, 0.0, causal, False
    )[:2]
    assert lse.shape == (4, q.shape[0]) and lse.dtype == torch.float32
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want_out, want_lse = [], []
    for i in range(len(lens)):
        pq, pk, pv = (t[c[i] : c[i + 1]].transpose(0, 1) for t, c in zip(leaves, (cq, ck, ck)))
        o, l = (
            _math(pq, pk, pv, causal) if pk.shape[1] else (torch.zeros_like(pq), torch.full(pq.shape[:2], -torch.inf))
        )
        want_out.append(o.transpose(0, 1))
        want_lse.append(l)
    ref = torch.cat(want_out)
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-2, rtol=2e-2)
    ref_lse = torch.cat(want_lse, 1)
    seen = ref_lse.isfinite()
    assert torch.equal(lse.isinf(), ~seen) and (lse[~seen] > 0).all()  # no key: +inf, as the kernel writes
    torch.testing.assert_close(lse[seen].double(), ref_lse[seen].detach(), atol=2e-2, rtol=1e-2)
    final = ref_lse.detach().float().masked_fill(~seen, 0.0).contiguous()  # what the ring hands back
    got = torch.ops.aten._flash_attention_backward(
        dout.bfloat16(), q.bfloat16(), k.bfloat16(), v.bfloat16(), ref.detach().bfloat16(), final, cq, ck, 6, 7, 0.0,
        causal, torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64),
    )  # fmt: skip
    want = torch.autograd.grad(ref, leaves, dout)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)


def test_varlen_standin_refuses_what_the_kernel_refuses():
    q = torch.randn(8, 2, 16, dtype=torch.bfloat16)
    c = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(KernelContractError, match="int32"):
        torch.ops.aten._flash_attention_forward(q, q, q, c.long(), c, 8, 8, 0.0, True, False)
    with pytest.raises(KernelContractError, match="exceeds its max"):
        torch.ops.aten._flash_attention_forward(q, q, q, c, c, 4, 8, 0.0, True, False)
    with pytest.raises(KernelContractError, match="packed"):
        torch.ops.aten._flash_attention_forward(q[None], q[None], q[None], c, c, 8, 8, 0.0, True, False)


def _hits(layout, world, causal, seg):
    """Every varlen pair of every rank and step, mapped to global (query, key) positions."""
    B, S = seg.shape
    L = S // world
    docs = Documents(seg, L)
    pos = lambda r: shard(torch.arange(S)[None], 1, r, world, layout)[0]  # noqa: E731
    hits = torch.zeros(B, S, S, dtype=torch.int32)
    for r in range(world):
        planner = StepPlanner(layout, r, world, L, causal, docs)
        plan = VarlenPlan(planner)
        for step, vs in enumerate(plan.steps):
            if planner.plan(step) is None:  # a block the layout skips: no call at all
                continue
            assert vs is not None, f"{layout} rank {r} step {step} does not fit one call"
            cq, ck = (t.tolist() for t in plan.lengths(vs, "cpu"))
            src = (r - step) % world
            for i in range(vs.pairs):
                nq, nk = cq[i + 1] - cq[i], ck[i + 1] - ck[i]
                if nq == 0 or nk == 0:
                    continue
                b, q0 = divmod(cq[i], L)
                k0 = ck[i] - b * L
                block = torch.ones(nq, nk, dtype=torch.int32)
                if vs.causal:
                    block = block.tril(nk - nq)  # bottom-right
                qi, ki = pos(r)[q0 : q0 + nq], pos(src)[k0 : k0 + nk]
                hits[b][qi[:, None], ki[None, :]] += block
    return hits


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("same", [True, False])
def test_one_call_per_step_computes_each_allowed_entry_once(layout, world, causal, same):
    seg = packings(2, 48, seed=3, same=same)
    assert torch.equal(_hits(layout, world, causal, seg), allowed(seg, causal).int())


def test_repeated_ids_fall_back_to_pieces():
    seg = torch.tensor([[1, 1, 2, 2, 1, 1, 3, 3]])
    plan = VarlenPlan(StepPlanner("striped", 0, 2, 4, True, Documents(seg, 4)))
    assert plan.steps == [None, None]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_masked_ring_on_the_varlen_kernel_matches_the_reference(layout, standins):
    """bf16 through the stand-ins vs fp32 SDPA with the block-diagonal mask; one forward and one
    backward call per rank and step, whatever the number of documents."""
    g = torch.Generator().manual_seed(1)
    B, S, world = 2, 64, 4
    q, k, v, dout = (torch.randn(B, h, S, 32, generator=g) for h in (4, 2, 2, 4))
    seg = packings(B, S, seed=4)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = masked_sdpa(*ref_in, seg, True)
    ref_grads = torch.autograd.grad(ref, ref_in, dout)
    low = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    out = simulate_ring(*low, world, True, layout, segment_ids=Documents(seg, S // world), backend="cuda_flash")
    grads = torch.autograd.grad(out, low, dout.bfloat16())
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        assert (a.float() - b).abs().max() < 0.1
    steps = sum(block_part(layout, r, s, S // world, True) is not None for r in range(world) for s in range(world))
    assert standins == {"flash varlen forward": steps, "flash varlen backward": steps}
