"""RMSNorm computed in fp32, scaled in the input dtype (as LLaMA), optionally tiled over the sequence.

Kernels (`RMSNorm.kernel`, set for a whole model by Transformer.set_norm_kernel):
    auto    F.rms_norm: torch picks aten's fused kernel on a CUDA tensor, its composite (pow,
            mean, rsqrt, mul, each a temporary) elsewhere
    fused   aten's fused kernel and its backward called by name, as torch calls them for a CUDA
            tensor: what a GPU runs, on any tensor whose device has the two ops (the planner's fake
            CPU tensors run their meta kernels; on CPU the backward has no kernel)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

NORM_KERNELS = ("auto", "fused")


class FusedRMSNorm(torch.autograd.Function):
    """aten._fused_rms_norm with the backward torch's autograd gives it (derivatives.yaml): it saves
    the input, the weight and the fp32 rstd (..., 1), and its backward is one fused op."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        # Below autograd: on a device without the kernel torch would decompose the op there.
        with torch._C._AutoDispatchBelowAutograd():
            out, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)  # rstd (..., 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]]
        dx, dw = torch.ops.aten._fused_rms_norm_backward(grad, x, [x.shape[-1]], rstd, weight, mask)
        return dx, dw, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, chunk_size: int = 0):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.chunk_size = chunk_size
        self.kernel = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.chunk_size or x.dim() < 3 or x.shape[1] <= self.chunk_size or not torch.is_grad_enabled():
            return self._norm(x)
        # Sequence-tiled: each chunk is recomputed in its backward, so the fp32 work of only one
        # chunk lives at a time; the output (x's dtype) is whole.
        chunks = x.split(self.chunk_size, dim=1)  # (B, S, dim) -> chunks of (B, chunk, dim)
        return torch.cat([checkpoint(self._norm, c, use_reentrant=False) for c in chunks], dim=1)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.scale()
        if x.dtype == torch.float32:
            return self._rms(x, weight)
        # Both kernels normalize in fp32 and round once to x's dtype (no fp32 copy of x is made or
        # saved); the weight scales the rounded result, as LLaMA does.
        return weight * self._rms(x, None)

    def scale(self) -> torch.Tensor:
        """The weight as the norm applies it (a seam: tensor parallelism sums its gradient over the
        ranks of a norm that sees only this rank's heads)."""
        return self.weight

    def _rms(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if self.kernel == "fused":
            return FusedRMSNorm.apply(x, weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
