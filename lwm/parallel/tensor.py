"""Tensor parallelism of the Transformer's blocks, applied from outside with DTensor.

Megatron's split: in attention wq, wk, wv are column-parallel (each tp rank computes its own heads)
and wo row-parallel (the partial outputs are summed across the tp group); in the MLP w1 and w3 are
column-parallel and w2 row-parallel. So each block costs one all-reduce forward and one backward per
sublayer, and the tp ranks' hidden states stay whole and equal. The embedding, norms and output head
stay whole on every tp rank (FSDP2 shards them over dp x cp): the chunked loss reads the head's whole
weight (lwm.model.loss), so splitting the vocabulary would need a vocabulary-parallel loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from lwm.model import Transformer
from lwm.model.norm import RMSNorm

BLOCK_PLAN = {
    "attn.wq": ColwiseParallel,
    "attn.wk": ColwiseParallel,
    "attn.wv": ColwiseParallel,
    "attn.wo": RowwiseParallel,
    "mlp.w1": ColwiseParallel,
    "mlp.w3": ColwiseParallel,
    "mlp.w2": RowwiseParallel,
}


def apply_tensor_parallel(model: Transformer, mesh: DeviceMesh) -> Transformer:
    """Split every block's heads and MLP columns over the 1-D `mesh` (before FSDP2 and before any
    wrapper); attention then sees its local heads. Heads must divide (ParallelDims.check_model)."""
    tp = mesh.size()
    if tp == 1:
        return model
    config = model.config
    if config.n_heads % tp or config.n_kv_heads % tp:
        raise ValueError(f"tp {tp} must divide the q heads ({config.n_heads}) and the kv heads ({config.n_kv_heads})")
    for layer in model.layers:
        parallelize_module(layer, mesh, {name: style() for name, style in BLOCK_PLAN.items()})
        # q/k/v come out as local tensors of this rank's heads: (B, S, H/tp * D)
        layer.attn.n_heads, layer.attn.n_kv_heads = config.n_heads // tp, config.n_kv_heads // tp
        for name in ("q_norm", "k_norm"):  # Qwen3's: one weight for every head, each rank sees its own heads
            norm = getattr(layer.attn, name)
            if norm is not None:
                setattr(layer.attn, name, HeadNorm.of(norm, mesh.get_group()))
    return model


class _SumGradOverGroup(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the group (Megatron's "copy to the tensor
    parallel region")."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class HeadNorm(RMSNorm):
    """A per-head RMSNorm under tensor parallelism: each rank normalizes its own heads with the one
    shared weight, so the weight's gradient is the sum of the ranks' parts. The parameter stays the
    model's (same name, same tensor), so FSDP2 and the state dict see no change."""

    group = None

    @classmethod
    def of(cls, norm: RMSNorm, group) -> "HeadNorm":
        head = cls(norm.weight.shape[0], norm.eps, norm.chunk_size)
        head.weight, head.kernel, head.group = norm.weight, norm.kernel, group  # the same parameter
        return head

    def scale(self) -> torch.Tensor:
        return _SumGradOverGroup.apply(self.weight, self.group)
