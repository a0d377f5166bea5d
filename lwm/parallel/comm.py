"""The one place where ring attention talks to other processes.

A RingComm sends to the next rank of a group and receives from the previous one, asynchronously
(`batch_isend_irecv`), so the caller computes while the message is in flight.
"""

from __future__ import annotations

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


def broadcast_from_first(value: int, group=None) -> int:
    """The group's first rank's value on every rank (sampling must agree across a group)."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.broadcast(t, src=dist.get_global_rank(group if group is not None else dist.group.WORLD, 0), group=group)
    return int(t)


def broadcast_object_from_first(obj, group=None):
    """The group's first rank's (picklable) object on every rank."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(
        box, src=dist.get_global_rank(group if group is not None else dist.group.WORLD, 0), group=group
    )
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
