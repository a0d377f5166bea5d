"""Everything that talks across processes: the parallel sizes (ParallelDims) and their meshes, layouts,
comm, block kernels, ring / Ulysses / hybrid attention, tensor parallelism, activation offload, and
`parallelize`, which applies them all to a model from outside."""

from lwm.parallel.comm import RingComm
from lwm.parallel.dims import ParallelDims
from lwm.parallel.hybrid import hybrid_attention, hybrid_groups
from lwm.parallel.kernels import block_backward, block_forward
from lwm.parallel.layout import LAYOUTS, check_divisible, positions, shard, unshard
from lwm.parallel.mesh import Meshes, build_meshes
from lwm.parallel.offload import ActivationOffload, CudaCopyEngine, SyncCopyEngine, apply_activation_offload
from lwm.parallel.parallelize import (
    ComputeSettings,
    allocate,
    apply_activation_checkpointing,
    apply_context_parallel,
    build_parallel_model,
    compute_settings,
    global_group_counts,
    meta_parallel_model,
    parallelize,
    parameter_device,
    state_offload,
)
from lwm.parallel.ring import ring_attention, simulate_ring
from lwm.parallel.schedule import block_plan, block_work
from lwm.parallel.ulysses import ulysses_attention

__all__ = [
    "LAYOUTS",
    "ActivationOffload",
    "CudaCopyEngine",
    "SyncCopyEngine",
    "apply_activation_offload",
    "ComputeSettings",
    "allocate",
    "Meshes",
    "ParallelDims",
    "apply_activation_checkpointing",
    "apply_context_parallel",
    "build_meshes",
    "build_parallel_model",
    "compute_settings",
    "RingComm",
    "block_backward",
    "block_forward",
    "block_plan",
    "block_work",
    "check_divisible",
    "global_group_counts",
    "hybrid_attention",
    "hybrid_groups",
    "meta_parallel_model",
    "parallelize",
    "parameter_device",
    "state_offload",
    "positions",
    "ring_attention",
    "shard",
    "simulate_ring",
    "ulysses_attention",
    "unshard",
]
