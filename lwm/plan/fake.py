"""The planner's library for running the real training step and inference prefill without their
memory: a fake process group (collectives that do nothing), rank 0's meshes and batch, a model
allocated as fake tensors, op and host-sync counting, and checks that every parameter, gradient
and AdamW moment is rank 0's FSDP2 shard. The step itself is lwm.core.step.train_step, the one
LWMModule runs; lwm/plan/memory.py tracks its memory, lwm/plan/fake_step.py is the command
that reports it at mission scale.

Fake tensors carry shapes, dtypes and devices, never values. The autograd engine cannot run a
backward on fake CUDA tensors without a GPU, so the tensors are fake CPU tensors with the GPU's
settings forced (GPU_SETTINGS: the bf16 policy, the CUDA flash kernel and the fused RMSNorm, whose
aten ops have meta kernels that give their shapes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import build_optimizer, train_step
from lwm.data.batches import Sharding, shard_batch, with_documents
from lwm.data.vocab import Vocab
from lwm.infer.generator import Generator
from lwm.model import ModelConfig, Transformer
from lwm.parallel import (
    ActivationOffload,
    ComputeSettings,
    Meshes,
    ParallelDims,
    allocate,
    build_meshes,
    build_parallel_model,
)
from lwm.parallel.layout import ring_parts
from lwm.parallel.tensor import BLOCK_PLAN


class PlanFakeMode(FakeTensorMode):
    """FakeTensorMode that asks once whether an op could initialise a device. torch asks at every op its
    cache does not serve (c10d's, views, first calls), and with Lightning imported (it sets
    PYTORCH_NVML_BASED_CUDA_CHECK) each asking loads NVML's library: 5-8% of a plan's time."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._avoid_device_init = FakeTensorMode.avoid_device_init.fget(self)

    @property
    def avoid_device_init(self) -> bool:
        return self._avoid_device_init


GPU_SETTINGS = ComputeSettings(torch.bfloat16, "cuda_flash", "fused")  # what compute_settings gives a GPU


def gpu_settings(kernel: str = "auto") -> ComputeSettings:
    """What compute_settings gives a GPU running parallel.attention_kernel `kernel`: cuDNN's blocks for cudnn
    (their copies into its layout counted), the flash kernels' otherwise."""
    return ComputeSettings(torch.bfloat16, "cuda_cudnn", "fused") if kernel == "cudnn" else GPU_SETTINGS


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
    offload: ActivationOffload | None = None,
) -> StepResult:
    """Build the sharded model (no starting weights: fake and meta tensors have no values), or take
    the one given (fake_allocate's), then one training step, its ops counted. `offload`: the
    activation offload the model is built with (under fake tensors the planner's:
    SyncCopyEngine("meta")); None: off."""
    optim = optim or OptimConfig()
    if model is None:
        model = build_parallel_model(
            model_config,
            where,
            settings,
            device,
            None,
            parallel.layout,
            parallel.activation_checkpointing,
            offload,
            keep_attention=parallel.kept_blocks(model_config.n_layers),
        )
    optimizer, scheduler = build_optimizer(model, stage, optim)
    seen: dict = {}
    hooks = _watch_first_block(model, seen)
    with OpCounter() as counter:
        loss, norm, _ = train_step(model, batch, optimizer, optim, where.cp_group, parallel.document_mask, scheduler)
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
    """Rank 0's local shape of a parameter (a weight or a bias): its tp split (lwm.parallel.tensor.BLOCK_PLAN),
    then FSDP2's rows over the dp x cp ranks."""
    style = next((style for key, style in BLOCK_PLAN.items() if name.rsplit(".", 1)[0].endswith(key)), None)
    if tp > 1 and style is ColwiseParallel:  # weight and bias (Qwen2's q/k/v) split by output rows
        shape = (shape[0] // tp, *shape[1:])
    elif tp > 1 and style is RowwiseParallel and len(shape) == 2:  # a rowwise bias would stay whole
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
    model.set_norm_kernel(settings.norm)
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
