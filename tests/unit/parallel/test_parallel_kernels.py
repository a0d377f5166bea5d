import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from lwm.parallel import block_backward, block_forward, ring_attention, simulate_ring, ulysses_attention
from lwm.parallel.merge import Sums, merge_
from lwm.parallel.pieces import Piece, StepPlanner
from lwm.parallel.ring import new_dq, ring_backward, ring_forward
from lwm.parallel.ring_steps import ring_steps


def sdpa_ref(q, k, v, causal):
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=causal)


def qkv(hq=4, hkv=2, S=24, D=16, dtype=torch.float32, B=2):
    return (
        torch.randn(B, hq, S, D, dtype=dtype),
        torch.randn(B, hkv, S, D, dtype=dtype),
        torch.randn(B, hkv, S, D, dtype=dtype),
    )


@pytest.mark.parametrize("backend", ["cpu_flash", "math"])
@pytest.mark.parametrize("causal,lq,lk", [(True, 12, 12), (False, 12, 7)])  # causal blocks are square
def test_block_kernels_fp64_against_autograd(backend, causal, lq, lk):
    q = torch.randn(1, 4, lq, 24, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, lk, 24, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, lk, 24, dtype=torch.float64, requires_grad=True)
    scale = 0.3
    s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    ref_lse = s.logsumexp(-1)
    ref = s.softmax(-1) @ v.repeat_interleave(2, 1)
    out, lse = block_forward(q.detach(), k.detach(), v.detach(), causal, scale, backend)
    torch.testing.assert_close(out, ref.detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(lse, ref_lse.detach(), atol=1e-12, rtol=1e-10)
    dout = torch.randn_like(ref)
    grads = torch.autograd.grad(ref, (q, k, v), dout)
    mine = block_backward(dout, q.detach(), k.detach(), v.detach(), out, lse, causal, scale, backend)
    for a, b in zip(mine, grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_merge_of_two_key_halves_is_full_attention():
    q, k, v = qkv(S=20)
    out, lse = block_forward(q, k[:, :, :8], v[:, :, :8], False)
    out, lse = out.clone(), lse.clone()
    o2, l2 = block_forward(q, k[:, :, 8:], v[:, :, 8:], False)
    merge_(out, lse, o2, l2)
    torch.testing.assert_close(out, sdpa_ref(q, k, v, False), atol=1e-6, rtol=1e-5)


def test_sums_over_row_parts_and_key_parts_equal_full_attention():
    """Parts over some rows start the sums empty (rows not reached weigh nothing); a first part over every
    row starts them as it is; either way the result is attention over all the keys."""
    q, k, v = qkv(S=20)
    ALL = slice(None)
    parts = [(slice(0, 12), slice(0, 8)), (slice(12, None), slice(0, 8)), (ALL, slice(8, None))]  # (rows, keys)
    for order in ("rows first", "whole first"):
        sums = Sums(q)
        for rows, keys in parts if order == "rows first" else parts[::-1]:
            o, l = block_forward(q[:, :, rows], k[:, :, keys], v[:, :, keys], False)
            sums.add(Piece(ALL, rows, ALL, False), o, l, spans=rows == ALL)
        out, lse = sums.result()
        torch.testing.assert_close(out, sdpa_ref(q, k, v, False), atol=1e-6, rtol=1e-5, msg=order)
        assert out.dtype == q.dtype and lse.shape == q.shape[:3]


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_ring_loops_add_and_merge_in_place_without_copying_back():
    """dq and the sums take each part in place: `dq[rows] += g` would read, add and copy the rows back (a
    whole dq-sized copy per step for a whole-block part). Rank 1 of a striped causal ring of 2: a
    whole-block step and a step over rows 1:."""
    q, k, v = qkv(S=16)
    dout = torch.randn_like(q)
    steps = ring_steps(StepPlanner("striped", 1, 2, 16, True), q)
    blocks = [(k, v), (k, v)]
    with _Ops() as ops:
        out, lse = ring_forward(q, blocks, steps, None)
        for _ in ring_backward(dout, q, out, lse, blocks, steps, None, new_dq(q)):
            pass
    assert "aten.copy_.default" in ops.names  # merge_ writes the new logsumexp: the counter sees copies
    assert ops.names.count("aten.copy_.default") == 1  # ... and that one only (step 1 merges; none in backward)


CASES = list(itertools.product(["contiguous", "striped", "zigzag"], [1, 2, 3, 4, 8], [True, False], [64, 128, 40]))


@pytest.mark.parametrize("layout,world,causal,d", CASES)
def test_simulated_ring_fp32_matches_sdpa(layout, world, causal, d):
    q, k, v = (t.requires_grad_() for t in qkv(S=48, D=d, B=1))
    out = simulate_ring(q, k, v, world, causal, layout)
    ref = sdpa_ref(q, k, v, causal)
    dout = torch.randn_like(ref)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["striped", "zigzag"])
def test_simulated_ring_math_backend_fp64(layout):
    q, k, v = (t.requires_grad_() for t in qkv(S=32, D=40, dtype=torch.float64))
    out = simulate_ring(q, k, v, 4, True, layout, backend="math")
    ref = sdpa_ref(q, k, v, True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    dout = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
def test_bf16_error_does_not_grow_with_world_size(layout):
    """Against an fp64 reference, the RMS error of bf16 outputs and grads at N = 2, 4, 8 stays
    within 10% of N = 1: merges and gradient sums are done in fp32."""
    torch.manual_seed(0)
    q, k, v = qkv(S=256, D=64, dtype=torch.float64, B=1)
    dout = torch.randn_like(q)
    ref = [t.requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
    ref_out = sdpa_ref(*ref, True)
    ref_all = [ref_out.detach(), *torch.autograd.grad(ref_out, ref, dout)]

    def rms_errors(world):
        low = [t.bfloat16().requires_grad_() for t in (q, k, v)]
        out = simulate_ring(*low, world, True, layout)
        got = [out, *torch.autograd.grad(out, low, dout.bfloat16())]
        return [((g.double() - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item() for g, r in zip(got, ref_all)]

    base = rms_errors(1)
    assert max(base) < 1e-2  # bf16 rounding, nothing worse
    for world in (2, 4, 8):
        for name, e, b in zip(("out", "dq", "dk", "dv"), rms_errors(world), base):
            assert e <= 1.1 * b, f"{layout} N={world} {name}: relative RMS error {e:.2e} vs {b:.2e} at N=1"


def test_single_process_ring_and_ulysses_need_no_process_group():
    q, k, v = qkv()
    torch.testing.assert_close(ring_attention(q, k, v), sdpa_ref(q, k, v, True), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ulysses_attention(q, k, v, causal=False), sdpa_ref(q, k, v, False), atol=1e-6, rtol=1e-5)


def test_bad_inputs_are_named():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k \(2, 2, 24, 16\) and v \(2, 2, 20, 16\) must have the same shape"):
        ring_attention(q, k, v[:, :, :20])
    with pytest.raises(ValueError, match="q heads 4 must be a multiple of k/v heads 3"):
        ring_attention(q, torch.randn(2, 3, 24, 16), torch.randn(2, 3, 24, 16))
    with pytest.raises(ValueError, match="must match q"):
        ring_attention(q, k[:, :, :20], v[:, :, :20])
    with pytest.raises(ValueError, match="unknown layout 'spiral'"):
        ring_attention(q, k, v, layout="spiral")
    with pytest.raises(ValueError, match="zigzag needs an even local length"):
        ring_attention(q[:, :, :7], k[:, :, :7], v[:, :, :7], layout="zigzag")
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        ring_attention(q, k, v, backend="fast")
    from lwm.parallel.ulysses import check_heads

    with pytest.raises(ValueError, match="q heads 6 are not divisible by the Ulysses group size 4"):
        check_heads(6, 2, 4)
    check_heads(6, 3, 2)  # k/v heads are replicated as far as the group needs
