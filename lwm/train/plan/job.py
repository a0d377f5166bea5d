"""What the preflight's child plans and what it answers (lwm/train/plan/preflight.py asks,
lwm/train/plan/stage_plan.py plans): plain dataclasses, carried as JSON between the processes."""

from __future__ import annotations

from dataclasses import dataclass, field

from lwm.model import ModelConfig
from lwm.train.config import OptimConfig, ParallelConfig, StageConfig
from lwm.train.plan.devices import GIB


@dataclass
class PreflightJob:
    """What the child plans: the stage's step of `model` (before the stage's RoPE theta and length,
    which the child applies) on `world` GPUs of `device_bytes` each."""

    model: ModelConfig
    stage: StageConfig
    parallel: ParallelConfig
    optim: OptimConfig
    world: int
    device_bytes: int
    reserved_gib: float = 1.5  # the CUDA context and NCCL's buffers (lwm.train.plan.devices.Device)
    fragmentation: float = 0.05  # the caching allocator's rounding and fragmentation
    device: str = "cuda"  # cuda: bf16 compute on fp32 shards, the CUDA flash kernel; cpu: fp32, the CPU kernel
    out: str = ""  # where the child writes its StagePlan as JSON (plan_in_child sets it)
    ranks_per_node: int = 8  # the run's ranks on one node (trainer.devices): they share its host memory


@dataclass
class StagePlan:
    """The preflight's answer: the stage's mesh, rank 0's planned peak and what it needs with the
    margins, on a device of device_bytes."""

    stage: str
    seq_len: int
    cp: int
    dp: int
    batch: int  # sequences per data-parallel rank
    peak_bytes: int
    needs_bytes: float
    device_bytes: int
    reserved_gib: float
    fragmentation: float
    parts: dict[str, int] = field(default_factory=dict)
    tp: int = 1
    fits_with: dict | None = None  # when it does not fit: the smallest larger cp that does ({"cp", "dp", "batch"})
    why: str = ""  # when it does not fit: the search's answer in full

    @property
    def fits(self) -> bool:
        return self.needs_bytes <= self.device_bytes

    def summary(self) -> str:
        margins = f"{self.fragmentation:.0%} for the allocator"
        if self.reserved_gib:
            margins += f" and {self.reserved_gib:.2f} GiB for the CUDA context and NCCL"
        return (
            f"stage {self.stage!r} (seq_len {self.seq_len}, cp {self.cp}, dp {self.dp}"
            + (f", tp {self.tp}" if self.tp > 1 else "")
            + f", {self.batch} sequence(s) per "
            f"data-parallel rank): planned peak {size(self.peak_bytes)} per rank, {size(self.needs_bytes)} with "
            f"{margins}, on a device of {size(self.device_bytes)}"
        )


def size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.2f} MiB"
