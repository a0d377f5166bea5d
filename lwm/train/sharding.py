"""Applying context parallelism, activation checkpointing and FSDP2 to a model from outside.

The device mesh is (data_parallel, context_parallel) — Lightning's ModelParallelStrategy names the
second dimension "tensor_parallel"; here it carries the context-parallel group. Parameters are
sharded over all dp x cp ranks (FSDP2 on a 1-D mesh of those ranks).

What the model computes with (precision, attention kernel), the meshes and the starting weights
are explicit arguments, decided once by the caller, so the same code runs on real, meta and fake
tensors (lwm/train/fake_step.py runs the GPU's settings on fake CPU tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from lwm.model import ModelConfig, Transformer
from lwm.parallel import parallelize
from lwm.parallel.kernels import auto_backend
from lwm.train.config import ParallelConfig

DP_DIM, CP_DIM = "data_parallel", "tensor_parallel"


@dataclass(frozen=True)
class ComputeSettings:
    """What the sharded model computes with."""

    param_dtype: torch.dtype | None  # FSDP2's compute dtype on fp32 master weights; None: fp32 throughout
    backend: str  # the ring's attention kernel (lwm.parallel.kernels.BACKENDS)

    def mp_policy(self) -> MixedPrecisionPolicy:
        # Forward inputs are not cast: the blocks' RoPE cos/sin stay fp32 (apply_rope rotates in
        # fp32, as on CPU and in inference); hidden states come in param_dtype from the embedding.
        reduce = torch.float32 if self.param_dtype is not None else None
        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=reduce, cast_forward_inputs=False)


def compute_settings(device: torch.device, head_dim: int) -> ComputeSettings:
    """A GPU computes in bf16 on fp32 master weights, a CPU in fp32; the kernel is the one
    lwm.parallel.kernels picks for queries of that device, dtype and head dim."""
    dtype = torch.bfloat16 if device.type == "cuda" else None
    return ComputeSettings(dtype, auto_backend(device.type, dtype or torch.float32, head_dim))


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh FSDP2 shards over: every rank of `mesh`, in its order (given the 2-D mesh,
    FSDP2 would replicate over its first dimension instead: HSDP)."""
    if mesh.ndim == 1:
        return mesh
    return DeviceMesh(mesh.device_type, mesh.mesh.flatten(), mesh_dim_names=("dp_cp",))


def apply_activation_checkpointing(model: Transformer) -> None:
    """Recompute each block in backward; the state-dict keys stay as they are."""
    for layer in model.layers:
        forward = layer.forward
        layer.forward = lambda *args, _f=forward: checkpoint(_f, *args, use_reentrant=False)


def shard_model(
    config: ModelConfig,
    cp_group,
    mesh: DeviceMesh,
    parallel: ParallelConfig,
    settings: ComputeSettings,
    device: torch.device | str,
    init_state: dict | None,
) -> Transformer:
    """The model built on the meta device, context-parallel over `cp_group`, FSDP2-sharded over
    the 1-D `mesh`, allocated on `device`. init_state: rank 0's full starting weights ({} on the
    other ranks), broadcast from rank 0; None leaves the weights as allocated (no values: fake
    and meta tensors)."""
    if mesh.ndim != 1:
        raise ValueError(f"shard_model needs the 1-D FSDP mesh (fsdp_mesh(mesh)), got {mesh.ndim} dims: {mesh}")
    with torch.device("meta"):
        model = Transformer(config)
    parallelize(model, cp_group, layout=parallel.layout, mode=parallel.mode, backend=settings.backend)
    if parallel.activation_checkpointing:
        apply_activation_checkpointing(model)
    policy = settings.mp_policy()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    if init_state is not None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, init_state, options=options)  # rank 0's, broadcast
    return model
