"""Self-attention with a replaceable attention function.

The attention function takes q (B, Hq, S, D) and k, v (B, Hkv, S, D) with Hq a multiple of Hkv
and returns (B, Hq, S, D); given `segment_ids` (B, S), packed documents attend only within
themselves. The model only ever calls it; lwm.parallel swaps in ring or Ulysses attention from
outside with `Transformer.set_attention`.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lwm.model.config import ModelConfig
from lwm.model.documents import document_attention
from lwm.model.rope import apply_rope

AttentionFn = Callable[..., torch.Tensor]  # attn(q, k, v, causal, segment_ids=None) -> out


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    segment_ids: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Local attention on one process (PyTorch SDPA); k/v may have fewer heads than q."""
    if segment_ids is not None:
        return document_attention(q, k, v, segment_ids, causal, scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        self.attn_fn: AttentionFn = sdpa_attention

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, S, H*D) -> (B, H, S, D)
        k = self.wk(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        v = self.wv(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Without segment ids the call is the plain one, so attention functions that know no
        # documents (the KV-cache paths of generation) keep working.
        out = (
            self.attn_fn(q, k, v, causal=True)
            if segment_ids is None
            else self.attn_fn(q, k, v, causal=True, segment_ids=segment_ids)
        )  # (B, H, S, D)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))  # (B, H, S, D) -> (B, S, H*D) -> (B, S, dim)

    def init_weights(self, std: float, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.wo.weight, std=out_std)
