"""Searches over fake runs: the smallest context-parallel size that fits a stage, and the longest
sequence that fits a mesh. Each probe is one planned step (memory.plan_step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from lwm.core.config import ParallelConfig, StageConfig
from lwm.model import ModelConfig
from lwm.plan import bounds
from lwm.plan.devices import GIB, Device
from lwm.plan.memory import Mesh, mesh_dims


def check_mesh(mesh: Mesh, model: ModelConfig, parallel: ParallelConfig, what: str) -> None:
    """What train.py's validate and the attention require of a mesh (lwm.parallel.ParallelDims: the
    heads for Ulysses, the length for the layout), with the values in the message."""
    for name in ("seq_len", "cp", "dp", "batch", "tp"):
        if getattr(mesh, name) < 1:
            raise ValueError(f"{what}: {name} must be >= 1, got {getattr(mesh, name)}")
    try:
        dims = mesh_dims(mesh, parallel)
        dims.check_model(model.n_heads, model.n_kv_heads, model.attn_head_groups)
        dims.check_seq(mesh.seq_len, parallel.layout)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def stage_dp(stage: StageConfig, world: int, parallel: ParallelConfig) -> int:
    """dp of `stage` on `world` GPUs (world = cp x dp x tp, as train.py's validate); raises naming the
    stage and the values."""
    try:
        return parallel.dims(world, stage.cp).dp
    except ValueError as e:
        raise ValueError(f"stage {stage.name!r}: {e}") from None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tokens_per_rank(mesh: Mesh) -> int:
    return mesh.batch * mesh.seq_len // mesh.cp


@dataclass
class CpSearch:
    """A larger cp for a mesh that does not fit: `fits` is the smallest that does (None: none),
    `helps` the cps searched (valid, and fewer tokens per rank), `peaks` cp -> planned peak of
    every probe."""

    fits: Mesh | None
    helps: list[int]
    peaks: dict[int, int] = field(default_factory=dict)


def smallest_fitting_cp(
    mesh: Mesh, mesh_for: Callable[[int], Mesh | None], peak_of: Callable[[Mesh], int], device: Device
) -> CpSearch:
    """The smallest cp above mesh.cp, of the same world and tp, whose step fits. mesh_for(cp) is the
    stage's mesh at that cp (dp = world / (cp x tp), its sequences per rank following dp), or None where
    the stage cannot run. Only meshes with fewer tokens per rank than `mesh` can fit where it does
    not (parameters and optimizer state are sharded over the whole world at every cp); among them
    the peak falls as cp grows, so a binary search finds the boundary: the largest cp first (if it
    does not fit, none does), then halves. Fewer probes, and the cheapest ones (short slices)."""
    helps = []
    for cp in divisors(mesh.world // mesh.tp):
        candidate = mesh_for(cp) if cp > mesh.cp else None
        if candidate is not None and tokens_per_rank(candidate) < tokens_per_rank(mesh):
            helps.append(candidate)
    found = CpSearch(None, [m.cp for m in helps])

    def fits(m: Mesh) -> bool:
        found.peaks[m.cp] = peak_of(m)
        return device.fits(found.peaks[m.cp])

    if not helps or not fits(helps[-1]):
        return found
    lo, hi = -1, len(helps) - 1  # helps[hi] fits; helps[lo] does not (-1: mesh itself)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(helps[mid]) else (mid, hi)
    found.fits = helps[hi]
    return found


def stage_meshes(
    stage: StageConfig, world: int, model: ModelConfig, parallel: ParallelConfig
) -> Callable[[int], Mesh | None]:
    """cp -> the stage's mesh on `world` GPUs at that cp and the run's tp (its sequences per rank
    following dp), or None where the stage cannot run so (world, global batch or layout)."""

    def mesh_for(cp: int) -> Mesh | None:
        if world % (cp * parallel.tp):
            return None
        dp = world // (cp * parallel.tp)
        try:
            mesh = Mesh(stage.seq_len, cp, dp, stage.per_rank_batch(dp), parallel.tp)
            check_mesh(mesh, model, parallel, stage.name)
            bounds.check_step(mesh, model, stage.name)  # a cp the planner cannot plan is not searched
        except ValueError:
            return None
        return mesh

    return mesh_for


def no_fit(mesh: Mesh, search: CpSearch) -> tuple[str, str]:
    """(a short verdict, the reason in full) for a mesh that does not fit."""
    if search.fits is not None:
        m = search.fits
        return f"needs cp {m.cp} x dp {m.dp}", f"the smallest cp that fits is {m.cp} (dp {m.dp}, {m.batch} per rank)"
    at_tp = f" at tp {mesh.tp}" if mesh.tp > 1 else ""
    short = f"no cp of {mesh.world} GPUs fits{at_tp}"
    if search.helps:
        return short, f"{short} (the largest, cp {search.helps[-1]}, does not)"
    if mesh.cp * mesh.tp == mesh.world:
        return short, f"{short} (cp {mesh.cp}{at_tp} is already all of them)"
    return short, (
        f"{short}: every cp that can run the stage puts {tokens_per_rank(mesh)} tokens "
        f"on each rank (its global batch follows dp); fewer need more GPUs, or gradient accumulation, "
        "which this project does not have"
    )


@dataclass
class Longest:
    cp: int
    dp: int
    longest: int | None  # tokens; None: not even one granule fits
    next_up: int | None  # the next length searched above it, which does not fit; None: the planner's bound fits
    points: dict[int, int] = field(default_factory=dict)  # seq_len -> planned peak bytes (every probe)
    tp: int = 1


def longest_sequence(
    cp: int,
    dp: int,
    peak_of: Callable[[Mesh], int],
    device: Device,
    granule: int,
    tp: int = 1,
    host_fits: Callable[[Mesh], bool] | None = None,
    ceiling: int | None = None,
) -> Longest:
    """The longest multiple of `granule` whose step fits on a (dp, cp, tp) mesh. The peak is flat while
    the optimizer step sets it (short lengths), then grows about linearly with the length (flash
    attention, chunked loss). Bracket: extrapolate along the line through the two longest lengths
    that fit, at most 8 times the last, until one does not; narrow: false position between the
    longest that fits and the shortest that does not, bisecting when the same end moves twice.
    Ends when a length fits and the next one up does not. host_fits(mesh), asked after its peak is
    planned: whether the node's host memory holds the mesh's offloaded tensors too (None: yes).
    ceiling: the longest length planned (lwm.plan.bounds); where it fits, it is the answer."""
    points: dict[int, int] = {}
    top = ceiling // granule if ceiling else None

    def peak(n: int) -> int:
        s = n * granule
        if s not in points:
            points[s] = peak_of(Mesh(s, cp, dp, 1, tp))
        return points[s]

    def fits(n: int) -> bool:
        return device.fits(peak(n)) and (host_fits is None or host_fits(Mesh(n * granule, cp, dp, 1, tp)))

    if not fits(1):
        return Longest(cp, dp, None, granule, points, tp)
    limit = (device.memory_gib * GIB - device.reserved_gib * GIB) / (1 + device.fragmentation)

    def toward_limit(a: int, b: int) -> float:
        """Where the line through (a, peak a) and (b, peak b) reaches the limit (inf when flat)."""
        slope = (peak(b) - peak(a)) / (b - a)
        return a + (limit - peak(a)) / slope if slope > 0 else float("inf")

    below, lo, hi, n = 1, 1, None, 4 if top is None else min(4, top)
    while hi is None:  # bracket
        if n == lo:  # the ceiling fits: nothing longer is planned
            return Longest(cp, dp, lo * granule, None, points, tp)
        if fits(n):
            below, lo = lo, n
            n = int(min(toward_limit(below, lo), 8 * lo))
            n = max(n, lo + max(1, lo // 4))
            n = n if top is None else min(n, top)
        else:
            hi = n
    moved = 0  # +k: lo moved k times running, -k: hi did
    while hi - lo > 1:  # narrow
        guess = toward_limit(lo, hi)  # inf where the device's peak is flat (the host's limit binds)
        n = (lo + hi) // 2 if abs(moved) >= 2 or guess == float("inf") else int(guess)
        n = min(max(n, lo + 1), hi - 1)
        if fits(n):
            lo, moved = n, max(moved, 0) + 1
        else:
            hi, moved = n, min(moved, 0) - 1
        if abs(moved) > 2:
            moved = 0
    return Longest(cp, dp, lo * granule, hi * granule, points, tp)
