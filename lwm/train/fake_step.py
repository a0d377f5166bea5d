"""One training step and one inference prefill at mission scale, without the memory: rank 0's view
of a (dp, cp) run under FakeTensorMode and a fake process group.

    python -m lwm.train.fake_step --preset 7b --seq-len 1048576 --cp 8 --dp 4

The step is the real one: the model built on the meta device, context-parallel attention
(lwm.parallel.parallelize), FSDP2 with bf16 mixed precision (lwm.parallel.build_parallel_model),
LWMModule's loss and backward objective, clipping and AdamW (lwm.train.module). Fake tensors carry
shapes, dtypes and devices, never values. The autograd engine cannot run a backward on fake CUDA
tensors without a GPU, so the tensors are fake CPU tensors with the GPU's settings forced: the bf16
policy and the CUDA flash kernel (whose aten ops have meta kernels that give their shapes).
The sequence is packed from `documents` equal documents with document masks on: the batch is cut
on the host as the datamodule cuts it, where the documents are read once (lwm.model.documents.
Documents), then its tensors become fake ones as Lightning would move them to the device; the
ring then runs one varlen flash call per step and never reads a device value.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lwm.data.batches import Sharding, shard_batch, with_documents
from lwm.data.vocab import Vocab
from lwm.infer.generator import Generator
from lwm.model import ModelConfig, Transformer
from lwm.model.config import PRESETS
from lwm.parallel import (
    ComputeSettings,
    Meshes,
    ParallelDims,
    allocate,
    build_meshes,
    build_parallel_model,
    meta_parallel_model,
)
from lwm.parallel.layout import check_divisible, ring_parts
from lwm.parallel.tensor import BLOCK_PLAN
from lwm.train.config import OptimConfig, ParallelConfig, StageConfig
from lwm.train.module import build_optimizer, clip_grad_norm, training_objective
from lwm.train.run import stage_model_config

GPU_SETTINGS = ComputeSettings(param_dtype=torch.bfloat16, backend="cuda_flash")  # what compute_settings gives a GPU

# Ops after which a GPU's host waits for the device: a value read to the host, or an output whose
# size depends on values. OpCounter adds tolist and device-to-host copies (none when all is on CPU).
SYNC_OPS = (
    "_local_scalar_dense",  # .item(), bool(), int(), float() of a tensor
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "equal",
    "is_nonzero",
)


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


class OpCounter:
    """Counts aten ops by name (a dispatch mode) and keeps the tensor of every host sync, Tensor.tolist
    included (a function mode: on the CPU tolist reads memory without any aten op)."""

    def __init__(self):
        self.ops: Counter = Counter()
        self.synced: list[tuple[str, torch.Tensor]] = []  # (what, the tensor read)
        self._modes = (_CountOps(self), _CountToList(self))

    def __enter__(self) -> "OpCounter":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def syncs(self, on_host=()) -> Counter:
        """The host syncs a GPU would make: SYNC_OPS, tolist, device-to-host copies; reads of the
        tensors in `on_host` (kept on the host on a GPU too) are left out."""
        host = {id(t) for t in on_host}
        return Counter(what for what, t in self.synced if id(t) not in host)

    def attention(self) -> Counter:
        return Counter({k: n for k, n in self.ops.items() if "attention" in k})


class _CountOps(TorchDispatchMode):
    def __init__(self, counter: OpCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.counter.ops[name] += 1
        if name in SYNC_OPS:
            self.counter.synced.append((name, args[0]))
        elif _copies_to_host(name, args, kwargs):
            self.counter.synced.append(("copy to host", args[-1] if name == "copy_" else args[0]))
        return func(*args, **kwargs)


def _copies_to_host(name: str, args, kwargs) -> bool:
    if name == "_to_copy":
        target = kwargs.get("device")
        return target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu"
    return name == "copy_" and args[0].device.type == "cpu" and args[1].device.type != "cpu"


class _CountToList(TorchFunctionMode):
    def __init__(self, counter: OpCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            self.counter.synced.append(("tolist", args[0]))
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------------------- the step


@dataclass
class StepResult:
    model: Transformer
    optimizer: torch.optim.Optimizer
    loss: torch.Tensor  # the whole sequence's loss
    grad_norm: torch.Tensor  # before clipping
    counter: OpCounter  # what the step ran (build excluded)
    seen: dict  # dtypes and shapes inside the first block

    def device_syncs(self) -> Counter:
        """Host syncs of the step, less AdamW's reads of its step counters: those live on the host
        on a GPU too (torch.optim keeps `step` on the CPU unless capturable or fused)."""
        return self.counter.syncs(on_host=[s["step"] for s in self.optimizer.state.values()])

    def host_counter_reads(self) -> int:
        return sum(self.counter.syncs().values()) - sum(self.device_syncs().values())


def start_fake_group(world_size: int, rank: int = 0) -> None:
    """A process group of `world_size` ranks in which this process is `rank` and collectives do
    nothing, for CPU (fake) tensors and for meta tensors."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # the fake backend registers here

    dist.init_process_group("cpu:fake,meta:fake", store=FakeStore(), rank=rank, world_size=world_size)


def place(dp: int, cp: int, device_type: str = "cpu", tp: int = 1, mode: str = "ring", ulysses: int = 1) -> Meshes:
    """Rank 0's meshes in a (dp, cp, tp) run (lwm.parallel.mesh). Built before any fake tensor
    exists: a DeviceMesh reads its ranks from real tensors."""
    return build_meshes(ParallelDims(dp, cp, tp, mode, ulysses), device_type, 0)


def make_batch(
    config: ModelConfig, seq_len: int, where: Meshes, documents: int, layout: str, device: torch.device | str
) -> dict:
    """This rank's slice of one packed sequence of `documents` equal documents (a third of each a
    vision span), cut on the host as the datamodule cuts it (lwm.data.batches.shard_batch), then
    moved to `device` as Lightning moves a batch (for fake tensors: `fake`)."""
    if seq_len % documents:
        raise ValueError(f"seq_len {seq_len} is not divisible by documents {documents}")
    tokens = torch.randint(0, config.vocab_size, (1, seq_len + 1))
    segment_ids = torch.arange(seq_len).div(seq_len // documents, rounding_mode="floor")[None]  # (1, S)
    in_document = torch.arange(seq_len) % (seq_len // documents)
    full = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_weight": torch.ones(1, seq_len),
        "vision_mask": (in_document < seq_len // documents // 3)[None],
        "segment_ids": segment_ids,
    }
    sharding = Sharding(cp_rank=where.cp_rank, cp_size=where.cp, layout=layout, ulysses_size=where.dims.data_ulysses)
    local = with_documents(shard_batch(full, sharding, "document" if documents > 1 else "sequence"))
    return {k: v.to(device) for k, v in local.items()}


def fake(batch: dict, mode: FakeTensorMode) -> dict:
    """The batch's tensors as fake ones of `mode` (what the device would hold); its Documents stay
    host data, as a real move leaves them."""
    return {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def train_step(model, batch: dict, optimizer, optim: OptimConfig, cp_group, document_mask: bool):
    """One optimizer step as Lightning runs LWMModule's: loss, backward, clipping, AdamW ->
    (the whole sequence's loss, the gradient norm before clipping)."""
    optimizer.zero_grad(set_to_none=True)
    objective, loss = training_objective(model, batch, optim, cp_group, document_mask)
    objective.backward()
    norm = clip_grad_norm(model.parameters(), optim.grad_clip)
    optimizer.step()
    return loss, norm


def fake_allocate(model: Transformer, mode: FakeTensorMode, device: torch.device | str = "cpu") -> Transformer:
    """A meta_parallel_model (built outside `mode`) allocated as fake tensors of `mode`: its meta
    parameters are the only non-fake inputs let in, and only while they are allocated."""
    before, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True
    try:
        return allocate(model, device, None)
    finally:
        mode.allow_non_fake_inputs = before


def run_step(
    model_config: ModelConfig,
    stage: StageConfig,
    where: Meshes,
    parallel: ParallelConfig,
    settings: ComputeSettings,
    device: torch.device | str,
    batch: dict,
    optim: OptimConfig | None = None,
    model: Transformer | None = None,
) -> StepResult:
    """Build the sharded model (no starting weights: fake and meta tensors have no values), or take
    the one given (fake_allocate's), then one training step, its ops counted."""
    optim = optim or OptimConfig()
    if model is None:
        model = build_parallel_model(
            model_config, where, settings, device, None, parallel.layout, parallel.activation_checkpointing
        )
    optimizer, _ = build_optimizer(model, stage, optim)
    seen: dict = {}
    hooks = _watch_first_block(model, seen)
    with OpCounter() as counter:
        loss, norm = train_step(model, batch, optimizer, optim, where.cp_group, parallel.document_mask)
    for hook in hooks:
        hook.remove()
    return StepResult(model, optimizer, loss, norm, counter, seen)


def _watch_first_block(model: Transformer, seen: dict) -> list:
    """Hooks that record what the first block's attention receives (normed hidden states, RoPE
    cos/sin: after FSDP2's input cast, if any) and what the block returns."""

    def inputs(module, args):
        x, cos, sin = args[:3]
        seen.setdefault("attn_in", (tuple(x.shape), x.dtype))
        seen.setdefault("rope", (tuple(cos.shape), cos.dtype, sin.dtype))

    def output(module, args, out):
        seen.setdefault("block_out", (tuple(out.shape), out.dtype))

    block = model.layers[0]
    return [block.attn.register_forward_pre_hook(inputs), block.register_forward_hook(output)]


def shard_rows(shape: tuple, world: int, rank: int = 0) -> tuple:
    """The local shape FSDP2 gives `rank` of a parameter of `shape`: dim 0 cut in `world` chunks of
    ceil(rows / world) (torch.chunk), the last ones shorter or empty."""
    chunk = -(-shape[0] // world)
    rows = max(0, min(chunk, shape[0] - rank * chunk))
    return (rows, *shape[1:])


def expected_shard(name: str, shape: tuple, fsdp: int, tp: int) -> tuple:
    """Rank 0's local shape of a parameter: its tp split (lwm.parallel.tensor.BLOCK_PLAN), then
    FSDP2's rows over the dp x cp ranks."""
    style = next((style for key, style in BLOCK_PLAN.items() if name.endswith(key + ".weight")), None)
    if tp > 1 and style is ColwiseParallel:
        shape = (shape[0] // tp, *shape[1:])
    elif tp > 1 and style is RowwiseParallel:
        shape = (shape[0], shape[1] // tp)
    return shard_rows(shape, fsdp)


def check_shards(step: StepResult, world: int, tp: int = 1) -> list[str]:
    """Every parameter, gradient and AdamW moment is rank 0's shard in fp32; raises otherwise."""
    fsdp = world // tp
    for name, p in step.model.named_parameters():
        want = expected_shard(name, tuple(p.shape), fsdp, tp)
        state = step.optimizer.state[p]
        got = {
            "parameter": p.to_local(),
            "gradient": p.grad.to_local(),
            "exp_avg": state["exp_avg"].to_local(),
            "exp_avg_sq": state["exp_avg_sq"].to_local(),
        }
        for what, t in got.items():
            if tuple(t.shape) != want or t.dtype != torch.float32:
                raise RuntimeError(f"{name}: {what} {tuple(t.shape)} {t.dtype}, expected rank 0's shard {want} fp32")
    embed = tuple(step.model.embed.weight.shape)
    wq = tuple(step.model.layers[0].attn.wq.weight.shape)
    n = len(list(step.model.parameters()))
    return [
        f"{n} parameters, their gradients and AdamW moments: rank 0's fp32 shards (embed {embed} -> "
        f"{expected_shard('embed.weight', embed, fsdp, tp)}, wq {wq} -> "
        f"{expected_shard('layers.0.attn.wq.weight', wq, fsdp, tp)})"
    ]


# ----------------------------------------------------------------------------------------- the prefill


class _GivenPrompt(Generator):
    """The Generator, taking the prompt as given: its own check reads the ids' range
    (int(ids.min())) before they move to the device, a value fake tensors do not have."""

    def _ids(self, ids) -> torch.Tensor:
        return ids.to(self.device)


@dataclass
class PrefillResult:
    cache: tuple  # (shape, dtype) of the first layer's cached keys on this rank
    ring_tokens: int  # prompt tokens through ring attention; the rest ran as an extend step
    counter: OpCounter


def run_prefill(
    model_config: ModelConfig,
    where: Meshes,
    seq_len: int,
    prefill_chunk: int,
    settings: ComputeSettings,
    device: torch.device | str,
) -> PrefillResult:
    """Generator.prefill of a seq_len prompt over the context-parallel group, the model's weights
    in the compute dtype (as lwm.infer.runtime loads them: bf16 on a GPU)."""
    with torch.device("meta"):
        model = Transformer(model_config)
    dtype = settings.param_dtype or torch.float32
    weights = {k: torch.empty(v.shape, dtype=dtype, device=device) for k, v in model.state_dict().items()}
    model.load_state_dict(weights, assign=True)
    vocab = Vocab(model_config.vocab_size - Vocab(1).used_size + 1)  # as many text ids as the rows allow
    prompt = torch.randint(0, vocab.text_size, (seq_len,), device=device)
    gen = _GivenPrompt(model, vocab, where.cp_group, prefill_chunk=prefill_chunk, backend=settings.backend)
    with OpCounter() as counter:
        gen.prefill(prompt)
    unit = ring_parts(where.cp, "striped")
    ring = 0 if where.cp == 1 else (seq_len - 1) // unit * unit  # as Generator.prefill splits the prompt
    keys = gen.cache.layers[0].cache.keys
    return PrefillResult((tuple(keys.shape), keys.dtype), ring, counter)


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
        with FakeTensorMode() as mode:
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
