"""Ring attention: exact attention over a sequence split across the ranks of a group.

Each rank keeps its queries; K/V blocks (Hkv heads, never expanded) travel around the ring, the
next one in flight while the current one is computed. What each step computes, forward and
backward, is ring_steps.py's (the layout's block plan, cut to a packed sequence's documents: one
variable-length call per step on CUDA flash, elsewhere the documents' rectangles one by one; on
CPU the flash kernel per piece is the fastest exact path: its varlen kernel does not exist, and a
masked dense call would compute every entry). Partial results merge in fp32 from (out,
logsumexp). Backward recomputes each block from the final output and logsumexp; dQ stays home,
dK/dV (fp32) travel the ring with the K/V they belong to and arrive back at their owner after the
last step.

The step loops (`ring_forward`, `ring_backward`) take the K/V blocks as an iterable, so the same
code runs over a real ring (`ring_attention`) or over N virtual ranks in one process
(`simulate_ring`, used by tests and the decomposition benchmark).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from lwm.model.documents import Documents, check_segment_ids
from lwm.parallel.comm import RingComm, all_gather_stack
from lwm.parallel.kept import recording, replaying
from lwm.parallel.layout import check_divisible, check_layout, shard, unshard
from lwm.parallel.merge import Sums, acc_dtype
from lwm.parallel.pieces import step_planner
from lwm.parallel.ring_steps import Finals, RingSteps, ring_steps


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


def ring_forward(q, kv_blocks: Iterable[tuple], steps: RingSteps, scale):
    """-> out (q's dtype), lse (fp32; fp64 for fp64). kv_blocks yields the (k, v) of step 0, 1, ..., N-1."""
    sums = Sums(q)
    for step, (k, v) in enumerate(kv_blocks):
        for p, o, l, spans in steps(step).forward(q, k, v, scale):
            sums.add(p, o, l, spans)
    return sums.result()


def new_dq(q: torch.Tensor) -> torch.Tensor:
    """The fp32 (or fp64) dq that ring_backward adds each step's gradient into."""
    return torch.zeros(q.shape, dtype=acc_dtype(q.dtype), device=q.device)


def ring_backward(dout, q, out, lse, kv_blocks, steps: RingSteps, scale, dq: torch.Tensor) -> Iterator:
    """Adds the queries' gradient into `dq` (new_dq) and yields, per step, [(piece, dk, dv)]: the gradients
    of that step's K/V block, rows piece.k (empty for a skipped block)."""
    finals = Finals(dout, q, out, lse)
    for step, (k, v) in enumerate(kv_blocks):
        grads = []
        for p, dq_b, dk_b, dv_b in steps(step).backward(finals, k, v, scale):
            rows = p.rows(dq)
            rows += dq_b  # in place, also for a whole-block part
            del dq_b, rows
            grads.append((p, dk_b, dv_b))
        yield grads


def add_block_grads(dk, dv, grads) -> None:
    for p, dk_b, dv_b in grads:
        dk[p.b, :, p.k] += dk_b
        dv[p.b, :, p.k] += dv_b


def ring_blocks(comm: RingComm, *tensors: torch.Tensor) -> Iterator[tuple]:
    """Yields the tensors (k, v) of each step; the next set is sent/received while the caller
    computes. Two sets of receive buffers alternate (a set is reused only after its send has
    completed)."""
    if comm.world_size > 1:
        tensors = tuple(t.contiguous() for t in tensors)  # what travels must be dense
    buffers = [[torch.empty_like(t) for t in tensors] for _ in range(2)] if comm.world_size > 1 else []
    for step in range(comm.world_size):
        last = step == comm.world_size - 1
        if not last:
            nxt = comm.send_recv(list(tensors), buffers[step % 2])
        yield tensors
        if not last:
            comm.wait()
            tensors = tuple(nxt)


def as_documents(segment_ids, q: torch.Tensor, gather=None) -> Documents | None:
    """None, the batch's Documents, or Documents read from ids (B, L) (the whole sequence's after
    `gather`): a tensor costs one host transfer per call, Documents none."""
    if segment_ids is None:
        return None
    if isinstance(segment_ids, Documents):
        if segment_ids.batch != q.shape[0]:
            raise ValueError(f"documents of batch {segment_ids.batch} for queries of batch {q.shape[0]}")
        return segment_ids
    check_segment_ids(segment_ids, q.shape[0], q.shape[2])
    ids = segment_ids.to(q.device).contiguous()
    return Documents(ids if gather is None else gather(ids), q.shape[2])


# ----------------------------------------------------------------------------------------- real ring


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout, scale, backend, documents):
        if (kept := replaying()) is not None:  # a checkpointed block's recompute: what its forward computed
            out, lse = kept.take()
            ctx.save_for_backward(q, k, v, out, lse)  # as the forward saved them: backward reads these
            return out
        comm = RingComm(group)
        planner = step_planner(layout, comm.rank, comm.world_size, q.shape[2], causal, documents)
        steps = ring_steps(planner, q, backend)
        out, lse = ring_forward(q, ring_blocks(comm, k, v), steps, scale)
        if (kept := recording()) is not None:
            kept.put((out.detach(), lse))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (group, steps, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, steps, scale = ctx.args
        kv_comm, dkv_comm = RingComm(group, tag=0), RingComm(group, tag=1)
        dq = new_dq(q)
        grads_by_step = ring_backward(dout.contiguous(), q, out, lse, ring_blocks(kv_comm, k, v), steps, scale, dq)
        # Step 0's block is this rank's own: its dK/dV stay home. The dK/dV of the block of step
        # s >= 1 travel: started here at step 1 (fp32), passed on with each rank's contribution,
        # and after the last step received by the owner (N-1 hops).
        travelling = None
        own = [torch.zeros(t.shape, dtype=acc_dtype(t.dtype), device=t.device) for t in (k, v)]
        for step, grads in enumerate(grads_by_step):
            if step == 0:
                add_block_grads(*own, grads)
                continue
            if travelling is None:
                travelling = [torch.zeros_like(t) for t in own]
            else:
                dkv_comm.wait()
            add_block_grads(*travelling, grads)
            del grads
            travelling = dkv_comm.send_recv(travelling)
        if travelling is not None:
            dkv_comm.wait()  # the dK/dV of our own block, from the other ranks
            own[0] += travelling[0]
            own[1] += travelling[1]
        dk, dv = own
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def ring_attention(
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
    """Exact attention for this rank's slice. q (B, Hq, L, D), k/v (B, Hkv, L, D), the rank's slice
    of the sequence in `layout`; returns (B, Hq, L, D). segment_ids: the batch's Documents, or
    (B, L) the rank's slice of the sequence's document ids (same layout; gathered and read on the
    host at each call); a query attends only keys of its own document.
    group=None: the default process group (a single process without torch.distributed is a group
    of one)."""
    check_qkv(q, k, v)
    check_layout(layout)
    if layout == "zigzag" and causal and q.shape[2] % 2:
        raise ValueError(f"zigzag needs an even local length (two chunks per rank), got {q.shape[2]}")
    gather = lambda ids: unshard(list(all_gather_stack(ids, group)), 1, layout)  # noqa: E731  (B, L) -> (B, S)
    documents = as_documents(segment_ids, q, gather)
    return _RingAttention.apply(q, k, v, group, causal, layout, scale, backend, documents)


# ----------------------------------------------------------------------------------------- virtual ring


class _SimulatedRing(torch.autograd.Function):
    """All N ranks of a ring in one process: same step loops, kernels and merges, no communication."""

    @staticmethod
    def forward(ctx, q, k, v, world_size, causal, layout, scale, backend, documents):
        n = world_size
        qs, ks, vs = ([shard(t, 2, r, n, layout) for r in range(n)] for t in (q, k, v))
        if (kept := replaying()) is not None:  # a checkpointed block's recompute: what its forward computed
            outs, lses = kept.take()
            ctx.save_for_backward(*qs, *ks, *vs, *outs, *lses)  # as the forward saved them
            return unshard(outs, 2, layout)
        steps = [
            ring_steps(step_planner(layout, r, n, qs[r].shape[2], causal, documents), qs[r], backend) for r in range(n)
        ]
        results = []
        for r in range(n):
            blocks = ((ks[(r - s) % n], vs[(r - s) % n]) for s in range(n))
            results.append(ring_forward(qs[r], blocks, steps[r], scale))
        outs, lses = [o for o, _ in results], [l for _, l in results]
        if (kept := recording()) is not None:
            kept.put(([o.detach() for o in outs], lses))
        ctx.save_for_backward(*qs, *ks, *vs, *outs, *lses)
        ctx.args = (n, steps, layout, scale)
        return unshard(outs, 2, layout)

    @staticmethod
    def backward(ctx, dout):
        n, steps, layout, scale = ctx.args
        saved = ctx.saved_tensors  # unpacked once: checkpointing allows one read
        qs, ks, vs, outs, lses = (saved[i * n : (i + 1) * n] for i in range(5))
        dks = [torch.zeros(k.shape, dtype=acc_dtype(k.dtype), device=k.device) for k in ks]
        dvs = [torch.zeros(v.shape, dtype=acc_dtype(v.dtype), device=v.device) for v in vs]
        dqs = []
        for r in range(n):
            kv_blocks = ((ks[(r - s) % n], vs[(r - s) % n]) for s in range(n))
            dqs.append(new_dq(qs[r]))
            dout_r = shard(dout, 2, r, n, layout).contiguous()
            grads_by_step = ring_backward(dout_r, qs[r], outs[r], lses[r], kv_blocks, steps[r], scale, dqs[r])
            for step, grads in enumerate(grads_by_step):
                src = (r - step) % n
                add_block_grads(dks[src], dvs[src], grads)
        dq, dk, dv = (unshard(parts, 2, layout) for parts in (dqs, dks, dvs))
        return dq.to(qs[0].dtype), dk.to(ks[0].dtype), dv.to(vs[0].dtype), None, None, None, None, None, None


def simulate_ring(
    q,
    k,
    v,
    world_size: int,
    causal: bool = True,
    layout: str = "striped",
    scale: float | None = None,
    segment_ids: torch.Tensor | Documents | None = None,
    backend: str = "auto",
):
    """Full-sequence attention computed as an N-rank ring would, in one process (differentiable).
    segment_ids: the full sequence's (B, S) document ids, or its Documents."""
    check_qkv(q, k, v)
    check_divisible(q.shape[2], world_size, layout)
    documents = as_documents(segment_ids, q)
    return _SimulatedRing.apply(q, k, v, world_size, causal, layout, scale, backend, documents)
