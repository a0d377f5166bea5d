"""Applying context parallelism, activation checkpointing and FSDP2 to a model from outside.

The device mesh is (data_parallel, context_parallel) — Lightning's ModelParallelStrategy names the
second dimension "tensor_parallel"; here it carries the context-parallel group. Parameters are
sharded over all dp x cp ranks (FSDP2 on the flattened mesh).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from lwm.model import ModelConfig, Transformer
from lwm.parallel import parallelize
from lwm.train.config import ParallelConfig

CP_DIM = "tensor_parallel"


def apply_activation_checkpointing(model: Transformer) -> None:
    """Recompute each block in backward; the state-dict keys stay as they are."""
    for layer in model.layers:
        forward = layer.forward
        layer.forward = lambda *args, _f=forward: checkpoint(_f, *args, use_reentrant=False)


def shard_model(config: ModelConfig, mesh, parallel: ParallelConfig, init_state: dict | None, device: torch.device):
    """The sharded model, filled with rank 0's `init_state` (the full starting weights)."""
    cp_mesh = mesh[CP_DIM]
    cp_group = cp_mesh.get_group()
    with torch.device("meta"):
        model = Transformer(config)
    parallelize(model, cp_group, layout=parallel.layout, mode=parallel.mode)
    if parallel.activation_checkpointing:
        apply_activation_checkpointing(model)
    flat = mesh._flatten("dp_cp") if mesh.ndim > 1 else mesh
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    for layer in model.layers:
        fully_shard(layer, mesh=flat, mp_policy=policy)
    fully_shard(model, mesh=flat, mp_policy=policy)
    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, init_state if dist.get_rank() == 0 else {}, options=options)  # rank 0's, broadcast
    return model, cp_group
