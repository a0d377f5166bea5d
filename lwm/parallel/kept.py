"""Attention kept through a checkpointed block's recompute (parallel.keep_attention).

A checkpointed block (torch.utils.checkpoint, non-reentrant) keeps only its input and runs its forward
again in backward to rebuild what backward reads. The attention's part of that rebuild is its output and
logsumexp, and running it again is the ring's whole forward (every step's kernels and its communication).
With keep_attention the block keeps them instead: its checkpoint gets a pair of contexts (checkpoint's
`context_fn`), one per forward it runs,

    record   around the forward: each attention call adds its (out, lse) to the forward's Kept
    replay   around the recompute: each attention call, in the same order, takes them back and computes
             nothing; it saves the recomputed q, k, v with them exactly as its forward did

so backward reads the same tensors, bitwise, and the recompute runs the norms, projections, RoPE and MLP
but no attention forward. A Kept lives as long as its forward's recompute context, so the graph holds it
and drops it with the graph. Memory: each block's attention output (and logsumexp) until its backward,
on the device, or, under activation offload, in host memory with the block's input: the offload is the
store (`storing`) while the block's forward runs, and the kept tensors go through its copy engine.
The attention functions (lwm.parallel.ring's autograd functions) ask `recording()` and `replaying()`.

Under head groups (model.attn_head_groups) each group is a checkpoint of its own inside the block's, and its
attention runs three times without keeping: the block's forward, the block's recompute (which runs each
group's forward again) and the group's recompute in backward. `group_contexts` (each group checkpoint's
`context_fn`) makes the last a replay too: torch recomputes a group with the contexts of the group's
checkpoint in the block's first forward, so there each result is kept for two reads, the block's recompute
and the group's, which follows it at once: one attention forward in all.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

import torch

_MODE: ContextVar[tuple[str, Kept] | None] = ContextVar("lwm_kept_attention", default=None)
_STORE: ContextVar = ContextVar("lwm_kept_store", default=None)  # where kept tensors wait (None: on the device)


class Store(Protocol):
    """Holds a kept tensor until its recompute: keep(t) returns a handle whose back() gives it again."""

    def keep(self, t: torch.Tensor) -> Any: ...


def _each(fn, result):
    """fn over the tensors (or handles) of a kept result: a tuple or list of them, or of lists of them."""
    if isinstance(result, (tuple, list)):
        return type(result)(_each(fn, r) for r in result)
    return fn(result)


class Kept:
    """One checkpointed forward's attention results, in call order, read back in the same order (a result a
    head group reads again in its own recompute stays, on the device, until that read)."""

    def __init__(self):
        self.results: list = []
        self.reads: list[int] = []  # reads left of each result
        self.read = 0

    def put(self, result, reads: int = 1) -> int:
        """Keep a result for `reads` replays; its index."""
        store = _STORE.get()
        self.results.append(result if store is None else _each(store.keep, result))
        self.reads.append(reads)
        return len(self.results) - 1

    def take(self):
        if self.read >= len(self.results):
            raise RuntimeError(
                f"a checkpointed block's recompute called its attention {self.read + 1} times, its forward "
                f"{len(self.results)}: keep_attention needs the recompute to repeat the forward's calls"
            )
        self.read += 1
        return self.take_at(self.read - 1)

    def take_at(self, i: int):
        result = _each(lambda t: t if isinstance(t, torch.Tensor) else t.back(), self.results[i])
        self.reads[i] -= 1
        # backward holds what it needs from the last read on; until then the tensors wait on the device
        self.results[i] = result if self.reads[i] else None
        return result


class _GroupKept:
    """A head group's share of its block's Kept: the results its forward put there, read a second time by
    the group's own recompute."""

    def __init__(self):
        self.block: Kept | None = None
        self.indices: list[int] = []
        self.read = 0

    def put(self, result) -> None:  # the block's forward, inside the group: kept for two reads
        self.indices.append(self.block.put(result, reads=2))

    def take(self):  # the group's recompute, after the block's recompute read them once
        if self.read >= len(self.indices):
            raise RuntimeError(
                f"a head group's recompute called its attention {self.read + 1} times, its forward "
                f"{len(self.indices)}: keep_attention needs the recompute to repeat the forward's calls"
            )
        self.read += 1
        return self.block.take_at(self.indices[self.read - 1])


class _Mode:
    def __init__(self, mode: str, kept: Kept):
        self.mode, self.kept = mode, kept

    def __enter__(self):
        # a forward without grad (evaluation) is never recomputed: it keeps nothing
        on = self.mode == "replay" or torch.is_grad_enabled()
        self.token = _MODE.set((self.mode, self.kept) if on else None)
        return self

    def __exit__(self, *exc) -> None:
        _MODE.reset(self.token)


def contexts() -> tuple[_Mode, _Mode]:
    """torch.utils.checkpoint's context_fn: (around the forward, around its recompute), sharing one Kept."""
    kept = Kept()
    return _Mode("record", kept), _Mode("replay", kept)


class _GroupForward:
    """Around a head group's forward: in its block's forward, the group's attention results go to the block's
    Kept through the group's share (read twice); anywhere else (the block's recompute replays) as it is."""

    def __init__(self, share: _GroupKept):
        self.share = share

    def __enter__(self):
        mode = _MODE.get()
        if mode is not None and mode[0] == "record":
            self.share.block = mode[1]
            mode = ("record", self.share)
        self.token = _MODE.set(mode)
        return self

    def __exit__(self, *exc) -> None:
        _MODE.reset(self.token)


def group_contexts() -> tuple[_GroupForward, _Mode]:
    """A head group checkpoint's context_fn inside a block that keeps its attention: (around the group's
    forward, around its recompute, which replays what the block's forward kept a second time)."""
    share = _GroupKept()
    return _GroupForward(share), _Mode("replay", share)


def kept_count(keep_attention: bool | int, blocks: int) -> int:
    """How many of `blocks` keep their attention: True all, False none, a number that many (at most all)."""
    if isinstance(keep_attention, bool):
        return blocks if keep_attention else 0
    if not 0 <= keep_attention <= blocks:
        raise ValueError(f"keep_attention: {keep_attention} blocks to keep their attention, the model has {blocks}")
    return keep_attention


@contextmanager
def storing(store: Store):
    """Kept tensors of the attention calls inside go to `store` (activation offload's, around a block)."""
    token = _STORE.set(store)
    try:
        yield
    finally:
        _STORE.reset(token)


def recording() -> Kept | None:
    mode = _MODE.get()
    return mode[1] if mode is not None and mode[0] == "record" else None


def replaying() -> Kept | None:
    mode = _MODE.get()
    return mode[1] if mode is not None and mode[0] == "replay" else None
