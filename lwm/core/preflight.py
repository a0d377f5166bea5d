"""Training's preflight: before a stage allocates anything, plan its step on the device it is about
to run on and stop with a clear message if it will not fit.

    plan = preflight(cfg, stage, device_memory(), model=model_config)   # WillNotFit if it does not fit

The plan is lwm-plan's (rank 0's real step under fake tensors, FSDP2's memory tracker, the second
step's peak; lwm/plan/memory.py) with the same margins: the caching allocator's 5% and 1.5 GiB
for the CUDA context and NCCL's buffers. Every rank of a striped or zigzag run holds the same
memory; rank 0 also holds the largest FSDP shards (torch.chunk puts the remainder first).

It runs in a child process (lwm.child runs lwm.plan.stage_plan.run, the job as JSON on stdin): a
fake process group and FakeTensorMode cannot share a process with a run's real process group
(the second stage of a schedule already has one), and the child leaves no global state behind.
It sees no GPU (CUDA_VISIBLE_DEVICES is empty), so it allocates nothing on the device. It takes
as long as lwm-plan's plan of the stage: about 5-40 s for the 7b preset on 2 CPU cores, longer
when the stage does not fit (the search for the smallest cp that does).

This module is what training imports: what the child plans and answers (PreflightJob, StagePlan: plain
dataclasses carried as JSON) and how a run asks. The planning itself is lwm/plan/stage_plan.py, in the
planner's package above training; a run names it for its child and never imports it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lwm.child import run_in_child
from lwm.configs import from_dict
from lwm.core.config import OptimConfig, ParallelConfig, RunConfig, StageConfig
from lwm.model import ModelConfig
from lwm.parallel.flash_impl import activate, choose_kernel, installed_kernels
from lwm.parallel.launch import single_process_env

GIB = 2**30  # the planner's too (lwm.plan.devices)


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
    reserved_gib: float = 1.5  # the CUDA context and NCCL's buffers (lwm.plan.devices.Device)
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


PLANNER = "lwm.plan.stage_plan:run"  # what plan_in_child runs in its child (lwm.child resolves the name)


class WillNotFit(RuntimeError):
    """A stage whose planned peak, with the margins, is more than the device holds."""

    def __init__(self, plan: StagePlan):
        self.plan = plan
        super().__init__(
            f"preflight: {plan.summary()}: it will not fit. {plan.why[0].upper() + plan.why[1:]}. "
            f"Plan it with lwm-plan (docs/planning.md); trainer.preflight=false skips this check."
        )


def check(plan: StagePlan) -> StagePlan:
    """The plan if it fits; WillNotFit naming the stage, its mesh, the peak, the device and the
    smallest cp that fits (or why none does) otherwise."""
    if not plan.fits:
        raise WillNotFit(plan)
    return plan


def device_kind(accelerator: str) -> str:
    """'cuda' or 'cpu': where a run of trainer.accelerator computes."""
    if accelerator == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if accelerator in ("gpu", "cuda") else "cpu"


def device_capability(kind: str) -> tuple[int, int] | None:
    """This rank's GPU's compute capability (LOCAL_RANK's under torchrun), None for a CPU run."""
    if kind != "cuda":
        return None
    import torch

    return torch.cuda.get_device_capability(local_gpu())


def attention_kernel(kernel: str, accelerator: str) -> str:
    """parallel.attention_kernel on this rank's device, chosen and activated (lwm.parallel.flash_impl): fa2, fa3
    or fa4; ValueError naming the setting where it cannot run here. Every rank runs it for itself, before any
    model is built: torch's registry holds the choice per process."""
    kind = device_kind(accelerator)
    chosen = choose_kernel(kernel, kind, device_capability(kind), installed_kernels())
    activate(chosen)
    return chosen


def wanted(setting: bool | None, accelerator: str) -> bool:
    """trainer.preflight: true or false as given; None (the default) is on for GPUs, off on CPU."""
    return setting if setting is not None else device_kind(accelerator) == "cuda"


def device_memory(kind: str = "cuda", ranks_per_node: int = 1) -> int:
    """Bytes one rank may use: its GPU's total (LOCAL_RANK's under torchrun, read without
    allocating), or for cpu this machine's physical memory shared by its ranks."""
    if kind == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks_per_node
    import torch

    return torch.cuda.get_device_properties(local_gpu()).total_memory


def local_gpu() -> int:
    """This rank's GPU: LOCAL_RANK's under torchrun and Lightning's launch, else the current one."""
    import torch

    return int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))


def preflight(
    run: RunConfig,
    stage: StageConfig,
    device_bytes: int,
    model: ModelConfig | None = None,
    device: str = "cuda",
    reserved_gib: float | None = None,
) -> StagePlan:
    """Plan `stage` of `run` (on run.trainer.world_size ranks of device_bytes each; `model`: the
    schedule's starting shapes, run.model when None; device: cuda or cpu, whose settings the step
    takes) in a child process; the plan if it fits, WillNotFit if not. reserved_gib: memory no
    tracker sees (None: 1.5 GiB on cuda for the context and NCCL, 0 on cpu)."""
    if reserved_gib is None:
        reserved_gib = 1.5 if device == "cuda" else 0.0
    world = run.trainer.world_size
    job = PreflightJob(model or run.model, stage, run.parallel, run.optim, world, device_bytes, reserved_gib)
    job.ranks_per_node = min(world, run.trainer.devices)
    return check(plan_in_child(dataclasses.replace(job, device=device)))


def plan_in_child(job: PreflightJob) -> StagePlan:
    """lwm.plan.stage_plan.run(job) in a process of its own (lwm.child) -> its StagePlan (written to a file),
    with no GPU visible to it. The planner is named, not imported: it is a package above training, run as its
    own program."""

    with tempfile.TemporaryDirectory(prefix="lwm-preflight-") as tmp:
        out, err = Path(tmp) / "plan.json", Path(tmp) / "stderr"
        env = single_process_env() | {"CUDA_VISIBLE_DEVICES": ""}
        with open(err, "w+b") as stderr:
            code = run_in_child(PLANNER, dataclasses.replace(job, out=str(out)), env=env, stderr=stderr)
        if code != 0 or not out.is_file():
            tail = err.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"preflight could not plan stage {job.stage.name!r} (exit {code}): " + " | ".join(tail))
        return from_dict(StagePlan, json.loads(out.read_text()), "preflight plan")
