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
    """One checkpointed forward's attention results, in call order, read back in the same order."""

    def __init__(self):
        self.results: list = []
        self.read = 0

    def put(self, result) -> None:
        store = _STORE.get()
        self.results.append(result if store is None else _each(store.keep, result))

    def take(self):
        if self.read >= len(self.results):
            raise RuntimeError(
                f"a checkpointed block's recompute called its attention {self.read + 1} times, its forward "
                f"{len(self.results)}: keep_attention needs the recompute to repeat the forward's calls"
            )
        result = self.results[self.read]
        self.results[self.read] = None  # backward holds what it needs from here on
        self.read += 1
        return _each(lambda t: t if isinstance(t, torch.Tensor) else t.back(), result)


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
