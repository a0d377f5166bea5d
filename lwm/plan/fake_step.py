"""One training step and one inference prefill at mission scale, without the memory: rank 0's view
of a (dp, cp) run under FakeTensorMode and a fake process group.

    python -m lwm.plan.fake_step --preset 7b --seq-len 1048576 --cp 8 --dp 4

The step is the real one, lwm.core.step.train_step as LWMModule runs it: the model built on the
meta device, context-parallel attention (lwm.parallel.parallelize), FSDP2 with bf16 mixed precision
(lwm.parallel.build_parallel_model), the loss and backward objective, clipping, AdamW and the
schedule. This is the command; the fake process group, the fake allocation, the op counting and
the shard checks are the planner's library (lwm/plan/fake.py), where fake tensors run as
fake CPU tensors with the GPU's settings forced (the bf16 policy and the CUDA flash kernel).
The sequence is packed from `documents` equal documents with document masks on: the batch is cut
on the host as the datamodule cuts it, where the documents are read once (lwm.model.documents.
Documents), then its tensors become fake ones as Lightning would move them to the device; the
ring then runs one varlen flash call per step and never reads a device value.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field, fields

import torch.distributed as dist

from lwm.core.config import ParallelConfig, StageConfig, stage_model_config
from lwm.model import ModelConfig
from lwm.model.config import PRESETS
from lwm.parallel import ParallelDims, meta_parallel_model
from lwm.parallel.layout import check_divisible
from lwm.plan import bounds
from lwm.plan.fake import (
    GPU_SETTINGS,
    PlanFakeMode,
    PrefillResult,
    StepResult,
    check_shards,
    fake,
    fake_allocate,
    make_batch,
    place,
    run_prefill,
    run_step,
    start_fake_group,
)
from lwm.plan.memory import Mesh


@dataclass
class FakeStepConfig:
    preset: str = field(default="7b", metadata={"help": f"model preset: {', '.join(PRESETS)}"})
    seq_len: int = field(default=1048576, metadata={"help": "tokens per sequence (the whole context)"})
    cp: int = field(default=8, metadata={"help": "context-parallel degree"})
    dp: int = field(default=4, metadata={"help": "data-parallel degree (world = dp x cp x tp)"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel degree"})
    prefill_chunk: int = field(default=8192, metadata={"help": "prompt tokens per rank per prefill segment"})
    documents: int = field(default=256, metadata={"help": "equal documents packed in the sequence (1: no masks)"})

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")
        for name in ("seq_len", "cp", "dp", "tp", "prefill_chunk", "documents"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_divisible(self.seq_len, self.cp, "striped")
        preset = PRESETS[self.preset]
        ParallelDims(self.dp, self.cp, self.tp).check_model(preset.n_heads, preset.n_kv_heads)
        if self.seq_len % self.documents:
            raise ValueError(f"seq_len {self.seq_len} is not divisible by documents {self.documents}")
        mesh = Mesh(self.seq_len, self.cp, self.dp, 1, self.tp)
        bounds.check_step(mesh, preset, f"--seq-len {self.seq_len} --cp {self.cp} --dp {self.dp} --tp {self.tp}")
        bounds.check_prefill(self.seq_len, self.cp, preset, self.prefill_chunk, f"--prefill-chunk {self.prefill_chunk}")


# ----------------------------------------------------------------------------------------- the command


@dataclass
class FakeStepReport:
    step: StepResult
    prefill: PrefillResult
    seconds: dict  # wall seconds of the step (build included) and of the prefill
    lines: list[str]  # what the command prints


def run(config: FakeStepConfig) -> FakeStepReport:
    """The fake group and mesh, then the step and the prefill under FakeTensorMode; prints the report."""
    world = config.dp * config.cp * config.tp
    start_fake_group(world)
    try:
        where = place(config.dp, config.cp, tp=config.tp)
        preset = ModelConfig.from_preset(config.preset)
        stage = StageConfig("fake", config.seq_len, rope_theta=preset.rope_theta, steps=1, lr=1e-5, cp=config.cp)
        model_config = stage_model_config(preset, stage)
        parallel = ParallelConfig(document_mask=config.documents > 1)
        batch = make_batch(model_config, config.seq_len, where, config.documents, parallel.layout, "cpu")  # host
        start = time.perf_counter()
        model = meta_parallel_model(model_config, where, GPU_SETTINGS, parallel.layout)
        with PlanFakeMode() as mode:
            batch = fake(batch, mode)
            model = fake_allocate(model, mode)
            step = run_step(model_config, stage, where, parallel, GPU_SETTINGS, "cpu", batch, model=model)
            seconds = {"step": time.perf_counter() - start}
            prefill = run_prefill(model_config, where, config.seq_len, config.prefill_chunk, GPU_SETTINGS, "cpu")
            seconds["prefill"] = time.perf_counter() - start - seconds["step"]
        lines = _report(config, step, prefill, seconds)
    finally:
        dist.destroy_process_group()
    for line in lines:
        print(line)
    return FakeStepReport(step, prefill, seconds, lines)


def _report(config: FakeStepConfig, step: StepResult, prefill: PrefillResult, seconds: dict) -> list[str]:
    world, local = config.dp * config.cp * config.tp, config.seq_len // config.cp
    attn_in, block_out, rope = step.seen["attn_in"], step.seen["block_out"], step.seen["rope"]
    masks = f"{config.documents} documents masked" if config.documents > 1 else "no document masks"
    return [
        f"fake step: preset {config.preset}, {config.seq_len} tokens, cp {config.cp}, tp {config.tp}, dp {config.dp} "
        f"(rank 0 of {world}), bf16 compute on fp32 shards, attention cuda_flash, {masks}",
        f"step {seconds['step']:.1f} s wall (model built on meta, sharded, loss, backward, clip, AdamW)",
        f"  batch: {local} of {config.seq_len} tokens on this rank; loss {tuple(step.loss.shape)} {step.loss.dtype}",
        f"  first block: attention in {attn_in[0]} {attn_in[1]}, RoPE cos/sin {rope[0]} {rope[1]}/{rope[2]}, "
        f"out {block_out[0]} {block_out[1]}",
        *("  " + line for line in check_shards(step, world, config.tp)),
        f"  attention kernels: {dict(step.counter.attention())}",
        f"  host syncs in the step: {sum(step.device_syncs().values())} {dict(step.device_syncs())} "
        f"(and {step.host_counter_reads()} reads of AdamW's step counters, on the host on a GPU too)",
        f"prefill {seconds['prefill']:.1f} s wall (Generator.prefill, its prompt check skipped): "
        f"{prefill.ring_tokens} prompt tokens through the ring, the last {config.seq_len - prefill.ring_tokens} "
        f"as an extend step; rank 0's cache per layer {prefill.cache[0]} {prefill.cache[1]}",
        f"  host syncs in the prefill: {sum(prefill.counter.syncs().values())} {dict(prefill.counter.syncs())}",
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(FakeStepConfig):
        p.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default, help=f.metadata["help"]
        )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        config = FakeStepConfig(**vars(parser.parse_args(argv)))
    except ValueError as e:
        parser.error(str(e))
    run(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
