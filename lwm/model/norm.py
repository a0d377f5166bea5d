"""RMSNorm computed in fp32, scaled in the input dtype (as LLaMA), optionally tiled over the sequence."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, chunk_size: int = 0):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.chunk_size = chunk_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.chunk_size or x.dim() < 3 or x.shape[1] <= self.chunk_size or not torch.is_grad_enabled():
            return self._norm(x)
        # Sequence-tiled: each chunk is recomputed in its backward, so the fp32 work of only one
        # chunk lives at a time; the output (x's dtype) is whole.
        chunks = x.split(self.chunk_size, dim=1)  # (B, S, dim) -> chunks of (B, chunk, dim)
        return torch.cat([checkpoint(self._norm, c, use_reentrant=False) for c in chunks], dim=1)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the fused kernel, same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * normed.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
