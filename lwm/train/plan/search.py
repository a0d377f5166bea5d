"""Searches over fake runs: the smallest context-parallel size that fits a stage, and the longest
sequence that fits a mesh. Each probe is one planned step (memory.plan_step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from lwm.parallel.layout import check_divisible
from lwm.train.plan.devices import GIB, Device
from lwm.train.plan.memory import Mesh


def check_mesh(mesh: Mesh, n_heads: int, layout: str, mode: str, what: str) -> None:
    """What train.py's validate and the ring require of a mesh, with the values in the message."""
    for name in ("seq_len", "cp", "dp", "batch"):
        if getattr(mesh, name) < 1:
            raise ValueError(f"{what}: {name} must be >= 1, got {getattr(mesh, name)}")
    try:
        check_divisible(mesh.seq_len, mesh.cp, layout)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if mode == "ulysses" and n_heads % mesh.cp:
        raise ValueError(f"{what}: parallel.mode ulysses needs n_heads {n_heads} divisible by cp {mesh.cp}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def smallest_fitting_cp(
    mesh: Mesh, peak_of: Callable[[Mesh], int], device: Device, valid: Callable[[Mesh], bool]
) -> Mesh | None:
    """The first mesh of the same world with a larger cp (dp = world / cp) whose step fits; the
    sequences per rank follow dp (valid(m) says whether the stage can run on m at all)."""
    for cp in divisors(mesh.world):
        if cp <= mesh.cp:
            continue
        candidate = Mesh(mesh.seq_len, cp, mesh.world // cp, mesh.batch)
        if valid(candidate) and device.fits(peak_of(candidate)):
            return candidate
    return None


@dataclass
class Longest:
    cp: int
    dp: int
    longest: int | None  # tokens; None: not even one granule fits
    next_up: int  # the next length searched above it, which does not fit
    points: dict[int, int] = field(default_factory=dict)  # seq_len -> planned peak bytes (every probe)


def longest_sequence(cp: int, dp: int, peak_of: Callable[[Mesh], int], device: Device, granule: int) -> Longest:
    """The longest multiple of `granule` whose step fits on a (dp, cp) mesh. Memory grows about
    linearly with the length (flash attention, chunked loss): two probes predict the boundary,
    then probes walk to it until a length fits and the next one up does not."""
    points: dict[int, int] = {}

    def peak(n: int) -> int:
        s = n * granule
        if s not in points:
            points[s] = peak_of(Mesh(s, cp, dp))
        return points[s]

    def fits(n: int) -> bool:
        return n >= 1 and device.fits(peak(n))

    if not fits(1):
        return Longest(cp, dp, None, granule, points)
    a, b = 1, 4
    limit = (device.memory_gib * GIB - device.reserved_gib * GIB) / (1 + device.fragmentation)
    slope = (peak(b) - peak(a)) / (b - a)
    guess = max(1, int(a + (limit - peak(a)) / slope)) if slope > 0 else b
    lo, hi = (guess, None) if fits(guess) else (None, guess)  # fits(lo), not fits(hi)
    step = max(1, guess // 16)
    while lo is None:  # walk down from a guess that did not fit
        n = max(1, hi - step)
        lo, hi = (n, hi) if fits(n) else (None, n)
        step *= 2
    while hi is None:  # walk up from one that did
        n = lo + step
        lo, hi = (lo, n) if not fits(n) else (n, None)
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return Longest(cp, dp, lo * granule, hi * granule, points)
