"""Rank 0's training step and inference prefill, measured: the peak memory and its parts (torch's
FSDP2 tracker, a step measured once AdamW's state exists) and the bytes the step moves. Under fake tensors with a fake process
group this is the plan; with real tensors in a gloo run it is what the plan is checked against.

The step is lwm.core.step.train_step, the one LWMModule runs (the model built on meta, parallelize,
FSDP2 through meta_parallel_model, then the objective, backward, clipping, AdamW and the schedule);
only the batch is widened to the stage's sequences per rank.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import build_optimizer, train_step
from lwm.model import ModelConfig
from lwm.parallel import (
    ActivationOffload,
    ComputeSettings,
    Meshes,
    ParallelDims,
    SyncCopyEngine,
    meta_parallel_model,
    reshards_after_forward,
    state_offload,
)
from lwm.plan.fake import PlanFakeMode, fake, fake_allocate, make_batch, place, run_prefill, start_fake_group
from lwm.plan.tracker import PeakTracker, PlanTracker, WorkCounter

HOST = torch.device("meta")  # the host memory of a planned step: what activation offload copies to


@dataclass(frozen=True)
class Mesh:
    """One configuration of a stage: sequences of seq_len over cp ranks, dp groups of them,
    `batch` sequences per data-parallel rank, each rank's layers split over tp ranks."""

    seq_len: int
    cp: int
    dp: int
    batch: int = 1
    tp: int = 1

    @property
    def world(self) -> int:
        return self.cp * self.dp * self.tp

    def __str__(self) -> str:
        tp = f", tp {self.tp}" if self.tp > 1 else ""
        return f"{self.seq_len} tokens x {self.batch}, cp {self.cp}, dp {self.dp}{tp}"


def mesh_dims(mesh: Mesh, parallel: ParallelConfig) -> ParallelDims:
    """The run's ParallelDims on this mesh, as train.py builds them (ParallelConfig.dims: a cp-1 mesh has
    no context parallelism to arrange under any mode)."""
    return dataclasses.replace(parallel, tp=mesh.tp).dims(mesh.world, mesh.cp)


@dataclass
class StepMemory:
    peak: int  # bytes the tracker saw at the measured step's peak (AdamW's state made before it)
    parts: dict[str, int]  # the peak's parts (tracker.PARTS); they add up to peak
    sent: dict[str, int] = field(default_factory=dict)  # bytes per kind of communication, measured step
    written: int = 0  # bytes written by ops other than matmuls and attention, measured step
    seconds: float = 0.0  # wall time of the measured step
    # The tensors live at the peak by what made them (PlanTracker.breakdown): add up to peak.
    breakdown: list[dict] = field(default_factory=list)
    host_peak: int = 0  # peak bytes in host memory (offloaded activations and states), measured step
    optimizer_written: int = 0  # the part of `written` the optimizer step wrote


def widen(batch: dict, sequences: int) -> dict:
    """`sequences` copies of a one-sequence batch: (1, L) -> (sequences, L); positions (L,) are shared."""
    if sequences == 1:
        return batch
    return {k: _widen(v, sequences) for k, v in batch.items()}


def _widen(v, sequences: int):
    if not isinstance(v, torch.Tensor) or v.dim() < 2:  # positions (L,), host-side document runs
        return v
    return v.expand(sequences, *v.shape[1:]).contiguous()


def tracked_step(
    model,
    batch: dict,
    optim: OptimConfig,
    stage: StageConfig,
    where: Meshes,
    document_mask: bool,
    host_states: bool = False,
):
    """One training step under the tracker after AdamW's state exists: its peak, parts, traffic
    and time. A step measured after the first: zero gradients and one optimizer step make the state
    a first step leaves (AdamW's moments and step counters; the gradients, dropped by the step's
    zero_grad) without its forward and backward, which halves a plan's time. Peaks and parts are
    those of a second real step (checked on debug, tiny and 7b steps, GPU and CPU settings, with and
    without checkpointing); the HBM bytes written include FSDP2's one-off lazy initialisation in the
    first forward (1-2% more). host_states: the model's states are offloaded (PlanTracker counts
    them, and what AdamW makes, in HOST)."""
    optimizer, scheduler = build_optimizer(model, stage, optim)
    device = batch["tokens"].device  # the compute device (offloaded parameters are on the host)
    tracker = PlanTracker(model, optimizer, device, host_states, HOST)
    tracker.track_inputs((batch,))
    counter = WorkCounter()
    hooks = counter.count_optimizer(optimizer)
    with tracker.skipping_propagation():
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        tracker.held_as_gradients(model)  # in host memory under parameter offload, as a step leaves them
        optimizer.step()
        tracker.restart_peak()
        start = time.perf_counter()
        with tracker.counting(counter):
            train_step(model, batch, optimizer, optim, where.cp_group, document_mask, scheduler)
        seconds = time.perf_counter() - start
    for hook in hooks:
        hook.remove()
    peak, parts = tracker.peak()
    host = tracker.host_peak(HOST)
    return StepMemory(
        peak, parts, dict(counter.sent), counter.written, seconds, tracker.breakdown(), host, counter.optimizer_written
    )


def plan_step(
    model_config: ModelConfig,
    stage: StageConfig,
    mesh: Mesh,
    parallel: ParallelConfig,
    optim: OptimConfig,
    settings: ComputeSettings,
) -> StepMemory:
    """Rank 0's step of `mesh` under FakeTensorMode, in a fake process group of mesh.world ranks
    (rank 0 is tp rank 0 of cp rank 0: every tp rank holds the same shapes)."""
    start_fake_group(mesh.world)
    try:
        dims = mesh_dims(mesh, parallel)  # as train.py: a cp-1 mesh runs without cp under any mode
        where = place(dims.dp, dims.cp, tp=dims.tp, mode=dims.mode, ulysses=dims.ulysses)
        host = make_batch(model_config, mesh.seq_len, where, 1, parallel.layout, "cpu")  # cut on the host
        # Built outside the fake mode (FSDP2 over a tp mesh reads real rank tensors), then allocated fake.
        model = meta_parallel_model(
            model_config,
            where,
            settings,
            parallel.layout,
            parallel.activation_checkpointing,
            planned_offload(parallel),
            state_offload(parallel.param_offload, torch.device("cpu")),  # unpinned: the fake tensors' device
            keep_attention=parallel.kept_blocks(model_config.n_layers),
        )
        with PlanFakeMode() as mode:
            batch = widen(fake(host, mode), mesh.batch)
            model = fake_allocate(model, mode)
            memory = tracked_step(model, batch, optim, stage, where, parallel.document_mask, parallel.param_offload)
            if parallel.param_offload:
                memory.sent["host"] = memory.sent.get("host", 0) + state_copies(model)
    finally:
        dist.destroy_process_group()
    return memory


def state_copies(model) -> int:
    """Bytes FSDP2's CPU offload copies between host and device in a step, per rank (under the
    planner its copies go from "cpu" to "cpu" and move nothing, so they are counted here): each
    gather of a module's parameters brings their fp32 shards in (before the cast to the compute
    dtype), each gradient's fp32 shard goes out once. FSDP2 gathers a block twice where it reshards it
    after the forward (lwm.parallel.reshards_after_forward), once where it keeps it, and the root (embedding,
    final norm, head) once: it keeps the root's parameters from forward through backward."""
    n = len(model.layers)
    gathers = sum(
        (2 if reshards_after_forward(i, n) else 1) * sum(p.to_local().nbytes for p in layer.parameters())
        for i, layer in enumerate(model.layers)
    )
    blocks = sum(p.to_local().nbytes for p in model.layers.parameters())
    every = sum(p.to_local().nbytes for p in model.parameters())
    return gathers + (every - blocks) + every


def planned_offload(parallel: ParallelConfig) -> ActivationOffload | None:
    """The run's activation offload as the planner runs it: plain copies at the GPU engine's program
    points, into HOST (the device tensors are fake CPU ones; the tracker counts the meta device apart)."""
    return ActivationOffload(SyncCopyEngine(HOST)) if parallel.activation_offload else None


@dataclass
class PrefillMemory:
    peak: int
    parts: dict[str, int]  # weights, kv_cache, temporaries (the rest of the peak)
    cache_tokens: int  # tokens of the prompt in this rank's cache
    sent: dict[str, int] = field(default_factory=dict)  # bytes per kind of communication
    written: int = 0  # bytes written by ops other than matmuls and attention


def plan_prefill(
    model_config: ModelConfig, seq_len: int, cp: int, prefill_chunk: int, settings: ComputeSettings
) -> PrefillMemory:
    """Rank 0's Generator.prefill of a seq_len prompt over cp ranks under FakeTensorMode, its
    memory tracked from before the weights exist."""
    start_fake_group(cp)
    try:
        where = place(1, cp)
        counter = WorkCounter()
        with PlanFakeMode(), PeakTracker() as tracker, counter:
            result = run_prefill(model_config, where, seq_len, prefill_chunk, settings, "cpu")
        snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]  # not the meta model it is loaded into
    finally:
        dist.destroy_process_group()
    shape, dtype = result.cache
    kv = 2 * model_config.n_layers * torch.Size(shape).numel() * dtype.itemsize  # keys and values, every layer
    weights = model_config.num_params() * (settings.param_dtype or torch.float32).itemsize
    peak = snap["Total"]
    parts = {"weights": weights, "kv_cache": kv, "temporaries": peak - weights - kv}
    return PrefillMemory(peak, parts, shape[2] if len(shape) == 4 else shape[0], dict(counter.sent), counter.written)
