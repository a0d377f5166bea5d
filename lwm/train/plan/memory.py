"""Rank 0's training step and inference prefill, measured: the peak memory and its parts (torch's
FSDP2 tracker, second step) and the bytes the step moves. Under fake tensors with a fake process
group this is the plan; with real tensors in a gloo run it is what the plan is checked against.

The step is lwm.train.fake_step's (the model built on meta, parallelize, FSDP2 through
build_parallel_model, LWMModule's objective, clipping, AdamW); only the batch is widened to the stage's
sequences per rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from lwm.model import ModelConfig
from lwm.parallel import ComputeSettings, Meshes, build_parallel_model
from lwm.train.config import OptimConfig, ParallelConfig, StageConfig
from lwm.train.fake_step import fake, make_batch, place, run_prefill, start_fake_group, train_step
from lwm.train.module import build_optimizer
from lwm.train.plan.tracker import PeakTracker, PlanTracker, WorkCounter

STEPS = 2  # the second step is reported: the first has no optimizer state yet


@dataclass(frozen=True)
class Mesh:
    """One configuration of a stage: sequences of seq_len over cp ranks, dp groups of them,
    `batch` sequences per data-parallel rank."""

    seq_len: int
    cp: int
    dp: int
    batch: int = 1

    @property
    def world(self) -> int:
        return self.cp * self.dp

    def __str__(self) -> str:
        return f"{self.seq_len} tokens x {self.batch}, cp {self.cp}, dp {self.dp}"


@dataclass
class StepMemory:
    peak: int  # bytes the tracker saw at the second step's peak
    parts: dict[str, int]  # the peak's parts (tracker.PARTS); they add up to peak
    sent: dict[str, int] = field(default_factory=dict)  # bytes per kind of communication, second step
    written: int = 0  # bytes written by ops other than matmuls and attention, second step
    seconds: float = 0.0  # wall time of the measured (second) step


def widen(batch: dict, sequences: int) -> dict:
    """`sequences` copies of a one-sequence batch: (1, L) -> (sequences, L); positions (L,) are shared."""
    if sequences == 1:
        return batch
    return {k: _widen(v, sequences) for k, v in batch.items()}


def _widen(v, sequences: int):
    if not isinstance(v, torch.Tensor) or v.dim() < 2:  # positions (L,), host-side document runs
        return v
    return v.expand(sequences, *v.shape[1:]).contiguous()


def tracked_step(model, batch: dict, optim: OptimConfig, stage: StageConfig, where: Meshes, document_mask: bool):
    """STEPS training steps under the tracker; the last one's peak, parts, traffic and time."""
    optimizer, _ = build_optimizer(model, stage, optim)
    tracker = PlanTracker(model, optimizer)
    tracker.track_inputs((batch,))
    counter = WorkCounter()
    with tracker.skipping_propagation():
        for step in range(STEPS):
            last = step == STEPS - 1
            if last:
                tracker.restart_peak()
                start = time.perf_counter()
            with counter if last else _nothing():
                train_step(model, batch, optimizer, optim, where.cp_group, document_mask)
        seconds = time.perf_counter() - start
    peak, parts = tracker.peak()
    return StepMemory(peak, parts, dict(counter.sent), counter.written, seconds)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def plan_step(
    model_config: ModelConfig,
    stage: StageConfig,
    mesh: Mesh,
    parallel: ParallelConfig,
    optim: OptimConfig,
    settings: ComputeSettings,
) -> StepMemory:
    """Rank 0's step of `mesh` under FakeTensorMode, in a fake process group of mesh.world ranks."""
    start_fake_group(mesh.world)
    try:
        where = place(mesh.dp, mesh.cp)
        host = make_batch(model_config, mesh.seq_len, where, 1, parallel.layout, "cpu")  # cut on the host
        with FakeTensorMode() as mode:
            batch = widen(fake(host, mode), mesh.batch)
            model = build_parallel_model(
                model_config, where, settings, "cpu", None, parallel.layout, parallel.activation_checkpointing
            )
            return tracked_step(model, batch, optim, stage, where, parallel.document_mask)
    finally:
        dist.destroy_process_group()


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
        with FakeTensorMode(), PeakTracker() as tracker, counter:
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
