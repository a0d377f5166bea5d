"""CPU stand-ins of the CUDA streams, events and pinned allocation that lwm.parallel.offload's
CudaCopyEngine takes as parameters, completing copies late so that a missing wait shows.

A copy issued on a side stream (inside `use_stream`) does not happen when it is issued: its
destination holds NaN until an event recorded after it on that stream is waited on (by a stream's
wait_event or the event's synchronize), and it then copies its source as the source is at that
moment; a source freed by then (its memory the caching allocator's to hand out again) raises. A
stream runs its copies in order: waiting on an event ends every copy before it too.

The contract checked, stricter than a GPU's stream order and the one offload keeps: a host buffer
is touched by a new copy only after every copy that touched it has been waited on; every copy
moves a pinned host buffer (allocated with pin_memory=True) and is asked non_blocking.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CopyContractError(RuntimeError):
    """A copy a GPU would run wrongly: a host buffer reused while a copy on it is in flight, a
    source freed before its copy ended, an unpinned host side, or a blocking copy."""


class _Copy:
    """The source is held weakly: a source the caller drops before the copy ended is memory the
    caching allocator could hand out again, so finishing such a copy raises."""

    def __init__(self, dst: torch.Tensor, src: torch.Tensor):
        self.dst, self.source, self.done = dst, weakref.ref(src), False
        self.storages = {dst.untyped_storage().data_ptr(), src.untyped_storage().data_ptr()}

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        src = self.source()
        if src is None:
            raise CopyContractError("a copy's source was freed before the copy ended")
        with torch.no_grad():
            self.dst.copy_(src)  # the source as it is now, not as it was when issued


class StandInEvent:
    def __init__(self, copies: list[_Copy]):
        self.copies = copies  # the stream's copies issued before this event

    def synchronize(self) -> None:
        for copy in self.copies:
            copy.finish()


class StandInStream:
    def __init__(self, cuda: StandInCuda):
        self.cuda = cuda
        self.copies: list[_Copy] = []

    def record_event(self, event=None) -> StandInEvent:
        return StandInEvent(list(self.copies))

    def wait_event(self, event: StandInEvent) -> None:
        self.cuda.waits += 1
        event.synchronize()


class StandInCuda:
    """One fake GPU: its compute stream, the side streams made, the pinned buffers, the copies."""

    def __init__(self):
        self.compute = StandInStream(self)
        self.pinned: set[int] = set()  # data pointers of buffers allocated with pin_memory=True
        self.copies: list[_Copy] = []
        self.waits = 0
        self.non_blocking: list[bool] = []

    # the CudaCopyEngine parameters
    def new_stream(self, device) -> StandInStream:
        return StandInStream(self)

    def current_stream(self, device) -> StandInStream:
        return self.compute

    @contextmanager
    def use_stream(self, stream: StandInStream):
        with _LateCopies(self, stream):
            yield

    def empty(self, shape, dtype, device, pin_memory: bool = False) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        if pin_memory:
            self.pinned.add(t.untyped_storage().data_ptr())
        return t

    def in_flight(self) -> list[_Copy]:
        return [c for c in self.copies if not c.done]


class _LateCopies(TorchDispatchMode):
    def __init__(self, cuda: StandInCuda, stream: StandInStream):
        super().__init__()
        self.cuda, self.stream = cuda, stream

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.ops.aten.copy_.default:
            return func(*args, **kwargs)
        dst, src = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        self.cuda.non_blocking.append(non_blocking)
        if not non_blocking:
            raise CopyContractError("a copy on the side stream was not asked non_blocking")
        ptrs = {t.untyped_storage().data_ptr() for t in (dst, src)}
        if not ptrs & self.cuda.pinned:
            raise CopyContractError("a copy on the side stream has no pinned host side")
        for copy in self.cuda.in_flight():
            if copy.storages & ptrs & self.cuda.pinned:
                raise CopyContractError("a host buffer was reused while a copy on it was in flight")
        copy = _Copy(dst, src)
        self.cuda.copies.append(copy)
        self.stream.copies.append(copy)
        dst.fill_(float("nan"))  # garbage until the copy's event is waited on
        return dst
