"""Everything that talks across processes: the parallel sizes (ParallelDims) and their meshes, layouts,
comm, block kernels, ring / Ulysses / hybrid attention, tensor parallelism, activation offload, and
`parallelize`, which applies them all to a model from outside."""

import importlib

# Each name's module, imported on first use (PEP 562): a process that needs only comm, layout or the
# kernels (inference, evaluation, data loader workers) does not pay for importing FSDP, DTensor and
# distributed checkpointing, about a second of CPU a process.
_HOMES = {
    "RingComm": "comm",
    "ParallelDims": "dims",
    "hybrid_attention": "hybrid",
    "hybrid_groups": "hybrid",
    "block_backward": "kernels",
    "block_forward": "kernels",
    "LAYOUTS": "layout",
    "check_divisible": "layout",
    "positions": "layout",
    "shard": "layout",
    "unshard": "layout",
    "Meshes": "mesh",
    "build_meshes": "mesh",
    "kept_count": "kept",
    "ActivationOffload": "offload",
    "CudaCopyEngine": "offload",
    "SyncCopyEngine": "offload",
    "apply_activation_offload": "offload",
    "ComputeSettings": "parallelize",
    "allocate": "parallelize",
    "apply_activation_checkpointing": "parallelize",
    "apply_compile": "parallelize",
    "apply_context_parallel": "parallelize",
    "build_parallel_model": "parallelize",
    "compute_settings": "parallelize",
    "global_group_counts": "parallelize",
    "meta_parallel_model": "parallelize",
    "parallelize": "parallelize",
    "parameter_device": "parallelize",
    "reshards_after_forward": "parallelize",
    "state_offload": "parallelize",
    "ring_attention": "ring",
    "simulate_ring": "ring",
    "block_part": "blocks",
    "block_work": "blocks",
    "ulysses_attention": "ulysses",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
