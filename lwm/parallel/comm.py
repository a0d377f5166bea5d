"""The one place where ring attention talks to other processes.

A RingComm sends to the next rank of a group and receives from the previous one, asynchronously
(`batch_isend_irecv`), so the caller computes while the message is in flight.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch
import torch.distributed as dist


def group_size_and_rank(group=None) -> tuple[int, int]:
    """(world size, rank) of a group; a single process without torch.distributed is (1, 0)."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise RuntimeError("a process group was given but torch.distributed is not initialized")
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


class RingComm:
    def __init__(self, group=None, tag: int = 0):
        self.world_size, self.rank = group_size_and_rank(group)
        self.group, self.tag = group, tag
        if self.world_size > 1:
            g = group if group is not None else dist.group.WORLD
            self.send_to = dist.get_global_rank(g, (self.rank + 1) % self.world_size)
            self.recv_from = dist.get_global_rank(g, (self.rank - 1) % self.world_size)
        self._pending: list = []

    def send_recv(
        self, tensors: list[torch.Tensor], recv_buffers: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Start sending `tensors` to the next rank and receiving the previous rank's into buffers
        (new ones unless given); the buffers hold the data after `wait()`."""
        bufs = [torch.empty_like(t) for t in tensors] if recv_buffers is None else recv_buffers
        ops = [dist.P2POp(dist.isend, t, self.send_to, self.group, self.tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.recv_from, self.group, self.tag) for b in bufs]
        self._pending.extend(dist.batch_isend_irecv(ops))
        return bufs

    def wait(self) -> None:
        for work in self._pending:
            work.wait()
        self._pending = []


def all_gather_stack(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's x stacked in rank order: (...) -> (N, ...). One process: x[None]."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return x.unsqueeze(0)
    out = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
    dist.all_gather(list(out.unbind(0)), x.contiguous(), group=group)
    return out


def _first_rank(group) -> int:
    return dist.get_global_rank(group if group is not None else dist.group.WORLD, 0)


def broadcast_from_first(x: torch.Tensor, group=None) -> torch.Tensor:
    """The group's first rank's x on every rank, in place (sampling must agree across a group). x is on
    the group's compute device: an NCCL group carries no host tensors."""
    world, _ = group_size_and_rank(group)
    if world > 1:
        dist.broadcast(x, src=_first_rank(group), group=group)
    return x


class PeerFailure(RuntimeError):
    """Raised, in an `agree_on_failure` round, on the ranks that did not fail when another rank did."""


def agree_on_failure(error: BaseException | None, group, device) -> None:
    """A round in which the ranks of a group tell each other whether they failed, so that none goes on
    into a collective alone: if any rank failed, every rank raises (its own error, or a PeerFailure
    naming the ranks that failed and why). One MAX all-reduce of a flag on `device` (the group's
    compute device); the messages travel only after a failure. Every round is these same collectives,
    so a rank that failed before reaching the round the others wait in meets them in its next one."""
    world, _ = group_size_and_rank(group)
    if world > 1:
        flag = torch.tensor([error is not None], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if int(flag):  # a host sync, once per round
            messages = [None] * world
            mine = None if error is None else f"{type(error).__name__}: {error}"
            dist.all_gather_object(messages, mine, group=group)
            if error is None:
                failed = "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)
                raise PeerFailure(f"another rank of the group failed ({failed})")
    if error is not None:
        raise error


T = TypeVar("T")


def run_agreed(work: Callable[[], T], group, device) -> tuple[T | None, Exception | None]:
    """work() on every rank of a group, its failure agreed by the group -> (its result, None) when no
    rank failed, else (None, the error this rank records: its own, or a PeerFailure naming the ranks
    that failed). So one rank failing alone (before the group first talks inside work, or after its
    last collective) fails the item on every rank, and the next item starts together. One
    agree_on_failure round per call; it meets the ranks still inside work at their own round
    (Generator._meet), where they raise PeerFailure instead of waiting for the failed rank in a
    collective. A rank failing inside a collective is not covered: the others wait there until the
    process group's timeout."""
    result, error = None, None
    try:
        result = work()
    except PeerFailure as e:  # the round was held inside work: another rank failed before it
        return None, e
    except Exception as e:  # out of memory, a bad prompt ...: the group hears of it below
        error = e
    try:
        agree_on_failure(error, group, device)
    except Exception as e:
        return None, e
    return result, None


def broadcast_object_from_first(obj, group=None):
    """The group's first rank's (picklable) object on every rank."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=_first_rank(group), group=group)
    return box[0]


class _AllToAll(torch.autograd.Function):
    """Chunk i of dim 0 goes to rank i; chunk i of the result came from rank i. Its own inverse."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad.contiguous(), ctx.group), None


def all_to_all(x: torch.Tensor, group=None) -> torch.Tensor:
    """Differentiable all-to-all over dim 0 (split into world-size equal chunks)."""
    return _AllToAll.apply(x, group)
