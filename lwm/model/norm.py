"""RMSNorm computed in fp32, scaled in the input dtype (as LLaMA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the fused kernel, same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * normed.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
