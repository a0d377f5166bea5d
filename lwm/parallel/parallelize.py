"""Every kind of parallelism applied to a plain Transformer from outside, in one order:

    tensor parallelism (tp group) -> context-parallel attention (cp group) -> activation
    checkpointing (PyTorch's checkpoint wrapper) -> activation offload (lwm/parallel/offload.py)
    -> FSDP2 over dp x cp (with its CPUOffloadPolicy where the parameter shards, gradients and
    AdamW state live in host memory)

The model itself stays single-process. Context parallelism only swaps its attention function; the
caller feeds each rank its slice of the tokens (lwm.parallel.layout.shard) with their global
positions, and the loss uses global text/vision counts (`global_group_counts`) so the ranks' losses
add up to the loss of the whole sequence.

What the model computes with (precision, attention kernel), the meshes and the starting weights are
explicit arguments, decided once by the caller, so the same code runs on real, meta and fake tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

# PyTorch's wrapper for activation checkpointing (torchtitan's too); its state-dict hooks keep the keys.
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from lwm.model import ModelConfig, Transformer
from lwm.model.loss import GroupCounts, group_counts
from lwm.model.rope import apply_rope
from lwm.parallel import kept
from lwm.parallel.dims import MODES
from lwm.parallel.hybrid import hybrid_attention
from lwm.parallel.kernels import auto_backend
from lwm.parallel.layout import check_layout
from lwm.parallel.mesh import Meshes
from lwm.parallel.offload import ActivationOffload, apply_activation_offload
from lwm.parallel.ring import ring_attention
from lwm.parallel.tensor import apply_tensor_parallel
from lwm.parallel.ulysses import ulysses_attention


@dataclass(frozen=True)
class ComputeSettings:
    """What the sharded model computes with."""

    param_dtype: torch.dtype | None  # FSDP2's compute dtype on fp32 master weights; None: fp32 throughout
    backend: str  # the attention kernel (lwm.parallel.kernels.BACKENDS)
    norm: str = "auto"  # the RMSNorm kernel (lwm.model.norm.NORM_KERNELS)

    def mp_policy(self) -> MixedPrecisionPolicy:
        # Forward inputs are not cast: the blocks' RoPE cos/sin stay fp32 (apply_rope rotates in
        # fp32, as on CPU and in inference); hidden states come in param_dtype from the embedding.
        reduce = torch.float32 if self.param_dtype is not None else None
        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=reduce, cast_forward_inputs=False)


def compute_settings(device: torch.device, head_dim: int, kernel: str = "auto") -> ComputeSettings:
    """A GPU computes in bf16 on fp32 master weights, a CPU in fp32; the attention kernel is the one
    lwm.parallel.kernels picks for queries of that device, dtype and head dim, or cuDNN's on a GPU where
    `kernel` (parallel.attention_kernel) is cudnn; the norm's is the fused one a CUDA tensor gets from
    torch, named so that the planner runs the same."""
    dtype = torch.bfloat16 if device.type == "cuda" else None
    norm = "fused" if device.type == "cuda" else "auto"
    backend = auto_backend(device.type, dtype or torch.float32, head_dim)
    if kernel == "cudnn" and device.type == "cuda":
        backend = "cuda_cudnn"
    return ComputeSettings(dtype, backend, norm)


def state_offload(on: bool, device: torch.device) -> OffloadPolicy:
    """FSDP2's policy for the parameter shards, their gradients and AdamW's state: in host memory
    when `on` (FSDP2 copies each layer's shards in before its all-gather and the gradients out after
    the reduce-scatter; AdamW steps on the CPU), pinned on a GPU so that those copies run
    asynchronously; otherwise on the device (FSDP2's default)."""
    return CPUOffloadPolicy(pin_memory=device.type == "cuda") if on else OffloadPolicy()


def parameter_device(device: torch.device | str, policy: OffloadPolicy) -> torch.device:
    """Where the sharded parameters are allocated: FSDP2's CPU offload wants them in host memory."""
    return torch.device("cpu") if isinstance(policy, CPUOffloadPolicy) else torch.device(device)


def apply_context_parallel(
    model: Transformer,
    group=None,
    layout: str = "striped",
    mode: str = "ring",
    ulysses_group=None,
    backend: str = "auto",
) -> Transformer:
    """Swap `model`'s attention for context-parallel attention over `group` (hybrid: `group` is the
    ring group and `ulysses_group` the all-to-all one). Returns the model."""
    check_layout(layout)
    if mode == "ring":
        fn = partial(ring_attention, group=group, layout=layout, backend=backend)
    elif mode == "ulysses":
        fn = partial(ulysses_attention, group=group, layout=layout, backend=backend)
    elif mode == "hybrid":
        if ulysses_group is None:
            raise ValueError("mode 'hybrid' needs ulysses_group (and group as the ring group)")
        fn = partial(hybrid_attention, ring_group=group, ulysses_group=ulysses_group, layout=layout, backend=backend)
    else:
        raise ValueError(f"unknown context-parallel mode {mode!r}; expected one of {MODES}")
    model.set_attention(fn)
    return model


def apply_activation_checkpointing(model: Transformer, keep_attention: bool | int = False) -> Transformer:
    """Recompute each block in backward (each block wrapped; state-dict keys and parameter names
    unchanged, attributes reach the block through the wrapper). keep_attention: the blocks that keep their
    attention's output and logsumexp for their backward, whose recompute then runs no attention forward
    (lwm.parallel.kept), their head groups' recompute included: True every block, False none, a number the
    first that many (ParallelConfig.kept_blocks)."""
    kept_blocks = kept.kept_count(keep_attention, len(model.layers))
    for i, layer in enumerate(model.layers):
        if i < kept_blocks:
            layer.attn.group_context_fn = kept.group_contexts
        model.layers[i] = checkpoint_wrapper(layer, **({"context_fn": kept.contexts} if i < kept_blocks else {}))
    return model


def apply_compile(model: Transformer) -> Transformer:
    """torch.compile each block's work around the attention: its two norms, its SwiGLU and RoPE (one compiled
    function for every block). The attention itself stays eager, outside every compiled graph: the ring's and
    Ulysses' communication and the documents' host tables are untouched, and a packed batch's documents
    never reach a graph's guards (no recompile per batch). Checkpointed blocks recompute the compiled code."""
    rope = torch.compile(apply_rope)
    for layer in model.layers:
        block = getattr(layer, "_checkpoint_wrapped_module", layer)
        for module in (block.attn_norm, block.mlp_norm, block.mlp):
            module.compile()
        block.attn.rope = rope
    return model


def reshards_after_forward(block: int, blocks: int) -> bool:
    """Whether FSDP2 frees a block's gathered parameters after its forward, to gather them again for its
    backward: every block but the last, whose backward comes right after its forward (gathered again at once,
    for nothing). FSDP2 keeps the root's (embedding, final norm, head) by itself."""
    return block < blocks - 1


def parallelize(
    model: Transformer,
    meshes: Meshes,
    settings: ComputeSettings,
    layout: str = "striped",
    activation_checkpointing: bool = False,
    offload: ActivationOffload | None = None,
    states: OffloadPolicy = OffloadPolicy(),  # FSDP2's default: on the device
    compile_blocks: bool = False,
    keep_attention: bool | int = False,
) -> Transformer:
    """Apply meshes.dims to `model` (best built on the meta device): tp, cp attention, the norm kernel, activation
    checkpointing, activation offload (`offload`, None: off; needs checkpointing), compiled blocks
    (apply_compile), FSDP2 over dp x cp with settings' mixed precision and `states` as its offload policy
    (state_offload)."""
    dims = meshes.dims
    dims.check_model(model.config.n_heads, model.config.n_kv_heads, model.config.attn_head_groups)
    apply_tensor_parallel(model, meshes.tp)
    apply_context_parallel(model, meshes.attention_group, layout, dims.mode, meshes.ulysses_group, settings.backend)
    model.set_norm_kernel(settings.norm)
    if activation_checkpointing:
        apply_activation_checkpointing(model, keep_attention)
    if offload is not None:
        apply_activation_offload(model, offload)
    if compile_blocks:
        apply_compile(model)
    policy = settings.mp_policy()
    for i, layer in enumerate(model.layers):
        reshard = reshards_after_forward(i, len(model.layers))
        fully_shard(layer, mesh=meshes.fsdp, mp_policy=policy, offload_policy=states, reshard_after_forward=reshard)
    fully_shard(model, mesh=meshes.fsdp, mp_policy=policy, offload_policy=states)
    return model


def meta_parallel_model(
    config: ModelConfig,
    meshes: Meshes,
    settings: ComputeSettings,
    layout: str = "striped",
    activation_checkpointing: bool = False,
    offload: ActivationOffload | None = None,
    states: OffloadPolicy = OffloadPolicy(),  # FSDP2's default: on the device
    compile_blocks: bool = False,
    keep_attention: bool | int = False,
) -> Transformer:
    """The model built on the meta device and parallelized, not yet allocated. Under fake tensors,
    call it outside FakeTensorMode: FSDP2 over a tp mesh makes DeviceMeshes from real rank tensors."""
    with torch.device("meta"):
        model = Transformer(config)
    return parallelize(
        model, meshes, settings, layout, activation_checkpointing, offload, states, compile_blocks, keep_attention
    )


def allocate(model: Transformer, device: torch.device | str, init_state: dict | None) -> Transformer:
    """Give a meta_parallel_model its storage on `device`. init_state: rank 0's full starting
    weights ({} on the other ranks), broadcast from rank 0 and cut to each rank's shards; None
    leaves the weights as allocated (no values: fake and meta tensors)."""
    model.to_empty(device=device)
    if init_state is not None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, init_state, options=options)  # rank 0's, broadcast
    return model


def build_parallel_model(
    config: ModelConfig,
    meshes: Meshes,
    settings: ComputeSettings,
    device: torch.device | str,
    init_state: dict | None,
    layout: str = "striped",
    activation_checkpointing: bool = False,
    offload: ActivationOffload | None = None,
    states: OffloadPolicy = OffloadPolicy(),  # FSDP2's default: on the device
    compile_blocks: bool = False,
    keep_attention: bool | int = False,
) -> Transformer:
    """meta_parallel_model, then allocate: the parallelized model on `device` (its parameter shards
    in host memory under `states`' CPU offload) with init_state's weights."""
    model = meta_parallel_model(
        config, meshes, settings, layout, activation_checkpointing, offload, states, compile_blocks, keep_attention
    )
    return allocate(model, parameter_device(device, states), init_state)


def global_group_counts(loss_mask: torch.Tensor, vision_mask: torch.Tensor, group=None) -> GroupCounts:
    """Text/vision loss-mask totals over the whole sequence (summed over the group's ranks)."""
    counts = torch.stack(list(group_counts(loss_mask, vision_mask)))
    if dist.is_initialized():
        dist.all_reduce(counts, group=group)
    return GroupCounts(counts[0], counts[1])
