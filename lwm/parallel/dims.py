"""The sizes of every kind of parallelism, checked together.

world = dp x cp x tp. Ranks are numbered with tp innermost (a tensor-parallel group sits on
neighbouring GPUs, inside one node), then cp, then dp:

    rank = (dp_rank * cp + cp_rank) * tp + tp_rank,   cp_rank = ring_rank * ulysses + ulysses_rank

dp  data parallel: different sequences; FSDP2 shards parameters over dp x cp.
cp  context parallel: one sequence's tokens split over cp ranks (mode ring, ulysses or hybrid).
tp  tensor parallel: each block's attention heads and MLP columns split over tp ranks, which see the
    same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from lwm.parallel.layout import check_divisible

MODES = ("ring", "ulysses", "hybrid")


@dataclass(frozen=True)
class ParallelDims:
    dp: int = 1
    cp: int = 1
    tp: int = 1
    mode: str = "ring"  # how the cp ranks attend: ring | ulysses | hybrid
    ulysses: int = 1  # hybrid: ranks per all-to-all group (divides cp); the ring has cp / ulysses

    def __post_init__(self) -> None:
        for name in ("dp", "cp", "tp", "ulysses"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"parallel {name} must be a positive integer, got {value!r}")
        if self.mode not in MODES:
            raise ValueError(f"parallel mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "hybrid":
            if self.cp % self.ulysses:
                raise ValueError(f"hybrid mode: ulysses {self.ulysses} must divide cp {self.cp}")
        elif self.ulysses != 1:
            raise ValueError(f"ulysses {self.ulysses} is hybrid mode's all-to-all size; mode is {self.mode!r}")

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp

    @property
    def ring(self) -> int:
        """Ranks around the ring (1 for pure Ulysses)."""
        return {"ring": self.cp, "ulysses": 1, "hybrid": self.cp // self.ulysses}[self.mode]

    @property
    def all_to_all(self) -> int:
        """Ranks in one Ulysses all-to-all (1 for pure ring)."""
        return {"ring": 1, "ulysses": self.cp, "hybrid": self.ulysses}[self.mode]

    @property
    def data_ulysses(self) -> int:
        """The data layout's Ulysses size: hybrid cuts each ring piece contiguously over its
        all-to-all group; pure Ulysses takes the layout's cut of the whole sequence."""
        return self.ulysses if self.mode == "hybrid" else 1

    def describe(self) -> str:
        """e.g. "cp 4 (hybrid: ulysses 2 x ring 2), tp 2, dp 1"; a size of 1 says no more than "cp 1"."""
        mode = f"hybrid: ulysses {self.ulysses} x ring {self.ring}" if self.mode == "hybrid" else self.mode
        return (
            f"cp {self.cp}"
            + (f" ({mode})" if self.cp > 1 else "")
            + (f", tp {self.tp}" if self.tp > 1 else "")
            + f", dp {self.dp}"
        )

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp_rank, cp_rank, tp_rank) of a global rank."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside the world of {self.world} ({self})")
        rest, tp_rank = divmod(rank, self.tp)
        dp_rank, cp_rank = divmod(rest, self.cp)
        return dp_rank, cp_rank, tp_rank

    def check_world(self, world: int) -> None:
        if world != self.world:
            raise ValueError(f"world size {world} != dp {self.dp} x cp {self.cp} x tp {self.tp} = {self.world}")

    def check_model(self, n_heads: int, n_kv_heads: int, head_groups: int = 1) -> None:
        """tp splits the q and kv heads; the all-to-all splits each tp rank's q heads (its kv heads
        are repeated where they do not split, lwm.parallel.ulysses.replicate_kv), one head group's
        at a time under head-tiled attention (model.attn_head_groups)."""
        if n_heads % self.tp or n_kv_heads % self.tp:
            raise ValueError(f"tp {self.tp} must divide the q heads ({n_heads}) and the kv heads ({n_kv_heads})")
        if head_groups > 1 and self.tp > 1:
            # The groups slice the projections' weights, which tensor parallelism has already split.
            raise ValueError(f"model.attn_head_groups {head_groups} needs tp 1, got tp {self.tp}")
        local = n_heads // self.tp // head_groups
        if local % self.all_to_all:
            groups = f" in each of {head_groups} head groups" if head_groups > 1 else " per tp rank"
            raise ValueError(
                f"mode {self.mode}: the {local} q heads{groups} (heads {n_heads} / tp {self.tp}"
                f"{f' / {head_groups}' if head_groups > 1 else ''}) are not divisible by the Ulysses size {self.all_to_all}"
            )

    def check_seq(self, seq_len: int, layout: str) -> None:
        check_divisible(seq_len, self.cp, layout, self.data_ulysses)

    @classmethod
    def from_world(cls, world: int, cp: int, tp: int = 1, mode: str = "ring", ulysses: int = 1) -> ParallelDims:
        """dp derived from the world size; raises naming the values when it does not divide."""
        if world % (cp * tp):
            raise ValueError(f"world size {world} is not divisible by cp {cp} x tp {tp}")
        return cls(world // (cp * tp), cp, tp, mode, ulysses)
