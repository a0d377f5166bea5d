"""One training step of the debug model through context-parallel attention with activation checkpointing,
with and without parallel.keep_attention: what tests/unit/parallel/test_keep_attention.py and
tests/integration/test_keep_attention_ranks.py compare (loss, every gradient, the ring forwards run)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from document_refs import packings

import lwm.parallel.ring as ring
from lwm.data.batches import Sharding, shard_batch, with_documents
from lwm.model import ModelConfig, Transformer
from lwm.parallel import apply_activation_checkpointing, apply_activation_offload, apply_context_parallel
from lwm.parallel.offload import ActivationOffload, SyncCopyEngine


def keep_step(
    keep: bool | int,
    mode="ring",
    group=None,
    layout="striped",
    groups=1,
    offload=False,
    nograd_first=False,
    flash=False,
):
    """(loss, {name: grad}, ring forwards run, the offload's host bytes) of one step (keep: every block keeps
    its attention, none, or the first that many); under a process group, this rank's slice of the
    packed batch (its documents as the datamodule hands them) and the gradients of its parameters. flash: a
    bf16 model on the CUDA flash kernels' path (their CPU stand-ins installed by the caller)."""
    torch.manual_seed(0)
    config = ModelConfig.from_preset("debug").replace(attn_head_groups=groups)
    model = Transformer(config).to(torch.bfloat16) if flash else Transformer(config)
    backend = "cuda_flash" if flash else "auto"
    model = apply_context_parallel(model, group=group, layout=layout, mode=mode, backend=backend)
    apply_activation_checkpointing(model, keep)
    offloaded = ActivationOffload(SyncCopyEngine("cpu")) if offload else None
    if offloaded is not None:
        apply_activation_offload(model, offloaded)
    torch.manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (2, 65))
    seg = packings(2, 64, seed=1)  # (B, S) document ids
    full = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_weight": torch.ones(2, 64),
        "vision_mask": torch.zeros(2, 64, dtype=torch.bool),
        "segment_ids": seg,
    }
    world, rank = (1, 0) if group is None else (dist.get_world_size(group), dist.get_rank(group))
    batch = with_documents(shard_batch(full, Sharding(cp_rank=rank, cp_size=world, layout=layout), "document"))
    inputs, targets, positions = batch["tokens"], batch["targets"], batch["positions"]
    coeff = torch.full(inputs.shape, 1 / 128)
    seg = batch["documents"]
    forwards = [0]
    run = ring.ring_forward

    def counted(*args, **kwargs):
        forwards[0] += 1
        return run(*args, **kwargs)

    ring.ring_forward = counted
    try:
        if nograd_first:  # an evaluation's forward keeps nothing for a backward that never comes
            with torch.no_grad():
                model(inputs, positions, targets=targets, loss_coeff=coeff, segment_ids=seg)
            forwards[0] = 0
        out = model(inputs, positions, targets=targets, loss_coeff=coeff, segment_ids=seg)
        out.loss.backward()
    finally:
        ring.ring_forward = run
    host = offloaded.host_bytes if offloaded is not None else 0
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}, forwards[0], host
