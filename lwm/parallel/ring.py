"""Ring attention: exact attention over a sequence split across the ranks of a group.

Each rank keeps its queries; K/V blocks (Hkv heads, never expanded) travel around the ring, the next one in flight while the current one is computed. Partial
results merge in fp32 from (out, logsumexp). Backward recomputes each block from the final
output and logsumexp; dQ stays home, dK/dV (fp32) travel the ring with the K/V they belong to
and arrive back at their owner after the last step.

The step loops (`ring_forward`, `ring_backward`) take the K/V blocks as an iterable, so the same
code runs over a real ring (`ring_attention`) or over N virtual ranks in one process
(`simulate_ring`, used by tests and the decomposition benchmark).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from lwm.parallel.comm import RingComm
from lwm.parallel.kernels import block_backward, block_forward
from lwm.parallel.layout import check_divisible, check_layout, shard, unshard
from lwm.parallel.merge import acc_dtype, merge_
from lwm.parallel.schedule import block_plan


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    B, Hq, S, D = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, S, D):
        raise ValueError(f"k/v {tuple(k.shape)} must match q {tuple(q.shape)} in batch, sequence and head dim")
    if Hq % k.shape[1]:
        raise ValueError(f"q heads {Hq} must be a multiple of k/v heads {k.shape[1]}")


# ----------------------------------------------------------------------------------------- step loops


def ring_forward(q, kv_blocks: Iterable[tuple], rank, world_size, layout, causal, scale, backend):
    """-> out (q's dtype), lse (fp32). kv_blocks yields the (k, v) of step 0, 1, ..., N-1."""
    L = q.shape[2]
    out = lse = None
    for step, (k, v) in enumerate(kv_blocks):
        plan = block_plan(layout, rank, (rank - step) % world_size, L, causal)
        if plan is None:
            continue
        o, l = block_forward(q[:, :, plan.q], k[:, :, plan.k], v[:, :, plan.k], plan.causal, scale, backend)
        if out is None:  # step 0 is the rank's own block: every row attends at least itself
            out, lse = o.to(acc_dtype(q.dtype)), l.clone()
        else:
            merge_(out[:, :, plan.q], lse[:, :, plan.q], o, l)
    return out.to(q.dtype), lse


def ring_backward(dout, q, out, lse, kv_blocks, rank, world_size, layout, causal, scale, backend) -> Iterator:
    """Yields, per step, (plan, dk, dv): the gradient of that step's K/V block (rows plan.k), or
    (None, None, None) for a skipped block. When exhausted, the returned dq (fp32) is in
    StopIteration.value."""
    L = q.shape[2]
    dq = torch.zeros(q.shape, dtype=acc_dtype(q.dtype), device=q.device)
    for step, (k, v) in enumerate(kv_blocks):
        plan = block_plan(layout, rank, (rank - step) % world_size, L, causal)
        if plan is None:
            yield None, None, None
            continue
        dq_b, dk_b, dv_b = block_backward(
            dout[:, :, plan.q], q[:, :, plan.q], k[:, :, plan.k], v[:, :, plan.k],
            out[:, :, plan.q], lse[:, :, plan.q], plan.causal, scale, backend,
        )
        dq[:, :, plan.q] += dq_b
        del dq_b
        yield plan, dk_b, dv_b
    return dq


def add_block_grads(dk, dv, plan, dk_b, dv_b) -> None:
    if plan is not None:
        dk[:, :, plan.k] += dk_b
        dv[:, :, plan.k] += dv_b


def ring_kv_blocks(comm: RingComm, k: torch.Tensor, v: torch.Tensor) -> Iterator[tuple]:
    """Yields the (k, v) of each step; the next pair is sent/received while the caller computes.
    Two sets of receive buffers alternate (a set is reused only after its send has completed)."""
    if comm.world_size > 1:
        k, v = k.contiguous(), v.contiguous()  # what travels must be dense
    buffers = [[torch.empty_like(k), torch.empty_like(v)] for _ in range(2)] if comm.world_size > 1 else []
    for step in range(comm.world_size):
        last = step == comm.world_size - 1
        if not last:
            nxt = comm.send_recv([k, v], buffers[step % 2])
        yield k, v
        if not last:
            comm.wait()
            k, v = nxt


# ----------------------------------------------------------------------------------------- real ring


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout, scale, backend):
        comm = RingComm(group)
        out, lse = ring_forward(q, ring_kv_blocks(comm, k, v), comm.rank, comm.world_size, layout, causal, scale, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (group, causal, layout, scale, backend)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, layout, scale, backend = ctx.args
        kv_comm, dkv_comm = RingComm(group, tag=0), RingComm(group, tag=1)
        n, rank = kv_comm.world_size, kv_comm.rank
        steps = ring_backward(dout.contiguous(), q, out, lse, ring_kv_blocks(kv_comm, k, v), rank, n, layout, causal, scale, backend)
        # Step 0's block is this rank's own: its dK/dV stay home. The dK/dV of the block of step
        # s >= 1 travel: started here at step 1 (fp32), passed on with each rank's contribution,
        # and after the last step received by the owner (N-1 hops).
        travelling = None
        for step in range(n):
            plan, dk_b, dv_b = next(steps)
            if step == 0:  # the plan of the own block covers every row
                own = [dk_b.to(acc_dtype(k.dtype)), dv_b.to(acc_dtype(v.dtype))]
                continue
            if travelling is None:
                travelling = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in own]
            else:
                dkv_comm.wait()
            add_block_grads(*travelling, plan, dk_b, dv_b)
            del dk_b, dv_b
            travelling = dkv_comm.send_recv(travelling)
        try:
            next(steps)
        except StopIteration as stop:
            dq = stop.value
        if travelling is not None:
            dkv_comm.wait()  # the dK/dV of our own block, from the other ranks
            own[0] += travelling[0]
            own[1] += travelling[1]
        dk, dv = own
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def ring_attention(q, k, v, group=None, causal: bool = True, layout: str = "striped", scale: float | None = None, backend: str = "auto"):
    """Exact attention for this rank's slice. q (B, Hq, L, D), k/v (B, Hkv, L, D), the rank's slice
    of the sequence in `layout`; returns (B, Hq, L, D). group=None: the default process group
    (a single process without torch.distributed is a group of one)."""
    check_qkv(q, k, v)
    check_layout(layout)
    if layout == "zigzag" and causal and q.shape[2] % 2:
        raise ValueError(f"zigzag needs an even local length (two chunks per rank), got {q.shape[2]}")
    return _RingAttention.apply(q, k, v, group, causal, layout, scale, backend)


# ----------------------------------------------------------------------------------------- virtual ring


class _SimulatedRing(torch.autograd.Function):
    """All N ranks of a ring in one process: same step loops, kernels and merges, no communication."""

    @staticmethod
    def forward(ctx, q, k, v, world_size, causal, layout, scale, backend):
        n = world_size
        qs, ks, vs = ([shard(t, 2, r, n, layout) for r in range(n)] for t in (q, k, v))
        results = [
            ring_forward(qs[r], ((ks[(r - s) % n], vs[(r - s) % n]) for s in range(n)), r, n, layout, causal, scale, backend)
            for r in range(n)
        ]
        outs, lses = [o for o, _ in results], [l for _, l in results]
        ctx.save_for_backward(*qs, *ks, *vs, *outs, *lses)
        ctx.args = (n, causal, layout, scale, backend)
        return unshard(outs, 2, layout)

    @staticmethod
    def backward(ctx, dout):
        n, causal, layout, scale, backend = ctx.args
        qs, ks, vs, outs, lses = (ctx.saved_tensors[i * n : (i + 1) * n] for i in range(5))
        dks = [torch.zeros(k.shape, dtype=acc_dtype(k.dtype)) for k in ks]
        dvs = [torch.zeros(v.shape, dtype=acc_dtype(v.dtype)) for v in vs]
        dqs = []
        for r in range(n):
            kv_blocks = ((ks[(r - s) % n], vs[(r - s) % n]) for s in range(n))
            steps = ring_backward(shard(dout, 2, r, n, layout).contiguous(), qs[r], outs[r], lses[r], kv_blocks,
                                  r, n, layout, causal, scale, backend)
            step = 0
            while True:
                try:
                    plan, dk_b, dv_b = next(steps)
                except StopIteration as stop:
                    dqs.append(stop.value)
                    break
                src = (r - step) % n
                add_block_grads(dks[src], dvs[src], plan, dk_b, dv_b)
                step += 1
        dq, dk, dv = (unshard(parts, 2, layout) for parts in (dqs, dks, dvs))
        return dq.to(qs[0].dtype), dk.to(ks[0].dtype), dv.to(vs[0].dtype), None, None, None, None, None


def simulate_ring(q, k, v, world_size: int, causal: bool = True, layout: str = "striped", scale: float | None = None, backend: str = "auto"):
    """Full-sequence attention computed as an N-rank ring would, in one process (differentiable)."""
    check_qkv(q, k, v)
    check_divisible(q.shape[2], world_size, layout)
    return _SimulatedRing.apply(q, k, v, world_size, causal, layout, scale, backend)
