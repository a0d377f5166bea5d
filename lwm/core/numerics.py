"""How this process's CPU computes with floats, set by a training run before its first step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lwm.ranks import say


def flush_denormals(on: bool) -> bool:
    """Compute floats below the normal range (under 1.2e-38 in fp32) as zero on the CPU (torch.set_flush_denormal,
    x86's FTZ and DAZ modes), or not. As a model fits its data, many gradients and softmax probabilities fall that
    low, and a CPU's arithmetic on them is many times slower: the text-to-video demo's step at step 300 took 1.8x
    as long with them kept. The mode is each thread's, and torch's worker threads take it from the thread that
    starts them: set it before the process's first parallel op. Returns whether they are flushed; a CPU that
    cannot is said so."""
    flushed = torch.set_flush_denormal(on) and on  # torch returns whether the CPU can, either way
    if on and not flushed:
        say("trainer.flush_denormal: this CPU cannot flush denormal floats; they are computed as they are")
    return flushed


def denormals_flushed_now() -> bool:
    """Whether this thread computes denormal floats as zero."""
    return (torch.tensor([1e-40]) * 1.0).item() == 0.0


@contextmanager
def denormals(on: bool) -> Iterator[bool]:
    """flush_denormals(on) inside, this thread's mode as it was after: a caller that trains in its own process
    (a notebook, a test) computes as before once training returns."""
    before = denormals_flushed_now()
    try:
        yield flush_denormals(on)
    finally:
        torch.set_flush_denormal(before)
