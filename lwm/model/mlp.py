"""SwiGLU feed-forward, optionally blockwise over the sequence (BPT-style)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class FeedForward(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, chunk_size: int = 0):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)  # down
        self.chunk_size = chunk_size

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.chunk_size or x.shape[1] <= self.chunk_size:
            return self._ffn(x)
        # Blockwise: only one chunk's (B, chunk, ffn_dim) intermediates live at a time; in training
        # each chunk is recomputed in backward, so they are not kept for the whole sequence either.
        chunks = x.split(self.chunk_size, dim=1)
        if torch.is_grad_enabled():
            outs = [checkpoint(self._ffn, c, use_reentrant=False) for c in chunks]
        else:
            outs = [self._ffn(c) for c in chunks]
        return torch.cat(outs, dim=1)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=std)
        nn.init.normal_(self.w3.weight, std=std)
        nn.init.normal_(self.w2.weight, std=out_std)
