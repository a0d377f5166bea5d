"""One pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

from __future__ import annotations

import torch
from torch import nn

from lwm.model.attention import Attention
from lwm.model.config import ModelConfig
from lwm.model.mlp import FeedForward
from lwm.model.norm import RMSNorm


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps, config.norm_chunk_size)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.dim, config.norm_eps, config.norm_chunk_size)
        self.mlp = FeedForward(config.dim, config.ffn_dim, config.mlp_chunk_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), cos, sin, segment_ids)
        return h + self.mlp(self.mlp_norm(h))

    def init_weights(self, std: float, out_std: float) -> None:
        self.attn_norm.reset_parameters()
        self.mlp_norm.reset_parameters()
        self.attn.init_weights(std, out_std)
        self.mlp.init_weights(std, out_std)
